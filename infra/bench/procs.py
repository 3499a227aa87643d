"""Start and stop the benchmark's helper processes (lean target) as real subprocesses."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
_READY = re.compile(r"listening on (http://\S+)")


class BenchError(RuntimeError):
    """A benchmark step could not run; the message says what failed and where its log is."""


@contextlib.contextmanager
def running_lean_target(base_url: str | None = None, *, ttft_s: float = 0.0,
                        itl_s: float = 0.0, cpu: int | None = None,
                        processes: int = 1, truth_dir: str | None = None) -> Iterator[str]:
    """Yield the URL of a lean target (``infra.bench.target``) started for the block, or
    ``base_url`` unchanged when one is given. ``cpu`` pins it to one core (``taskset``)."""
    if base_url:
        yield base_url.rstrip("/")
        return
    port = 0
    if processes > 1:
        from infra.ports import free_port

        port = free_port()
    argv = [sys.executable, "-m", "infra.bench.target", "--port", str(port),
            "--ttft-s", str(ttft_s), "--itl-s", str(itl_s), "--processes", str(processes),
            *(["--truth-dir", truth_dir] if truth_dir else [])]
    if cpu is not None:
        argv = ["taskset", "-c", str(cpu), *argv]
    log = tempfile.NamedTemporaryFile(prefix="swarmload-bench-target-", suffix=".log",
                                      delete=False)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            text = Path(log.name).read_text(errors="replace")
            match = _READY.search(text)
            if match:
                break
            if proc.poll() is not None:
                raise BenchError(f"lean target exited: {text[-2000:]}")
            time.sleep(0.05)
        else:
            raise BenchError(f"lean target did not start; log {log.name}")
        yield match.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
        with contextlib.suppress(OSError):
            os.unlink(log.name)
