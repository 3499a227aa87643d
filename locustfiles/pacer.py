"""Wake a greenlet at a monotonic time to within tens of microseconds, ahead of other work.

gevent's timers (libev) wait in ``epoll_wait``, whose timeout is whole milliseconds: a sleep of
0.3 ms comes back 0.8 ms late at the median (``gevent.sleep`` measured on the 2-core machines:
p50 0.8-0.9 ms late for 0.3-5.7 ms sleeps). A Linux ``timerfd`` set to an absolute
``CLOCK_MONOTONIC`` time (the clock of ``time.perf_counter_ns``) becomes readable at that time,
so the same ``epoll_wait`` returns then (p50 30-80 us late in the same measurement). Its
watcher runs at the loop's highest priority, so when several watchers are ready at once, the
pacer's goes first, before the streams' reads.

:class:`Pacer` is that timer, one per process (the open-loop scheduler's); without ``timerfd``
(not Linux) it falls back to a gevent event with a timeout, at millisecond precision.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import gevent
import gevent.event

log = logging.getLogger(__name__)

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_MAX_PRIORITY = 2  # libev's EV_MAXPRI


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.timerfd_create  # noqa: B018 (an AttributeError where there is none)
        libc.timerfd_settime  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


class Pacer:
    """``wait_until(t_ns)`` blocks the calling greenlet until ``time.perf_counter_ns() >= t_ns``
    or until :meth:`wake` (another greenlet moved the deadline earlier or has news); the caller
    checks the time again. Only one greenlet waits on a pacer."""

    def __init__(self) -> None:
        self._libc = _libc() if time.get_clock_info("perf_counter").implementation.endswith(
            "(CLOCK_MONOTONIC)") else None
        self._fd = -1
        self._watcher: Any = None
        self._event = gevent.event.Event()
        self.armed_ns = 0  # the deadline the waiter sleeps to (0: none)
        if self._libc is not None:
            fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                self._watcher = gevent.get_hub().loop.io(fd, 1)
                try:
                    self._watcher.priority = _MAX_PRIORITY
                except (AttributeError, ValueError):  # a loop without priorities (libuv)
                    pass

    @property
    def precise(self) -> bool:
        """True when waits end on a timerfd (to tens of microseconds)."""
        return self._fd >= 0

    def _arm(self, t_ns: int) -> None:
        t_ns = max(t_ns, 1)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(t_ns // 1_000_000_000,
                                                      t_ns % 1_000_000_000))
        libc: Any = self._libc  # armed only with a timerfd, so libc is there
        libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None)

    def wait_until(self, t_ns: int) -> None:
        self.armed_ns = t_ns
        try:
            if self._fd < 0:
                self._event.clear()
                delay = (t_ns - time.perf_counter_ns()) * 1e-9
                if delay > 0:
                    self._event.wait(timeout=delay)
                return
            self._arm(t_ns)
            gevent.get_hub().wait(self._watcher)
            try:
                os.read(self._fd, 8)  # the expiry count: readable no more
            except BlockingIOError:
                pass  # disarmed or re-armed later meanwhile (wake)
        finally:
            self.armed_ns = 0

    def wake(self) -> None:
        """End the current wait now (no-op when nobody waits)."""
        if not self.armed_ns:
            return
        if self._fd < 0:
            self._event.set()
        else:
            self._arm(1)  # an absolute time long past: readable at once

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def spin_until(t_ns: int) -> None:
    """Hold the loop, without yielding, until ``time.perf_counter_ns() >= t_ns``: for the last
    microseconds before a planned send, which the pacer's timer could not hit (a yield there
    could cost a millisecond). Only for deadlines a timer already brought this close."""
    perf = time.perf_counter_ns
    while perf() < t_ns:
        continue


class SendTurn:
    """Sends ahead of other work: where a greenlet about to hold the event loop lets a due
    open-loop send go first.

    The pacer's timerfd wakes it on time only if the loop is free then; a greenlet that reads a
    whole answer, builds its record or serialises a batch of records holds the loop for tens to
    hundreds of microseconds, and a send due meanwhile went out late by the rest of that work
    (lag P99 0.7-1.4 ms at loads the worker kept up with). Such work calls :func:`make_way`
    first with how long it expects to take; if a send is due by then, the calling greenlet
    sends it (and every other one due by then) at its time, then does its work. ``due_ns`` is
    the scheduler's next planned send on ``time.perf_counter_ns``'s clock (0: none, or the
    scheduler is sending now); ``send_due(horizon_ns)`` sends every request due by
    ``horizon_ns``.

    ``spare_work`` is work that holds the loop but may wait (a batch of records to serialise):
    ``(cost_ns, run)`` pairs, ``cost_ns()`` what it would take now (0: nothing to do),
    ``run(until_ns)`` does it if it ends by ``until_ns``. The scheduler runs it between two
    sends whose gap has room for it, so it delays no send (work that cannot wait goes in
    pieces, each making way for the sends due before it ends: :meth:`room_ns` says how much
    room the next send leaves)."""

    __slots__ = ("due_ns", "send_due", "spare_work")

    def __init__(self) -> None:
        self.due_ns = 0
        self.send_due: Any = None
        self.spare_work: list[tuple[Callable[[], int], Callable[[int], None]]] = []

    def room_ns(self) -> int | None:
        """How long the loop is free before the next planned send, less :data:`CHECK_AHEAD_NS`
        (negative: it is overdue); None while none is planned or sends are going out."""
        due = self.due_ns
        return due - time.perf_counter_ns() - CHECK_AHEAD_NS if due else None

    def run_spare_work(self, until_ns: int) -> None:
        """Run the spare work whose pieces fit before ``until_ns`` (``perf_counter_ns``)."""
        for cost_ns, run in self.spare_work:
            cost = cost_ns()
            if cost and time.perf_counter_ns() + cost <= until_ns:
                try:
                    run(until_ns)
                except Exception:  # the work's failure, not the scheduler's: told, not passed on
                    log.exception("spare-time work failed")


TURN = SendTurn()  # the process's open-loop scheduler's (one per worker process)
# A send overdue by this much means the worker is behind its schedule: work that makes way then
# sends only the oldest overdue request, one between two pieces of work, so the answers already
# in keep being read (sending every overdue request ahead of every read starved the reads, and
# the worker fell further behind). Sending none left them to the pacer's own turn, which comes
# only after the loop has run the greenlets ready before it: near the ceiling, the reads of
# tens of answers (lag P99 14-277 ms at 2,800-3,800 req/s on a 2-core machine, 1.7-40 ms so)
BEHIND_NS = 1_000_000
# Work that holds the loop checks for a due send (make_way) at least this often: a send is
# late by at most about this much when the loop is busy
CHECK_AHEAD_NS = 50_000


def make_way(ahead_ns: int) -> None:
    """Call before work that holds the loop for about ``ahead_ns``: an open-loop send due
    before it ends goes out first, on time (the caller waits for it, spinning); when the worker
    is behind its schedule (:data:`BEHIND_NS`), only the oldest overdue one."""
    due = TURN.due_ns
    if not due:
        return
    perf = time.perf_counter_ns
    now = perf()
    if now + ahead_ns < due:
        return
    try:
        if now - due >= BEHIND_NS:
            TURN.send_due(due)  # behind: the oldest send only, between two pieces of work
            return
        # the sends take time, and the work starts after them: a send due before the work
        # ends, counted from when the last send went out, goes out too
        while True:
            TURN.send_due(now + ahead_ns)
            due = TURN.due_ns
            if not due:
                return
            now = perf()
            if now + ahead_ns < due or now - due >= BEHIND_NS:
                return
    except Exception:  # the scheduler's failure, not the caller's: told, not passed on
        log.exception("an open-loop send made way for failed")
