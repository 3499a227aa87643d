"""End to end against llama.cpp's real ``llama-server``, the suite's second real engine: built by
``make llama-server`` (from the llama.cpp source llama-cpp-python's sdist vendors), serving the
tiny random-weight model as a GGUF file (infra/targets/tiny_gguf.py).

``swarmload run --target llama-cpp`` starts and stops it itself (the engine's module,
infra/targets/llama_cpp.py); the run is checked as the vLLM one is (test_e2e_vllm.py):
streaming, usage, TTFT, outcomes and the server's own figures from its ``/metrics``; then a
short study of two slot counts, a fault drill on two replicas, and a study of two engines (the
suite's shared vLLM server against llama-server: the verdict and the frontier between them).
Skipped, with the reason, where no llama-server was built.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pandas as pd
import pytest
import yaml
from e2e_checks import (
    check_over_long_prompts_refused,
    check_usage_is_the_servers,
    swarmload,
    swarmload_run,
)

from collectors import server_figures as fig
from collectors.metric_maps.llama_cpp import MAP
from collectors.run_folder import load_requests, load_server_metrics
from infra.targets.llama_cpp import LlamaCppError, LlamaServer, resolve_program
from infra.targets.tiny_gguf import TINY_GGUF


def _program() -> Path | None:
    try:
        return resolve_program(None)
    except LlamaCppError:
        return None


PROGRAM = _program()
pytestmark = [
    pytest.mark.llama_cpp,
    pytest.mark.slow,
    pytest.mark.skipif(PROGRAM is None, reason="no llama-server: run `make llama-server`"),
]
SLOTS = 4
SLOT_CONTEXT = 2048  # tokens a request may hold: llama-server splits --ctx-size over its slots
SERVER_ARGS = (f"--parallel={SLOTS}", f"--ctx-size={SLOTS * SLOT_CONTEXT}")
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def server():
    """One llama-server of its own (the run below starts another through --target)."""
    with LlamaServer(extra_args=SERVER_ARGS) as started:
        yield started


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return swarmload_run(
        tmp_path_factory.mktemp("results"), "--target", "llama-cpp",
        *[f"--target-arg={arg}" for arg in SERVER_ARGS], "--workers", "1",
        "--users", "6", "--duration", "30", "--max-tokens", str(MAX_TOKENS),
        # long prompts up to 2600 tokens: some exceed a slot's context -> HTTP 400
        "--long-max-tokens", "2600")


def test_a_run_records_every_request_with_the_servers_own_usage(llama_run) -> None:
    run_dir, stdout = llama_run
    records = load_requests(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    target = manifest["target"]
    assert (target["kind"], target["model"]) == ("llama-cpp", TINY_GGUF.stem)
    assert "--metrics" in target["launch"]["args"]
    ok = records[records["outcome"] == "ok"]
    # 370 on a quiet 2-core machine, 98 at a load average of 11: enough to check each below
    assert len(ok) >= 50, f"only {len(ok)} ok requests"
    assert records["request_id"].is_unique
    # the server's usage comes in the stream's last chunk, beside the finish reason
    check_usage_is_the_servers(ok, MAX_TOKENS)
    # a whole answer may come in one read: its first token and its end then share a time
    assert (ok["ttft_s"] > 0).all() and (ok["ttft_s"] <= ok["e2e_s"]).all()
    print(f"\nllama-cpp e2e: {len(records)} requests, {len(ok)} ok\n{stdout[-2500:]}")


def test_a_prompt_over_a_slots_context_is_a_4xx_kept_out_of_percentiles(llama_run) -> None:
    run_dir, _ = llama_run
    check_over_long_prompts_refused(load_requests(run_dir), MAX_TOKENS, SLOT_CONTEXT)


def test_the_server_figures_come_from_its_own_metrics(llama_run) -> None:
    run_dir, _ = llama_run
    metrics = load_server_metrics(run_dir)
    assert fig.engine_of(metrics["sample"]) == MAP
    running = fig.select(metrics, fig.RUNNING).sort_values("wall_ns")
    assert len(running) > 10
    assert running["value"].max() >= 2  # 6 users, 4 slots
    assert running["value"].iloc[-1] == 0  # scraping goes on after the load stops
    generated = fig.select(metrics, fig.GENERATION_TOKENS).sort_values("wall_ns")["value"]
    ok = load_requests(run_dir).query("outcome == 'ok'")
    assert generated.iloc[-1] >= len(ok) * MAX_TOKENS  # plus the readiness probe's
    assert not fig.select(metrics, fig.PREFIX_QUERIES).empty  # the sum of two counters
    assert fig.absent(MAP, [fig.KV_USAGE, fig.TTFT]) == {
        fig.KV_USAGE: "not exposed by llama.cpp", fig.TTFT: "not exposed by llama.cpp"}


def test_every_name_in_the_map_is_in_the_real_metrics_text(server) -> None:
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    exposed = {line.split()[0].split("{")[0] for line in text.splitlines()
               if line and not line.startswith("#")}
    mapped = {name for names in (*MAP.names.values(), *MAP.sums.values()) for name in names}
    assert mapped <= exposed, mapped - exposed


def test_a_streamed_completion_ends_with_the_finish_reason_usage_and_timings(server) -> None:
    body = {"model": server.model_name, "prompt": "Please explain the server latency",
            "max_tokens": 12, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body,
                      timeout=60) as response:
        assert response.status_code == 200
        events = [line[5:].strip() for line in response.iter_lines()
                  if line.startswith("data:")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 12 and "timings" in last
    # the same prompt counts the same tokens under vLLM's tokenizer (the tiny model's)
    assert last["usage"]["prompt_tokens"] == 5


def test_the_client_times_it_with_the_servers_usage(server) -> None:
    from locustfiles.streaming import make_client, stream_request

    client = make_client(server.base_url)
    try:
        timing = stream_request(client, "/v1/completions", {
            "model": server.model_name, "prompt": "Hello world", "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
        chat = stream_request(client, "/v1/chat/completions", {
            "model": server.model_name, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}})
    finally:
        client.close()
    for answer in (timing, chat):
        assert answer.outcome == "ok", answer.error
        assert answer.finish_reason == "length"
        assert answer.usage["completion_tokens"] == MAX_TOKENS


def _run_study(study: dict, tmp_path: Path) -> tuple[Path, str]:
    """``swarmload study run`` of ``study`` (it must finish): its folder and its output."""
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump(study))
    done = swarmload("study", "run", str(study_file), "--results", str(tmp_path / "studies"),
                     timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (study_dir,) = (tmp_path / "studies").iterdir()
    return study_dir, done.stdout


def test_a_study_of_two_slot_counts_finds_the_queue(tmp_path: Path) -> None:
    study = {
        "name": "llama-slots",
        "configurations": [
            {"name": f"slots-{n}", "target": "llama-cpp", "args": [f"--parallel={n}",
                                                                   f"--ctx-size={n * 1024}"]}
            for n in (1, 4)],
        # 64 tokens: 20 ms of one slot on an idle machine, up to a second on a loaded one (16
        # took 5 ms: no scrape saw a queue)
        "workload": {"mix": "100/0/0", "max_tokens": 64},
        "load": {"kind": "concurrency", "steps": [1, 4]},
        "step_duration_s": 8, "warmup_s": 1, "cooldown_s": 0.5, "workers": 1,
        "slo": {"ttft_ms": 2000}, "refine": False,
    }
    from dashboards.analysis import study as sa

    study_dir, _ = _run_study(study, tmp_path)
    steps, _ = sa.load_rollup(study_dir)
    steps = steps[steps["bucket"] == "all"].set_index(["config", "offered_load"])
    assert steps["num_requests_running_mean"].notna().all()
    # one slot at concurrency 4: the others wait in llama-server's queue (requests_deferred)
    assert steps.loc[("slots-1", 4.0), "num_requests_waiting_mean"] > 1
    assert steps.loc[("slots-4", 4.0), "num_requests_waiting_mean"] < 0.5
    assert steps.loc[("slots-1", 4.0), "ttft_p50_s"] > steps.loc[("slots-4", 4.0), "ttft_p50_s"]



def test_a_fault_drill_kills_a_replica_and_the_other_carries_the_load(tmp_path: Path) -> None:
    """Two llama-server replicas, the client balancing round-robin; r0 killed at 6 s and
    restarted 6 s later (``--fault-plan``): both actions done at their second, the requests
    that failed are those sent to r0 while it was out (the fault report counts them all), and
    the service is back: every request of the last 5 s ok, r0 serving again."""
    from dashboards.analysis.faults import fault_report

    plan = tmp_path / "faults.yaml"
    plan.write_text("actions:\n  - {at_s: 6, action: kill, replica: r0, for_s: 6}\n")
    run_dir, _ = swarmload_run(
        tmp_path / "runs", "--target", "llama-cpp", "--replicas", "2",
        # a core each: two llama-servers of 2 threads on 2 cores spin at their barriers, and the
        # restarted one decoded at 149 ms a token (0.9-4.6 ms before), its probe queued 12 s
        "--target-arg=--parallel=2", "--target-arg=--threads=1", "--fault-plan", str(plan),
        "--workers", "1",
        "--users", "4", "--duration", "24", "--max-tokens", "64", timeout=300)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    replicas = manifest["target"]["replicas"]
    assert [r["launch"]["kind"] for r in replicas] == ["llama-cpp"] * 2
    actions = manifest["faults"]["actions"]
    assert [(a["action"], a["replica"], a["outcome"]) for a in actions] == [
        ("kill", "r0", "done"), ("restart", "r0", "done")]
    assert all(abs(a["late_s"]) < 0.5 for a in actions)
    killed_ns = actions[0]["wall_ns"]
    back_ns = actions[1]["wall_ns"] + actions[1]["took_s"] * 1e9
    records = load_requests(run_dir)
    failed = records[~records["outcome"].isin(["ok", "cancelled"])]
    assert len(failed) > 0 and (failed["replica"] == replicas[0]["url"]).all()
    # each was in flight at the kill (on a busy host a 64-token answer took over 5 s) or sent
    # while r0 was out
    ended_ns = failed["sent_wall_ns"] + failed["e2e_s"].fillna(0.0) * 1e9
    assert ((ended_ns >= killed_ns - 0.5e9) & (failed["sent_wall_ns"] <= back_ns + 2e9)).all(), (
        (failed["sent_wall_ns"] - killed_ns) / 1e9, failed["e2e_s"], (back_ns - killed_ns) / 1e9)
    report = fault_report(run_dir)
    assert report is not None
    (fault,) = report.faults.to_dict("records")
    # its own count; not its "recovered" (P95 TTFT back in the band before the fault), which a
    # load average of 11 on the 2 cores kept from settling in the 12 s left
    assert fault["failed"] == len(failed), fault
    last = records[records["sent_wall_ns"] > records["sent_wall_ns"].max() - 5e9]
    assert last["outcome"].isin(["ok", "cancelled"]).all(), last["outcome"].value_counts()
    assert replicas[0]["url"] in set(last["replica"])


def test_a_study_of_two_engines_gives_its_verdict_and_frontier(shared_vllm,
                                                                 tmp_path: Path) -> None:
    """vLLM (the suite's shared server, the tiny model) against llama-server (started by the
    study, the same model as GGUF) in one study: each configuration's server figures come from
    its own engine's /metrics (vLLM's KV-cache usage; none from llama.cpp, which has none), and
    the roll-up holds both capacities, the verdict between them and the frontier."""
    from dashboards.analysis import study as sa

    study = {
        "name": "two-engines",
        "configurations": [
            {"name": "vllm", "target": shared_vllm.base_url},
            {"name": "llama-cpp", "target": "llama-cpp",
             "args": ["--parallel=4", f"--ctx-size={4 * SLOT_CONTEXT}"]}],
        "workload": {"mix": "100/0/0", "max_tokens": MAX_TOKENS, "ignore_eos": True},
        "load": {"kind": "concurrency", "steps": [1, 4]},
        # 10 s: at a load average of 12, 6 s steps left one of vLLM's windows without a request
        "step_duration_s": 10, "warmup_s": 1, "cooldown_s": 0.5, "workers": 1,
        "slo": {"ttft_ms": 5000}, "refine": False,
    }
    study_dir, stdout = _run_study(study, tmp_path)
    assert "verdict" in stdout
    steps, capacity = sa.load_rollup(study_dir)
    steps = steps[steps["bucket"] == "all"].set_index("config")
    assert steps.loc["vllm", "kv_cache_usage_mean"].notna().all()
    assert steps.loc["llama-cpp", "kv_cache_usage_mean"].isna().all()
    assert steps["num_requests_running_mean"].notna().all()
    assert set(capacity["config"]) == {"vllm", "llama-cpp"}
    rollup = study_dir / "rollup"
    verdict = pd.read_parquet(rollup / "verdict.parquet")
    # the rows comparing two configurations (the others: one configuration's own efficiency)
    pairs = {frozenset((a, b)) for a, b in zip(verdict["config_a"], verdict["config_b"],
                                               strict=True) if a and b}
    assert pairs == {frozenset({"vllm", "llama-cpp"})}
    frontier = pd.read_parquet(rollup / "frontier.parquet")
    assert set(frontier["config"]) == {"vllm", "llama-cpp"}
    assert (frontier["per"] == "server").all()  # no GPU: output tok/s per server
    assert frontier.groupby("config")["tok_s"].max().gt(0).all()
