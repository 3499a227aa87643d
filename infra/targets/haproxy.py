"""HAProxy (the Debian package) in front of several replicas of a target: one URL to load.

    with running_haproxy(["http://127.0.0.1:8001", "http://127.0.0.1:8002"], workdir) as lb:
        lb.base_url          # http://127.0.0.1:PORT: load this
        lb.servers           # {"r0": "http://127.0.0.1:8001", "r1": ...}
        lb.server_stats()    # HAProxy's own counters per server, from its stats socket

Every answer carries ``X-Served-By: <server name>`` (``http-response set-header ...
%[srv_name]``), which the client records per request (``replica`` column), so the per-replica
breakdown comes from the requests themselves and can be checked against HAProxy's counters
(``show stat`` on the admin socket: CSV, one row per server with ``stot``, ``hrsp_2xx``...), and
HAProxy logs one line per request to its log (``collectors.balancer_log``: the request's
``X-Request-Id``, server, status, termination state, retries).
Timeouts are long (streams of minutes). ``balance`` is HAProxy's: ``roundrobin`` or ``leastconn``.

Health checks (:class:`HealthCheck`, ``swarmload run --health-check-interval``): ``option httpchk
GET /health`` on every server, every ``interval_s``; ``fall`` failed checks in a row take a
server out, ``rise`` passing ones put it back. Checks are not sessions: HAProxy's per-server
``stot`` and ``hrsp_*`` still hold only the load's requests. A connection refused by a server
that is gone is retried once on another (``retries 1``, ``option redispatch 1``), counted by
HAProxy as ``wretr``/``wredis``. :class:`BalancerWatch` reads ``show stat`` every 0.1 s during a
run and keeps each server's status changes (``DOWN``, ``UP``) with their wall-clock times.

With ``session_header`` (a session's requests carry it: ``X-Session-Id``), a stick table keeps
every request of a session on the server its first one went to, so that server's prefix cache
holds the session's history; requests without the header are balanced as before.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import resource
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from collectors.balancer_log import HAPROXY_LOG, LOG_FORMAT
from infra import procs
from infra.ports import free_port

REPLICA_HEADER = "X-Served-By"
REQUEST_ID_HEADER = "X-Request-Id"  # the client's id of each request, in HAProxy's log lines
BACKEND = "replicas"
BALANCES = {"roundrobin", "leastconn"}
# HAProxy's per-server counters of what went wrong (``show stat``): retries and redispatches,
# transfers aborted by the server or the client, failed checks, times marked down, seconds down
FAULT_COUNTERS = ("wretr", "wredis", "srv_abrt", "cli_abrt", "chkfail", "chkdown", "downtime",
                  "scur")
STARTUP_TIMEOUT_S = 10.0
# how often BalancerWatch reads HAProxy's status: a change is seen up to this much after it
WATCH_INTERVAL_S = 0.1
MAX_SOCKET_PATH = 96  # HAProxy refuses a longer stats socket path (a Unix socket's limit)


class HaproxyError(RuntimeError):
    """HAProxy is missing, rejected its configuration or did not come up; says which."""


@dataclass(frozen=True)
class HealthCheck:
    """HAProxy's active health check of every server (``option httpchk``)."""

    interval_s: float = 1.0
    fall: int = 2  # failed checks in a row that take a server out
    rise: int = 2  # passing checks in a row that put it back
    path: str = "/health"

    def lines(self) -> list[str]:
        inter = f"{max(1, round(self.interval_s * 1000))}ms"
        return [f"    option httpchk GET {self.path}",
                # a check that gets no answer (a stopped server) fails after one interval
                f"    timeout check {inter}",
                f"    default-server check inter {inter} fall {self.fall} rise {self.rise}"]

    def manifest(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "fall": self.fall, "rise": self.rise,
                "path": self.path}


def server_name(index: int) -> str:
    return f"r{index}"


def haproxy_config(backends: list[str], port: int, stats_socket: Path, *,
                   balance: str = "roundrobin", bind: str = "127.0.0.1",
                   tls_pem: str | None = None, health_check: HealthCheck | None = None,
                   session_header: str | None = None) -> str:
    """The whole configuration file for ``backends`` (base URLs ``http://HOST:PORT``).

    ``tls_pem`` (a PEM file with the certificate, its chain and its key): HAProxy terminates
    TLS on the front end, as in front of a production server, and speaks plain HTTP behind."""
    if balance not in BALANCES:
        raise HaproxyError(f"balance {balance!r}: use one of {sorted(BALANCES)}")
    servers = []
    for index, url in enumerate(backends):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or parts.path.strip("/"):
            raise HaproxyError(f"replica {url!r}: want http://HOST:PORT")
        servers.append(f"    server {server_name(index)} {parts.hostname}:{parts.port or 80}")
    return "\n".join([
        "global",
        f"    stats socket {stats_socket} mode 600 level admin",
        # one line per request on stderr (the log file of the run's balancer folder)
        "    log stderr format raw local0 info",
        f"    maxconn {_maxconn()}",
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        "    timeout client 600s",
        "    timeout server 600s",
        "    option http-keep-alive",
        # a refused connection (a killed server not yet marked down) goes to another server
        "    retries 1",
        "    option redispatch 1",
        "frontend load",
        f"    bind {bind}:{port}" + (f" ssl crt {tls_pem}" if tls_pem else ""),
        "    log global",
        f"    http-request capture req.hdr({REQUEST_ID_HEADER}) len 120",
        f'    log-format "{LOG_FORMAT}"',  # collectors.balancer_log reads it
        f"    default_backend {BACKEND}",
        f"backend {BACKEND}",
        f"    balance {balance}",
        *(["    stick-table type string len 128 size 1m expire 60m",
           f"    stick on req.hdr({session_header})"] if session_header else []),
        f"    http-response set-header {REPLICA_HEADER} %[srv_name]",
        *(health_check.lines() if health_check else []),
        *servers,
        "",
    ])


def _maxconn() -> int:
    """As many connections as the file limit lets HAProxy hold (two descriptors each)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit = 20000 if hard == resource.RLIM_INFINITY else (hard - 200) // 2
    return max(256, min(20000, limit))


def parse_show_stat(text: str) -> list[dict[str, str]]:
    """``show stat`` output (CSV whose header line starts with ``# ``) as dict rows."""
    return list(csv.DictReader(io.StringIO(text.lstrip("# "))))


@dataclass
class RunningHaproxy:
    base_url: str
    servers: dict[str, str]  # server name -> replica base URL
    stats_socket: Path
    config_path: Path
    pid: int
    balance: str
    launch_args: list[str] = field(default_factory=list)
    health_check: HealthCheck | None = None

    def command(self, line: str) -> str:
        """One command on the admin socket (``show stat``, ``show info``), its whole answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5.0)
            sock.connect(str(self.stats_socket))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def server_stats(self) -> dict[str, dict[str, int | str]]:
        """Per server of the backend: HAProxy's own counters (``stot`` sessions, ``hrsp_2xx``
        ... responses by class, ``bin``/``bout`` bytes) and its status."""
        out: dict[str, dict[str, int | str]] = {}
        for row in parse_show_stat(self.command("show stat")):
            if row.get("pxname") != BACKEND or row.get("svname") in ("FRONTEND", "BACKEND"):
                continue
            counters: dict[str, int | str] = {"status": row.get("status", ""),
                                              "check_status": row.get("check_status", "")}
            for key in ("stot", "hrsp_1xx", "hrsp_2xx", "hrsp_3xx", "hrsp_4xx", "hrsp_5xx",
                        "hrsp_other", "bin", "bout", "eresp", "econ", *FAULT_COUNTERS):
                with contextlib.suppress(TypeError, ValueError):
                    counters[key] = int(row.get(key) or 0)
            out[row["svname"]] = counters
        return out


@contextlib.contextmanager
def running_haproxy(backends: list[str], workdir: str | os.PathLike[str], *,
                    balance: str = "roundrobin", port: int = 0,
                    tls_pem: str | None = None,
                    health_check: HealthCheck | None = None,
                    session_header: str | None = None) -> Iterator[RunningHaproxy]:
    """Start ``haproxy`` in the foreground in front of ``backends``; stop it on exit.

    ``workdir`` holds its configuration, admin socket and log."""
    binary = shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/sbin/haproxy") if os.path.exists(p)), None)
    if binary is None:
        raise HaproxyError("haproxy is not installed (apt-get install -y haproxy)")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    stats_socket = workdir / "haproxy.sock"
    short = None
    if len(str(stats_socket)) > MAX_SOCKET_PATH:  # a deep run folder (a study's step)
        short = Path(tempfile.mkdtemp(prefix="swarmload-haproxy-"))
        stats_socket = short / "haproxy.sock"
    config_path = workdir / "haproxy.cfg"
    config_path.write_text(haproxy_config(backends, port, stats_socket, balance=balance,
                                          tls_pem=tls_pem, health_check=health_check,
                                          session_header=session_header))
    checked = subprocess.run([binary, "-c", "-f", str(config_path)], capture_output=True,
                             text=True, timeout=30)
    if checked.returncode != 0:
        said = checked.stderr + checked.stdout
        alerts = [line for line in said.splitlines() if "ALERT" in line]
        raise HaproxyError(f"haproxy rejected {config_path}: {' '.join(alerts[:2]) or said}")
    argv = [binary, "-db", "-f", str(config_path)]
    try:
        with procs.running(argv, name="haproxy", log_path=workdir / HAPROXY_LOG,
                           ready_port=port, ready_timeout_s=STARTUP_TIMEOUT_S,
                           grace_s=5.0) as proc:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while not stats_socket.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            yield RunningHaproxy(
                base_url=f"{'https' if tls_pem else 'http'}://127.0.0.1:{port}",
                servers={server_name(i): url.rstrip("/") for i, url in enumerate(backends)},
                stats_socket=stats_socket, config_path=config_path, pid=proc.pid,
                balance=balance, launch_args=argv, health_check=health_check)
    except procs.ProcessStartError as exc:
        raise HaproxyError(str(exc)) from exc
    finally:
        if short is not None:
            shutil.rmtree(short, ignore_errors=True)


def stats_as_rows(haproxy: RunningHaproxy) -> list[dict[str, Any]]:
    """``server_stats`` with each server's replica URL, as rows for the manifest."""
    return [{"server": name, "url": haproxy.servers.get(name), **counters}
            for name, counters in sorted(haproxy.server_stats().items())]


def status_word(status: object) -> str:
    """HAProxy's server status as UP or DOWN (``UP 1/2``, still up but failing checks, is UP;
    ``DOWN 1/2`` is DOWN), or as it is (``MAINT``, ``no check``)."""
    return str(status).split(" ")[0] if status else ""


class BalancerWatch:
    """Reads HAProxy's ``show stat`` every ``interval_s`` in a thread while the run goes on and
    keeps, per server, every change of its status (``UP`` -> ``DOWN`` and back) with the
    wall-clock time it was first seen and HAProxy's fault counters then; :meth:`snapshot` adds
    the counters at a moment of the caller's choosing (a fault action)."""

    def __init__(self, haproxy: RunningHaproxy, interval_s: float = WATCH_INTERVAL_S) -> None:
        self.haproxy = haproxy
        self.interval_s = interval_s
        self.events: list[dict[str, Any]] = []
        self._last: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="balancer-watch", daemon=True)

    def __enter__(self) -> BalancerWatch:
        self.poll()
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
        with contextlib.suppress(OSError):
            self.snapshot("end")

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(OSError):
                self.poll()

    def _counters(self, row: dict[str, int | str]) -> dict[str, int]:
        return {k: int(row[k]) for k in (*FAULT_COUNTERS, "eresp", "econ", "hrsp_5xx", "stot")
                if isinstance(row.get(k), int)}

    def poll(self) -> None:
        stats = self.haproxy.server_stats()
        now = time.time_ns()
        with self._lock:
            for name, row in sorted(stats.items()):
                word = status_word(row.get("status"))
                if self._last.get(name) != word:
                    self.events.append({"event": "status", "server": name, "wall_ns": now,
                                        "status": word, "raw_status": row.get("status"),
                                        "previous": self._last.get(name),
                                        "check_status": row.get("check_status"),
                                        "counters": self._counters(row)})
                    self._last[name] = word

    def snapshot(self, label: str) -> dict[str, dict[str, int]]:
        """Every server's fault counters now, kept as an event labelled ``label``."""
        stats = self.haproxy.server_stats()
        counters = {name: self._counters(row) for name, row in sorted(stats.items())}
        with self._lock:
            self.events.append({"event": "snapshot", "label": label, "wall_ns": time.time_ns(),
                                "servers": counters})
        return counters

    def manifest(self) -> dict[str, Any]:
        with self._lock:
            return {"interval_s": self.interval_s, "events": list(self.events)}

