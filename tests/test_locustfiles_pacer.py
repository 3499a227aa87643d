"""The open-loop pacer's timer (locustfiles/pacer.py): never early, woken at once when told."""

from __future__ import annotations

import socket
import sys
import threading
import time
import types

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


def _serve_one_long_answer(events: int) -> tuple[str, threading.Thread]:
    """A server that answers one streaming request with ``events`` content events at once."""
    listener = socket.create_server(("127.0.0.1", 0))
    token = b'data: {"choices":[{"index":0,"text":" t","finish_reason":null}]}\n\n'
    body = token * events + b"data: [DONE]\n\n"
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
              % len(body)) + body

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while not data.endswith(b'{"prompt":"x"}'):
                data += conn.recv(65536)
            conn.sendall(answer)
            conn.recv(1)
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", thread


def test_a_send_due_while_a_long_answer_is_read_goes_out_first_at_its_time(monkeypatch) -> None:
    """Sends ahead of reads: a greenlet reading an answer of 20,000 events holds the event loop
    for many milliseconds, and the pacer's timer cannot end its wait meanwhile. The reader makes
    way (locustfiles.pacer.make_way): the send due meanwhile goes out at its time, before the
    read ends, not after it."""
    from locustfiles.streaming import make_client, stream_request

    url, thread = _serve_one_long_answer(20_000)
    sends: list[tuple[str, int]] = []
    due = [0]
    timer = Pacer()

    def send_due(horizon_ns: int) -> None:  # the scheduler's: spin to the time, then send
        assert horizon_ns >= due[0]
        while time.perf_counter_ns() < due[0]:
            pass
        sends.append(("made way", time.perf_counter_ns()))
        pacer_module.TURN.due_ns = 0

    def the_pacer() -> None:  # what the scheduler's greenlet does: wait on the timer, send
        timer.wait_until(due[0])
        if pacer_module.TURN.due_ns:
            sends.append(("pacer", time.perf_counter_ns()))

    client = make_client(url)
    read_headers = client.response
    waiting = []

    def headers_then_plan_a_send(sock):  # a send due 2 ms after the answer began to come
        response = read_headers(sock)
        due[0] = time.perf_counter_ns() + 2_000_000
        pacer_module.TURN.due_ns = due[0]
        waiting.append(gevent.spawn(the_pacer))
        return response

    monkeypatch.setattr(pacer_module.TURN, "send_due", send_due)
    monkeypatch.setattr(pacer_module.TURN, "due_ns", 0)
    # a batch that begins past the send's time counts as behind only after seconds here: a
    # neighbour's load may keep this process off the CPU for a millisecond at any moment
    monkeypatch.setattr(pacer_module, "BEHIND_NS", 10**10)
    client.response = headers_then_plan_a_send
    timing = stream_request(client, "/v1/completions", {"prompt": "x"})
    read_ended = time.perf_counter_ns()
    waiting[0].join(timeout=5)
    client.close()
    timer.close()
    thread.join(timeout=5)
    assert timing.outcome == "ok" and len(timing.content_ns) == 20_000, timing.error
    assert read_ended > due[0], "the answer was read too fast to test anything"
    assert [who for who, _ in sends] == ["made way"], sends
    assert due[0] <= sends[0][1] < read_ended


def test_behind_its_schedule_a_worker_sends_one_overdue_request_between_two_reads(
        monkeypatch) -> None:
    """Every send due goes ahead of other work while the worker is on time: once a send is
    overdue by BEHIND_NS, every read making way for every overdue send starved the reads (the
    worker fell further behind), and none at all left them to the pacer's turn, after the whole
    backlog of reads: then only the oldest goes, one between two pieces of work."""
    calls: list[int] = []

    def send_due(horizon_ns: int) -> None:  # the scheduler's, with nothing due after
        calls.append(horizon_ns)
        pacer_module.TURN.due_ns = 0

    monkeypatch.setattr(pacer_module.TURN, "send_due", send_due)
    now = time.perf_counter_ns()
    overdue = now - 2 * pacer_module.BEHIND_NS
    monkeypatch.setattr(pacer_module.TURN, "due_ns", overdue)
    pacer_module.make_way(100_000)
    assert calls == [overdue]  # sends up to the oldest's time only, not up to the work's end
    calls.clear()
    monkeypatch.setattr(pacer_module.TURN, "due_ns", now + 50_000_000)  # far beyond the work
    pacer_module.make_way(100_000)
    assert calls == []
    monkeypatch.setattr(pacer_module.TURN, "due_ns", time.perf_counter_ns() + 50_000)
    pacer_module.make_way(10_000_000)  # due before the work would end
    assert len(calls) == 1


def test_a_send_due_before_the_work_ends_counted_after_the_sends_goes_out_too(
        monkeypatch) -> None:
    """A check before 50 us of work sends what is due by then; the sends take time (80 us each
    on the 2-core machines) and the work starts only after them. A send that falls due within
    50 us of the last send's end went out at the next check, after the work: it goes now."""
    plan = [time.perf_counter_ns() + 20_000, 0, 0]  # due in 20 us; the next ones 60 us after
    plan[1] = plan[0] + 60_000  # each send's end (80 us) + the work (50 us) is past this
    # ... and not past this one: it waits for the next check. 50 ms off, not 0.5 ms: a loaded
    # 2-core CI machine once paused this process for over 0.4 ms inside the sends
    plan[2] = plan[1] + 50_000_000
    sent: list[int] = []

    def send_due(horizon_ns: int) -> None:  # the scheduler's: each due by horizon, 80 us each
        while plan and plan[0] <= horizon_ns:
            due = plan.pop(0)
            while time.perf_counter_ns() < due + 80_000:
                pass
            sent.append(due)
        pacer_module.TURN.due_ns = plan[0] if plan else 0

    monkeypatch.setattr(pacer_module.TURN, "send_due", send_due)
    monkeypatch.setattr(pacer_module.TURN, "due_ns", plan[0])
    monkeypatch.setattr(pacer_module, "BEHIND_NS", 10**10)  # a slow neighbour is not behind
    first, second = plan[0], plan[1]
    pacer_module.make_way(50_000)
    assert sent == [first, second]  # the third is 50 ms off: not before this work's end


def test_spare_work_runs_only_when_it_ends_before_the_next_send(monkeypatch) -> None:
    ran: list[str] = []
    monkeypatch.setattr(pacer_module.TURN, "spare_work", [
        (lambda: 0, lambda until: ran.append("nothing to do")),
        (lambda: 5_000_000, lambda until: ran.append("5 ms")),
        (lambda: 50_000, lambda until: ran.append(f"50 us, until {until}")),
    ])
    # the clock stands still: a loaded machine that paused this process for 1 ms between
    # reading the time here and the check would leave no room for the 50 us piece either
    now = time.perf_counter_ns()
    monkeypatch.setattr(pacer_module.time, "perf_counter_ns", lambda: now)
    until = now + 1_000_000  # 1 ms to the send
    pacer_module.TURN.run_spare_work(until)
    assert ran == [f"50 us, until {until}"]


def test_the_pacer_builds_the_next_request_bodies_before_it_sleeps_for_them(
        monkeypatch) -> None:
    """The JSON body is the largest part of a request's bytes: built while the pacer has time,
    so the microseconds before the send hold only its head and the write. Not only the next
    request's: two sends due together went out one build apart (the second one 10-20 us later
    on the 2-core machines), so the heap's first three are built (the second due is one of
    them), and no other."""
    from locustfiles.clock_sync import wall_ns
    from locustfiles.replay import WorkerScheduler

    class _Context:
        def item_payload(self, item):
            return {"prompt": item["prompt"], "stream": True}

    monkeypatch.setattr(pacer_module.TURN, "send_due", None)
    monkeypatch.setattr(pacer_module.TURN, "due_ns", 0)
    monkeypatch.setattr(pacer_module.TURN, "spare_work", [])
    scheduler = WorkerScheduler(types.SimpleNamespace(runner=None), _Context())
    # due in 30 s (two together), 31 s and 40 s
    scheduler.add(wall_ns(), [{"seq": seq, "off": off, "prompt": f"p{seq}"}
                              for seq, off in ((7, 30.0), (8, 30.0), (9, 31.0), (10, 40.0))])
    pacing = gevent.spawn(scheduler._run)
    try:
        gevent.sleep(0.05)
        assert scheduler._built == {
            seq: ({"prompt": f"p{seq}", "stream": True},
                  b'{"prompt":"p%d","stream":true}' % seq) for seq in (7, 8, 9)}
        assert pacer_module.TURN.due_ns == scheduler.heap[0][0]  # asleep until it is due
    finally:
        pacing.kill()
        scheduler.pacer.close()


class _SendingContext:
    """The open-loop scheduler's context, as far as a send goes: each call logged in order."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.client = types.SimpleNamespace(has_idle_connection=lambda: True,
                                            take_connection=lambda: None)

    def request_id(self, rid):
        return rid

    def item_payload(self, item):
        return {"prompt": "x", "stream": True}

    def prepare(self, path, payload, request_id, body):
        return types.SimpleNamespace(client=self.client, data=b"bytes")

    def note_sent(self, rid, *_args):
        self.log.append(f"journal {rid}")

    def send(self, prepared, connection):
        self.log.append("send")
        return object()


def test_sends_due_together_go_out_before_any_of_their_readers_is_spawned(monkeypatch) -> None:
    """Spawning a send's reading greenlet took 15 us on the 2-core machines: between two sends
    due together it made the second later by as much. The readers are spawned once the sends
    due are out (they could run no earlier: the loop is held until then); every answer is still
    read."""
    from locustfiles.replay import WorkerScheduler

    log: list[str] = []
    monkeypatch.setattr(pacer_module.TURN, "due_ns", 0)
    scheduler = WorkerScheduler(types.SimpleNamespace(runner=None), _SendingContext(log))
    monkeypatch.setattr(scheduler, "_read", lambda key: log.append("read"))
    spawn = scheduler.group.spawn
    monkeypatch.setattr(scheduler.group, "spawn",
                        lambda *args: (log.append("spawn"), spawn(*args))[1])
    now = time.perf_counter_ns()
    for seq in range(3):
        item = {"seq": seq, "rid": f"r{seq}", "endpoint": "completions", "bucket": "short",
                "ptoks": 1, "max_tokens": 1}
        scheduler.heap.append((now, seq, 0, item))  # all due now, in order (a valid heap)
    later = {"seq": 3, "rid": "r3", "endpoint": "completions", "bucket": "short", "ptoks": 1,
             "max_tokens": 1}
    scheduler.heap.append((now + 30 * 10**9, 3, 0, later))  # due in 30 s
    scheduler._send_until(now)
    assert log == ["journal r0", "send", "journal r1", "send", "journal r2", "send",
                   "spawn", "spawn", "spawn"]
    # the pacer may not wake before the next send is due (a greenlet that made way sent
    # these): its body is built now, while there is time
    assert list(scheduler._built) == [3]
    scheduler.group.join(timeout=1)
    assert log[-3:] == ["read"] * 3 and [entry[1] for entry in scheduler.heap] == [3]
    scheduler.pacer.close()


def test_a_pacer_whose_builds_took_it_past_its_wake_time_sends_without_waiting(
        monkeypatch) -> None:
    """A wait on the timer, even one armed in the past, lets every greenlet already ready run
    first (hundreds of microseconds of reads at 2,000 req/s): a pacer whose bodies took it past
    its wake time goes on to the send."""
    from locustfiles.clock_sync import wall_ns
    from locustfiles.replay import WorkerScheduler

    log: list[str] = []
    monkeypatch.setattr(pacer_module.TURN, "due_ns", 0)
    monkeypatch.setattr(pacer_module.TURN, "spare_work", [])
    scheduler = WorkerScheduler(types.SimpleNamespace(runner=None), _SendingContext(log))
    monkeypatch.setattr(scheduler, "_read", lambda key: None)

    def slow_builds() -> None:  # the bodies take 2 ms this once
        end = time.perf_counter_ns() + 2_000_000
        while time.perf_counter_ns() < end:
            pass

    waits: list[int] = []
    wait_until = scheduler.pacer.wait_until
    monkeypatch.setattr(scheduler, "_build_ahead", slow_builds)
    monkeypatch.setattr(scheduler.pacer, "wait_until",
                        lambda t_ns: (waits.append(t_ns - time.perf_counter_ns()),
                                      wait_until(t_ns))[1])
    scheduler.add(wall_ns(), [{"seq": 0, "off": 0.001, "rid": "r0", "endpoint": "completions",
                               "bucket": "short", "ptoks": 1, "max_tokens": 1}])  # in 1 ms
    pacing = gevent.spawn(scheduler._run)
    try:
        gevent.sleep(0.05)
        assert log == ["journal r0", "send"]
        assert all(left > 0 for left in waits), waits  # never a wait for a time gone by
    finally:
        pacing.kill()
        scheduler.pacer.close()


def test_an_awake_pacer_polls_the_loop_before_a_send_and_other_greenlets_still_run(
        monkeypatch) -> None:
    """``pacer_awake_us``: within that time of a send the pacer does not sleep on its timer (a
    sleeping CPU may wake late) but turns the loop, so every other greenlet keeps running."""
    import types

    from locustfiles.clock_sync import wall_ns
    from locustfiles.replay import WorkerScheduler

    class _Context:
        def item_payload(self, item):
            return {"prompt": "x", "stream": True}

    monkeypatch.setattr(pacer_module.TURN, "send_due", None)
    monkeypatch.setattr(pacer_module.TURN, "due_ns", 0)
    monkeypatch.setattr(pacer_module.TURN, "spare_work", [])
    scheduler = WorkerScheduler(types.SimpleNamespace(runner=None), _Context(),
                                awake_ns=60 * 10**9)
    scheduler._gap_ns = 4 * 60e9  # sends planned far apart: the whole awake time is polled
    scheduler.add(wall_ns(), [{"seq": 1, "off": 30.0}])  # due in 30 s: within the awake time
    pacing = gevent.spawn(scheduler._run)
    ticks = []
    try:
        for _ in range(20):
            gevent.sleep(0.005)
            ticks.append(scheduler.pacer.armed_ns)
        assert ticks == [0] * 20  # never asleep on its timer, and this greenlet ran meanwhile
        assert pacer_module.TURN.due_ns == scheduler.heap[0][0]
    finally:
        pacing.kill()
        scheduler.pacer.close()


class _ConnectingContext:
    """The open-loop scheduler's context, as far as connections go: none idle until one is
    opened, at once (``at_once``: a near target) or by ``connect_ahead`` (a greenlet: a connect
    that takes a while)."""

    def __init__(self, at_once: bool) -> None:
        self.at_once, self.idle, self.opened_at_once, self.connects = at_once, False, 0, 0

    def item_payload(self, item):
        return {"prompt": "x", "stream": True}

    def needs_connection(self):
        return not self.idle

    def connect_at_once(self):
        if self.at_once:
            self.opened_at_once += 1
            self.idle = True
        return self.at_once

    def connect_ahead(self):
        gevent.sleep(0.01)  # a connect takes a while: asked for once meanwhile
        self.connects += 1
        self.idle = True


def _pace_a_while(monkeypatch, ctx: _ConnectingContext, off_s: float) -> None:
    """The scheduler's loop for 0.1 s, with one send planned ``off_s`` from now."""
    import types

    from locustfiles.clock_sync import wall_ns
    from locustfiles.replay import WorkerScheduler

    monkeypatch.setattr(pacer_module.TURN, "send_due", None)
    monkeypatch.setattr(pacer_module.TURN, "due_ns", 0)
    monkeypatch.setattr(pacer_module.TURN, "spare_work", [])
    scheduler = WorkerScheduler(types.SimpleNamespace(runner=None), ctx)
    scheduler.add(wall_ns(), [{"seq": 1, "off": off_s}])
    pacing = gevent.spawn(scheduler._run)
    try:
        gevent.sleep(0.1)
    finally:
        pacing.kill()
        scheduler.pacer.close()


def test_a_waiting_pacer_opens_a_connection_ahead_of_its_next_send(monkeypatch) -> None:
    """A send that must connect first goes out late (from a greenlet of its own, after the
    connect): while the pacer waits for one within the pool's idle limit and a replica has no
    connection waiting, it opens one, once."""
    far, near = _ConnectingContext(at_once=False), _ConnectingContext(at_once=False)
    _pace_a_while(monkeypatch, far, 30.0)  # beyond the idle limit
    _pace_a_while(monkeypatch, near, 0.5)  # within it
    assert far.connects == 0  # it would no longer be reused when the send comes
    assert near.connects == 1 and near.idle


def test_a_connection_that_opens_at_once_is_opened_by_the_pacer_itself(monkeypatch) -> None:
    """A target whose handshake is over when connect returns (this host, the next one) gets its
    connection from the pacer, without a greenlet: one spawned starts only after every greenlet
    already ready, hundreds of milliseconds on a worker near its ceiling."""
    ctx = _ConnectingContext(at_once=True)
    _pace_a_while(monkeypatch, ctx, 0.5)
    assert ctx.opened_at_once == 1 and ctx.connects == 0 and ctx.idle
