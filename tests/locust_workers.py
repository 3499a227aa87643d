"""Finding a run's Locust worker process, for tests that kill one mid-run."""

from __future__ import annotations

import contextlib
import subprocess
import time

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
