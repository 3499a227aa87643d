"""Start and stop the benchmark's helper processes (lean target) as real subprocesses."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator

from infra import procs
from infra.tools.bench.target import READY_PREFIX

_READY = re.compile(re.escape(READY_PREFIX) + r"(http://\S+)")


class BenchError(RuntimeError):
    """A benchmark step could not run; the message says what failed and where its log is."""


@contextlib.contextmanager
def running_lean_target(base_url: str | None = None, *, ttft_s: float = 0.0,
                        itl_s: float = 0.0, cpu: int | None = None,
                        processes: int = 1, truth_dir: str | None = None) -> Iterator[str]:
    """Yield the URL of a lean target (``infra.tools.bench.target``) started for the block, or
    ``base_url`` unchanged when one is given. ``cpu`` pins it to one core (``taskset``)."""
    if base_url:
        yield base_url.rstrip("/")
        return
    port = 0
    if processes > 1:
        from infra.ports import free_port

        port = free_port()
    argv = [sys.executable, "-m", "infra.tools.bench.target", "--port", str(port),
            "--ttft-s", str(ttft_s), "--itl-s", str(itl_s), "--processes", str(processes),
            *(["--truth-dir", truth_dir] if truth_dir else [])]
    if cpu is not None:
        argv = ["taskset", "-c", str(cpu), *argv]
    proc = procs.start(argv, name="bench-target")
    try:
        try:
            url = proc.wait_ready(log_pattern=_READY, timeout_s=20)
        except procs.ProcessStartError as exc:
            raise BenchError(f"lean target did not start: {exc}") from None
        assert url is not None
        yield url
    finally:
        proc.stop(20.0)
