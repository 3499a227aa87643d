"""The fault matrix: a real ``swarmload run`` (master + 2 workers) against the simulator giving
every outcome class in turn (``--fault-cycle``), checked against the simulator's own per-request
log: every request the server saw has exactly one record, and each record's outcome is the class
its fault must produce (or ``cancelled``, for the ones in flight when the run ended). Also after
Ctrl-C, and after a worker is killed with SIGKILL.

Short timeouts (first token 1 s, stall 0.5 s) keep the stalls, and so the test, short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pytest
from trace_data import AZURE_CONV

from collectors.run_folder import load_requests
from dashboards.analysis.runs import summarize_requests
from infra.targets.simulator.faults import FAULT_OUTCOMES

REPO_ROOT = Path(__file__).resolve().parent.parent
CYCLE = ",".join(FAULT_OUTCOMES)


def _argv(results: Path, log: Path, duration: str) -> list[str]:
    return [
        sys.executable, "-m", "infra.cli", "run", "--target", "sim",
        f"--target-arg=--fault-cycle={CYCLE}", f"--target-arg=--fault-log={log}",
        "--target-arg=--fault-stall-s=60", "--target-arg=--fixed-ttft-s=0.02",
        "--target-arg=--fixed-itl-s=0.005", "--workers", "2", "--users", "12",
        "--duration", duration, "--max-tokens", "8", "--mix", "100/0/0",
        "--first-token-timeout", "1", "--stall-timeout", "0.5", "--no-collectors",
        "--results", str(results),
    ]


def _server_log(path: Path) -> pd.DataFrame:
    return pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line])


def check_matrix(run_dir: Path, log: Path) -> dict[str, Any]:
    """Records against the server's log; returns the figures for the report."""
    records = load_requests(run_dir)
    server = _server_log(log)
    assert len(server) > 0
    assert server["request_id"].is_unique and records["http_request_id"].is_unique
    # every request the server saw has exactly one record
    missing = set(server["request_id"]) - set(records["http_request_id"])
    assert not missing, missing
    # and the only records of requests it never saw are of ones that may not have left the
    # client: cancelled before their answer's headers, or journalled by a worker killed as it
    # sent them (the kernel drops a killed process's unsent bytes)
    unseen = records[~records["http_request_id"].isin(server["request_id"])]
    before_headers = (unseen["outcome"] == "cancelled") & unseen["error"].str.contains(
        "before the answer's headers")
    assert (before_headers | (unseen["outcome"] == "worker_lost")).all(), unseen[
        ["outcome", "error"]]
    assert len(records) - len(unseen) == len(server)
    joined = server.merge(records, left_on="request_id", right_on="http_request_id")
    joined["expected"] = joined["fault"].map(FAULT_OUTCOMES)
    wrong = joined[(joined["outcome"] != joined["expected"])
                   & ~joined["outcome"].isin(["cancelled", "worker_lost"])]
    assert wrong.empty, wrong[["fault", "outcome", "error"]].to_string()
    per_class = {}
    for fault, expected in FAULT_OUTCOMES.items():
        rows = joined[joined["fault"] == fault]
        per_class[fault] = {
            "server": int(len(rows)), expected: int((rows["outcome"] == expected).sum()),
            "cancelled": int((rows["outcome"] == "cancelled").sum()),
            "worker_lost": int((rows["outcome"] == "worker_lost").sum())}
        assert len(rows) == sum(v for k, v in per_class[fault].items() if k != "server")
    # failed requests never enter the latency percentiles
    summary = summarize_requests(records)
    ok = records[records["outcome"] == "ok"]
    assert summary.loc["all", "ok"] == len(ok)
    assert summary.loc["all", "ttft_p99_s"] <= ok["ttft_s"].max()
    assert (records.loc[records["outcome"] == "http_429", "retry_after_s"] == 2).all()
    assert (records.loc[records["outcome"] == "malformed_event", "error"]
            .str.contains("oops").all())
    assert records["finish_reason"].notna().sum() >= len(ok)
    return {"server_saw": len(server), "records": len(records),
            "not_seen_by_server": unseen["outcome"].value_counts().to_dict(),
            "per_class": per_class}


def _report(name: str, figures: dict[str, Any]) -> None:
    # the figures, for docs/BENCHMARKS.md and the report (pytest -s shows them)
    print(f"\nfault matrix ({name}): {json.dumps(figures)}")


@pytest.mark.slow
def test_every_request_the_server_saw_has_one_record_of_its_class(tmp_path: Path) -> None:
    log = tmp_path / "faults.jsonl"
    proc = subprocess.run(_argv(tmp_path / "results", log, "8"), cwd=REPO_ROOT, text=True,
                          capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "results").iterdir()
    figures = check_matrix(run_dir, log)
    for fault, counts in figures["per_class"].items():
        assert counts[FAULT_OUTCOMES[fault]] > 0, (fault, counts)  # every class was seen
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    counted = load_requests(run_dir)["outcome"].value_counts().to_dict()
    assert manifest["requests"]["by_outcome"] == counted  # the manifest counts every class
    # the master waited for every worker's last report: nothing had to come from the journals
    assert manifest["recorder"]["reconciled"]["reconciled"] == 0
    assert "cancelled" in proc.stdout  # the summary says how many were cut off by the end
    _report("duration ended", figures)


def _start_and_wait_for_records(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, Path]:
    log = tmp_path / "faults.jsonl"
    proc = subprocess.Popen(
        _argv(tmp_path / "results", log, "120"), cwd=REPO_ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = list((tmp_path / "results").glob("*/requests/*.parquet"))
        if runs and log.exists() and len(log.read_text().splitlines()) > 60:
            return proc, runs[0].parent.parent, log
        time.sleep(0.3)
    proc.kill()
    raise AssertionError("no records appeared")


@pytest.mark.slow
def test_ctrl_c_leaves_no_request_without_a_record(tmp_path: Path) -> None:
    # Ctrl-C
    proc, run_dir, log = _start_and_wait_for_records(tmp_path / "ctrl-c")
    try:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, 130), out
    figures = check_matrix(run_dir, log)
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "interrupted"
    _report("Ctrl-C", figures)



@pytest.mark.slow
def test_a_killed_worker_leaves_no_request_without_a_record(tmp_path: Path) -> None:
    proc, run_dir, log = _start_and_wait_for_records(tmp_path)
    try:
        worker = next(p for p in psutil.Process(proc.pid).children(recursive=True)
                      if "--worker" in p.cmdline())
        worker.kill()
        time.sleep(3)  # the other worker goes on
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out  # a run with a crashed process failed
    figures = check_matrix(run_dir, log)
    lost = sum(counts["worker_lost"] for counts in figures["per_class"].values())
    assert lost > 0, figures
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "crashed", manifest["status"]
    (crash,) = manifest["crashes"]
    assert crash["process"].startswith("worker-") and crash["exit"] == "signal SIGKILL"
    assert any("CRASHED" in w and "SIGKILL" in w for w in manifest["warnings"]), manifest
    assert manifest["validity"]["verdict"] == "crashed"
    # the journal's reconciliation wrote every worker_lost record: those the server saw, and
    # those the dying worker journalled but never got onto the wire (not seen by the server)
    reconciled = manifest["recorder"]["reconciled"]
    unseen = figures["not_seen_by_server"]
    assert reconciled["reconciled"] == lost + unseen.get("worker_lost", 0) + unseen.get(
        "record_lost", 0), (reconciled, unseen)
    _report("worker SIGKILL", {**figures, "status": manifest["status"],
                               "crashes": manifest["crashes"], "warnings": manifest["warnings"]})




@pytest.mark.slow
def test_open_loop_requests_in_flight_at_the_end_get_their_records(tmp_path: Path) -> None:
    """Open-loop replay, stalls longer than the run: every scheduled request has one record, the
    stalled ones ``cancelled`` with how long they had waited."""
    workload = tmp_path / "workload"
    subprocess.run(
        [sys.executable, "-m", "infra.cli", "workload", "build", "--source",
         f"azure:{AZURE_CONV}", "--n", "60", "--tokenizer", "words", "--max-model-len", "4000",
         "--out", str(workload), "--arrivals", "trace:fit_window_s=6", "--quiet"],
        cwd=REPO_ROOT, check=True, timeout=120)
    log = tmp_path / "faults.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "infra.cli", "run", "--target", "sim",
         f"--target-arg=--fault-cycle={CYCLE}", f"--target-arg=--fault-log={log}",
         "--target-arg=--fault-stall-s=60", "--target-arg=--fixed-ttft-s=0.02",
         "--target-arg=--fixed-itl-s=0.005", "--workers", "2", "--workload", str(workload),
         "--duration", "6", "--drain", "2", "--first-token-timeout", "60",
         "--stall-timeout", "60", "--no-collectors", "--results", str(tmp_path / "results")],
        cwd=REPO_ROOT, text=True, capture_output=True, timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "results").iterdir()
    figures = check_matrix(run_dir, log)
    records = load_requests(run_dir)
    assert len(records) == 60 and records["request_id"].is_unique  # one per scheduled request
    stalls = figures["per_class"]["first_token_stall"], figures["per_class"]["mid_stream_stall"]
    assert all(s["cancelled"] == s["server"] > 0 for s in stalls), stalls  # all in flight
    cancelled = records[records["outcome"] == "cancelled"]
    assert (cancelled["e2e_s"] > 0.5).all()  # how long each had waited
    _report("open loop, stalls in flight at the end", figures)
