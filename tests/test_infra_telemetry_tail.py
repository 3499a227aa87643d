"""The telemetry tail of ``swarmload run``: after the load the collectors sample on until the
server is seen settled, then the run ends; it does not sit out ``--telemetry-tail``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from collectors.run_folder import load_host, load_requests, load_server_metrics
from collectors.server_figures import RUNNING, WAITING, aliases

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_the_tail_ends_once_a_sample_after_the_load_shows_the_server_settled(
        tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "run", "--target", "sim", "--workers", "1",
         "--users", "4", "--duration", "2", "--max-tokens", "8", "--telemetry-tail", "60",
         "--results", str(tmp_path), "--run-id", "tail"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "tail"
    report = json.loads((run_dir / f"telemetry-{socket.gethostname()}.json").read_text())
    assert report["stopped_by"] == "settled"  # by itself, not the run's SIGTERM after 60 s
    requests = load_requests(run_dir)
    assert len(requests) > 5
    last_answer_ns = int((requests["sent_wall_ns"] + requests["e2e_s"] * 1e9).max())
    metrics = load_server_metrics(run_dir)
    busy = metrics[metrics["sample"].isin([*aliases(RUNNING), *aliases(WAITING)])]
    per_scrape = busy.groupby("wall_ns")["value"].sum()
    assert per_scrape.max() > 0  # the load was seen
    # the last scrape came after the last answer and shows the server with nothing to do
    assert per_scrape.index[-1] > last_answer_ns and per_scrape.iloc[-1] == 0
    assert load_host(run_dir)["wall_ns"].max() > last_answer_ns
