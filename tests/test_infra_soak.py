"""`swarmload soak` end to end on the simulator, sped up: bounded structures and drift verdicts,
and kill -9 then --resume with no request lost or duplicated by id."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from collectors.run_folder import load_requests
from dashboards.analysis.soak import load_windows

REPO_ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("soak-workload")
    log = folder / "log.csv"
    rows = [f"{16 + (i * 37) % 120},{16 + (i * 11) % 24}" for i in range(400)]
    log.write_text("prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    out = folder / "wl"
    subprocess.run(
        [sys.executable, "-m", "infra.cli", "workload", "build", "--source", f"generic:{log}",
         "--map", "prompt_tokens=prompt_tokens,output_tokens=output_tokens", "--n", "400",
         "--mix", "native", "--tokenizer", "words", "--out", str(out),
         "--arrivals", "poisson:rate_rps=40", "--quiet"],
        cwd=REPO_ROOT, check=True, timeout=120)
    return out


def _soak(*args: str) -> list[str]:
    return [sys.executable, "-m", "infra.cli", "soak", "--target", "sim", "--workers", "2",
            "--target-arg=--fixed-ttft-s=0.05", "--target-arg=--fixed-itl-s=0.004", *args]


def test_a_sped_up_soak_stays_bounded_and_flags_the_leak_and_the_creep(
        workload: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # leak 120 MB/min (7,200 MB/h) and TTFT +18,000 %/h (+5 %/s, strong enough to stand out
    # of a busy CI machine's noise): 50 s of 3 s windows
    proc = subprocess.run(
        _soak("--target-arg=--leak-mb-per-min=120", "--target-arg=--ttft-creep-pct-per-h=18000",
              "--workload", str(workload), "--duration", "50s", "--window", "3s",
              "--compact-every", "20s", "--stats-keep", "10s", "--sample-interval", "1",
              "--warmup", "9s", "--results", str(tmp_path), "--run-id", f"soak-ci-{os.getpid()}"),
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / f"soak-ci-{os.getpid()}"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    drift = {row["series"]: row for row in manifest["drift"]["series"]}

    # both injected drifts are found, with the leak's slope within 20% of the injected one
    assert {"server_rss_mb", "server_ttft_mean_s"} <= set(manifest["drift"]["drifting"]), (
        proc.stdout)
    assert drift["server_rss_mb"]["slope_per_h"] == pytest.approx(7200, rel=0.2)
    # the server's own TTFT: 0.05 s x 180 /h = 9 s/h (the client's is ~ the same, unless this
    # busy machine held the generator back in too many windows)
    assert drift["server_ttft_mean_s"]["slope_per_h"] == pytest.approx(9.0, rel=0.2)
    if "ttft_p50_s" in drift and drift["ttft_p50_s"]["left_out"] == 0:
        assert drift["ttft_p50_s"]["verdict"] == "drifts up"
    assert "drifting: " in proc.stdout and "server_rss_mb" in proc.stdout

    # bounded: files per table by compactions, not flushes; structures by what is in flight
    requests = load_requests(run_dir, ["request_id", "outcome"])
    assert len(list((run_dir / "requests").glob("*.parquet"))) <= 6  # vs ~40 flushed parts
    state = json.loads((run_dir / "soak_state.json").read_text())
    sizes = state["sizes"]
    assert sizes["acked"] < 200 and sizes["outstanding"] < 200, sizes
    assert sizes["schedule_buffered"] <= 1, sizes  # the schedule is drawn, not held
    assert sizes["locust_stats_per_second_entries"] < 16 * 30, sizes  # ~10 s kept per entry
    assert state["stats_trimmed"] > 0
    # the master handed its freed memory back (every 30 s), in milliseconds
    assert 0 < state["memory_release_ms"] < 200, state

    # windows were written during the run and hold every request exactly once
    windows = load_windows(run_dir)
    assert len(windows) >= 15
    assert int(windows["requests"].sum()) == len(requests) > 1500
    assert requests["request_id"].is_unique

    # the Soak page shows it: verdicts worst first, the charts drawn (no exception)
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SWARMLOAD_RESULTS", str(tmp_path))
    at = AppTest.from_file(str(REPO_ROOT / "dashboards/ui/soak_page.py"), default_timeout=60).run()
    assert not at.exception, at.exception
    table = next(m.value for m in at.markdown if m.value.startswith("| series"))
    assert "| server_rss_mb | drifts up |" in table
    # the charts: drawn on the server, shown as Markdown images (nothing to load in the browser)
    images = [m.value for m in at.markdown if m.value.startswith("![")]
    assert len(images) >= 4 and all("](data:image/png;base64," in i for i in images)


def test_kill_9_then_resume_loses_and_duplicates_no_request(workload: Path,
                                                             tmp_path: Path) -> None:
    args = _soak("--workload", str(workload), "--duration", "24s", "--window", "4s",
                 "--sample-interval", "1", "--warmup", "0s", "--results", str(tmp_path),
                 "--run-id", f"soak-crash-{os.getpid()}")
    first = subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    run_dir = tmp_path / f"soak-crash-{os.getpid()}"
    # killed once its second requests file is on disk: at five, a loaded 2-core CI machine
    # (files come late there) had run 70% of the schedule first, too little left to resume
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list((run_dir / "requests").glob("*.parquet"))
                                              if (run_dir / "requests").is_dir() else []) < 2:
        time.sleep(0.5)
    os.killpg(first.pid, signal.SIGKILL)  # the orchestrator and the simulator it started
    first.wait(10)
    before = load_requests(run_dir, ["request_id"])
    assert 0 < len(before)
    resumed = subprocess.run(
        [sys.executable, "-m", "infra.cli", "soak", "--resume", str(run_dir)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=200)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    requests = load_requests(run_dir, ["request_id", "outcome", "worker_id"])
    assert requests["request_id"].is_unique
    seqs = requests["request_id"].str.rsplit("#", n=1).str[1].astype(int)
    assert sorted(seqs) == list(range(int(seqs.max()) + 1))  # none lost, none twice
    assert int(seqs.max()) + 1 > 1.5 * len(before)  # the schedule went on after the crash
    segments = json.loads((run_dir / "manifest.json").read_text())["soak"]["segments"]
    assert [s["status"] for s in segments] == ["crashed", "finished"]
    assert segments[1]["gap_before_s"] > 0
    # the schedule goes on after every request the crashed run stored or had sent (journal)
    assert segments[1]["start_seq"] >= int(pd.Series(before["request_id"]).str.rsplit(
        "#", n=1).str[1].astype(int).max()) + 1
    windows = load_windows(run_dir)
    assert sorted(windows["segment"].unique()) == [0, 1]
    assert int(windows["requests"].sum()) == len(requests)
