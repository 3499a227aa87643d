"""`swarmload run` end to end on the simulator: real Locust master + worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow.dataset as ds
import pytest

from collectors.run_folder import load_requests
from dashboards.analysis.runs import summarize_requests

REPO_ROOT = Path(__file__).resolve().parent.parent


def _only_run(results: Path) -> Path:
    runs = [p for p in results.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


@pytest.mark.slow
def test_master_and_two_workers_record_every_request(tmp_path: Path, run_swarmload) -> None:
    proc = run_swarmload("run", "--target", "sim", "--workers", "2", "--users", "12",
                         "--duration", "12", "--results", str(tmp_path), "--max-tokens", "16")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    run_dir = _only_run(tmp_path)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    assert manifest["load"]["workers"] == 2 and manifest["load"]["users"] == 12
    assert manifest["gpu"]["available"] is False and manifest["gpu"]["reason"]
    assert manifest["started_at"] < manifest["ended_at"]

    table = ds.dataset(run_dir / "requests").to_table().to_pandas()
    workers = table["worker_id"].unique()
    assert len(workers) == 2, workers
    assert table["request_id"].is_unique
    assert (table["run_id"] == manifest["run_id"]).all()
    ok = table[table["outcome"] == "ok"]
    assert len(ok) > 100
    assert (ok["output_tokens"] == 16).all()  # ignore_eos: exactly max_tokens
    # recorder counted exactly what was written, per worker
    assert manifest["recorder"]["records_written"] == len(table)

    # the printed summary is computed from these records: its percentiles equal numpy's
    summary = summarize_requests(load_requests(run_dir))
    for column in ("ttft_s", "e2e_s", "tpot_s"):
        expected = np.percentile(ok[column].dropna().to_numpy(), [50, 95, 99])
        got = summary.loc["all", [f"{column[:-2]}_p50_s", f"{column[:-2]}_p95_s",
                                  f"{column[:-2]}_p99_s"]].to_numpy(dtype=float)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    itl = np.concatenate(ok["itl_s"].to_numpy()).astype(np.float64)
    assert summary.loc["all", "itl_p99_s"] == pytest.approx(np.percentile(itl, 99), abs=1e-9)
    assert "P95" in proc.stdout and "TTFT" in proc.stdout
    assert "swarmload dashboard" in proc.stdout


@pytest.mark.slow
@pytest.mark.alone  # medians within 2 ms: two loaded clean-clone runs put a test beside it over
def test_measured_ttft_and_itl_match_a_fixed_timing_server(tmp_path: Path,
                                                          run_swarmload) -> None:
    server_log = tmp_path / "server-requests.jsonl"
    proc = run_swarmload(
        "run", "--target", "sim", "--target-arg=--fixed-ttft-s=0.2",
        "--target-arg=--fixed-itl-s=0.02", f"--target-arg=--request-log={server_log}",
        "--workers", "1", "--users", "4", "--duration", "10",
        # short prompts only: parsing a 1,500-word prompt stalls the simulator's loop, and so the
        # other streams' token timers, by about a millisecond: the server's error, not ours
        "--max-tokens", "20", "--mix", "100/0/0", "--results", str(tmp_path / "results"),
        "--no-collectors",
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    ok = load_requests(_only_run(tmp_path / "results"))
    ok = ok[ok["outcome"] == "ok"]
    assert len(ok) >= 20
    # What the server did, request by request, on its own clock (its request log): the worker's
    # figures are compared with that, so a late wake-up of the server on a busy host, which
    # the worker measures correctly, is not counted as the worker's error.
    ends = [json.loads(line) for line in server_log.read_text().splitlines()]
    server = {end["request_id"]: end for end in ends if end["event"] == "end" and "e2e_s" in end}
    matched = [(row.ttft_s, np.asarray(row.itl_s, dtype=float), server[row.http_request_id])
               for row in ok.itertuples() if row.http_request_id in server]
    assert len(matched) == len(ok)  # every request the worker timed, the server served
    # the worker's TTFT starts before the server's (the request's bytes still in flight) and
    # ends after it (the first token's): never shorter, and within 2 ms at the median
    ttft_over = [ttft - end["ttft_s"] for ttft, _, end in matched]
    assert 0 <= float(np.median(ttft_over)) < 0.002, ttft_over
    # a request's mean gap between tokens, as the worker read them and as the server wrote them
    gap_over = [itl.mean() - (end["e2e_s"] - end["ttft_s"]) / (end["tokens"] - 1)
                for _, itl, end in matched]
    assert abs(float(np.median(gap_over))) < 0.002, gap_over
    itl_median = float(np.median(np.concatenate([itl for _, itl, _ in matched])))
    assert abs(itl_median - 0.020) < 0.002, itl_median
    # and the server kept its schedule: never early, and its precision on a quiet host is
    # test_infra_simulator's (this check only catches a schedule that is plainly wrong)
    server_ttft = float(np.median([end["ttft_s"] for _, _, end in matched]))
    assert 0.1995 < server_ttft < 0.215, server_ttft


@pytest.mark.slow
def test_ctrl_c_stops_every_process_and_keeps_records(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "run", "--target", "sim", "--workers", "2",
         "--users", "8", "--duration", "120", "--results", str(tmp_path)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # Ctrl-C as in a terminal: a suite started in the background (`make test &`) hands its
        # children an ignored SIGINT, and Python leaves an ignored SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        run_dir = None
        while time.monotonic() < deadline:  # wait until records are flowing
            runs = [p for p in tmp_path.iterdir() if p.is_dir()]
            if runs and list((runs[0] / "requests").glob("*.parquet")):
                run_dir = runs[0]
                break
            time.sleep(0.5)
        assert run_dir is not None, "no records appeared"
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 4  # simulator, collectors, master, 2 workers
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out  # interrupted (README "Exit codes"), summary printed
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left running: {alive}"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["ended_at"]
    table = ds.dataset(run_dir / "requests").to_table()
    assert table.num_rows > 0
    # records the master stored, plus any written afterwards from the workers' send journals
    # (a worker's last report can arrive after an interrupted master has stopped)
    reconciled = manifest["recorder"]["reconciled"]["reconciled"]
    assert manifest["recorder"]["records_written"] + reconciled == table.num_rows


@pytest.mark.slow
def test_server_faults_are_classified_and_kept_out_of_latency(tmp_path: Path,
                                                              run_swarmload) -> None:
    proc = run_swarmload(
        "run", "--target", "sim", "--target-arg=--error-rate=0.2", "--target-arg=--cut-rate=0.2",
        "--workers", "2", "--users", "8", "--duration", "8", "--max-tokens", "12",
        "--results", str(tmp_path), "--no-collectors",
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    records = load_requests(_only_run(tmp_path))
    outcomes = records["outcome"].value_counts()
    assert outcomes.get("http_5xx", 0) > 0 and outcomes.get("stream_cut", 0) > 0, outcomes
    # cancelled: in flight when the duration ended
    assert set(outcomes.index) <= {"ok", "http_5xx", "stream_cut", "cancelled"}
    assert (records.loc[records["outcome"] == "http_5xx", "http_status"] == 500).all()
    summary = summarize_requests(records)
    failed = int((~records["outcome"].isin(["ok", "cancelled"])).sum())
    assert summary.loc["all", "errors"] == failed
    assert summary.loc["all", "cancelled"] == outcomes.get("cancelled", 0)
    attempts = len(records) - outcomes.get("cancelled", 0)
    assert summary.loc["all", "error_rate"] == pytest.approx(failed / attempts)
    ok = records[records["outcome"] == "ok"]
    assert summary.loc["all", "e2e_p50_s"] == pytest.approx(np.percentile(ok["e2e_s"], 50))
    assert "http_5xx" in proc.stdout and "stream_cut" in proc.stdout
