"""The worker side of collectors.request_recorder: records leave in small batches (serialising a
big batch blocks the loop that timestamps tokens) and none is lost or duplicated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from locust.runners import WorkerRunner

from collectors.request_recorder import RECORDS_KEY, RequestRecorder


class _Worker(WorkerRunner):
    """A WorkerRunner that only collects what it would send (no ZeroMQ, no master)."""

    def __init__(self) -> None:  # the real one connects to a master
        self.sent_messages: list[tuple[str, Any]] = []
        self.greenlet = None  # Runner.__del__ reads it

    def send_message(self, msg_type: str, data: Any = None, client_id: str | None = None) -> None:
        self.sent_messages.append((msg_type, data))


class _Env:
    def __init__(self) -> None:
        self.runner = _Worker()


def test_worker_sends_records_in_small_batches_and_the_rest_on_the_report() -> None:
    env = _Env()
    recorder = RequestRecorder(env, None)  # type: ignore[arg-type]
    for i in range(300):
        recorder.on_record({"request_id": f"r{i}", "worker_id": "w0", "ttft_s": 0.01 * i})
    batches = [data for kind, data in env.runner.sent_messages if kind == RECORDS_KEY]
    assert [len(b["request_id"]) for b in batches] == [128, 128]
    report: dict[str, Any] = {}
    recorder.on_report_to_master("w0", report)
    ids = [i for b in batches for i in b["request_id"]] + report[RECORDS_KEY]["request_id"]
    assert ids == [f"r{i}" for i in range(300)]
    assert recorder.sent == 300
    report = {}
    recorder.on_report_to_master("w0", report)
    assert RECORDS_KEY not in report  # nothing twice


def test_while_a_pacer_has_spare_time_full_batches_wait_for_it_and_then_go_whole() -> None:
    """Serialising a batch holds the loop for about a millisecond: while the open-loop
    scheduler paces sends (``spare_time``), a full batch waits until it runs it between two
    sends (``batch_cost_ns`` says how long it takes); only a worker with no spare time for
    several batches sends one without waiting. No record is lost or sent twice."""
    from collectors.request_recorder import SPARE_TIME_BATCHES

    env = _Env()
    recorder = RequestRecorder(env, None)  # type: ignore[arg-type]
    recorder.spare_time = lambda: True
    for i in range(200):
        recorder.on_record({"request_id": f"r{i}", "worker_id": "w0"})
    assert env.runner.sent_messages == []  # full, but waiting for a gap
    assert recorder.batch_cost_ns() >= 200 * 1_000
    recorder.send_spare_batch()
    assert recorder.batch_cost_ns() == 0  # nothing waits: a gap passes it by
    for i in range(200, 200 + SPARE_TIME_BATCHES * 128):
        recorder.on_record({"request_id": f"r{i}", "worker_id": "w0"})
    sizes = [len(data["request_id"]) for kind, data in env.runner.sent_messages]
    assert sizes == [200, SPARE_TIME_BATCHES * 128]  # no gap came: sent at the limit
    ids = [i for _, data in env.runner.sent_messages for i in data["request_id"]]
    assert ids == [f"r{i}" for i in range(200 + SPARE_TIME_BATCHES * 128)]


def test_the_batch_cost_is_learnt_from_what_batches_took() -> None:
    import time as time_module

    class _SlowWorker(_Worker):
        def send_message(self, msg_type: str, data: Any = None,
                         client_id: str | None = None) -> None:
            end = time_module.thread_time_ns() + 3_000_000  # 3 ms of CPU for 128 records
            while time_module.thread_time_ns() < end:
                pass
            super().send_message(msg_type, data)

    env = _Env()
    env.runner = _SlowWorker()
    recorder = RequestRecorder(env, None)  # type: ignore[arg-type]
    asked: list[int] = []
    recorder.before_batch = asked.append
    for i in range(256):
        recorder.on_record({"request_id": f"r{i}", "worker_id": "w0"})
    assert len(asked) == 2
    assert asked[0] == 128 * 3_000  # the first guess
    assert asked[1] >= 2_900_000  # then what the first batch took


class _Clock:
    """A CPU's clock for the recorder (``time.perf_counter_ns`` and ``time.thread_time_ns``):
    it moves only as work is done, so the test reads the same on a loaded machine."""

    def __init__(self) -> None:
        self.now_ns = 1_000_000_000

    def __call__(self) -> int:
        return self.now_ns


class _TimedWorker(_Worker):
    """Serialising costs 20 us a record, as on a slow core with long records."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self.clock = clock

    def send_message(self, msg_type: str, data: Any = None, client_id: str | None = None) -> None:
        self.clock.now_ns += 20_000 * len(data["request_id"])
        super().send_message(msg_type, data)


class _Sends:
    """Planned sends 1 ms apart, made way for as locustfiles.pacer.make_way does: each one due
    by the horizon goes out at its time (the caller waits for it), and its lateness is noted."""

    def __init__(self, clock: _Clock, first_in_ns: int) -> None:
        self.clock = clock
        self.due_ns = clock() + first_in_ns
        self.late_ns: list[int] = []

    def room_ns(self) -> int:
        return self.due_ns - self.clock() - 50_000

    def make_way(self, ahead_ns: int) -> None:
        horizon = self.clock() + ahead_ns
        while self.due_ns <= horizon:
            self.clock.now_ns = max(self.clock(), self.due_ns)
            self.send()

    def send(self) -> None:
        self.late_ns.append(self.clock() - self.due_ns)
        self.due_ns += 1_000_000

    def catch_up(self) -> None:
        """After the work: the sends it held past their time go out now, late."""
        while self.due_ns <= self.clock():
            self.send()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    import time as time_module

    clock = _Clock()
    monkeypatch.setattr(time_module, "perf_counter_ns", clock)
    monkeypatch.setattr(time_module, "thread_time_ns", clock)
    return clock


@pytest.mark.parametrize("spare_time", [True, False])
def test_a_batch_that_cannot_wait_goes_in_pieces_between_the_sends(
        clock: _Clock, spare_time: bool) -> None:
    """A full batch of 256 records at 20 us each holds the loop for 5 ms; sends planned 1 ms
    apart (``room_ns``) would wait for it, up to 5 ms late. In pieces that fit the room before
    each send, and with a send due before a piece could end going first, none is held at all.
    Every record leaves once, in order."""
    env = _Env()
    env.runner = _TimedWorker(clock)
    recorder = RequestRecorder(env, None)  # type: ignore[arg-type]
    recorder.batch_ns_per_record = 20_000.0  # as learnt from earlier batches
    sends = _Sends(clock, first_in_ns=300_000)
    recorder.room_ns = sends.room_ns
    recorder.before_batch = sends.make_way
    recorder.spare_time = lambda: spare_time  # no gap came (True) or no spare time at all
    count = 256 if spare_time else 128
    for i in range(count):
        recorder.on_record({"request_id": f"r{i}", "worker_id": "w0"})
    sends.catch_up()
    sizes = [len(data["request_id"]) for _, data in env.runner.sent_messages]
    assert sum(sizes) == count and len(sizes) >= 3
    ids = [i for _, data in env.runner.sent_messages for i in data["request_id"]]
    assert ids == [f"r{i}" for i in range(count)]
    assert len(sends.late_ns) >= count * 20_000 // 1_000_000  # the work took that long
    assert max(sends.late_ns) == 0, sends.late_ns


def test_a_send_overdue_goes_between_pieces_of_the_smallest_size(clock: _Clock) -> None:
    """A worker behind its schedule (the next send overdue) still sends the records that
    cannot wait: in pieces of MIN_PIECE_RECORDS, each after the send that made way."""
    from collectors.request_recorder import MIN_PIECE_RECORDS

    env = _Env()
    env.runner = _TimedWorker(clock)
    recorder = RequestRecorder(env, None)  # type: ignore[arg-type]
    recorder.batch_ns_per_record = 20_000.0
    asked: list[int] = []
    recorder.room_ns = lambda: -1_000_000  # 1 ms behind, whatever is sent
    recorder.before_batch = asked.append
    for i in range(128):
        recorder.on_record({"request_id": f"r{i}", "worker_id": "w0"})
    sizes = [len(data["request_id"]) for _, data in env.runner.sent_messages]
    assert sizes == [MIN_PIECE_RECORDS] * (128 // MIN_PIECE_RECORDS)
    assert len(asked) == len(sizes)


def test_in_spare_time_a_batch_goes_whole_or_waits(clock: _Clock) -> None:
    """Spare time takes a batch only whole: pieces filling a gap to its edge leave no slack
    for a cost above its estimate, and the next send would be late by that."""
    env = _Env()
    env.runner = _TimedWorker(clock)
    recorder = RequestRecorder(env, None)  # type: ignore[arg-type]
    recorder.batch_ns_per_record = 20_000.0
    recorder.spare_time = lambda: True
    for i in range(200):
        recorder.on_record({"request_id": f"r{i}", "worker_id": "w0"})
    assert env.runner.sent_messages == []
    assert recorder.batch_cost_ns() == 200 * 20_000
    recorder.send_spare_batch(clock() + 1_000_000)  # 1 ms of spare time: not enough
    assert env.runner.sent_messages == [] and recorder.buffer.size == 200
    until = clock() + 5_000_000
    recorder.send_spare_batch(until)
    assert [len(data["request_id"]) for _, data in env.runner.sent_messages] == [200]
    assert clock() <= until


def test_the_records_go_ahead_of_the_report_in_pieces_while_sends_are_planned() -> None:
    env = _Env()
    recorder = RequestRecorder(env, None)  # type: ignore[arg-type]
    recorder.room_ns = lambda: 200_000  # 0.2 ms to the next send
    for i in range(100):
        recorder.on_record({"request_id": f"r{i}", "worker_id": "w0"})
    report: dict[str, Any] = {}
    recorder.on_report_to_master("w0", report)
    assert RECORDS_KEY not in report
    sizes = [len(data["request_id"]) for _, data in env.runner.sent_messages]
    assert sum(sizes) == 100 and max(sizes) <= 200_000 // 3_000


REPO_ROOT = Path(__file__).resolve().parent.parent
_SENDER = """
import os, sys
from locust.rpc import Message
from locust.rpc.zmqrpc import Client
from collectors.request_recorder import flush_to_master
client = Client("127.0.0.1", int(sys.argv[1]), "worker-x")
for i in range(200):
    client.send(Message("swarmload_records", {"i": i, "pad": "x" * 1000}, "worker-x"))
print("queued", flush=True)
if sys.argv[2] == "flush":
    flush_to_master(client)
os._exit(0)  # as an exiting process leaves pyzmq's I/O thread
"""


@pytest.mark.parametrize("flush", ["flush", "no-flush"])
def test_a_worker_exits_only_once_its_last_messages_have_left(flush: str) -> None:
    """Locust leaves a worker's socket to the master open at exit, and what pyzmq has not sent
    by then is lost (a worker's last report, seen lost on a loaded CI machine):
    ``flush_to_master`` holds the exit until it has left. Here the master's socket is bound
    only after the worker has queued its messages, so what the exit does is all that
    decides."""
    import subprocess
    import sys
    import time

    import zmq

    from infra.ports import free_port

    port = free_port()
    sender = subprocess.Popen([sys.executable, "-c", _SENDER, str(port), flush], cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Bound once the sender has queued its messages, not after a fixed sleep: on a loaded
    # machine the sender's start took longer than the sleep and the first poll together, so the
    # master had stopped listening before anything was queued, and the test read 0 of 200.
    said = ""
    for said_line in sender.stdout:  # type: ignore[union-attr]  # ends when the sender does
        said += said_line
        if said_line == "queued\n":
            break
    assert said.endswith("queued\n"), said[-2000:]
    if flush == "flush":
        time.sleep(0.5)  # the exit is holding them now: FLUSH_LINGER_S (2 s) leaves 1.5 s
    else:
        out = sender.communicate(timeout=60)[0]  # gone before anyone listens
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{port}")
    received = 0
    try:
        while router.poll(3000 if received < 200 else 200):
            router.recv_multipart()
            received += 1
    finally:
        router.close(linger=0)
        context.term()
    if flush == "flush":
        out = sender.communicate(timeout=60)[0]
    assert sender.returncode == 0, out[-2000:]
    assert received == (200 if flush == "flush" else 0)
