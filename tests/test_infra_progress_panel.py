"""Live progress: the master's progress.json and the orchestrator's panel / plain lines."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from collectors.progress import PROGRESS_FILE, ProgressTracker
from infra.progress_panel import RunProgress


def _columns(n: int, outcome: str = "ok", lag: float | None = None) -> dict[str, list]:
    now = time.time_ns()
    return {"outcome": [outcome] * n, "bucket": ["short"] * n,
            "sent_wall_ns": [now - int(1e9) + i * 1000 for i in range(n)],
            "e2e_s": [0.5] * n, "ttft_s": [0.01 * (i + 1) for i in range(n)],
            "schedule_lag_s": [lag] * n, "read_delay_s": [None] * n,
            "output_tokens": [64] * n}


def test_tracker_counts_and_window(tmp_path: Path) -> None:
    tracker = ProgressTracker(tmp_path)
    tracker.on_records(_columns(20))
    tracker.on_records(_columns(2, outcome="http_5xx"))
    tracker.write()
    state = json.loads((tmp_path / PROGRESS_FILE).read_text())
    assert state["requests"] == 22
    assert state["by_bucket"]["short"] == {"ok": 20, "failed": 2}
    assert state["failed_by_outcome"] == {"http_5xx": 2}
    window = state["window"]
    # ok requests only; the one percentile (collectors.percentiles: linear interpolation)
    assert window["completed"] == 22 and window["ttft_p95_s"] == pytest.approx(0.1905)


def test_plain_lines_and_warnings_once(tmp_path: Path) -> None:
    tracker = ProgressTracker(tmp_path)
    tracker.on_records(_columns(10, lag=0.25))  # open-loop requests sent 250 ms late
    tracker.write()
    out = io.StringIO()
    with RunProgress(tmp_path, 30, title="run x", mode="plain", plain_every_s=0,
                     stream=out) as view:
        view.tick()
        view.tick()
    text = out.getvalue()
    assert text.count("WARNING FELL BEHIND: P99 schedule lag 250 ms") == 1, text
    # P95 of 10..100 ms by linear interpolation, the one percentile definition
    assert "run x:" in text and "ok 10, failed 0" in text and "P95 TTFT 95 ms" in text


def test_rich_panel_shows_counts_rate_and_warnings(tmp_path: Path) -> None:
    tracker = ProgressTracker(tmp_path)
    tracker.on_records(_columns(10, lag=0.25))
    tracker.on_records(_columns(1, outcome="stream_cut"))
    tracker.write()
    out = io.StringIO()
    with RunProgress(tmp_path, 30, title="run y", mode="rich", stream=out) as view:
        view.tick()
    text = out.getvalue()
    for part in ("run y", "elapsed", "remaining", "short", "req/s", "P95 TTFT",
                 "failures: stream_cut 1", "FELL BEHIND"):
        assert part in text, (part, text)


def test_a_load_past_its_workers_budget_is_warned_about_before_its_figures_bend(
        tmp_path: Path) -> None:
    tracker = ProgressTracker(tmp_path)
    tracker.on_records(_columns(100))  # 6,400 output tokens, finished over the first 0.5 s
    tracker.write()
    window = json.loads((tmp_path / PROGRESS_FILE).read_text())["window"]
    assert window["events_per_s"] == pytest.approx(12_800, rel=0.01)
    out = io.StringIO()
    with RunProgress(tmp_path, 30, title="run z", mode="plain", stream=out,
                     events_budget_per_s=4000) as view:
        view.tick()
    assert "WARNING OUTGROWING ITS WORKERS: 12,7" in out.getvalue()
    assert "streamed events/s > the workers' budget of 4,000" in out.getvalue()
    out = io.StringIO()
    with RunProgress(tmp_path, 30, title="run z", mode="plain", stream=out,
                     events_budget_per_s=16_000) as view:
        view.tick()
    assert "OUTGROWING" not in out.getvalue()
