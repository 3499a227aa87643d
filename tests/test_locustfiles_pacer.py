"""The open-loop pacer's timer (locustfiles/pacer.py): never early, woken at once when told."""

from __future__ import annotations

import sys
import time

import gevent
import pytest

from locustfiles import pacer as pacer_module
from locustfiles.pacer import Pacer


@pytest.fixture(params=["timerfd", "fallback"])
def pacer(request, monkeypatch) -> Pacer:
    if request.param == "fallback":
        monkeypatch.setattr(pacer_module, "_libc", lambda: None)
    elif not sys.platform.startswith("linux"):
        pytest.skip("timerfd is Linux's")
    made = Pacer()
    assert made.precise == (request.param == "timerfd")
    yield made
    made.close()


def test_a_wait_ends_at_its_time_never_before(pacer: Pacer) -> None:
    for delay_ns in (0, 200_000, 3_000_000):
        due = time.perf_counter_ns() + delay_ns
        pacer.wait_until(due)
        assert time.perf_counter_ns() >= due
    past = time.perf_counter_ns() - 1_000_000
    started = time.perf_counter_ns()
    pacer.wait_until(past)  # already due: back at once
    assert time.perf_counter_ns() - started < 0.5e9


def test_wake_ends_a_long_wait_and_other_greenlets_run_meanwhile(pacer: Pacer) -> None:
    ran = []

    def other() -> None:
        ran.append(time.perf_counter_ns())
        pacer.wake()

    gevent.spawn_later(0.05, other)
    started = time.perf_counter_ns()
    pacer.wait_until(started + 30 * 10**9)
    assert ran and time.perf_counter_ns() - started < 5e9
    assert pacer.armed_ns == 0
    pacer.wake()  # nobody waits: nothing happens, and the next wait is a normal one
    due = time.perf_counter_ns() + 1_000_000
    pacer.wait_until(due)
    assert time.perf_counter_ns() >= due
