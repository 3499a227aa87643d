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
from infra.targets.simulator.settings import READY_LINE_PREFIX, SimulatorConfig

_READY_PATTERN = re.compile(re.escape(READY_LINE_PREFIX) + r"(https?://\S+)")
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


class SimulatorProcess:
    """One simulator subprocess on loopback that can be started again on the same port (a
    fault plan's ``restart``): :meth:`start` serves and returns the base URL, :meth:`stop`
    ends it. ``port`` 0 (default): a free port the first time, the same one after."""

    def __init__(self, config: SimulatorConfig | None = None, log_path: str | None = None,
                 **overrides: Any) -> None:
        base = config if config is not None else SimulatorConfig()
        self.config = dataclasses.replace(base, **{"port": 0, **overrides, "host": "127.0.0.1"})
        self.config.validate()
        self.log_path = log_path
        self.proc: procs.ManagedProcess | None = None
        self.base_url: str | None = None

    @property
    def argv(self) -> list[str]:
        return [sys.executable, "-m", "infra.targets.simulator", *self.config.to_argv()]

    def start(self) -> str:
        # Its own session (Ctrl-C reaches only the caller, which stops it in order) and it dies
        # with its parent (SIGTERM): a killed `swarmload run` leaves no simulator behind.
        self.proc = procs.start(self.argv, name="swarmload-sim", log_path=self.log_path,
                                append_log=True)
        try:
            self.base_url = _wait_until_ready(self.proc, STARTUP_TIMEOUT_S)
        except BaseException:
            self.proc.stop(STOP_TIMEOUT_S)
            raise
        if not self.config.port:  # a restart binds the same port (HAProxy knows it)
            port = int(self.base_url.rsplit(":", 1)[1])
            self.config = dataclasses.replace(self.config, port=port)
        return self.base_url

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(STOP_TIMEOUT_S)


@contextlib.contextmanager
def running_simulator(config: SimulatorConfig | None = None, **overrides: Any) -> Iterator[str]:
    """Run ``python -m infra.targets.simulator`` on a free loopback port; yield its base URL.

    ``overrides`` replace fields of ``config`` (or of the defaults). ``host`` is forced to
    127.0.0.1 and ``port`` to 0 (free port). The process is terminated (then killed) on exit.
    """
    server = SimulatorProcess(config, **{**overrides, "port": 0})
    try:
        yield server.start()
    finally:
        server.stop()
