"""Finding a run's Locust worker process, and the moment its schedule starts, for tests that kill
one mid-run."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import psutil


def wait_for_worker(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> psutil.Process | None:
    """A Locust worker among the children of ``proc`` (the orchestrator), once one runs.

    Matched by its own argument list: a child caught between fork and exec still has the
    orchestrator's command line, whose "--workers 2" holds "--worker" as text (a loaded CI
    machine once killed the simulator so).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                argv = child.cmdline()
                if "--worker" in argv and "locust" in argv:
                    return child
        time.sleep(0.2)
    return None


def wait_for_schedule_start(proc: subprocess.Popen[str], results: Path,
                            timeout_s: float = 120.0) -> bool:
    """True once the run's master has started its schedule (it writes ``replay_events.json``
    into the run folder under ``results`` then); False if ``proc`` ended or time ran out first.

    A kill timed from the worker's start instead (seconds after its process appeared) can land
    before both workers are ready on a loaded machine: the master then waits for the missing
    worker, gives up, and the run never starts its schedule."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if any(results.glob("*/replay_events.json")):
            return True
        time.sleep(0.1)
    return False
