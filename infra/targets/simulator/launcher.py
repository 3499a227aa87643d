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
import os
import re
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from infra.targets.simulator.config import SimulatorConfig

_READY_PATTERN = re.compile(r"swarmload-sim listening on (https?://\S+)")
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0


class SimulatorStartError(RuntimeError):
    """The simulator subprocess exited or did not become healthy in time; carries its output."""


def _tail(path: str, limit: int = 4000) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()[-limit:]


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


def _wait_until_ready(proc: subprocess.Popen[bytes], log_path: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    base_url: str | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SimulatorStartError(
                f"simulator exited with {proc.returncode} during start-up:\n{_tail(log_path)}"
            )
        if base_url is None:
            match = _READY_PATTERN.search(_tail(log_path))
            if match:
                base_url = match.group(1)
        if base_url is not None and _healthy(base_url):
            return base_url
        time.sleep(0.05)
    raise SimulatorStartError(
        f"simulator not healthy after {timeout_s:.0f} s:\n{_tail(log_path)}"
    )


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
    log = tempfile.NamedTemporaryFile(prefix="swarmload-sim-", suffix=".log", delete=False)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env)
    try:
        yield _wait_until_ready(proc, log.name, STARTUP_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)
        log.close()
        with contextlib.suppress(OSError):
            os.unlink(log.name)
