"""``--workers auto``: as many workers as the load's streamed events need, no more than the cores.

A worker (one gevent process, one core at most) times its streams exactly while it reads each
event before the next one lands; past its budget of streamed events per second it starts to
read several at once, and their times become the later one's
(``collectors.itl_gaps.merged_reads``). :data:`WORKER_EVENTS_PER_S` is that budget,
measured with the accuracy bench on a 2-core machine shared with other jobs
(docs/results/generator-check/): one worker held its TTFT error under 0.13 ms at P99 up to
2,160 events/s, and not at 3,000 (47 ms). A host of its own does more (the GPU host's cores:
past 11,000 events/s per worker, docs/BENCHMARKS.md), so the budget errs on the safe side.

The load's events per second: an open-loop plan's busiest :data:`PEAK_WINDOW_S` seconds of
arrivals x the workload's mean output tokens (exact: every token is one event); closed-loop
users (or a closed plan's sessions) x :data:`STREAM_TOKENS_PER_S`, a fast server's pace, since
the server's own is not known before the run. The count is capped by the host's cores (one a
worker; with ``--pin-workers``, one kept for the rest). :func:`size_workers` says how it chose
in one line; the run's live view warns once the events per worker outgrow the budget
(``infra/progress_panel.py``).
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from locustfiles.config import AUTO_WORKERS, RunConfig
from workloads.arrivals import load_plan, schedule
from workloads.schema import PLAN_FILE, read_workload

WORKER_EVENTS_PER_S = 2_000.0  # streamed events per second one worker times exactly (above)
STREAM_TOKENS_PER_S = 100.0  # closed loop: tokens per second per stream assumed (10 ms ITL)
PEAK_WINDOW_S = 5.0  # an open-loop plan is sized for its busiest window this long


def expected_events(config: RunConfig) -> tuple[float, str]:
    """(streamed events per second the run's load asks for, how that was reckoned)."""
    folder = Path(config.workload) if config.workload else None
    plan_path = Path(config.plan) if config.plan else (folder / PLAN_FILE if folder else None)
    if folder is not None and plan_path is not None and plan_path.is_file():
        plan = load_plan(plan_path)
        if plan.kind == "closed":
            k = int(getattr(plan, "concurrency", 1))
            return k * STREAM_TOKENS_PER_S, (f"{k} sessions at a time x "
                                             f"{STREAM_TOKENS_PER_S:g} tok/s per stream")
        frame = read_workload(folder)
        arrivals = schedule(plan, frame, config.duration, config.seed)
        if not len(arrivals):
            return 0.0, "an empty schedule"
        offsets = arrivals["offset_s"].to_numpy(dtype=np.float64)
        tokens = frame["output_tokens"].to_numpy(dtype=np.float64)[
            arrivals["request_index"].to_numpy()]
        window = min(PEAK_WINDOW_S, max(float(offsets.max()), 1.0))
        edges = np.arange(0.0, float(offsets.max()) + window, window)
        counts, _ = np.histogram(offsets, bins=edges) if edges.size > 1 else (
            np.array([offsets.size]), None)
        peak = float(counts.max()) / window
        mean = float(np.nanmean(tokens)) if tokens.size else 0.0
        return peak * mean, (f"peak {peak:,.1f} req/s over {window:g} s x {mean:,.0f} output "
                             "tokens")
    return config.users * STREAM_TOKENS_PER_S, (
        f"{config.users} users x {STREAM_TOKENS_PER_S:g} tok/s per stream")


def size_workers(config: RunConfig, cores: int | None = None) -> tuple[RunConfig, str]:
    """``config`` with ``--workers auto`` resolved, and the one line that says how (``""``
    when the count was given)."""
    if config.workers != AUTO_WORKERS:
        return config, ""
    cores = cores or os.cpu_count() or 1
    room = max(1, cores - 1) if config.pin_workers else cores
    events, how = expected_events(config)
    need = max(1, math.ceil(events / WORKER_EVENTS_PER_S))
    workers = min(need, room)
    capped = (f"; capped at {room} by the host's {cores} cores: {events / workers:,.0f} events/s "
              "a worker, past its budget, so expect the run to warn") if need > room else ""
    line = (f"--workers auto: {workers} ({how} = {events:,.0f} events/s; one worker times "
            f"{WORKER_EVENTS_PER_S:,.0f} events/s exactly{capped})")
    return replace(config, workers=workers), line
