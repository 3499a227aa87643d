"""Sessions replayed through a real master, two workers and the simulator: turns in order on one
worker, history growing by the real answers, tool loops closed, every turn recorded once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from locust_workers import wait_for_schedule_start, wait_for_worker

from collectors.run_folder import load_requests
from locustfiles.sse import assemble_answer
from workloads.schema import read_workload

REPO_ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

SPEC = ("synthetic:sessions=12,turns=4,system_tokens=60,groups=2,user_tokens=20,"
        "output_tokens=8,think_s=0.3,tool_every=3,tool_time_s=0.25")


def _workload(out: Path, arrivals: str, spec: str = SPEC) -> Path:
    """A synthetic session workload; ``arrivals=""``: built without an arrival plan."""
    plan = ["--arrivals", arrivals] if arrivals else []
    subprocess.run([sys.executable, "-m", "infra.cli", "workload", "build", "--source", spec,
                    "--tokenizer", "words", *plan, "--out", str(out), "--quiet"],
                   cwd=REPO_ROOT, check=True, timeout=120)
    return out


def _run(workload: Path, results: Path, *extra: str, duration: str = "8",
         wait: bool = True) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "run", "--target", "sim", "--workers", "2",
         "--workload", str(workload), "--duration", duration, "--drain", "30",
         "--results", str(results), "--no-collectors", *extra],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if wait:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out
    return proc


def _records(results: Path) -> pd.DataFrame:
    (run,) = [p for p in results.iterdir() if p.is_dir()]
    return load_requests(run)


def _turns(records: pd.DataFrame) -> pd.DataFrame:
    return records[records["turn_step"].ne("final")]


def test_open_loop_sessions_keep_their_turns_on_one_worker_and_close_tool_loops(
        tmp_path: Path) -> None:
    workload = _workload(tmp_path / "wl", "poisson:rate_rps=3")
    _run(workload, tmp_path / "results")
    records = _records(tmp_path / "results")
    turns = _turns(records)
    assert set(records["outcome"]) == {"ok"}
    assert records["request_id"].is_unique
    per_session = turns.groupby("session_id")["turn"].apply(sorted)
    assert len(per_session) >= 12 and per_session.map(lambda t: t == [0, 1, 2, 3]).all()
    assert records.groupby("session_id")["worker_id"].nunique().eq(1).all()
    assert records["worker_id"].nunique() == 2
    # the history grows by the real answers: each turn's prompt holds the previous one's
    for _, rows in turns.sort_values("turn").groupby("session_id"):
        prompts = rows["prompt_tokens"].tolist()
        assert prompts == sorted(prompts) and prompts[0] < prompts[-1]
        assert rows["history_tokens"].iloc[0] == 0
        assert (rows["history_tokens"].iloc[1:] < rows["prompt_tokens"].iloc[1:]).all()
    # turn 2 (tool_every=3: the third turn) is a tool loop: the call, then the final answer
    calls = records[records["turn_step"] == "tool_call"]
    finals = records[records["turn_step"] == "final"]
    assert (calls["turn"] == 2).all() and (calls["tool_calls"] >= 1).all()
    assert (calls["finish_reason"] == "tool_calls").all()
    assert len(finals) == len(calls) and finals["ttft_s"].notna().all()
    assert (finals["tool_wait_s"] >= 0.25).all()
    # turns after the first wait their think time after the previous answer
    later = turns[turns["turn"] > 0]
    assert (later["schedule_lag_s"] < 0.2).all() and (later["schedule_lag_s"] > -0.01).all()


@pytest.mark.parametrize("how", ["closed plan", "--users on a workload without a plan"])
def test_closed_loop_runs_k_sessions_at_a_time(tmp_path: Path, how: str) -> None:
    if how == "closed plan":
        workload = _workload(tmp_path / "wl", "closed:concurrency=3")
        _run(workload, tmp_path / "results", duration="6")
    else:  # what a Locust user types: --users K on the workload as built
        workload = _workload(tmp_path / "wl", "")
        assert not (workload / "arrivals.yaml").exists()
        out, _ = _run(workload, tmp_path / "results", "--users", "3", duration="6",
                      wait=False).communicate(timeout=240)
        assert "has no arrival plan: 3 sessions at a time, closed loop (--users" in out, out
    records = _records(tmp_path / "results")
    assert set(records["outcome"]) <= {"ok", "cancelled"}
    start = records.groupby("session_id")["sent_wall_ns"].min()
    end = (records["sent_wall_ns"] + records["e2e_s"].fillna(0) * 1e9).groupby(
        records["session_id"]).max()
    events = sorted([(t, 1) for t in start] + [(t, -1) for t in end], key=lambda e: (e[0], e[1]))
    running, most = 0, 0
    for _, step in events:
        running += step
        most = max(most, running)
    assert most == 3  # never more than K sessions at once, and K reached
    assert len(start) > 3  # a finished session's place went to the next one


def test_a_failed_turn_ends_its_session_and_the_unsent_turns_are_counted(
        tmp_path: Path) -> None:
    workload = _workload(tmp_path / "wl", "poisson:rate_rps=3")
    _run(workload, tmp_path / "results", "--target-arg=--error-rate=0.3")
    records = _records(tmp_path / "results")
    turns = _turns(records)
    assert turns.groupby("session_id")["turn"].apply(sorted).map(
        lambda t: t == [0, 1, 2, 3]).all()  # every turn of every session: one record
    assert "http_5xx" in set(records["outcome"])
    # a turn failed when any of its requests did (a tool loop's final answer included)
    worst = records.assign(bad=records["outcome"].ne("ok")).sort_values("bad").groupby(
        ["session_id", "turn"]).last().reset_index()
    for _, rows in worst.sort_values("turn").groupby("session_id"):
        outcomes = rows["outcome"].tolist()
        failed = [i for i, o in enumerate(outcomes) if o != "ok"]
        if failed:  # the first failure, then only session_ended after it
            assert set(outcomes[failed[0] + 1:]) <= {"session_ended"}
            assert outcomes[failed[0]] != "session_ended"
    assert (records["outcome"] == "session_ended").any()


@pytest.mark.parametrize("kind", ["synthetic", "mooncake"])
def test_a_killed_worker_leaves_its_sessions_unsent_turns_counted(tmp_path: Path,
                                                                  kind: str) -> None:
    if kind == "synthetic":
        spec = SPEC.replace("sessions=12", "sessions=40").replace("think_s=0.3", "think_s=1")
        workload = _workload(tmp_path / "wl", "poisson:rate_rps=4", spec)
    else:  # a Mooncake stand-in: 60 conversations over 10 s, turns 1.5 s apart
        source = _mooncake_file(tmp_path / "trace.jsonl", conversations=60)
        workload = tmp_path / "wl"
        subprocess.run([sys.executable, "-m", "infra.cli", "workload", "build", "--source",
                        f"mooncake:{source}", "--sessions", "--tokenizer", "words",
                        "--arrivals", "trace:fit_window_s=10", "--out", str(workload),
                        "--quiet"], cwd=REPO_ROOT, check=True, timeout=120)
    expected = read_workload(workload).groupby("session_id").size()
    proc = _run(workload, tmp_path / "results", duration="10", wait=False)
    try:
        worker = wait_for_worker(proc)
        assert worker is not None
        assert wait_for_schedule_start(proc, tmp_path / "results"), "the schedule never started"
        time.sleep(3)  # a few seconds into the 10 s schedule
        os.kill(worker.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    records = _records(tmp_path / "results")
    turns = _turns(records)
    (run,) = [p for p in (tmp_path / "results").iterdir() if p.is_dir()]
    events = json.loads((run / "replay_events.json").read_text())
    scheduled = next(e["requests"] for e in events if e["event"] == "schedule_start")
    assert turns["session_id"].nunique() == scheduled  # every session has its records
    by_session = turns.groupby("session_id").agg(wl=("session_id", "first"), n=("turn", "size"))
    wanted = expected.loc[by_session["wl"].str.split("#").str[0]].to_numpy()
    assert (by_session["n"].to_numpy() == wanted).all()  # each turn exactly once
    assert turns["request_id"].is_unique
    lost = turns[turns["outcome"] == "worker_lost"]
    assert len(lost) > 0 and set(turns["outcome"]) <= {"ok", "worker_lost"}
    # a started session of the dead worker: its later turns are counted lost, none sent twice
    assert (lost.groupby("session_id")["turn"].min() >= 0).all()


def test_answers_are_assembled_from_stream_chunks_and_whole_bodies() -> None:
    chunks = [
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}',
        b'data: {"choices":[{"delta":{"content":"Hello"}}]}',
        b'data: {"choices":[{"delta":{"content":" world"}}]}',
        b'data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function",'
        b'"function":{"name":"lookup","arguments":""}}]}}]}',
        b'data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\\"a'
        b'\\":"}}]}}]}',
        b'data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]}',
        b"data: [DONE]",
    ]
    text, calls = assemble_answer(chunks)
    assert text == "Hello world"
    assert calls == [{"id": "c1", "type": "function",
                      "function": {"name": "lookup", "arguments": '{"a":1}'}}]
    whole = json.dumps({"choices": [{"message": {"content": "hi", "tool_calls": []}}]}).encode()
    assert assemble_answer([whole]) == ("hi", [])


@pytest.mark.parametrize("balance", ["haproxy", "round-robin"])
def test_a_session_stays_on_one_replica(tmp_path: Path, balance: str) -> None:
    if balance == "haproxy" and not any(
            Path(p).exists() for p in ("/usr/sbin/haproxy", "/usr/bin/haproxy")):
        pytest.skip("haproxy not installed (make haproxy)")
    workload = _workload(tmp_path / "wl", "poisson:rate_rps=3")
    # a short folder: HAProxy's admin socket path must fit a UNIX socket name (108 bytes)
    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        _run(workload, Path(short), "--replicas", "2", "--balance", balance, duration="6")
        records = _records(Path(short))
    assert set(records["outcome"]) == {"ok"} and records["replica"].nunique() == 2
    # HAProxy sticks on the session header; the workers pick one replica per session
    assert records.groupby("session_id")["replica"].nunique().eq(1).all()


def _sharegpt_file(path: Path, conversations: int = 30) -> Path:
    """A ShareGPT-format stand-in (the shared data has none): 2 to 5 exchanges each."""
    rng = np.random.default_rng(1)
    words = "alpha beta gamma delta river stone light music water field".split()
    records = []
    for c in range(conversations):
        turns = []
        for _ in range(int(rng.integers(2, 6))):
            turns.append({"from": "human", "value": " ".join(rng.choice(words, 12))})
            turns.append({"from": "gpt", "value": " ".join(rng.choice(words, 6))})
        records.append({"id": f"conv{c}", "conversations": turns})
    path.write_text(json.dumps(records))
    return path


def _mooncake_file(path: Path, conversations: int = 24) -> Path:
    """A Mooncake conversation-trace stand-in (JSONL: timestamp ms, input_length,
    output_length, hash_ids): conversations that share block 0, each turn growing its prompt."""
    rng = np.random.default_rng(2)
    rows = []
    next_block = 1
    for _ in range(conversations):
        start = float(rng.uniform(0, 6000))
        blocks, length = [0], 600
        for k in range(int(rng.integers(2, 5))):
            if k:
                length += int(rng.integers(520, 900))
            while len(blocks) * 512 < length:
                blocks.append(next_block)
                next_block += 1
            rows.append({"timestamp": int(start + 1500 * k), "input_length": length,
                         "output_length": 8, "hash_ids": list(blocks)})
            blocks = blocks[:-1] + [next_block]  # the partial last block changes next turn
            next_block += 1
    rows.sort(key=lambda r: r["timestamp"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("kind", ["sharegpt", "mooncake"])
def test_logged_conversations_replay_as_sessions_with_every_turn_recorded_once(
        tmp_path: Path, kind: str) -> None:
    source = (_sharegpt_file(tmp_path / "sg.json") if kind == "sharegpt"
              else _mooncake_file(tmp_path / "trace.jsonl"))
    arrivals = "poisson:rate_rps=4" if kind == "sharegpt" else "trace:fit_window_s=6"
    out = tmp_path / "wl"
    subprocess.run([sys.executable, "-m", "infra.cli", "workload", "build", "--source",
                    f"{kind}:{source}", "--sessions", "--tokenizer", "words", "--arrivals",
                    arrivals, "--out", str(out), "--quiet"], cwd=REPO_ROOT, check=True,
                   timeout=120)
    workload = read_workload(out)
    _run(out, tmp_path / "results", duration="7")
    records = _records(tmp_path / "results")
    turns = _turns(records)
    assert set(records["outcome"]) == {"ok"} and turns["request_id"].is_unique
    # every session of the schedule: each of its workload turns exactly once, in order
    expected = workload.groupby("session_id").size()
    sent = turns.assign(wl=turns["session_id"].str.split("#").str[0])
    got = sent.groupby("session_id").agg(wl=("wl", "first"), turns=("turn", sorted))
    assert len(got) >= 10
    for row in got.itertuples():
        assert row.turns == list(range(int(expected[row.wl])))
    assert records.groupby("session_id")["worker_id"].nunique().eq(1).all()


def test_logged_history_repeats_the_prompts_exactly(tmp_path: Path) -> None:
    # without ignore_eos the simulator's answers stop at random lengths: a real history differs
    # from run to run, a logged one holds the workload's answers and repeats
    workload = _workload(tmp_path / "wl", "poisson:rate_rps=4")
    prompts = {}
    for name, history in (("one", "logged"), ("two", "logged"), ("real", "real")):
        _run(workload, tmp_path / name, "--session-history", history, "--prompt-salt",
             "repeatme", "--ignore-eos", "false", duration="4")
        turns = _turns(_records(tmp_path / name))
        prompts[name] = turns.set_index("request_id")["prompt_tokens"].sort_index()
    common = prompts["one"].index.intersection(prompts["two"].index).intersection(
        prompts["real"].index)
    later = [rid for rid in common if ".t0#" not in rid]
    assert len(later) >= 20
    assert (prompts["one"][common] == prompts["two"][common]).all()
    assert (prompts["real"][later] < prompts["one"][later]).any()  # shorter real answers
    # the comparison of two session runs has the session rows
    (one,) = [p for p in (tmp_path / "one").iterdir() if p.is_dir()]
    (two,) = [p for p in (tmp_path / "two").iterdir() if p.is_dir()]
    done = subprocess.run([sys.executable, "-m", "infra.cli", "compare", str(one), str(two)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert "Session goodput" in done.stdout and "Last turn TTFT P50" in done.stdout, done.stderr
