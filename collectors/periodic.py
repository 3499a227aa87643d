"""A sampler thread that calls ``sample(wall_ns)`` on a fixed beat and accounts for its own cost.

Every telemetry sampler (GPU, server metrics, host) is one of these: ``start()`` runs
``setup()`` in the caller's thread and, when that says the sampler can work, starts a daemon
thread; ``stop()`` ends the loop, joins the thread and runs ``teardown()`` (which closes the
Parquet writers, so stopping flushes).

Ticks are laid on an absolute monotonic grid (``t0 + k * interval_s``), so the rate does not drift
with the time a sample takes; a sample that overruns skips the ticks it missed and counts them in
``missed_ticks`` rather than bursting to catch up. ``cpu_s`` is the sampler thread's own CPU
time (``time.thread_time``) across samples, flushes included: divided by ``samples`` it is the
cost of one sample. :meth:`PeriodicSampler.settled` says whether a sample begun after a given
moment is stored and showed nothing still going on (a run's telemetry tail ends on it:
``swarmload collect``, SIGUSR1). Only the standard library is imported here, so
``collectors.gpu`` stays importable on a machine that has nothing but pynvml and pyarrow.

:class:`RunSampler` adds what every sampler of a run shares: its folder, run id and host, and
its Parquet tables under the run folder.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collectors.parquet_sink import RollingParquetWriter
from collectors.remote import wall_ns

if TYPE_CHECKING:
    from collectors.parquet_sink import RollingParquetWriter

log = logging.getLogger(__name__)


class PeriodicSampler:
    """Base class: subclasses implement ``setup``, ``sample`` and ``teardown``."""

    name = "sampler"

    def __init__(self, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"{self.name}: interval_s must be > 0, got {interval_s}")
        self.interval_s = float(interval_s)
        self.samples = 0
        self.missed_ticks = 0
        self.sample_errors = 0  # exceptions escaping sample(); the loop goes on
        self.cpu_s = 0.0
        self.busy_s = 0.0
        self.last_error: str | None = None
        self.running = False
        self.last_sample_ns: int | None = None  # when the last finished sample began (wall)
        self._stop = threading.Event()
        self._wake = threading.Event()  # stop() or sample_now(): end the wait for the next tick
        self._thread: threading.Thread | None = None
        self._torn_down = False

    # -- subclass hooks -------------------------------------------------------------------------
    def setup(self) -> bool:
        """Open devices and writers. Return False to stay idle: nothing runs or is written."""
        return True

    def sample(self, wall_ns: int) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        """Release what setup took; called once from stop(), after the thread ended."""

    def idle(self) -> bool:
        """Whether the last sample showed nothing still going on (a server with requests
        running or waiting is not idle); samplers with nothing to settle say True."""
        return True

    def settled(self, since_ns: int) -> bool:
        """A sample begun at or after ``since_ns`` (wall clock, ns) is stored and showed
        :meth:`idle`; a sampler that is not running has nothing to add and is settled."""
        if not self.running:
            return True
        last = self.last_sample_ns
        return last is not None and last >= since_ns and self.idle()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> bool:
        if self._thread is not None:
            return self.running
        if not self.setup():
            return False
        self.running = True
        self._thread = threading.Thread(target=self._loop, name=f"swarmload-{self.name}",
                                        daemon=True)
        self._thread.start()
        return True

    def sample_now(self) -> None:
        """Take one sample now, off the grid, then go on at the next tick: a run whose load has
        ended (SIGUSR1) is seen settled at once, not up to an interval later."""
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                # A read stuck in a driver call: leave the daemon thread, still flush what we have.
                log.warning("%s: sampler thread did not stop within %.1f s", self.name, timeout_s)
        self.running = False
        if self._thread is not None and not self._torn_down:
            self._torn_down = True
            self.teardown()

    def stats(self) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s,
            "samples": self.samples,
            "missed_ticks": self.missed_ticks,
            "sample_errors": self.sample_errors,
            "cpu_s": round(self.cpu_s, 6),
            "cpu_s_per_sample": round(self.cpu_s / self.samples, 9) if self.samples else None,
            "busy_s_per_sample": round(self.busy_s / self.samples, 9) if self.samples else None,
            "last_error": self.last_error,
        }

    def _loop(self) -> None:
        t0 = time.monotonic()
        tick = 0
        off_grid = False  # this sample was asked for (sample_now): the next tick stays due
        while not self._stop.is_set():
            cpu0, busy0 = time.thread_time(), time.perf_counter()
            began = wall_ns()  # time.time_ns (+ test-only skew)
            try:
                self.sample(began)
            except Exception as exc:  # noqa: BLE001 - a sampler must outlive one bad sample
                self.sample_errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("%s: sample failed", self.name)
            self.samples += 1
            self.last_sample_ns = began
            self.cpu_s += time.thread_time() - cpu0
            self.busy_s += time.perf_counter() - busy0
            tick += 0 if off_grid else 1
            now = time.monotonic()
            due = t0 + tick * self.interval_s
            if now > due:
                skipped = int((now - due) // self.interval_s) + 1
                self.missed_ticks += skipped
                tick += skipped
                due = t0 + tick * self.interval_s
            off_grid = self._wake.wait(due - now) and not self._stop.is_set()
            self._wake.clear()


class RunSampler(PeriodicSampler):
    """A sampler of one run: rows carry ``run_id`` and ``host``; tables live under ``run_dir``,
    one part-file series per sampler process (``<host>-<pid>``), flushed every
    ``flush_interval_s``."""

    def __init__(self, run_dir: str | os.PathLike[str], run_id: str, interval_s: float,
                 host: str | None, flush_interval_s: float) -> None:
        super().__init__(interval_s)
        self.run_dir = Path(run_dir)
        self.run_id = run_id
        self.host = host or socket.gethostname()
        self.flush_interval_s = flush_interval_s
        self.compact_every_s = 0.0  # soaks: merge part files this often (set before start)

    def open_table(self, table: str, schema: Any) -> RollingParquetWriter:
        """A ``RollingParquetWriter`` for ``run_dir/table`` (pyarrow is imported only here)."""
        return RollingParquetWriter(self.run_dir / table, schema,
                                    prefix=f"{self.host}-{os.getpid()}",
                                    flush_interval_s=self.flush_interval_s,
                                    compact_every_s=self.compact_every_s)
