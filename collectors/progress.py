"""``progress.json``: how a run is going, rewritten every second by the master (or local runner).

A Locust plugin fed by the request recorder's stored batches (``recorder.batch_listeners``), so
it sees exactly the records that reach the run folder and costs a few list appends per record.
The file (atomic rewrite, readable any time) holds::

    {"wall_ns": ..., "first_sent_wall_ns": ..., "requests": N,
     "by_bucket": {"short": {"ok": n, "failed": n}, ...},
     "failed_by_outcome": {"http_5xx": n, ...},   # server-side failures
     "generator_outcomes": {"cancelled": n, ...}, # never reached / answered: not failures
     "window": {"seconds": 10, "completed": n, "req_per_s": x, "ttft_p95_s": x | null,
                "schedule_lag_p99_s": x | null, "read_delay_p99_s": x | null,
                "generator_dropped": n, "events_per_s": x}}

``events_per_s``: output tokens (streamed events) of the ok requests in the window per second,
what the workers had to time (``infra/workers_auto.py`` sizes them by it).

The window holds the requests that *finished* in the 10 s before the newest finish seen, so the
workers' batching (records arrive every few seconds) does not make the rate jump. ``swarmload
run`` draws its live panel from this file (``infra/progress_panel.py``); any other tool can too.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from pathlib import Path
from typing import Any

import gevent

from collectors.atomic import write_json_atomic
from collectors.percentiles import percentile
from collectors.schemas import GENERATOR_OUTCOMES, OUTCOME_DROPPED, OUTCOME_OK

PROGRESS_FILE = "progress.json"
WINDOW_S = 10.0


def _p(values: list[Any], q: float) -> float | None:
    """The one percentile definition (collectors.percentiles); None (JSON null) for none."""
    return percentile([v for v in values if v is not None], q, empty=None)


class ProgressTracker:
    def __init__(self, run_dir: str | os.PathLike[str], window_s: float = WINDOW_S) -> None:
        self.path = Path(run_dir) / PROGRESS_FILE
        self.window_s = window_s
        self.requests = 0
        self.by_bucket: dict[str, dict[str, int]] = {}
        self.failed_by_outcome: dict[str, int] = {}
        self.generator: dict[str, int] = {}  # dropped / worker_lost / cancelled
        self.first_sent_wall_ns: int | None = None
        # (finished wall ns, ok, ttft, lag, read delay, dropped over the cap, output tokens if
        # ok) of recent requests
        self.recent: deque[tuple[int, bool, Any, Any, Any, bool, int]] = deque()
        self._greenlet: gevent.Greenlet | None = None

    def on_records(self, columns: dict[str, list[Any]]) -> None:
        outcomes = columns["outcome"]
        tokens = columns.get("output_tokens") or [None] * len(outcomes)
        self.requests += len(outcomes)
        for i, outcome in enumerate(outcomes):
            bucket = columns["bucket"][i] or "all"
            counts = self.by_bucket.setdefault(bucket, {"ok": 0, "failed": 0})
            ok = outcome == OUTCOME_OK
            if outcome in GENERATOR_OUTCOMES:  # never reached the server: not its failure
                self.generator[outcome] = self.generator.get(outcome, 0) + 1
            elif ok:
                counts["ok"] += 1
            else:
                counts["failed"] += 1
                self.failed_by_outcome[outcome] = self.failed_by_outcome.get(outcome, 0) + 1
            sent = columns["sent_wall_ns"][i]
            if sent and (self.first_sent_wall_ns is None or sent < self.first_sent_wall_ns):
                self.first_sent_wall_ns = sent
            e2e = columns["e2e_s"][i]
            finished = int(sent + (e2e or 0.0) * 1e9) if sent else time.time_ns()
            self.recent.append((finished, ok, columns["ttft_s"][i], columns["schedule_lag_s"][i],
                                columns["read_delay_s"][i], outcome == OUTCOME_DROPPED,
                                (tokens[i] or 0) if ok else 0))

    def snapshot(self) -> dict[str, Any]:
        newest = max((r[0] for r in self.recent), default=0)
        start = newest - int(self.window_s * 1e9)
        while self.recent and self.recent[0][0] < start - int(60e9):
            self.recent.popleft()  # finishes arrive out of order: keep a margin, then drop
        window = [r for r in self.recent if r[0] > start]
        span_s = self.window_s
        if self.first_sent_wall_ns is not None and newest:
            span_s = min(self.window_s, max((newest - self.first_sent_wall_ns) / 1e9, 1e-3))
        return {
            "wall_ns": time.time_ns(), "first_sent_wall_ns": self.first_sent_wall_ns,
            "requests": self.requests, "by_bucket": self.by_bucket,
            "failed_by_outcome": self.failed_by_outcome, "generator_outcomes": self.generator,
            "window": {
                "seconds": self.window_s, "completed": len(window),
                "req_per_s": len(window) / span_s if window else 0.0,
                "ttft_p95_s": _p([r[2] for r in window if r[1]], 95),
                "schedule_lag_p99_s": _p([r[3] for r in window], 99),
                "read_delay_p99_s": _p([r[4] for r in window], 99),
                "generator_dropped": sum(1 for r in window if r[5]),
                "events_per_s": sum(r[6] for r in window) / span_s if window else 0.0,
            },
        }

    def write(self) -> None:
        write_json_atomic(self.path, self.snapshot(), indent=None)

    def _loop(self, interval_s: float) -> None:
        while True:
            gevent.sleep(interval_s)
            # a full disk must not stop the run; the records say everything anyway
            with contextlib.suppress(OSError):
                self.write()

    def start(self, interval_s: float = 1.0) -> None:
        if self._greenlet is None:
            self._greenlet = gevent.spawn(self._loop, interval_s)

    def stop(self, **_kwargs: Any) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None
        try:
            self.write()
        except OSError:
            pass


def register(environment: Any, recorder: Any, run_dir: str | None) -> ProgressTracker | None:
    """On the master or local runner: track ``recorder``'s stored batches into ``run_dir``."""
    if not run_dir:
        return None
    tracker = ProgressTracker(run_dir)
    recorder.batch_listeners.append(tracker.on_records)
    environment.events.test_start.add_listener(lambda **_kw: tracker.start())
    environment.events.quit.add_listener(tracker.stop)
    return tracker
