"""The headless Locust master's wait for its workers, cut to what it waits for.

A headless master looks for its ``--expect-workers`` once a second (``locust.main``): workers
that become ready 50 ms after its first look wait 950 ms, in every run, every study step and
every test run. :func:`wait_for_workers`, called at the end of the master's ``init``, looks every
:data:`POLL_S` instead, for at most :data:`FIRST_LOOK_S`; Locust's own loop then finds them ready
at its first look, and goes on as before when some are still missing (its messages,
``--expect-workers-max-wait``). The wait at the other end, for the workers' last reports, is the
recorder's (``collectors.request_recorder.RequestRecorder.quit_after_final_reports``).
"""

from __future__ import annotations

import time
from typing import Any

import gevent

POLL_S = 0.01
FIRST_LOOK_S = 5.0  # Locust's own loop starts logging "Waiting for workers" after 5 s


def wait_for_workers(runner: Any, expected: int, max_wait_s: float = 0.0) -> float:
    """Yield to the master's loop until ``expected`` workers are ready, at most
    :data:`FIRST_LOOK_S` (or ``max_wait_s`` when smaller and set). Returns the seconds waited."""
    start = time.monotonic()
    limit = min(FIRST_LOOK_S, max_wait_s) if max_wait_s > 0 else FIRST_LOOK_S
    while len(runner.clients.ready) < expected and time.monotonic() - start < limit:
        gevent.sleep(POLL_S)
    return time.monotonic() - start
