"""Each worker's clock offset to the master, measured over Locust's own message channel.

NTP's exchange, repeated: the master sends ``swarmload_clock_ping`` with its wall time ``t1``; the
worker answers ``swarmload_clock_pong`` with its receive and send times ``t2``/``t3``; the master
reads ``t4`` on arrival. Then::

    offset = ((t2 - t1) + (t3 - t4)) / 2        # worker clock minus master clock
    rtt    = (t4 - t1) - (t3 - t2)

and the true offset lies within ``rtt / 2`` of the estimate whatever the path's asymmetry. A
busy loop on either side only adds delay, so of all samples the one with the smallest RTT is the
best (NTP's clock filter); :class:`OffsetEstimator` keeps it. The master pings each worker
``BURST`` times as it connects, then once every ``interval_s``; the estimates go into
``recorder_stats.json`` (``clock``) and from there into the run manifest.

Used for: open-loop sends (the master's lease carries the worker's offset, the worker turns
the master's due times into its own clock) and the telemetry join (``manifest.hosts``).

Host name and test-only skew: :func:`host_name` is ``SWARMLOAD_HOST_NAME`` or the machine's
name (it is the first field of every ``worker_id``); :func:`wall_ns` is the wall clock plus
``SWARMLOAD_TEST_CLOCK_SKEW_S`` seconds, a skew injected by the multi-host test so that one
worker runs ahead of the master as a badly synchronised machine would.

Messages (declared here, where they live):
- ``swarmload_clock_ping`` master -> worker: ``{"seq": int, "t1": int}`` (ns, master clock)
- ``swarmload_clock_pong`` worker -> master: ``{"seq", "t1", "t2", "t3", "host"}`` (ns)
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gevent

if TYPE_CHECKING:
    from locust.env import Environment

log = logging.getLogger(__name__)

PING = "swarmload_clock_ping"
PONG = "swarmload_clock_pong"
SKEW_ENV = "SWARMLOAD_TEST_CLOCK_SKEW_S"
HOST_ENV = "SWARMLOAD_HOST_NAME"
BURST = 16  # pings at connect, BURST_GAP_S apart: enough for one quiet round trip on a busy box
BURST_GAP_S = 0.02
# A worker is leased to once its connect burst has come back and its best exchange bounds the
# offset within READY_BOUND_S (the burst goes on until it does), or this long after it
# connected, on whatever estimate it has (0 if none). The bound: a lease's due times are turned
# into the worker's clock with the estimate of that moment, the records with the run's last;
# on a loaded box the best of 16 exchanges was once 13 ms round trip, 6.6 ms off the last.
READY_BOUND_S = 0.001
READY_WAIT_S = 2.0


def _skew_ns() -> int:
    return int(round(float(os.environ.get(SKEW_ENV) or 0.0) * 1e9))


def wall_ns() -> int:
    """This process's wall clock (``time.time_ns``), plus the test-only injected skew."""
    return time.time_ns() + SKEW_NS[0]


SKEW_NS = [0]  # set by configure_skew(); a list so the hot path reads one global without a call


def configure_skew() -> int:
    """Read the test-only skew from the environment (once per process); returns it in ns."""
    SKEW_NS[0] = _skew_ns()
    return SKEW_NS[0]


def host_name() -> str:
    """The name this process reports as its host (``SWARMLOAD_HOST_NAME`` or the hostname)."""
    return os.environ.get(HOST_ENV) or socket.gethostname()


def ntp_sample(t1: int, t2: int, t3: int, t4: int) -> tuple[int, int]:
    """(offset, rtt) in ns from one exchange; offset = remote clock minus local clock."""
    return ((t2 - t1) + (t3 - t4)) // 2, (t4 - t1) - (t3 - t2)


@dataclass
class OffsetEstimator:
    """Keeps the exchange with the smallest round trip: its offset is the best estimate."""

    offset_ns: int | None = None
    rtt_ns: int | None = None
    samples: int = 0
    spread_ns: tuple[int, int] | None = None  # smallest and largest offset seen (diagnostic)

    def add(self, offset_ns: int, rtt_ns: int) -> None:
        if rtt_ns < 0:  # a clock stepped mid-exchange: this sample means nothing
            return
        self.samples += 1
        lo, hi = self.spread_ns or (offset_ns, offset_ns)
        self.spread_ns = (min(lo, offset_ns), max(hi, offset_ns))
        if self.rtt_ns is None or rtt_ns < self.rtt_ns:
            self.offset_ns, self.rtt_ns = offset_ns, rtt_ns

    def as_dict(self) -> dict[str, Any]:
        return {
            "offset_s": self.offset_ns / 1e9 if self.offset_ns is not None else None,
            "rtt_s": self.rtt_ns / 1e9 if self.rtt_ns is not None else None,
            "error_bound_s": self.rtt_ns / 2e9 if self.rtt_ns is not None else None,
            "samples": self.samples,
            "offset_spread_s": ([v / 1e9 for v in self.spread_ns]
                                if self.spread_ns is not None else None),
        }


class ClockSync:
    """Master side: ping every worker, keep one estimator per worker (Locust client id)."""

    def __init__(self, environment: Environment, interval_s: float = 2.0) -> None:
        self.environment = environment
        self.interval_s = interval_s
        self.estimators: dict[str, OffsetEstimator] = {}
        self.hosts: dict[str, str] = {}  # client id -> host name the worker reported
        self.host = host_name()  # the master's
        self.joined: dict[str, float] = {}  # client id -> time.monotonic() of its connect
        # a worker asked about before it joined (its init not announced yet): since when
        self.seen: dict[str, float] = {}
        self._seq = 0
        self._loop: gevent.Greenlet | None = None

    def shares_clock(self, client_id: str) -> bool:
        """Whether that worker reported the master's own host: one clock, offset 0 by
        construction (the run manifest says so too, ``infra.orchestrate``)."""
        return self.hosts.get(client_id) == self.host

    def offset_ns(self, client_id: str) -> int:
        """The best offset of that worker so far (0 until one exchange has come back); 0 for a
        worker on the master's host, whose measured offset is only the exchange's error (on a
        loaded box, milliseconds: its sends would move by as much)."""
        estimator = self.estimators.get(client_id)
        if self.shares_clock(client_id) or estimator is None or estimator.offset_ns is None:
            return 0
        return estimator.offset_ns

    def error_bound_ns(self, client_id: str) -> int | None:
        """How far :meth:`offset_ns` may be from the truth: half the best exchange's round trip
        (0 for a worker on the master's host, None before any exchange came back)."""
        if self.shares_clock(client_id):
            return 0
        estimator = self.estimators.get(client_id)
        return None if estimator is None or estimator.rtt_ns is None else estimator.rtt_ns // 2

    def ready(self, client_id: str) -> bool:
        """Whether a lease to that worker may carry its offset: its connect burst has come
        back with an exchange that bounds its offset within READY_BOUND_S, or READY_WAIT_S
        have passed since it connected (since it was first asked about, for a worker that never
        announced its init). A lease sent before the first exchange would carry
        offset 0 and move every send of a skewed worker by its skew. A worker on the master's
        host is ready at its first exchange: its offset is 0 whatever the exchanges say."""
        if self.shares_clock(client_id) or self._good_enough(client_id):
            return True
        joined = self.joined.get(client_id) or self.seen.setdefault(client_id, time.monotonic())
        if time.monotonic() - joined >= READY_WAIT_S:
            estimator = self.estimators.get(client_id)
            if estimator is None or estimator.offset_ns is None:
                log.warning("no clock exchange with worker %s came back in %.1f s: its sends "
                            "are timed on its own wall clock", client_id, READY_WAIT_S)
            return True
        return False

    def _good_enough(self, client_id: str) -> bool:
        estimator = self.estimators.get(client_id)
        return (estimator is not None and estimator.samples >= BURST
                and estimator.rtt_ns is not None and estimator.rtt_ns <= 2 * READY_BOUND_S * 1e9)

    def ping(self, client_id: str) -> None:
        runner: Any = self.environment.runner  # the master's, while it runs
        self._seq += 1
        runner.send_message(PING, {"seq": self._seq, "t1": time.time_ns()}, client_id=client_id)

    def on_worker_connect(self, client_id: str, **_kwargs: Any) -> None:
        self.joined[client_id] = time.monotonic()
        gevent.spawn(self._burst, client_id)
        if self._loop is None:
            self._loop = gevent.spawn(self._periodic)

    def _burst(self, client_id: str) -> None:
        gevent.sleep(BURST_GAP_S)  # the worker handles its "ack" first
        joined = self.joined.get(client_id, time.monotonic())
        sent = 0
        while sent < BURST or (not self.shares_clock(client_id)
                               and not self._good_enough(client_id)
                               and time.monotonic() - joined < READY_WAIT_S):
            self.ping(client_id)
            sent += 1
            gevent.sleep(BURST_GAP_S)

    def _periodic(self) -> None:
        while True:
            gevent.sleep(self.interval_s)
            runner = self.environment.runner
            for client_id in list(getattr(runner, "clients", {})):
                self.ping(client_id)

    def on_pong(self, msg: Any, **_kwargs: Any) -> None:
        t4 = time.time_ns()
        data = msg.data
        offset, rtt = ntp_sample(data["t1"], data["t2"], data["t3"], t4)
        self.estimators.setdefault(msg.node_id, OffsetEstimator()).add(offset, rtt)
        self.hosts[msg.node_id] = data["host"]

    def stop(self, **_kwargs: Any) -> None:
        if self._loop is not None:
            self._loop.kill(block=False)
            self._loop = None

    def report(self) -> dict[str, dict[str, Any]]:
        """client id -> {host, offset_s, rtt_s, error_bound_s, samples, offset_spread_s}."""
        return {cid: {"host": self.hosts.get(cid), **est.as_dict()}
                for cid, est in sorted(self.estimators.items())}


def _on_ping(environment: Environment, msg: Any, **_kwargs: Any) -> None:
    t2 = wall_ns()
    data = msg.data
    runner: Any = environment.runner  # the worker's, which just received the ping
    runner.send_message(PONG, {"seq": data["seq"], "t1": data["t1"], "t2": t2,
                                           "t3": wall_ns(), "host": host_name()})


def register(environment: Environment) -> ClockSync | None:
    """Attach the exchange to ``environment``'s runner; call from an ``init`` listener."""
    # late: Locust patches the process for gevent when imported: only in a Locust process
    from locust.runners import MasterRunner, WorkerRunner  # noqa: PLC0415

    configure_skew()
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        runner.register_message(PING, _on_ping)
        return None
    if isinstance(runner, MasterRunner):
        sync = ClockSync(environment)
        runner.register_message(PONG, sync.on_pong)
        # not on Locust's worker_connect: that comes before the worker's init has registered
        # the ping's handler (locustfiles.master_waits), which calls on_worker_connect then
        environment.events.quitting.add_listener(sync.stop)
        return sync
    return None
