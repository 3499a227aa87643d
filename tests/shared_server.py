"""The suite's one real vLLM server (``conftest.shared_vllm``), and a way to start it early.

``make test`` starts it (``python tests/shared_server.py STATE``) as soon as the vLLM venv is
built, while the parallel part still runs: the tests of real vLLM come after that part and no
longer wait the minute it takes to come up. This process writes STATE (JSON: the server's
address, model, process group, traces endpoint and its own pid), keeps the server until SIGTERM
(or MAX_LIFETIME_S), then stops it. ``conftest.shared_vllm`` adopts it where
``$SWARMLOAD_SHARED_VLLM_STATE`` names that file and starts its own server otherwise.
``python tests/shared_server.py --stop STATE`` stops it (make test's last step; nothing to do
once the suite's stop test has).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The shared vLLM server's configuration; a test needing another one starts its own server.
MAX_MODEL_LEN = 2048
# Eager mode: no torch.compile of the model at start-up (about 20 s of two cores); the tests look
# at vLLM's HTTP behaviour (streaming, usage, 400s, /metrics, /tokenize), which compiling leaves
# as it is.
# tool calls (the sessions tests' tool loop), cached_tokens in usage, and 32-token cache blocks
# (the CPU backend's default 128 leaves up to 127 tokens of every prompt uncached: the sessions
# test compares the hit rate with a perfect cache's)
# The model runs in the engine core process (the uni executor), not in a worker process of its
# own: one Python process fewer to start (27 s to ready against 35 s at load 5, vLLM 0.32). vLLM's
# CPU platform turns uni back into mp unless VLLM_ENABLE_V1_MULTIPROCESSING=0 (it binds OpenMP
# threads per worker process); the engine core is still a process of its own.
ARGS = ("--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser",
        "hermes", "--enable-prompt-tokens-details", "--block-size", "32",
        "--distributed-executor-backend", "uni")
ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
STATE_ENV = "SWARMLOAD_SHARED_VLLM_STATE"
READY_TIMEOUT_S = 400.0
MAX_LIFETIME_S = 3600.0  # an early server outlives no suite: make test takes 15-20 minutes
STOP_TIMEOUT_S = 40.0


def make_server() -> Any:
    """The shared server, not started. It sends its per-request spans to a port on which a run
    with --server-traces listens (test_e2e_vllm.py); while nothing listens there, its exporter
    drops them after retrying."""
    from infra.ports import free_port
    from infra.targets.vllm_cpu import VllmCpuTarget

    traces = f"http://127.0.0.1:{free_port()}/v1/traces"
    return VllmCpuTarget(max_model_len=MAX_MODEL_LEN, extra_args=ARGS, traces_endpoint=traces,
                         env=ENV)


class EarlyServerGone(RuntimeError):
    """The early server's keeper ended before the tests could use it (the message holds the end
    of the server's log)."""


def _tail(path: str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(unreadable: {exc})"


@dataclass
class AdoptedServer:
    """A shared server another process started (``main``), with the surface the tests use."""

    base_url: str
    model_name: str
    traces_endpoint: str
    pid: int  # the API server's, which leads the server's process group
    keeper_pid: int  # the process that started it and stops it on SIGTERM
    log_path: str

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until a completion comes back (the keeper gone or the time up: an error)."""
        import httpx

        deadline = time.monotonic() + timeout_s
        body = {"model": self.model_name, "prompt": "hello", "max_tokens": 1}
        last = "no answer yet"
        while time.monotonic() < deadline:
            if not _alive(self.keeper_pid):
                raise EarlyServerGone(f"the early vLLM server's keeper {self.keeper_pid} "
                                      f"ended; the end of its log ({self.log_path}):\n"
                                      f"{_tail(self.log_path)}")
            try:
                if httpx.post(f"{self.base_url}/v1/completions", json=body,
                              timeout=30).status_code == 200:
                    return
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(1.0)
        raise RuntimeError(f"the early vLLM server not ready after {timeout_s:.0f} s ({last}); "
                           f"its log: {self.log_path}")

    def stop(self) -> None:
        """The keeper stops the server's process group; at most STOP_TIMEOUT_S, then killed."""
        from infra.targets.vllm_cpu import group_members

        if _alive(self.keeper_pid):
            os.kill(self.keeper_pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while group_members(self.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if group_members(self.pid):
            os.killpg(self.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def adopt(state: Path, wait_s: float = 120.0) -> AdoptedServer | None:
    """The early server STATE describes (waiting up to ``wait_s`` for the file while its keeper
    may still be preparing), or None when there is none to adopt."""
    deadline = time.monotonic() + wait_s
    while not state.exists():
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)
    server = AdoptedServer(**json.loads(state.read_text()))
    return server if _alive(server.keeper_pid) else None


def main(argv: list[str]) -> int:
    if argv[:1] == ["--stop"] and len(argv) == 2:
        state = Path(argv[1])
        if state.exists():
            AdoptedServer(**json.loads(state.read_text())).stop()
            state.unlink()
        return 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    state = Path(argv[0])
    state.unlink(missing_ok=True)
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    server = make_server()
    server.start()
    try:
        part = state.with_suffix(".part")
        part.write_text(json.dumps({
            "base_url": server.base_url, "model_name": server.model_name,
            "traces_endpoint": server.traces_endpoint, "pid": server.pid,
            "keeper_pid": os.getpid(), "log_path": str(server.log_path)}))
        part.replace(state)
        print(f"early vLLM server pid {server.pid} at {server.base_url}, log {server.log_path}",
              flush=True)
        started = time.monotonic()
        while not stopping and time.monotonic() - started < MAX_LIFETIME_S:
            try:
                code = server.wait(timeout_s=1.0)
            except subprocess.TimeoutExpired:
                continue
            print(f"the early vLLM server exited with code {code}; the end of its log:\n"
                  f"{_tail(str(server.log_path))}", file=sys.stderr)
            return 1
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main(sys.argv[1:]))
