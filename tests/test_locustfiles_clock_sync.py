"""The NTP-style offset estimate (locustfiles.clock_sync): pure arithmetic, no sockets."""

from __future__ import annotations

import pytest

from locustfiles.clock_sync import OffsetEstimator, ntp_sample, wall_ns

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
