"""Open-loop replay across Locust workers: one schedule, leased out by the master.

Locust only knows closed-loop users, so open-loop plans bypass its user dispatch:

- The **master** owns the schedule (``workloads.arrivals``: every request and its offset from the
  run start). A dispatcher greenlet leases the next ``lookahead_s`` of it, item by item
  round-robin, to the workers alive at that moment (``swarmload_lease`` messages with the full
  request, so workers need no shared files). Workers acknowledge each request the moment they
  send it (``swarmload_sent``). Both messages are declared in :mod:`locustfiles.events`.
- A **worker** runs one scheduler greenlet (started once per process, never by Locust's user
  re-dispatch) that fires each request at its time in a fresh greenlet, within an explicit cap
  on requests in flight; an arrival over the cap is recorded as ``dropped``, never delayed.
- When Locust marks a worker missing, the master re-leases that worker's not-yet-due requests to
  the others and records the due-but-unacknowledged ones as ``worker_lost``: no request goes out
  twice and none is lost without a record. When it left is written to ``replay_events.json``.

Times cross hosts as wall-clock nanoseconds (run start + offset); each worker converts them to
its own monotonic clock once, so pacing itself never depends on wall-clock steps.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import gevent
import gevent.event
import gevent.pool
import httpx
from locust.env import Environment
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner

from collectors.atomic import write_json_atomic
from collectors.schemas import OUTCOME_CANCELLED, OUTCOME_DROPPED, OUTCOME_WORKER_LOST
from locustfiles.clock_sync import wall_ns
from locustfiles.config import ENDPOINT_PATHS
from locustfiles.events import LEASE_MESSAGE, SENT_MESSAGE, fire_live_stats, fire_record
from locustfiles.pacer import CHECK_AHEAD_NS, TURN, Pacer, make_way, spin_until
from locustfiles.sessions import SessionRun, root_scheduled_wall, unsent_turn_record
from locustfiles.streaming import IDLE_LIMIT_S, StreamTiming, cancelled_timing, request_body
from locustfiles.timing import build_record

log = logging.getLogger(__name__)



def _unsent_record(item: dict[str, Any], outcome: str, error: str, *, run_id: str,
                   worker_id: str, scheduled_wall_ns: int) -> dict[str, Any]:
    timing = StreamTiming(sent_ns=0, sent_wall_ns=wall_ns(), outcome=outcome, error=error)
    record = build_record(
        timing, run_id=run_id, worker_id=worker_id, request_id=item["rid"],
        bucket=item["bucket"], endpoint=item["endpoint"], target_prompt_tokens=item["ptoks"],
        max_tokens=item["max_tokens"],
    )
    record["scheduled_wall_ns"] = scheduled_wall_ns
    record["e2e_s"] = None
    return record


class LazyItems:
    """The part of a deque the dispatcher uses, over an iterator of items in offset order.

    Items are drawn only as the dispatcher looks at them, so a soak's schedule (days of
    arrivals) is never held in memory; items given back (a worker left) go in front.
    """

    def __init__(self, items: Iterable[dict[str, Any]]) -> None:
        self._source: Iterator[dict[str, Any]] = iter(items)
        self._buffer: deque[dict[str, Any]] = deque()
        self.exhausted = False
        self.drawn = 0

    def _fill(self) -> bool:
        if not self._buffer and not self.exhausted:
            try:
                self._buffer.append(next(self._source))
                self.drawn += 1
            except StopIteration:
                self.exhausted = True
        return bool(self._buffer)

    def __bool__(self) -> bool:
        return self._fill()

    def __len__(self) -> int:  # drawn but not yet leased
        return len(self._buffer)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index != 0 or not self._fill():
            raise IndexError(index)
        return self._buffer[0]

    def popleft(self) -> dict[str, Any]:
        if not self._fill():
            raise IndexError("no more items")
        return self._buffer.popleft()

    def appendleft(self, item: dict[str, Any]) -> None:
        self._buffer.appendleft(item)


# Requests per lease message: a worker unpacks about this many in the time a send may be late
LEASE_PART_ITEMS = 32


class ScheduleDispatcher:
    """Master side: lease the schedule to live workers, re-lease when one goes missing.

    Every leased request stays *outstanding* until its record reaches the master. When a worker
    goes missing, its outstanding requests that it has not sent and that are not yet due are
    leased again to the others; the rest (sent but unanswered, or due already) are recorded as
    ``worker_lost``. So each scheduled request ends with exactly one record.
    """

    def __init__(self, environment: Environment,
                 items: list[dict[str, Any]] | Iterator[dict[str, Any]], *, run_id: str,
                 run_dir: str | None, lookahead_s: float = 1.5, tick_s: float = 0.05,
                 start_delay_s: float = 1.0, drain_timeout_s: float = 60.0,
                 records_received: Any = None, clock_offset_ns: Any = None,
                 resume: bool = False, concurrency: int | None = None,
                 duration_s: float | None = None, clock_ready: Any = None,
                 clock_bound_ns: Any = None) -> None:
        self.environment = environment
        # sessions under a closed plan: keep ``concurrency`` sessions running, the next one
        # leased the moment one ends, until ``duration_s`` of schedule has passed
        self.concurrency = concurrency
        self.duration_ns = int(duration_s * 1e9) if duration_s else None
        self.active: set[int] = set()  # seqs of leased sessions not yet over
        self.turns_left: dict[int, int] = {}  # session seq -> turns without their record
        self.run_id = run_id
        self.run_dir = Path(run_dir) if run_dir else None
        # A list is a whole schedule; an iterator (a soak) is drawn lazily, in offset order.
        self.pending: deque[dict[str, Any]] | LazyItems = (
            deque(sorted(items, key=lambda i: i["off"])) if isinstance(items, list)
            else LazyItems(items))
        self.total: int | None = len(items) if isinstance(items, list) else None
        self.lookahead_ns = int(lookahead_s * 1e9)
        self.tick_s = tick_s
        self.start_delay_ns = int(start_delay_s * 1e9)
        self.t0_wall_ns = 0
        self.outstanding: dict[str, tuple[str, dict[str, Any]]] = {}  # rid -> (worker, item)
        self.acked: set[int] = set()
        self.live: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.counts = {"leased": 0, "released": 0, "worker_lost": 0}
        self._rr = 0
        self._greenlet: gevent.Greenlet | None = None
        self.drain_timeout_s = drain_timeout_s
        self.resume = resume
        # () -> int: records the master holds; when it reaches the schedule's size, all is done
        self.records_received = records_received
        # (worker client id) -> that worker's clock minus the master's, ns (clock_sync)
        self.clock_offset_ns = clock_offset_ns or (lambda _worker: 0)
        # (worker client id) -> whether its offset is known yet: a worker joins the rotation
        # only then, so no lease carries a guessed offset (clock_sync.ClockSync.ready)
        self.clock_ready = clock_ready or (lambda _worker: True)
        # (worker client id) -> how far its offset may be off, ns, None if unknown: its
        # worker_joined event says with what estimate its first lease went
        self.clock_bound_ns = clock_bound_ns or (lambda _worker: None)
        self.joining = 0  # connected workers waiting for their clock offset

    def due_wall_ns(self, item: dict[str, Any]) -> int:
        return self.t0_wall_ns + int(item["off"] * 1e9)

    def start(self) -> None:
        self.t0_wall_ns = time.time_ns() + self.start_delay_ns
        if self.resume and self.pending:
            # A resumed run: its first item (not the schedule's start) is due after the delay;
            # the time the run was down is a gap, not a burst of overdue requests.
            self.t0_wall_ns -= int(self.pending[0]["off"] * 1e9)
        self._event("schedule_start", requests=self.total, t0_wall_ns=self.t0_wall_ns)
        self._write_events()  # a fault plan's driver times its actions from t0 (infra.faults)
        self._greenlet = gevent.spawn(self._loop)

    def stop(self) -> None:
        if self._greenlet is not None and self._greenlet is not gevent.getcurrent():
            self._greenlet.kill(block=False)
        self._greenlet = None
        self._event("schedule_stop", unleased=len(self.pending), acked=len(self.acked),
                    outstanding=len(self.outstanding), **self.counts)
        self._write_events()

    def on_sent(self, msg: Any, **_kwargs: Any) -> None:
        self.acked.update(msg.data["seqs"])
        self.active.difference_update(msg.data.get("done", ()))  # sessions over on the worker

    def on_records(self, columns: dict[str, list[Any]]) -> None:
        outstanding, acked = self.outstanding, self.acked
        for rid in columns["request_id"]:
            entry = outstanding.pop(rid, None)
            if entry is None:
                continue
            item = entry[1]
            if "turns" in item and not self._turn_settled(item):
                continue  # the session still has turns without their record
            acked.discard(item["seq"])  # settled: acknowledgement state stays windowed

    def _turn_settled(self, item: dict[str, Any]) -> bool:
        """One more turn of a session has its record; True when that was its last."""
        seq = item["seq"]
        left = self.turns_left.get(seq, 1) - 1
        if left > 0:
            self.turns_left[seq] = left
            return False
        self.turns_left.pop(seq, None)
        self.active.discard(seq)
        return True

    def _track(self, item: dict[str, Any], worker: str) -> None:
        if "turns" in item:
            for turn in item["turns"]:
                self.outstanding[turn["rid"]] = (worker, item)
            self.turns_left[item["seq"]] = len(item["turns"])
            self.active.add(item["seq"])
        else:
            self.outstanding[item["rid"]] = (worker, item)

    def _prune_acked(self) -> None:
        """Forget acknowledgements of requests no longer outstanding (an ack can trail its
        record), so the set holds only requests in flight, however long the run."""
        self.acked &= {item["seq"] for _, item in self.outstanding.values()}

    def _loop(self) -> None:
        last_prune = time.monotonic()
        while True:
            while self.pending:
                self._check_workers()
                self._lease_due()
                if time.monotonic() - last_prune > 30.0:
                    self._prune_acked()
                    last_prune = time.monotonic()
                gevent.sleep(self.tick_s)
            self._event("schedule_leased", **self.counts)
            self._write_events()
            if not self._drain():
                break
        self._quit()

    def _drain(self) -> bool:
        """Wait until every scheduled request has a record (or the drain time is up); True when
        a worker that left gave requests back first, which the loop then leases again (the
        whole schedule is leased seconds ahead, before Locust finds a worker missing)."""
        deadline = time.monotonic() + self.drain_timeout_s
        while self.outstanding and time.monotonic() < deadline and not self.pending:
            self._check_workers()
            if not self.pending:
                gevent.sleep(0.5)
        return bool(self.pending)

    def _quit(self) -> None:
        """End the run: every scheduled request has a record, or the drain time is up."""
        complete = not self.outstanding
        self._event("schedule_done", complete=complete, outstanding=len(self.outstanding))
        self._write_events()
        if self.records_received is None:
            return
        log.info("schedule done (%s); quitting", "complete" if complete else "drain timeout")
        # Complete means every record is already here; after a drain timeout the missing ones
        # are in flight on workers, which send them with their final report when they quit.
        runner: Any = self.environment.runner  # the master's, which runs this
        runner.quit()

    def _check_workers(self) -> None:
        runner = self.environment.runner
        assert isinstance(runner, MasterRunner)
        alive = sorted(c.id for c in runner.clients.all if c.state != STATE_MISSING)
        for worker in self.live:
            if worker not in alive:
                self._worker_left(worker)
        live = []
        for worker in alive:
            if worker in self.live:
                live.append(worker)
            elif self.clock_ready(worker):
                bound = self.clock_bound_ns(worker)
                self._event("worker_joined", worker=worker,
                            clock_offset_s=self.clock_offset_ns(worker) / 1e9,
                            clock_error_bound_s=None if bound is None else bound / 1e9)
                live.append(worker)
        self.joining = len(alive) - len(live)
        self.live = live

    def _worker_left(self, worker: str) -> None:
        now = time.time_ns()
        back: list[dict[str, Any]] = []
        lost = 0
        for rid, (owner, item) in list(self.outstanding.items()):
            if owner != worker:
                continue
            del self.outstanding[rid]
            due = self.due_wall_ns(item)
            if item["seq"] not in self.acked and due > now + int(self.tick_s * 2e9):
                if "turns" not in item or self.turns_left.pop(item["seq"], None) is not None:
                    back.append(item)  # a session goes back whole, once
                    self.active.discard(item["seq"])
                continue
            lost += 1
            why = ("in flight when its worker left" if item["seq"] in self.acked
                   else "its worker left before sending it")
            if "turns" in item:  # a session's turn: in flight, or never sent
                self._turn_settled(item)
                turn = next(t for t in item["turns"] if t["rid"] == rid)
                record = unsent_turn_record(
                    item, turn, OUTCOME_WORKER_LOST, f"{why} (its session's worker left)",
                    run_id=self.run_id, worker_id=f"master:{worker}",
                    scheduled_wall_ns=root_scheduled_wall(turn, due))
            else:
                record = _unsent_record(item, OUTCOME_WORKER_LOST, why, run_id=self.run_id,
                                        worker_id=f"master:{worker}", scheduled_wall_ns=due)
            fire_record(self.environment, record)
        for item in sorted(back, key=lambda i: i["off"], reverse=True):
            self.pending.appendleft(item)
        self.counts["released"] += len(back)
        self.counts["worker_lost"] += lost
        self._event("worker_left", worker=worker, released=len(back), lost=lost)
        log.warning("worker %s left: %d requests leased again, %d lost", worker, len(back), lost)

    def _lease_due(self) -> None:
        now = time.time_ns()
        if self.concurrency is not None:
            self._lease_sessions(now)
            return
        if not self.live:
            if self.joining:
                return  # every worker is still on its clock exchange: a moment, not a loss
            while self.pending and self.due_wall_ns(self.pending[0]) < now:
                item = self.pending.popleft()
                self.counts["worker_lost"] += 1
                fire_record(self.environment, _unsent_record(
                    item, OUTCOME_WORKER_LOST, "no live worker", run_id=self.run_id,
                    worker_id="master", scheduled_wall_ns=self.due_wall_ns(item)))
            return
        horizon = now + self.lookahead_ns
        batches: dict[str, list[dict[str, Any]]] = {}
        while self.pending and self.due_wall_ns(self.pending[0]) <= horizon:
            item = self.pending.popleft()
            worker = self.live[self._rr % len(self.live)]
            self._rr += 1
            batches.setdefault(worker, []).append(item)
            self._track(item, worker)
        self._send_batches(batches)

    def _lease_sessions(self, now: int) -> None:
        """Closed plan: lease sessions until ``concurrency`` run at once, each due now."""
        if self.duration_ns is not None and now >= self.t0_wall_ns + self.duration_ns:
            self.pending = deque()  # the schedule's time is over: no new session starts
            return
        if not self.live or now < self.t0_wall_ns:
            return
        batches: dict[str, list[dict[str, Any]]] = {}
        while self.pending and len(self.active) < (self.concurrency or 0):
            item = self.pending.popleft()
            item["off"] = (now - self.t0_wall_ns) * 1e-9
            worker = self.live[self._rr % len(self.live)]
            self._rr += 1
            batches.setdefault(worker, []).append(item)
            self._track(item, worker)
        self._send_batches(batches)

    def _send_batches(self, batches: dict[str, list[dict[str, Any]]]) -> None:
        runner = self.environment.runner
        assert isinstance(runner, MasterRunner)
        for worker, items in batches.items():
            self.counts["leased"] += len(items)
            offset = self.clock_offset_ns(worker)
            # a worker unpacks a message whole, holding its loop: a long lease goes in parts
            for start in range(0, len(items), LEASE_PART_ITEMS):
                runner.send_message(LEASE_MESSAGE, {
                    "t0_wall_ns": self.t0_wall_ns, "clock_offset_ns": offset,
                    "items": items[start:start + LEASE_PART_ITEMS]}, client_id=worker)

    def _event(self, kind: str, **fields: Any) -> None:
        self.events.append({"event": kind, "wall_ns": time.time_ns(), **fields})

    def _write_events(self) -> None:
        if self.run_dir is not None:
            write_json_atomic(self.run_dir / "replay_events.json", self.events, indent=1)


# The pacer wakes this long before a request's planned time, builds its bytes, then waits out
# the rest without yielding: the timerfd's own lateness (tens of microseconds) and the build
# come out of this margin instead of making the send late.
WAKE_EARLY_NS = 60_000
# ... and this long while the loop is kept awake before sends (they are planned far apart, so
# the spin costs little): coming back from a long wait, the same work takes longer (caches
# gone cold). One pinned worker on a 2-core machine at 99 req/s: lag P50 0.023-0.076 ms with
# 60 us, 0.007-0.013 ms with 150 us (docs/results/hotpath/, tenth session)
WAKE_EARLY_AWAKE_NS = 150_000
# The loop polls before sends only while they are planned this many awake times apart or more
AWAKE_SHARE = 4
# While the pacer waits for a send at least this far off and a replica has no connection
# waiting, it opens one ahead: a send that must connect first goes out from a greenlet of its
# own after the connect, late by both (0.3-1.3 ms on the 2-core machines: the late sends of a
# step's first second). Not further off than IDLE_LIMIT_S / 2: the pool would not reuse it.
CONNECT_AHEAD_MIN_NS = 1_000_000
CONNECT_AHEAD_MAX_NS = int(IDLE_LIMIT_S * 1e9 / 2)
# The next sends' bodies are built after a send only while the next is due this far off: three
# bodies take about 40 us (13 us each on the 2-core machines)
BUILD_AHEAD_ROOM_NS = 100_000
# How long a request's record takes to build (build_record): a send due within it goes first
# (make_way); Locust's live entries and the recorder make way again
RECORD_AHEAD_NS = 40_000


def _take_connection(client: Any) -> Any:
    """``client``'s connection for the next send, taken ahead of its time; None if taking it
    failed (the idle one was closed and a new connect failed: the send tries again and records
    what it meets)."""
    try:
        return client.take_connection()
    except (OSError, httpx.HTTPError):
        return None


class WorkerScheduler:
    """Worker (or local) side: send each leased request at its time, read it in a greenlet.

    One pacer greenlet owns the sends: it wakes on a :class:`locustfiles.pacer.Pacer` (timerfd,
    highest loop priority) just before the next planned time, builds the request, waits out
    the last microseconds, journals it and writes it to a kept-alive connection itself, then
    hands the answer to a greenlet of its own. So a send waits neither for a timer's
    millisecond nor behind the streams' reads. With no connection idle, the pacer opens one
    itself when the handshake is over as ``connect`` returns (a near target); a request whose
    connect takes longer, a non-streaming one and a session (turn after turn) go out from a
    greenlet of their own instead, so a slow connect never holds the pacer. Work that holds the
    loop (a read's lines, a record, a batch of records) makes way first
    (:func:`locustfiles.pacer.make_way`): a send due before that work would end goes out at its
    time from that greenlet (behind the schedule, the oldest one only).
    """

    def __init__(self, environment: Environment, ctx: Any, *, in_flight_cap: int = 1000,
                 awake_ns: int = 0,
                 ack_interval_s: float = 0.2) -> None:
        self.environment = environment
        self.ctx = ctx
        self.in_flight_cap = in_flight_cap
        self.awake_ns = awake_ns  # the loop polls (not sleeps) this long before a send
        # only while planned sends are on average AWAKE_SHARE times that far apart: the
        # polling's CPU stays under 1/AWAKE_SHARE of a core, and a busy worker (whose loop
        # rarely sleeps anyway) does not poll at all (at 2,800 req/s on a 2-core host, polling
        # before each send took the CPU the target needed, and the worker fell behind)
        self._gap_ns = 0.0  # the mean gap between planned sends (EWMA)
        self._last_due_ns = 0
        self.ack_interval_s = ack_interval_s
        self.heap: list[tuple[int, int, int, dict[str, Any]]] = []
        self.group = gevent.pool.Group()
        self.wake = gevent.event.Event()
        self.pacer = Pacer()
        self.sent_seqs: list[int] = []
        self.done_seqs: list[int] = []  # sessions over here (a closed plan leases the next)
        # One pairing of the two clocks per process: wall times from the master become
        # monotonic deadlines here, so pacing never follows a wall-clock step.
        self.wall_ref_ns = wall_ns()
        self.mono_ref_ns = time.perf_counter_ns()
        self._greenlets: list[gevent.Greenlet] = []
        # sent by the pacer, not yet picked up by their reading greenlet: recorded at a stop
        self._unread: dict[int, tuple[dict[str, Any], int, int, Any, Any]] = {}
        # the next request's payload and body, built before the pacer sleeps for it (seq ->)
        self._built: dict[int, tuple[dict[str, Any], bytes]] = {}
        self.fired = 0
        self.dropped = 0
        self._sending = False  # _send_until runs (sends go out)
        self._readers: list[int] = []  # _unread keys whose reading greenlet is not spawned yet
        self._connecting: gevent.Greenlet | None = None  # a connection opened ahead

    def start(self) -> None:
        if not self._greenlets:
            self._greenlets = [gevent.spawn(self._run), gevent.spawn(self._ack_loop)]

    def add(self, t0_wall_ns: int, items: list[dict[str, Any]], clock_offset_ns: int = 0) -> None:
        """``t0_wall_ns`` is on the master's clock; ``clock_offset_ns`` is this worker's clock
        minus the master's (measured by the master, ``locustfiles.clock_sync``)."""
        for index, item in enumerate(items):
            due_wall = t0_wall_ns + int(item["off"] * 1e9)  # master clock: what the plan meant
            due_mono = self.mono_ref_ns + (due_wall + clock_offset_ns - self.wall_ref_ns)
            heapq.heappush(self.heap, (due_mono, item["seq"], due_wall, item))
            if index % 16 == 15:  # a lease of thousands of requests holds the loop for ms
                make_way(CHECK_AHEAD_NS)
        self.wake.set()
        armed = self.pacer.armed_ns
        if armed and self.heap and self.heap[0][0] - WAKE_EARLY_NS < armed:
            self.pacer.wake()  # an earlier request than the one the pacer sleeps for
        if armed and not self._sending and self.heap:
            TURN.due_ns = self.heap[0][0]

    def on_lease(self, msg: Any, **_kwargs: Any) -> None:
        self.start()
        self.add(msg.data["t0_wall_ns"], msg.data["items"], msg.data.get("clock_offset_ns", 0))

    def _run(self) -> None:
        perf = time.perf_counter_ns
        heap = self.heap
        TURN.send_due = self._send_until
        while True:
            if not heap:
                TURN.due_ns = 0
                self.wake.clear()
                self.wake.wait()
                continue
            due_mono = heap[0][0]
            awake = self.awake_ns if self._gap_ns >= AWAKE_SHARE * self.awake_ns else 0
            early = WAKE_EARLY_AWAKE_NS if awake else WAKE_EARLY_NS
            if due_mono - perf() > early:
                TURN.due_ns = due_mono  # a greenlet about to hold the loop sends it (make_way)
                self._build_ahead()
                if (self._connecting is None
                        and CONNECT_AHEAD_MIN_NS < due_mono - perf() < CONNECT_AHEAD_MAX_NS
                        and self.ctx.needs_connection() and not self.ctx.connect_at_once()):
                    self._connecting = gevent.spawn(self._connect_ahead)
                TURN.run_spare_work(due_mono - early)
                wake_ns = due_mono - early - awake
                if wake_ns > perf():
                    self.pacer.wait_until(wake_ns)
                elif awake:
                    gevent.sleep(0)  # awake: a turn of the loop (its ready sockets), then again
                # else the builds above took it to its wake time: a wait, even one armed in the
                # past, would let every greenlet ready before the pacer run first
                continue  # an earlier item may have arrived meanwhile
            if self._sending:  # a send made way for went out on a full socket and waits
                gevent.sleep(0)
                continue
            self._send_until(perf() + early)

    def _connect_ahead(self) -> None:
        try:
            self.ctx.connect_ahead()
        finally:
            self._connecting = None

    def _build_ahead(self) -> None:
        """The next requests' bodies (their JSON, the largest part of their bytes) are built
        while the pacer has time, not in the microseconds before the sends: the heap's first
        three (the second due is one of them), so sends due together go out one after the
        other without a build between them."""
        built = self._built
        for _, seq, _, item in self.heap[:3]:
            if seq not in built and "turns" not in item:
                payload = self.ctx.item_payload(item)
                built[seq] = (payload, request_body(payload))

    def _send_until(self, horizon_ns: int) -> None:
        """Send every request due by ``horizon_ns``, each at its time: called by the pacer
        greenlet, or by one about to hold the loop (:func:`locustfiles.pacer.make_way`)."""
        if self._sending:
            return
        self._sending = True
        TURN.due_ns = 0  # make_way does nothing while these go out
        heap = self.heap
        readers = self._readers
        try:
            while heap and heap[0][0] <= horizon_ns:
                due_mono, _, due_wall, item = heapq.heappop(heap)
                gap = due_mono - self._last_due_ns
                if 0 < gap < 1_000_000_000:
                    self._gap_ns += (gap - self._gap_ns) / 64
                self._last_due_ns = due_mono
                self._send_one(item, due_mono, due_wall)
        finally:
            self._sending = False
            TURN.due_ns = heap[0][0] if heap else 0
            # the answers' readers, after the sends: a greenlet's spawn (15 us on the 2-core
            # machines) between two sends due together made the second later by as much
            spawn, read = self.group.spawn, self._read
            for key in readers:
                spawn(read, key)
            readers.clear()
        if heap and heap[0][0] - time.perf_counter_ns() > BUILD_AHEAD_ROOM_NS:
            # sent by a greenlet that made way, the pacer asleep: the next bodies are built
            # here, or the next sends would build their own (a third of them did at 2,000
            # req/s on a 2-core machine)
            self._build_ahead()

    def _send_one(self, item: dict[str, Any], due_mono: int, due_wall: int) -> None:
        # readers not yet spawned (sends due together) or not yet run included
        if len(self.group) + len(self._readers) >= self.in_flight_cap:
            self._built.pop(item["seq"], None)
            self.dropped += 1
            self.sent_seqs.append(item["seq"])  # settled: the master must not re-lease it
            why = f"in-flight cap {self.in_flight_cap} reached"
            if "turns" in item:  # a session: every turn is counted dropped
                self.done_seqs.append(item["seq"])
                for turn in item["turns"]:
                    self._record(unsent_turn_record(
                        item, turn, OUTCOME_DROPPED, why, run_id=self.ctx.settings.run_id,
                        worker_id=self.ctx.worker_id,
                        scheduled_wall_ns=root_scheduled_wall(turn, due_wall)))
                return
            self._record(_unsent_record(
                item, OUTCOME_DROPPED, why,
                run_id=self.ctx.settings.run_id, worker_id=self.ctx.worker_id,
                scheduled_wall_ns=due_wall))
            return
        self.fired += 1
        self.sent_seqs.append(item["seq"])
        if "turns" in item:
            self.group.spawn(self._send_session, item, due_mono, due_wall)
        else:
            self._fire(item, due_mono, due_wall)

    def _fire(self, item: dict[str, Any], due_mono: int, due_wall: int) -> None:
        ctx = self.ctx
        request_id = ctx.request_id(item["rid"])
        built = self._built.pop(item["seq"], None)
        payload, body = built if built is not None else (ctx.item_payload(item), None)
        prepared = ctx.prepare(ENDPOINT_PATHS[item["endpoint"]], payload, request_id, body)
        if prepared.data is None or not (prepared.client.has_idle_connection()
                                         or prepared.client.connect_at_once()):
            # not streamed, or a connect that takes a while: all of it in a greenlet of its own
            self.group.spawn(self._send, item, due_mono, due_wall, prepared, None)
            return
        # journalled before it is sent, as every request; before the wait, so the write's
        # microseconds come out of the early margin, not out of the send's time
        self._journal(item, request_id, due_wall)
        try:
            # the connection too: the pool's check that it is still open is a system call
            connection = _take_connection(prepared.client)
            spin_until(due_mono)
            opened = ctx.send(prepared, connection)
        except gevent.GreenletExit:  # killed as it sent (the run stopped): recorded as such
            self._record(_unsent_record(
                item, OUTCOME_CANCELLED, "run ended as it was sent", run_id=ctx.settings.run_id,
                worker_id=ctx.worker_id, scheduled_wall_ns=due_wall))
            raise
        key = id(opened)
        self._unread[key] = (item, due_mono, due_wall, prepared, opened)
        self._readers.append(key)  # spawned once the sends due with it are out

    def _journal(self, item: dict[str, Any], request_id: str, due_wall: int) -> None:
        self.ctx.note_sent(item["rid"], request_id, item["bucket"], item["endpoint"],
                           item["ptoks"], item["max_tokens"], due_wall)

    def _read(self, key: int) -> None:
        make_way(CHECK_AHEAD_NS)  # the answer's head and first piece are read before a check
        entry = self._unread.pop(key, None)
        if entry is not None:
            item, due_mono, due_wall, prepared, opened = entry
            self._send(item, due_mono, due_wall, prepared, opened)

    def _send_session(self, item: dict[str, Any], due_mono: int, due_wall: int) -> None:
        """A whole session, turn after turn, on this worker (``locustfiles.sessions``)."""
        try:
            SessionRun(self.ctx, item, self._record,
                       live=lambda r: fire_live_stats(self.environment, r)).run(
                due_mono, due_wall)
        finally:
            self.done_seqs.append(item["seq"])

    def _send(self, item: dict[str, Any], due_mono: int, due_wall: int, prepared: Any,
              opened: Any) -> None:
        """Send (unless the pacer did: ``opened``) and read one request; record it."""
        ctx = self.ctx
        request_id = ctx.request_id(item["rid"])
        try:
            if opened is not None:
                timing = ctx.read(prepared, opened)
            else:
                self._journal(item, request_id, due_wall)
                timing = ctx.stream_prepared(prepared)
        except gevent.GreenletExit as exc:
            self._record_cancelled(item, due_mono, due_wall, cancelled_timing(exc))
            raise
        stopped = None
        try:
            make_way(RECORD_AHEAD_NS)  # the record's build and hand-over hold the loop
        except gevent.GreenletExit as exc:  # killed as it sent another's request: still recorded
            stopped = exc
        record = build_record(
            timing, run_id=ctx.settings.run_id, worker_id=ctx.worker_id, request_id=item["rid"],
            bucket=item["bucket"], endpoint=item["endpoint"], target_prompt_tokens=item["ptoks"],
            max_tokens=item["max_tokens"], scheduled_ns=due_mono, scheduled_wall_ns=due_wall,
            http_request_id=request_id,
        )
        try:
            make_way(CHECK_AHEAD_NS)
            fire_live_stats(self.environment, record)
            make_way(CHECK_AHEAD_NS)
        except gevent.GreenletExit as exc:
            stopped = stopped or exc
        self._record(record)
        if stopped is not None:
            raise stopped

    def _record_cancelled(self, item: dict[str, Any], due_mono: int, due_wall: int,
                          cancelled: StreamTiming | None) -> None:
        ctx = self.ctx
        if cancelled is None:  # killed before the request began
            self._record(_unsent_record(
                item, OUTCOME_CANCELLED, "run ended before it was sent",
                run_id=ctx.settings.run_id, worker_id=ctx.worker_id,
                scheduled_wall_ns=due_wall))
        else:
            self._record(build_record(
                cancelled, run_id=ctx.settings.run_id, worker_id=ctx.worker_id,
                request_id=item["rid"], bucket=item["bucket"], endpoint=item["endpoint"],
                target_prompt_tokens=item["ptoks"], max_tokens=item["max_tokens"],
                scheduled_ns=due_mono, scheduled_wall_ns=due_wall,
                http_request_id=ctx.request_id(item["rid"])))

    def _record(self, record: dict[str, Any]) -> None:
        fire_record(self.environment, record)

    def _ack_loop(self) -> None:
        runner = self.environment.runner
        while True:
            gevent.sleep(self.ack_interval_s)
            self.flush_acks(runner)

    def flush_acks(self, runner: Any) -> None:
        if (self.sent_seqs or self.done_seqs) and isinstance(runner, WorkerRunner):
            seqs, self.sent_seqs = self.sent_seqs, []
            done, self.done_seqs = self.done_seqs, []
            runner.send_message(SENT_MESSAGE, {"seqs": seqs, "done": done})
        elif not isinstance(runner, WorkerRunner):
            self.sent_seqs.clear()
            self.done_seqs.clear()

    def stop(self) -> None:
        if TURN.send_due == self._send_until:
            TURN.due_ns, TURN.send_due = 0, None
        for greenlet in [*self._greenlets, self._connecting]:
            if greenlet is not None:
                greenlet.kill(block=False)
        self._greenlets = []
        self.group.kill(block=True, timeout=5)  # in-flight requests are recorded as cancelled
        # sent, but their reading greenlet never ran: cancelled with how long they had waited
        for item, due_mono, due_wall, _prepared, opened in self._unread.values():
            timing = opened.timing
            timing.last_byte_ns = time.perf_counter_ns()
            timing.outcome, timing.error = OUTCOME_CANCELLED, "run ended while in flight"
            self._record_cancelled(item, due_mono, due_wall, timing)
            if opened.sock is not None:
                opened.sock.close()
        self._unread.clear()
        self._built.clear()
        self.flush_acks(self.environment.runner)
