"""Open-loop replay of a real trace across a real master and two workers (simulator target)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from locust_workers import wait_for_schedule_start, wait_for_worker
from trace_data import AZURE_CONV

from collectors.run_folder import load_requests

REPO_ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def azure_workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("workload")
    subprocess.run(
        [sys.executable, "-m", "infra.cli", "workload", "build", "--source",
         f"azure:{AZURE_CONV}", "--n", "240", "--tokenizer", "words", "--max-model-len", "4000",
         "--out", str(out), "--arrivals", "trace:fit_window_s=20", "--quiet"],
        cwd=REPO_ROOT, check=True, timeout=120,
    )
    return out


def _start_run(workload: Path, results: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "run", "--target", "sim", "--workers", "2",
         "--workload", str(workload), "--duration", "20", "--drain", "30",
         "--results", str(results), "--no-collectors"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _run_dir(results: Path) -> Path:
    (run,) = [p for p in results.iterdir() if p.is_dir()]
    return run


def _scheduled(run_dir: Path) -> int:
    events = json.loads((run_dir / "replay_events.json").read_text())
    return next(e["requests"] for e in events if e["event"] == "schedule_start")


def test_every_scheduled_request_is_sent_once_in_the_target_mix(azure_workload: Path,
                                                                 tmp_path: Path) -> None:
    proc = _start_run(azure_workload, tmp_path)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    run_dir = _run_dir(tmp_path)
    records = load_requests(run_dir)
    assert _scheduled(run_dir) == 240
    assert len(records) == 240 and records["request_id"].is_unique
    assert set(records["outcome"]) == {"ok"}
    assert records["worker_id"].nunique() == 2
    # every record carries its schedule: lag and queued TTFT per METRICS.md
    assert records["scheduled_wall_ns"].notna().all()
    lag = records["schedule_lag_s"].to_numpy()
    assert np.all(lag > -0.001)
    assert np.all(records["queued_ttft_s"] >= records["ttft_s"] - 1e-9)
    shares = records["bucket"].value_counts(normalize=True)
    for bucket, target in {"short": 0.45, "medium": 0.40, "long": 0.15}.items():
        assert abs(shares[bucket] - target) <= 0.02, shares
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["load"]["kind"] == "trace" and manifest["load"]["users"] == 0


def test_a_killed_worker_loses_nothing_silently(azure_workload: Path, tmp_path: Path) -> None:
    proc = _start_run(azure_workload, tmp_path)
    try:
        worker = wait_for_worker(proc)
        assert worker is not None
        assert wait_for_schedule_start(proc, tmp_path), "the schedule never started"
        time.sleep(5)  # mid-run: a few seconds into the 20 s schedule
        os.kill(worker.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out  # a process of the run died: the run crashed
    run_dir = _run_dir(tmp_path)
    records = load_requests(run_dir)
    # one record per scheduled request: sent once by someone, or counted as lost
    assert len(records) == _scheduled(run_dir) == 240
    assert records["request_id"].is_unique
    assert set(records["outcome"]) <= {"ok", "worker_lost"}
    events = json.loads((run_dir / "replay_events.json").read_text())
    left = [e for e in events if e["event"] == "worker_left"]
    assert len(left) == 1 and left[0]["wall_ns"] > 0
    assert left[0]["released"] > 0  # the rest of its schedule went to the other worker
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert any(e["event"] == "worker_left" for e in manifest["replay_events"])
    assert manifest["status"] == "crashed"
    assert [c["process"][:7] for c in manifest["crashes"]] == ["worker-"]


def test_a_burst_plan_is_sent_at_its_planned_per_second_rates(azure_workload: Path,
                                                               tmp_path: Path) -> None:
    plan = tmp_path / "bursts.yaml"
    plan.write_text("kind: bursts\nbase_rps: 2\nmultiplier: 10\nspike_s: 4\nperiod_s: 30\n"
                    "first_spike_s: 5\nspacing: even\n")
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "infra.cli", "run", "--target", "sim", "--workers", "2",
         "--workload", str(azure_workload), "--plan", str(plan), "--duration", "12",
         "--drain", "30", "--results", str(results), "--no-collectors"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = _run_dir(results)
    events = json.loads((run_dir / "replay_events.json").read_text())
    t0 = next(e["t0_wall_ns"] for e in events if e["event"] == "schedule_start")
    records = load_requests(run_dir)
    assert set(records["outcome"]) == {"ok"}
    sent_s = (records["sent_wall_ns"].to_numpy() - t0) / 1e9
    per_second = np.bincount(np.floor(sent_s).astype(int), minlength=12)[:12]
    planned = np.array([20 if 5 <= s < 9 else 2 for s in range(12)])
    assert len(records) == planned.sum()
    # each second's measured sends match the plan (a send may cross a boundary by its lag)
    assert np.abs(per_second - planned).max() <= 1, per_second
