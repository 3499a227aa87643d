"""Start the simulator as a real subprocess for tests and local runs: :func:`running_simulator`.

Usage::

    with running_simulator(max_num_seqs=4, decode_base_s=0.05) as base_url:
        httpx.post(f"{base_url}/v1/completions", json={...})

The child is ``python -m infra.targets.simulator ... --port 0``; it binds a free loopback port
itself and prints it (no race between picking a port and binding it). Its output goes to a
temporary file whose tail is quoted if start-up fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from infra import procs
from infra.targets.simulator.config import SimulatorConfig

_READY_PATTERN = re.compile(r"swarmload-sim listening on (https?://\S+)")
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0


class SimulatorStartError(RuntimeError):
    """The simulator subprocess exited or did not become healthy in time; carries its output."""


def _healthy(base_url: str) -> bool:
    # The launcher's own readiness probe of the process it just started: its certificate may be
    # one a test made, so the probe does not verify it (a run always does).
    context = ssl._create_unverified_context() if base_url.startswith("https") else None
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=1.0,
                                    context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _wait_until_ready(proc: procs.ManagedProcess, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    try:
        base_url = proc.wait_ready(log_pattern=_READY_PATTERN, timeout_s=timeout_s)
    except procs.ProcessStartError as exc:
        raise SimulatorStartError(str(exc)) from None
    assert base_url is not None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SimulatorStartError(
                f"simulator exited ({procs.describe_exit(proc.returncode)}) during start-up:\n"
                f"{proc.log_tail()}")
        if _healthy(base_url):
            return base_url
        time.sleep(0.05)
    raise SimulatorStartError(f"simulator not healthy after {timeout_s:.0f} s:\n"
                              f"{proc.log_tail()}")


@contextlib.contextmanager
def running_simulator(config: SimulatorConfig | None = None, **overrides: Any) -> Iterator[str]:
    """Run ``python -m infra.targets.simulator`` on a free loopback port; yield its base URL.

    ``overrides`` replace fields of ``config`` (or of the defaults). ``host`` is forced to
    127.0.0.1 and ``port`` to 0 (free port). The process is terminated (then killed) on exit.
    """
    base = config if config is not None else SimulatorConfig()
    effective = dataclasses.replace(base, **{**overrides, "host": "127.0.0.1", "port": 0})
    effective.validate()
    argv = [sys.executable, "-m", "infra.targets.simulator", *effective.to_argv()]
    # Its own session (Ctrl-C reaches only the caller, which stops it in order) and it dies with
    # its parent (SIGTERM): a killed `swarmload run` leaves no simulator behind.
    proc = procs.start(argv, name="swarmload-sim")
    try:
        yield _wait_until_ready(proc, STARTUP_TIMEOUT_S)
    finally:
        proc.stop(STOP_TIMEOUT_S)
