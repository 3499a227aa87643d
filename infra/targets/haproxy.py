"""HAProxy (the Debian package) in front of several replicas of a target: one URL to load.

    with running_haproxy(["http://127.0.0.1:8001", "http://127.0.0.1:8002"], workdir) as lb:
        lb.base_url          # http://127.0.0.1:PORT: load this
        lb.servers           # {"r0": "http://127.0.0.1:8001", "r1": ...}
        lb.server_stats()    # HAProxy's own counters per server, from its stats socket

Every answer carries ``X-Served-By: <server name>`` (``http-response set-header ...
%[srv_name]``), which the client records per request (``replica`` column), so the per-replica
breakdown comes from the requests themselves and can be checked against HAProxy's counters
(``show stat`` on the admin socket: CSV, one row per server with ``stot``, ``hrsp_2xx``...).
Timeouts are long (streams of minutes); no health checks, so HAProxy's counters hold only the
load's requests. ``balance`` is HAProxy's: ``roundrobin`` or ``leastconn``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from infra import procs
from infra.ports import free_port

REPLICA_HEADER = "X-Served-By"
BACKEND = "replicas"
BALANCES = {"roundrobin", "leastconn"}
STARTUP_TIMEOUT_S = 10.0


class HaproxyError(RuntimeError):
    """HAProxy is missing, rejected its configuration or did not come up; says which."""


def server_name(index: int) -> str:
    return f"r{index}"


def haproxy_config(backends: list[str], port: int, stats_socket: Path, *,
                   balance: str = "roundrobin", bind: str = "127.0.0.1",
                   tls_pem: str | None = None) -> str:
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
        f"    maxconn {_maxconn()}",
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        "    timeout client 600s",
        "    timeout server 600s",
        "    option http-keep-alive",
        "frontend load",
        f"    bind {bind}:{port}" + (f" ssl crt {tls_pem}" if tls_pem else ""),
        f"    default_backend {BACKEND}",
        f"backend {BACKEND}",
        f"    balance {balance}",
        f"    http-response set-header {REPLICA_HEADER} %[srv_name]",
        *servers,
        "",
    ])


def _maxconn() -> int:
    """As many connections as the file limit lets HAProxy hold (two descriptors each)."""
    import resource

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
            counters: dict[str, int | str] = {"status": row.get("status", "")}
            for key in ("stot", "hrsp_1xx", "hrsp_2xx", "hrsp_3xx", "hrsp_4xx", "hrsp_5xx",
                        "hrsp_other", "bin", "bout", "eresp", "econ"):
                with contextlib.suppress(TypeError, ValueError):
                    counters[key] = int(row.get(key) or 0)
            out[row["svname"]] = counters
        return out


@contextlib.contextmanager
def running_haproxy(backends: list[str], workdir: str | os.PathLike[str], *,
                    balance: str = "roundrobin", port: int = 0,
                    tls_pem: str | None = None) -> Iterator[RunningHaproxy]:
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
    config_path = workdir / "haproxy.cfg"
    config_path.write_text(haproxy_config(backends, port, stats_socket, balance=balance,
                                          tls_pem=tls_pem))
    checked = subprocess.run([binary, "-c", "-q", "-f", str(config_path)], capture_output=True,
                             text=True, timeout=30)
    if checked.returncode != 0:
        raise HaproxyError(f"haproxy rejected {config_path}: {checked.stderr or checked.stdout}")
    argv = [binary, "-db", "-f", str(config_path)]
    try:
        with procs.running(argv, name="haproxy", log_path=workdir / "haproxy.log",
                           ready_port=port, ready_timeout_s=STARTUP_TIMEOUT_S,
                           grace_s=5.0) as proc:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while not stats_socket.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            yield RunningHaproxy(
                base_url=f"{'https' if tls_pem else 'http'}://127.0.0.1:{port}",
                servers={server_name(i): url.rstrip("/") for i, url in enumerate(backends)},
                stats_socket=stats_socket, config_path=config_path, pid=proc.pid,
                balance=balance, launch_args=argv)
    except procs.ProcessStartError as exc:
        raise HaproxyError(str(exc)) from exc


def stats_as_rows(haproxy: RunningHaproxy) -> list[dict[str, Any]]:
    """``server_stats`` with each server's replica URL, as rows for the manifest."""
    return [{"server": name, "url": haproxy.servers.get(name), **counters}
            for name, counters in sorted(haproxy.server_stats().items())]
