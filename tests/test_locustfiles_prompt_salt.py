"""A fresh prompt salt per run: no run meets another run's prompts in a prefix cache, a run's
own sharing (Mooncake blocks, common openings) stays, and a plan longer than its workload never
sends the same prompt twice in one run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from locustfiles.schedule_items import build_items
from workloads.arrivals import PoissonPlan, save_plan
from workloads.builtin_mix import NO_SALT, BuiltinMix, new_prompt_salt
from workloads.schema import write_workload

SHARED = " ".join(["system prompt words"] * 40)  # what two rows of the workload share


def _first_words(text: str, n: int = 3) -> str:
    return " ".join(text.split()[:n])


def test_builtin_mix_salt_changes_openings_not_lengths() -> None:
    a, b = new_prompt_salt(), new_prompt_salt()
    assert a != b and len(a) == 8 and a.isalpha()
    run_a = [BuiltinMix(seed=3, salt=a).request(i, "w0-") for i in range(50)]
    run_b = [BuiltinMix(seed=3, salt=b).request(i, "w0-") for i in range(50)]
    again = [BuiltinMix(seed=3, salt=a).request(i, "w0-") for i in range(50)]
    assert again == run_a  # the manifest's salt repeats a run exactly
    openings_a = {_first_words(r.prompt) for r in run_a}
    assert len(openings_a) == 50 and not openings_a & {_first_words(r.prompt) for r in run_b}
    for x, y in zip(run_a, run_b, strict=True):  # the seed alone fixes the mix
        assert (x.bucket, x.target_prompt_tokens) == (y.bucket, y.target_prompt_tokens)
        assert len(x.prompt.split()) == len(y.prompt.split())
    unsalted = [BuiltinMix(seed=3, salt=NO_SALT).request(i, "w0-").prompt for i in range(5)]
    assert unsalted == [BuiltinMix(seed=3).request(i, "w0-").prompt for i in range(5)]


def _workload(folder: Path, endpoint: str) -> Path:
    texts = [f"{SHARED} question {i} " + "word " * (10 + i) for i in range(4)]
    rows = [{"request_id": f"r{i:06d}", "bucket": "medium", "prompt_tokens": len(t.split()),
             "output_tokens": 8,
             "prompt": t if endpoint == "completions" else None,
             "messages": json.dumps([{"role": "system", "content": SHARED},
                                     {"role": "user", "content": t}]) if endpoint == "chat"
             else None,
             "trace_offset_s": None, "session_id": None, "prefix_block_ids": [],
             "source_line": i + 1, "prompt_source": "log"} for i, t in enumerate(texts)]
    write_workload(pd.DataFrame(rows), folder, {"endpoint": endpoint})
    save_plan(PoissonPlan(rate_rps=20.0), folder / "arrivals.yaml")  # ~200 arrivals, 4 rows
    return folder


def _opening(item: dict) -> str:
    text = item["prompt"] if item["endpoint"] == "completions" else item["messages"][0]["content"]
    return text


def test_replayed_prompts_unique_in_a_run_fresh_across_runs_shared_within(tmp_path: Path) -> None:
    for endpoint in ("completions", "chat"):
        folder = _workload(tmp_path / endpoint, endpoint)
        one = build_items(str(folder), None, 10.0, seed=0, salt="aaaaaaaa")
        two = build_items(str(folder), None, 10.0, seed=0, salt="bbbbbbbb")
        assert len(one) > 4 * 20  # the plan wraps around the workload many times
        bodies = [json.dumps(i["prompt"] or i["messages"]) for i in one]
        assert len(set(bodies)) == len(bodies), "a prompt was sent twice in one run"
        # across runs: no opening in common, so not even a first cache block is shared
        firsts_one = {_opening(i).split()[0] for i in one}
        assert not firsts_one & {_opening(i).split()[0] for i in two}
        # within a run, a pass over the workload keeps what its rows share (opening + prompt)
        first_pass = [_opening(i) for i in one[:4]]
        assert len({t[:len(SHARED) + 9] for t in first_pass}) == 1, first_pass
        # the salt repeats exactly when given again
        assert build_items(str(folder), None, 10.0, seed=0, salt="aaaaaaaa") == one


def test_closed_loop_replay_walks_the_workload_and_no_two_workers_send_one_prompt(
        tmp_path: Path) -> None:
    from itertools import islice

    from locustfiles.schedule_items import closed_items

    for endpoint in ("completions", "chat"):
        folder = _workload(tmp_path / endpoint, endpoint)
        w0 = list(islice(closed_items(str(folder), salt="aaaaaaaa", tag="w0-"), 12))
        w1 = list(islice(closed_items(str(folder), salt="aaaaaaaa", tag="w1-"), 12))
        # the rows in turn, pass after pass, each request id the row's own with the worker's tag
        assert [i["rid"] for i in w0[:5]] == ["w0-r000000#0", "w0-r000001#1", "w0-r000002#2",
                                              "w0-r000003#3", "w0-r000000#4"]
        assert {i["endpoint"] for i in w0} == {endpoint} and {i["max_tokens"] for i in w0} == {8}
        bodies = [json.dumps(i["prompt"] or i["messages"]) for i in w0 + w1]
        assert len(set(bodies)) == len(bodies), "a prompt was sent twice in one run"
        # within a worker's pass the rows keep what they share
        assert len({_opening(i)[:len(SHARED) + 12] for i in w0[:4]}) == 1
    unsalted = list(islice(closed_items(str(folder), salt=NO_SALT, tag="w0-"), 1))
    assert _opening(unsalted[0]).startswith(SHARED[:20])  # 'none': the prompt as logged
