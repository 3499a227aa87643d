"""Timing checks on a shared host: a measurement retried, never a tolerance widened.

A timer on a busy host only ever fires late, and a test beside this one can take the CPU for
several milliseconds at the wrong moment. A check of a few milliseconds is therefore tried up to
``ATTEMPTS`` times with the same tolerances: an error in what is timed (a wrong deadline, drift, a
missing token) fails every attempt, while the host's stall fails one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

ATTEMPTS = 3
# a neighbour's burst (a browser starting, a wheel building) lasts seconds: the next attempt
# waits this long, so the attempts do not all fall into the same one
PAUSE_BETWEEN_ATTEMPTS_S = 2.0


def cpu_pressure() -> str:
    """Linux PSI line for CPU ("some avg10=..."): how long runnable tasks waited for a CPU."""
    try:
        with open("/proc/pressure/cpu") as handle:
            return handle.readline().strip()
    except OSError:
        return "unknown"


def first_passing(measure: Callable[[], T], check: Callable[[T], None],
                  attempts: int = ATTEMPTS) -> T:
    """``measure()`` then ``check(measured)`` until a check passes (at most ``attempts`` times);
    the measurement it passed on. Every attempt's failure, with the CPU pressure then, is in the
    error when none passes."""
    failures = []
    for attempt in range(1, attempts + 1):
        measured = measure()
        try:
            check(measured)
        except AssertionError as exc:
            failures.append(f"attempt {attempt}: {exc} (CPU pressure: {cpu_pressure()})")
            if attempt < attempts:
                time.sleep(PAUSE_BETWEEN_ATTEMPTS_S)
            continue
        return measured
    raise AssertionError("\n".join(failures))
