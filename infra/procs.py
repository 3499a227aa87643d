"""The one process helper: start a child with a log, wait until it is ready, stop its group.

- :func:`start` runs ``argv`` in its own session (so Ctrl-C reaches only the caller, and a stop
  reaches the child's own children), output to a log file, and with ``die_with_parent`` (the
  default) asks Linux to send it SIGTERM when the process that started it dies
  (``prctl(PR_SET_PDEATHSIG)``): a ``kill -9`` of ``swarmload run`` leaves nothing running.
- :meth:`ManagedProcess.wait_ready` waits for a TCP port, an HTTP URL answering 2xx, or a log
  line matching a pattern (and fails with the log's tail if the child exits first).
- :meth:`ManagedProcess.stop` sends SIGTERM to the child's process group, waits ``grace_s``,
  then SIGKILLs the group.
- :class:`ProcessGroup` holds named children of one run and stops them in order.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from infra.paths import PACKAGE_ROOT

_PR_SET_PDEATHSIG = 1


class ProcessStartError(RuntimeError):
    """The child exited or was not ready in time; the message carries its log's tail."""


def _die_with(parent_pid: int, sig: int) -> None:
    """preexec_fn: ask for ``sig`` when the parent dies, and go at once if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent_pid:  # died between fork and prctl
        os._exit(1)


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` for a ``subprocess.Popen`` this helper does not start (one that must
    keep the caller's terminal): the child gets ``sig`` when the caller dies."""
    parent = os.getpid()
    return lambda: _die_with(parent, sig)


def describe_exit(code: int | None) -> str:
    """``0`` -> 'exit code 0', ``-9`` -> 'signal SIGKILL', None -> 'running'."""
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class ManagedProcess:
    """One started child: its Popen, name and log."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_path: Path,
                 temporary_log: bool = False, own_group: bool = True) -> None:
        self.name = name
        self.popen = popen
        self.log_path = log_path
        self.own_group = own_group  # started in its own session: its pid is its group's id
        self._temporary_log = temporary_log

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout_s: float | None = None) -> int | None:
        """The exit code, or None if still running after ``timeout_s``."""
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, limit: int = 4000) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                return handle.read()[-limit:]
        except OSError:
            return ""

    def wait_ready(self, *, port: int | None = None, host: str = "127.0.0.1",
                   url: str | None = None, log_pattern: str | re.Pattern[str] | None = None,
                   timeout_s: float = 30.0, interval_s: float = 0.05) -> str | None:
        """Block until every given condition holds; returns the log match's first group (or
        whole match) when ``log_pattern`` is given. Raises :class:`ProcessStartError`."""
        pattern = re.compile(log_pattern) if isinstance(log_pattern, str) else log_pattern
        deadline = time.monotonic() + timeout_s
        found: str | None = None
        while True:
            if self.poll() is not None:
                raise ProcessStartError(f"{self.name} exited ({describe_exit(self.returncode)}) "
                                        f"during start-up:\n{self.log_tail()}")
            if pattern is not None and found is None:
                match = pattern.search(self.log_tail(1 << 20))
                if match:
                    found = match.group(1) if match.groups() else match.group(0)
            ready = (pattern is None or found is not None) and (
                port is None or _port_open(host, port)) and (url is None or _url_ok(url))
            if ready:
                return found
            if time.monotonic() > deadline:
                raise ProcessStartError(f"{self.name} not ready after {timeout_s:.0f} s:\n"
                                        f"{self.log_tail()}")
            time.sleep(interval_s)

    def signal_group(self, sig: int) -> None:
        """``sig`` to the child's process group (only the child without a session of its own)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.own_group:
                os.killpg(self.pid, sig)
            else:
                self.popen.send_signal(sig)

    def group_alive(self) -> bool:
        if not self.own_group:
            return self.poll() is None
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def stop(self, grace_s: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
        """``sig`` to the child's group, ``grace_s`` for the child and everything it started to
        exit, then SIGKILL to the group. Idempotent; returns the child's exit code."""
        deadline = time.monotonic() + grace_s
        if self.poll() is None:
            self.signal_group(sig)
            self.wait(grace_s)
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.poll() is None or self.group_alive():
            self.signal_group(signal.SIGKILL)
            self.wait(5.0)
            end = time.monotonic() + 5.0
            while self.group_alive() and time.monotonic() < end:
                time.sleep(0.05)
        if self._temporary_log:
            with contextlib.suppress(OSError):
                os.unlink(self.log_path)
        return self.returncode


def start(argv: Sequence[str], *, name: str | None = None, log_path: str | Path | None = None,
          cwd: str | Path = PACKAGE_ROOT, env: Mapping[str, str] | None = None,
          extra_env: Mapping[str, str] | None = None, new_session: bool = True,
          die_with_parent: bool = True, parent_death_signal: int = signal.SIGTERM,
          append_log: bool = False) -> ManagedProcess:
    """Start ``argv`` with stdout and stderr into ``log_path`` (a temporary file if None, removed
    by :meth:`ManagedProcess.stop`). ``env`` replaces the environment (default: this one),
    ``extra_env`` is added to it; ``PYTHONUNBUFFERED`` is set so logs show lines as they come."""
    temporary = log_path is None
    handle: Any
    if log_path is None:
        handle = tempfile.NamedTemporaryFile(prefix=f"swarmload-{name or 'proc'}-",
                                             suffix=".log", delete=False)
        path = Path(handle.name)
    else:
        path = Path(log_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "ab" if append_log else "wb")  # noqa: SIM115 - the child owns it
    parent = os.getpid()
    environment = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1",
                   **(extra_env or {})}
    try:
        popen = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
            cwd=cwd, env=environment, start_new_session=new_session,
            preexec_fn=(lambda: _die_with(parent, parent_death_signal)) if die_with_parent
            else None,
        )
    finally:
        handle.close()
    return ManagedProcess(name or Path(argv[0]).name, popen, path, temporary_log=temporary,
                          own_group=new_session)


@contextlib.contextmanager
def running(argv: Sequence[str], *, grace_s: float = 10.0, ready_port: int | None = None,
            ready_url: str | None = None, ready_log: str | re.Pattern[str] | None = None,
            ready_timeout_s: float = 30.0, **start_kwargs: object) -> Iterator[ManagedProcess]:
    """:func:`start`, wait until ready, yield, and stop on the way out (even on error)."""
    proc = start(argv, **start_kwargs)  # type: ignore[arg-type]
    try:
        if ready_port is not None or ready_url is not None or ready_log is not None:
            proc.ready_match = proc.wait_ready(  # type: ignore[attr-defined]
                port=ready_port, url=ready_url, log_pattern=ready_log, timeout_s=ready_timeout_s)
        yield proc
    finally:
        proc.stop(grace_s)


class ProcessGroup:
    """Named children of one run, each in its own session and logged to ``log_dir/<name>.log``.

    ``deaths`` records the children found dead while the run still needed them (see
    :meth:`check`), which is how a run knows it crashed.
    """

    def __init__(self, log_dir: Path, parent_death_signal: int = signal.SIGTERM) -> None:
        self.log_dir = log_dir
        self.parent_death_signal = parent_death_signal
        self.procs: dict[str, ManagedProcess] = {}
        self.deaths: dict[str, dict[str, Any]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.procs[name] = start(argv, name=name, log_path=self.log_dir / f"{name}.log",
                                 extra_env=env, parent_death_signal=self.parent_death_signal)

    def stop(self, name: str, timeout_s: float = 15.0, sig: int = signal.SIGTERM) -> int | None:
        proc = self.procs.get(name)
        return None if proc is None else proc.stop(timeout_s, sig)

    def wait(self, name: str, timeout_s: float) -> int | None:
        return self.procs[name].wait(timeout_s)

    def check(self, names: Sequence[str] | None = None) -> list[str]:
        """Note every child among ``names`` (default all) that has died since the last call
        (exit code other than 0, or a signal) while nobody stopped it; returns their names."""
        dead = []
        for name, proc in self.procs.items():
            if names is not None and name not in names:
                continue
            if name not in self.deaths and proc.poll() not in (None, 0):
                self.deaths[name] = {"process": name, "pid": proc.pid,
                                     "exit": describe_exit(proc.returncode),
                                     "returncode": proc.returncode, "wall_ns": time.time_ns()}
                dead.append(name)
        return dead

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name, timeout_s=5.0)


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _url_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:  # noqa: S310 - local URL
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False
