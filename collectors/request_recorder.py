"""Per-request records from every Locust process into one run folder, as Parquet.

A Locust plugin (``register(environment)``), in the manner of ``locust/contrib``:

- Users fire ``environment.events.swarmload_record`` with ``record=<dict of REQUEST_SCHEMA>``.
- On a **worker**, records are buffered column by column and go to the master in small batches:
  every ``max_buffered_records`` records (128) as a ``swarmload_records`` message, the rest on
  Locust's own periodic stats report (``report_to_master``, every 3 s, and once more when the
  worker quits). Small batches because serialising a batch blocks the worker's event loop, which
  is also the loop that timestamps tokens: 6,000 records (3 s at 2,000 req/s) took 20 ms to
  msgpack, 128 take about 0.4 ms (docs/BENCHMARKS.md). Memory stays bounded whatever the rate.
- On the **master** (or a local, non-distributed runner), batches go to a
  :class:`~collectors.parquet_sink.RollingParquetWriter` under ``<run_dir>/requests/`` which
  writes a closed part file every ``flush_interval_s``; the run can be read while it goes on.
- Counts (records received per worker) are kept in ``recorder_stats`` so the orchestrator can
  check that nothing was lost.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
from locust.env import Environment
from locust.event import EventHook
from locust.rpc import Message
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner

from collectors.atomic import write_json_atomic
from collectors.parquet_sink import RollingParquetWriter, arrow_with_pandas
from collectors.schemas import REQUEST_SCHEMA, REQUESTS_TABLE

log = logging.getLogger(__name__)

# The recorder's event, message and report key, each with its arguments as Locust declares its
# hooks (locust/event.py); locustfiles/events.py says in full who fires the event and when.
RECORD_EVENT = "swarmload_record"
"""Custom event on ``environment.events``, created by :func:`register` when missing.
Arguments: ``record``, one ``REQUEST_SCHEMA`` row as a dict. Fired once per request when its
outcome is final (by the user, the worker's replay scheduler or the master's replay dispatcher)."""
RECORDS_KEY = "swarmload_records"
FINAL_KEY = "swarmload_final"  # a worker's report sent after its test stopped: its last records
FINAL_REPORT_WAIT_S = 10.0
FLUSH_LINGER_S = 2.0  # a worker's exit waits this long at most for its last messages to leave
REPORT_RECORDS = 64  # what Locust's own part of a report costs to serialise, in records
# What serialising one record into a batch costs at first (CPU ns); then what batches took
BATCH_NS_PER_RECORD = 3_000
BATCH_NS_PER_RECORD_MAX = 50_000  # a learnt cost is held under this
# A worker whose sender takes batches in its spare time (``spare_time``) holds up to this many
# batches before it sends one at once (an overloaded worker has no spare time)
SPARE_TIME_BATCHES = 2
# Records that cannot wait for a gap (SPARE_TIME_BATCHES) while open-loop sends are planned
# leave in pieces, each sized to the room before the next send, of at least this many records
# (about 30-100 us of serialising): a send due before such a piece ends goes first. Whole, such
# batches held the loop for 1.4-4.9 ms at 2,000 req/s on a 2-core machine, and the sends due
# meanwhile went out that late; a message costs about 3 us more than its records
MIN_PIECE_RECORDS = 16
"""Worker -> master, two ways with the same ``data``, ``{column: [value, ...]}`` over
``REQUEST_SCHEMA``'s columns: as a message every ``max_buffered_records`` records, and as a key of
Locust's ``report_to_master`` data (every 3 s and once when the worker quits) for the rest."""
COLUMNS = tuple(REQUEST_SCHEMA.names)


class _ColumnBuffer:
    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in COLUMNS}
        self.size = 0

    def add(self, record: dict[str, Any]) -> None:
        for name, column in self.columns.items():
            column.append(record.get(name))
        self.size += 1

    def take(self, count: int | None = None) -> dict[str, list[Any]] | None:
        """The oldest ``count`` records (all of them by default), as columns."""
        if not self.size:
            return None
        if count is not None and count < self.size:
            columns = {name: column[:count] for name, column in self.columns.items()}
            self.columns = {name: column[count:] for name, column in self.columns.items()}
            self.size -= count
            return columns
        columns = self.columns
        self.columns = {name: [] for name in COLUMNS}
        self.size = 0
        return columns


class RequestRecorder:
    def __init__(
        self,
        environment: Environment,
        run_dir: str | os.PathLike[str] | None,
        *,
        flush_interval_s: float = 2.0,
        max_buffered_records: int = 128,
    ) -> None:
        self.environment = environment
        self.run_dir = Path(run_dir) if run_dir else None
        self.flush_interval_s = flush_interval_s
        self.max_buffered_records = max_buffered_records
        self.buffer = _ColumnBuffer()
        self.sink: RollingParquetWriter | None = None
        self.received_by_worker: dict[str, int] = {}
        self.received = 0
        # () -> {client id: {host, offset_s, rtt_s, ...}}: locustfiles.clock_sync's estimates
        self.clock_report: Any = None
        self.master_host = socket.gethostname()
        self.batch_listeners: list[Any] = []  # called with each stored column batch
        self.sent = 0
        self.users_stopped = False  # worker: its test stopped (see on_report_to_master)
        self.final_reports: set[str] = set()  # master: workers whose last report came
        self.compact_every_s = 0.0  # soak mode: merge part files this often (0: never)
        self._flusher: gevent.Greenlet | None = None
        # worker: called with how long (ns) serialising the next batch will hold the event
        # loop: the open-loop scheduler sends what is due by then first
        self.before_batch: Callable[[int], None] | None = None
        # that estimate per record: the CPU time batches took, rising at once, falling slowly
        self.batch_ns_per_record = float(BATCH_NS_PER_RECORD)
        # worker: () -> True while something calls send_spare_batch between its own deadlines
        # (the open-loop scheduler): full batches wait for it (batch_cost_ns says how long)
        self.spare_time: Callable[[], bool] = lambda: False
        # worker: () -> how long (ns) the loop is free before the open-loop scheduler's next
        # send, None while none is planned: a batch that cannot wait goes in pieces that fit
        self.room_ns: Callable[[], int | None] = lambda: None

    # worker and local side -------------------------------------------------------------
    def on_record(self, record: dict[str, Any], **_kwargs: Any) -> None:
        runner = self.environment.runner
        if isinstance(runner, WorkerRunner):
            self.buffer.add(record)
            size = self.buffer.size
            if size >= self.max_buffered_records and (
                    size >= SPARE_TIME_BATCHES * self.max_buffered_records
                    or not self.spare_time()):
                self._send_batch(runner)
        else:
            self._store({name: [record.get(name)] for name in COLUMNS})

    def batch_cost_ns(self) -> int:
        """How long sending the full batch that waits would hold the loop (0: none waits)."""
        size = self.buffer.size
        return int(size * self.batch_ns_per_record) if size >= self.max_buffered_records else 0

    def send_spare_batch(self, until_ns: int | None = None) -> None:
        """Send the batch that waits (:meth:`batch_cost_ns`), in someone's spare time: with
        ``until_ns`` (``time.perf_counter_ns``), only if it ends by then."""
        runner = self.environment.runner
        if isinstance(runner, WorkerRunner) and self.buffer.size:
            self._send_batch(runner, until_ns)

    def _send_batch(self, runner: WorkerRunner, until_ns: int | None = None) -> None:
        """Send every waiting record; while open-loop sends are planned, in pieces that fit the
        room before the next send, a send due before the next piece could end going first
        (``before_batch``). With ``until_ns`` (spare time), whole if it ends by then, else
        not at all."""
        perf = time.perf_counter_ns
        while self.buffer.size:
            size = self.buffer.size
            per_record = self.batch_ns_per_record
            room = until_ns - perf() if until_ns is not None else self.room_ns()
            if room is None:  # no send planned: all at once
                piece = size
                if self.before_batch is not None:
                    self.before_batch(int(size * per_record))
            else:
                fits = int(room // per_record)
                if until_ns is not None and fits < size:
                    return  # spare time: whole or not at all (a gap filled to its edge by
                    # pieces left no slack for a cost above its estimate: sends late by that)
                if fits < MIN_PIECE_RECORDS:
                    if self.before_batch is not None:  # the send due first goes first
                        self.before_batch(int(MIN_PIECE_RECORDS * per_record))
                    room = self.room_ns()
                    fits = size if room is None else int(room // per_record)
                piece = min(size, max(fits, MIN_PIECE_RECORDS))
            columns = self.buffer.take(piece)
            start_ns = time.thread_time_ns()  # CPU time: a descheduled worker is not slow
            self.sent += piece
            runner.send_message(RECORDS_KEY, columns)
            self._learn_batch_cost((time.thread_time_ns() - start_ns) / piece)

    def _learn_batch_cost(self, ns_per_record: float) -> None:
        known = self.batch_ns_per_record
        learnt = ns_per_record if ns_per_record > known else 0.9 * known + 0.1 * ns_per_record
        self.batch_ns_per_record = min(learnt, BATCH_NS_PER_RECORD_MAX)

    def on_report_to_master(self, client_id: str, data: dict[str, Any], **_kwargs: Any) -> None:
        runner = self.environment.runner
        if (self.buffer.size and isinstance(runner, WorkerRunner)
                and self.room_ns() is not None):
            # sends are planned: the records go ahead of the report, in pieces between sends
            # (the same socket: the master has them before the report, a last one included)
            self._send_batch(runner)
        if self.before_batch is not None:  # Locust serialises the report with the records
            self.before_batch(int((self.buffer.size + REPORT_RECORDS) * self.batch_ns_per_record))
        columns = self.buffer.take()
        if columns:
            self.sent += len(columns["request_id"])
            data[RECORDS_KEY] = columns
        if self.users_stopped:
            # after the test stopped here no request starts: this report holds the last records
            data[FINAL_KEY] = True

    def on_worker_test_stop(self, **_kwargs: Any) -> None:
        self.users_stopped = True  # its users are stopped, the cancelled ones recorded

    def on_worker_test_start(self, **_kwargs: Any) -> None:
        self.users_stopped = False

    # master and local side -------------------------------------------------------------
    def on_worker_report(self, client_id: str, data: dict[str, Any], **_kwargs: Any) -> None:
        columns = data.get(RECORDS_KEY)
        if columns:
            self._store(columns)
        if data.get(FINAL_KEY):
            self.final_reports.add(client_id)

    def quit_after_final_reports(self, timeout_s: float = FINAL_REPORT_WAIT_S) -> None:
        """The master's ``quit``: Locust's own waits a fixed 0.5 s for the workers' last reports
        (which carry the records of requests cancelled at the end), and a worker busy with
        hundreds of streams can take longer. This one waits until every worker it told to quit
        has sent its last report, up to ``timeout_s``, and no longer: Locust quits the runner
        twice in a headless run, and the fixed 0.5 s kept here once made that a second at the
        end of every run. Same steps as ``locust.runners.MasterRunner.quit`` (locust 2.x)
        otherwise."""
        runner = self.environment.runner
        assert isinstance(runner, MasterRunner)
        runner.stop(send_stop_to_client=False)
        told = set()
        for client in runner.clients.all:
            runner.server.send_to_client(Message("quit", None, client.id))
            if client.state != STATE_MISSING:
                told.add(client.id)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not told <= self.final_reports:
            gevent.sleep(0.05)
        if not told <= self.final_reports:
            log.warning("no last report from %s within %.0f s", sorted(told - self.final_reports),
                        timeout_s)
        runner.greenlet.kill(block=True)

    def on_records_message(self, msg: Any, **_kwargs: Any) -> None:
        self._store(msg.data)

    def _store(self, columns: dict[str, list[Any]]) -> None:
        if self.sink is None:
            if self.run_dir is None:
                return
            self.sink = RollingParquetWriter(
                self.run_dir / REQUESTS_TABLE,
                REQUEST_SCHEMA,
                prefix=f"{socket.gethostname()}-{os.getpid()}",
                flush_interval_s=self.flush_interval_s,
                compact_every_s=self.compact_every_s,
                # a soak's master: merges in a child, never holding their buffers
                compact_in_child=self.compact_every_s > 0,
            )
        self.received += len(columns["worker_id"])
        for listener in self.batch_listeners:
            listener(columns)
        for worker_id in columns["worker_id"]:
            self.received_by_worker[worker_id] = self.received_by_worker.get(worker_id, 0) + 1
        self.sink.append_columns(columns)

    def _flush_loop(self) -> None:
        while True:
            gevent.sleep(min(1.0, self.flush_interval_s))
            if self.sink is not None:
                try:
                    self.sink.maybe_flush()
                except Exception:  # a failed flush must not kill the run; it is retried
                    log.exception("flushing request records failed")

    def start(self, **_kwargs: Any) -> None:
        if self._flusher is None and not isinstance(self.environment.runner, WorkerRunner):
            self._flusher = gevent.spawn(self._flush_loop)

    def close(self, **_kwargs: Any) -> None:
        if self._flusher is not None:
            self._flusher.kill(block=False)
            self._flusher = None
        if self.sink is not None:
            self.sink.close()
        if self.run_dir is not None and not isinstance(self.environment.runner, WorkerRunner):
            clock = self.clock_report() if self.clock_report else {}
            stats = {
                "records_written": self.sink.rows_written if self.sink else 0,
                "received_by_worker": self.received_by_worker,
                "master_host": self.master_host,
                # worker clock minus master clock, per worker (Locust client id), measured by
                # locustfiles.clock_sync's repeated NTP-style exchange
                "clock": clock,
            }
            write_json_atomic(self.run_dir / "recorder_stats.json", stats)


def flush_to_master(client: Any, linger_s: float = FLUSH_LINGER_S) -> None:
    """A worker's last step before it exits: close its socket to the master once what it queued
    there (its last report, with the records of the requests its stop cancelled, and Locust's
    ``quit``) has left, ``linger_s`` at most (the master may be gone).

    Locust leaves the socket open at exit, and pyzmq then drops what its I/O thread has not
    sent yet: on a loaded CI machine a worker's last report and ``quit`` were lost that way (the
    master waited 10 s for them, then marked the worker missing, and the records of that
    worker's last requests never reached it)."""
    socket_ = getattr(client, "socket", None)
    if socket_ is None or socket_.closed:
        return
    context = socket_.context
    socket_.close(linger=int(linger_s * 1000))
    context.term()  # returns once every socket of it is closed and its messages have left


def register(environment: Environment, run_dir: str | os.PathLike[str] | None) -> RequestRecorder:
    """Attach a recorder to ``environment``; call from an ``init`` listener.

    ``run_dir`` matters on the master / local runner only (workers forward everything).
    """
    if not hasattr(environment.events, RECORD_EVENT):
        setattr(environment.events, RECORD_EVENT, EventHook())
    recorder = RequestRecorder(environment, run_dir)
    getattr(environment.events, RECORD_EVENT).add_listener(recorder.on_record)
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        environment.events.report_to_master.add_listener(recorder.on_report_to_master)
        environment.events.test_stop.add_listener(recorder.on_worker_test_stop)
        environment.events.test_start.add_listener(recorder.on_worker_test_start)
        # last of all (``quit`` fires as the process is about to exit)
        environment.events.quit.add_listener(lambda **_kw: flush_to_master(runner.client))
    else:
        arrow_with_pandas()  # the master's records become Parquet on its loop
        if isinstance(runner, MasterRunner):
            environment.events.worker_report.add_listener(recorder.on_worker_report)
            runner.register_message(RECORDS_KEY, recorder.on_records_message)
            runner.quit = recorder.quit_after_final_reports  # type: ignore[method-assign]
        environment.events.test_start.add_listener(recorder.start)
        # ``quit`` fires after the runner has collected the workers' final reports (``quitting``
        # fires before, on SIGTERM), so closing here loses nothing.
        environment.events.quit.add_listener(recorder.close)
    return recorder
