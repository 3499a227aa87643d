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

Either way the manifest's ``target.replicas`` lists ``{"name", "url"}`` per replica, and the
collector scrapes every replica's ``/metrics`` (rows carry the replica's URL as ``target``), so
the summary can put each replica's client-side figures beside its server's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.targets.haproxy import RunningHaproxy, running_haproxy, server_name
from locustfiles.config import BALANCE_CHOICES as RUN_BALANCE_CHOICES

BALANCE_CHOICES = RUN_BALANCE_CHOICES  # defined with the run option (locustfiles.config)
_HAPROXY_BALANCE = {"haproxy": "roundrobin", "haproxy-leastconn": "leastconn"}


@dataclass
class Replicas:
    """What the load and the collectors need to know about the replicas of one run."""

    base_url: str  # Locust's --host: HAProxy's URL, or the first replica's
    urls: list[str]  # every replica's base URL
    balance: str
    haproxy: RunningHaproxy | None = None
    names: list[str] = field(default_factory=list)  # how records name each replica

    @property
    def client_targets(self) -> list[str]:
        """Base URLs the workers balance over themselves (empty when HAProxy does)."""
        return [] if self.haproxy is not None or len(self.urls) < 2 else self.urls

    def manifest(self) -> list[dict[str, str]]:
        return [{"name": name, "url": url} for name, url in zip(self.names, self.urls,
                                                               strict=True)]

    def balancer_stats(self) -> dict[str, Any] | None:
        """HAProxy's own per-server counters now (None without HAProxy)."""
        if self.haproxy is None:
            return None
        from infra.targets.haproxy import stats_as_rows

        return {"kind": "haproxy", "balance": self.haproxy.balance,
                "config": str(self.haproxy.config_path), "servers": stats_as_rows(self.haproxy)}


@contextlib.contextmanager
def balanced(urls: list[str], balance: str, workdir: Path) -> Iterator[Replicas]:
    """Put ``balance`` in front of replicas already serving at ``urls``."""
    if balance not in BALANCE_CHOICES:
        raise ValueError(f"--balance {balance!r}: use one of {list(BALANCE_CHOICES)}")
    urls = [u.rstrip("/") for u in urls]
    if balance in _HAPROXY_BALANCE:
        with running_haproxy(urls, workdir, balance=_HAPROXY_BALANCE[balance]) as haproxy:
            yield Replicas(haproxy.base_url, urls, balance, haproxy,
                           [server_name(i) for i in range(len(urls))])
    else:
        yield Replicas(urls[0], urls, balance, None, list(urls) if len(urls) > 1 else [])
