"""Soak mode on the Locust master: what keeps a run of hours or days bounded, and its windows.

Started by ``llm_user`` when ``--swarmload-soak`` is on (``swarmload soak`` sets it):

- **Locust's own stats** are trimmed every minute (Locust itself never trims its per-second
  counters or its history): per-second request and failure counts older than
  ``--swarmload-stats-keep`` seconds are dropped, and the history keeps its newest entries only.
  Locust's rounded stats feed only the live view; reports come from the records.
- **Windows**: every batch of records the master stores also goes to a
  :class:`collectors.windows.WindowAggregator`, which writes one row per ``--swarmload-window``
  seconds (per minute by default) to the run's ``windows`` table during the run.
- **Compaction**: the requests and windows tables merge their part files every
  ``--swarmload-compact-every`` seconds (hourly by default), so files grow with hours; each
  merge runs in a short-lived child process, so the master never holds its buffers.
- **Freed memory** goes back to the system every 30 s (:mod:`collectors.memory`).

Everything here is O(open windows + requests in flight), never O(run length).
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gevent
import pyarrow as pa

from collectors.atomic import write_json_atomic
from collectors.memory import RELEASE_EVERY_S, release_free_memory
from collectors.parquet_sink import RollingParquetWriter
from collectors.schemas import WINDOW_SCHEMA, WINDOWS_TABLE

if TYPE_CHECKING:  # importing locust patches the interpreter (gevent): not at import time
    from locust.env import Environment

    from collectors.windows import WindowAggregator  # pandas: only a soak's master needs it

log = logging.getLogger(__name__)

# Newest entries of Locust's stats history kept in soak mode (one entry per 5 s: 10 minutes).
STATS_HISTORY_KEEP = 120
SOAK_TICK_S = 5.0
STATS_TRIM_EVERY_S = 60.0  # at most; more often when fewer seconds are kept
STATE_FILE = "soak_state.json"


def soak_enabled(options: Any) -> bool:
    value = getattr(options, "swarmload_soak", "false")
    return str(value).lower() in ("1", "true", "yes", "on")


def trim_locust_stats(stats: Any, now_s: float, keep_s: float,
                      history_keep: int = STATS_HISTORY_KEEP) -> int:
    """Drop Locust's per-second counters older than ``keep_s`` and all but the newest history
    entries; return how many entries went. Totals and percentile buckets stay as they are
    (the buckets are bounded by Locust's rounding)."""
    cutoff = int(now_s - keep_s)
    dropped = 0
    entries = [*stats.entries.values(), stats.total]
    for entry in entries:
        for per_sec in (entry.num_reqs_per_sec, entry.num_fail_per_sec):
            old = [second for second in per_sec if second < cutoff]
            for second in old:
                del per_sec[second]
            dropped += len(old)
    if len(stats.history) > history_keep:
        dropped += len(stats.history) - history_keep
        del stats.history[: len(stats.history) - history_keep]
    return dropped


def memory_probes() -> dict[str, Callable[[], int]]:
    """Where the master's memory is, beside its RSS: Arrow's pool (bytes in use), Python's
    allocator (blocks in use) and glibc's heap (bytes in use, bytes free but kept), so that a
    soak that grows says which of them grew."""
    probes: dict[str, Callable[[], int]] = {
        "arrow_allocated_bytes": pa.total_allocated_bytes,
        "python_allocated_blocks": sys.getallocatedblocks,
    }
    try:
        class MallInfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                "uordblks", "fordblks", "keepcost")]

        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2

        probes["malloc_in_use_bytes"] = lambda: libc.mallinfo2().uordblks + libc.mallinfo2().hblkhd
        probes["malloc_free_kept_bytes"] = lambda: libc.mallinfo2().fordblks
    except (OSError, AttributeError):  # not glibc (or older than 2.33): no heap figures
        pass
    return probes


def release_memory_loop(every_s: float = RELEASE_EVERY_S) -> None:
    """A soak worker's greenlet: hand freed memory back every ``every_s`` (see
    :mod:`collectors.memory`), so a burst does not set its RSS for the rest of the run."""
    while True:
        gevent.sleep(every_s)
        release_free_memory()


class SoakServices:
    """Master-side soak bookkeeping: windows, compaction, Locust stats trimming."""

    def __init__(self, environment: Environment, recorder: Any, run_dir: str, *,
                 window_s: float, compact_every_s: float, stats_keep_s: float,
                 segment: int) -> None:
        self.environment = environment
        self.recorder = recorder
        self.stats_keep_s = stats_keep_s
        recorder.compact_every_s = compact_every_s
        prefix = f"{socket.gethostname()}-{os.getpid()}"
        self.window_sink: RollingParquetWriter | None = None
        self.windows: WindowAggregator | None = None
        if window_s > 0:
            self.window_sink = RollingParquetWriter(
                os.path.join(run_dir, WINDOWS_TABLE), WINDOW_SCHEMA, prefix=prefix,
                flush_interval_s=max(window_s, 10.0), compact_every_s=compact_every_s,
                compact_in_child=True)
            from collectors.windows import WindowAggregator  # noqa: PLC0415 - pandas

            self.windows = WindowAggregator(self.window_sink.append_frame, window_s=window_s,
                                            grace_s=max(window_s, 30.0), segment=segment)
            recorder.batch_listeners.append(self.windows.add)
        self._greenlet: gevent.Greenlet | None = None
        self.trimmed = 0
        self.released_s = 0.0  # seconds the last release_free_memory() took
        self.run_dir = run_dir
        # name -> () -> size of one of the master's structures, written to soak_state.json
        # every tick, so a soak shows (and a test asserts) that each stays bounded
        self.probes: dict[str, Callable[[], int]] = {
            "recorder_batch_listeners": lambda: len(recorder.batch_listeners),
            "locust_stats_per_second_entries": lambda: sum(
                len(e.num_reqs_per_sec) + len(e.num_fail_per_sec)
                for e in [*environment.stats.entries.values(), environment.stats.total]),
            "locust_stats_history": lambda: len(environment.stats.history),
            "locust_errors": lambda: len(environment.stats.errors),
        }
        self.probes.update(memory_probes())
        windows = self.windows
        if windows is not None:
            self.probes["window_open_records"] = windows.open_records
            self.probes["window_open_windows"] = lambda: len(windows.open)

    def start(self) -> None:
        if self._greenlet is None:
            self._greenlet = gevent.spawn(self._loop)

    def state(self) -> dict[str, Any]:
        """Sizes of the master's structures now (see ``probes``) and what was trimmed."""
        sizes = {}
        for name, probe in self.probes.items():
            try:
                sizes[name] = int(probe())
            except Exception:  # a probe of a structure that is gone says nothing
                continue
        return {"wall_ns": time.time_ns(), "sizes": sizes, "stats_trimmed": self.trimmed,
                "memory_release_ms": round(self.released_s * 1e3, 2),
                "windows_written": self.windows.windows_written if self.windows else 0}

    def _loop(self) -> None:
        last_trim = last_release = time.monotonic()
        trim_every = min(STATS_TRIM_EVERY_S, max(SOAK_TICK_S, self.stats_keep_s / 2))
        while True:
            gevent.sleep(SOAK_TICK_S)
            try:
                if self.windows is not None and self.window_sink is not None:
                    self.windows.close_due()
                    self.window_sink.maybe_flush()
                if time.monotonic() - last_trim >= trim_every:
                    last_trim = time.monotonic()
                    self.trimmed += trim_locust_stats(self.environment.stats, time.time(),
                                                      self.stats_keep_s)
                if time.monotonic() - last_release >= RELEASE_EVERY_S:
                    last_release = time.monotonic()
                    self.released_s = release_free_memory()
                write_json_atomic(os.path.join(self.run_dir, STATE_FILE), self.state())
            except Exception:  # bookkeeping must never end a soak; it is retried next tick
                log.exception("soak bookkeeping failed")

    def close(self, **_kwargs: Any) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None
        if self.windows is not None and self.window_sink is not None:
            self.windows.close_due(everything=True)
            self.window_sink.close()
