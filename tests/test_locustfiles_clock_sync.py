"""The NTP-style offset estimate (locustfiles.clock_sync): pure arithmetic, no sockets."""

from __future__ import annotations

import time

import pytest

from locustfiles.clock_sync import ClockSync, OffsetEstimator, ntp_sample, wall_ns

MS = 1_000_000


def exchange(offset: int, out_delay: int, back_delay: int, t1: int = 10**18) -> tuple[int, ...]:
    """Master sends at t1; the worker's clock reads master time + offset."""
    t2 = t1 + out_delay + offset
    t3 = t2 + 50_000  # the worker's own handling
    t4 = t3 - offset + back_delay
    return t1, t2, t3, t4


@pytest.mark.parametrize("offset", [250 * MS, -250 * MS, 0])
def test_symmetric_paths_give_the_exact_offset_ahead_or_behind(offset: int) -> None:
    est, rtt = ntp_sample(*exchange(offset, 300_000, 300_000))
    assert est == offset and rtt == 600_000


def test_smallest_round_trip_wins_not_smallest_offset() -> None:
    """A worker 250 ms ahead: a delayed answer pulls the estimate towards 0, and the old
    estimator (smallest |offset|) would have kept exactly that sample."""
    estimator = OffsetEstimator()
    estimator.add(*ntp_sample(*exchange(250 * MS, 200_000, 200_000)))
    estimator.add(*ntp_sample(*exchange(250 * MS, 200_000, 40 * MS)))  # busy master loop
    assert estimator.offset_ns == 250 * MS and estimator.samples == 2
    assert estimator.as_dict()["error_bound_s"] == pytest.approx(200e-6)


def test_a_clock_step_mid_exchange_is_ignored() -> None:
    estimator = OffsetEstimator()
    estimator.add(5 * MS, -1)
    assert estimator.offset_ns is None and estimator.samples == 0


def test_injected_skew_moves_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    from locustfiles import clock_sync

    monkeypatch.setenv(clock_sync.SKEW_ENV, "0.5")
    monkeypatch.setattr(clock_sync, "SKEW_NS", [0])
    assert clock_sync.configure_skew() == 500 * MS
    import time

    assert abs(wall_ns() - time.time_ns() - 500 * MS) < 50 * MS


class _Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _sync_with_clock(monkeypatch: pytest.MonkeyPatch) -> tuple[ClockSync, _Clock]:
    from locustfiles import clock_sync

    clock = _Clock()
    monkeypatch.setattr(clock_sync.time, "monotonic", clock)
    monkeypatch.setattr(clock_sync.gevent, "spawn", lambda *_a, **_k: None)  # no pings here
    return ClockSync(environment=None), clock  # type: ignore[arg-type]


def test_a_worker_is_ready_once_its_connect_burst_has_come_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from locustfiles import clock_sync

    sync, _clock = _sync_with_clock(monkeypatch)
    sync.on_worker_connect("w1")
    assert not sync.ready("w1")  # no exchange yet: a lease now would carry offset 0
    estimator = sync.estimators.setdefault("w1", OffsetEstimator())
    for _ in range(clock_sync.BURST - 1):
        estimator.add(*ntp_sample(*exchange(250 * MS, 200_000, 200_000)))
    assert not sync.ready("w1")
    estimator.add(*ntp_sample(*exchange(250 * MS, 200_000, 200_000)))
    assert sync.ready("w1") and sync.offset_ns("w1") == 250 * MS


def test_a_burst_of_slow_round_trips_is_not_ready_until_one_bounds_the_offset(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded box: 16 exchanges of 13 ms round trip bound the offset only within 6.5 ms, and
    leases sent on that estimate were 6.6 ms off the run's final one. Ready once an exchange
    bounds it within READY_BOUND_S (the burst goes on until then), or after READY_WAIT_S."""
    from locustfiles import clock_sync

    sync, clock = _sync_with_clock(monkeypatch)
    sync.on_worker_connect("w1")
    estimator = sync.estimators.setdefault("w1", OffsetEstimator())
    for _ in range(clock_sync.BURST):
        estimator.add(*ntp_sample(*exchange(250 * MS, 10 * MS, 3 * MS)))
    assert not sync.ready("w1")
    estimator.add(*ntp_sample(*exchange(250 * MS, 900_000, 900_000)))  # 1.8 ms round trip
    assert sync.ready("w1") and abs(sync.offset_ns("w1") - 250 * MS) < MS
    sync.on_worker_connect("w2")
    slow = sync.estimators.setdefault("w2", OffsetEstimator())
    for _ in range(clock_sync.BURST * 4):
        slow.add(*ntp_sample(*exchange(250 * MS, 10 * MS, 3 * MS)))
    assert not sync.ready("w2")
    clock.now += clock_sync.READY_WAIT_S
    assert sync.ready("w2")  # on the estimate it has: within 6.5 ms


def test_a_worker_not_yet_through_its_init_is_not_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """Locust counts a worker once it connects, before its init registered the clock ping's
    handler: no lease until the exchange has started, or READY_WAIT_S after first asked."""
    from locustfiles import clock_sync

    sync, clock = _sync_with_clock(monkeypatch)
    assert not sync.ready("w1")
    clock.now += clock_sync.READY_WAIT_S - 0.01
    assert not sync.ready("w1")
    clock.now += 0.02
    assert sync.ready("w1")


def test_a_silent_worker_is_ready_after_the_wait_with_a_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from locustfiles import clock_sync

    sync, clock = _sync_with_clock(monkeypatch)
    sync.on_worker_connect("w1")
    clock.now += clock_sync.READY_WAIT_S - 0.01
    assert not sync.ready("w1")
    clock.now += 0.02
    assert sync.ready("w1") and sync.offset_ns("w1") == 0
    assert "no clock exchange with worker w1" in caplog.text



class _Pong:
    """A worker's answer as Locust hands it to the master: sent 6 ms ago (t1), answered at
    once on a clock that reads the master's (t2 = t3 = t1); the master reads t4 on arrival."""

    def __init__(self, node_id: str, host: str) -> None:
        t1 = time.time_ns() - 6 * MS
        self.node_id = node_id
        self.data = {"seq": 1, "t1": t1, "t2": t1, "t3": t1, "host": host}


def test_a_worker_on_the_masters_host_sends_on_the_masters_clock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes of one host share its clock: what an exchange measures between them is
    only its own error (3 ms here: a slow answer on a loaded box), and a lease carrying it
    moved that worker's sends 3 ms off their plan. A worker of another host keeps its measured
    offset; the same-host worker is ready at its first exchange, not after a tight one."""
    sync, _clock = _sync_with_clock(monkeypatch)
    for cid, host in (("here", sync.host), ("there", "loadgen-b")):
        sync.on_worker_connect(cid)
        sync.on_pong(_Pong(cid, host))
    measured = sync.estimators["here"].offset_ns
    assert measured is not None and -4 * MS < measured <= -3 * MS  # still reported as measured
    assert sync.report()["here"]["offset_s"] == measured / 1e9
    assert sync.offset_ns("here") == 0 and sync.ready("here")
    assert -4 * MS < sync.offset_ns("there") <= -3 * MS and not sync.ready("there")
