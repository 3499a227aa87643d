"""Rolling Parquet writer: bounded memory, closed part files readable while a run goes on.

Rows are buffered as Python dicts (or column batches) and written as a new, closed part file
whenever ``flush_interval_s`` has passed or ``max_buffered_rows`` is reached, so a reader with
``pyarrow.dataset`` always sees complete files and a crash loses at most one interval.

Usage::

    sink = RollingParquetWriter(run_dir / "requests", REQUEST_SCHEMA, prefix="master")
    sink.append_rows([{...}, {...}])
    sink.maybe_flush()   # call periodically
    sink.close()         # flushes what is left

Long runs (soaks): with ``compact_every_s`` the writer merges its own part files into one
``<prefix>-<first>-to-<last>.parquet`` every so often (hourly by default in a soak), so a table
holds a file per hour, not one per flush. The merged file is written under a hidden name and
renamed into place; from that moment :func:`visible_part_files` (which every reader uses) skips
the parts it covers, so a reader never counts a row twice or misses one, and the covered parts
are deleted afterwards (or by the next compaction, after a crash).

With ``compact_in_child`` (a soak's Locust master) the merge runs in a short-lived child process
(``python -m collectors.parquet_sink``): the master never holds the merge's buffers (Arrow's
allocator would keep them, and the pages its reader threads touched, for the rest of the run:
RSS stepping up at each compaction), and under gevent the wait for the child yields, so the
master goes on taking its workers' records instead of stalling for the whole merge.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from collectors.atomic import write_atomic

PART_PATTERN = re.compile(r"^(?P<prefix>.+)-(?P<part>\d{6})\.parquet$")
COMPACTED_PATTERN = re.compile(r"^(?P<prefix>.+)-(?P<first>\d{6})-to-(?P<last>\d{6})\.parquet$")
# Rows per row group of a compacted file (memory while compacting stays about one group).
COMPACT_ROWS_PER_GROUP = 20_000


class _NoPandas:
    """A meta path finder that fails ``import pandas`` (see :func:`arrow_without_pandas`)."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas is kept out of this process")


def arrow_with_pandas() -> None:
    """pyarrow's first conversion of Python objects imports pandas (0.35 s of CPU, seconds on a
    loaded machine): done now, before the load, in a process that writes Parquet from an event
    loop (the Locust master), so that its first part does not stall the loop mid-run."""
    pa.array([0])


def arrow_without_pandas() -> None:
    """Keep pyarrow from importing pandas in a process that hands it no pandas objects.

    pyarrow imports pandas the first time it converts Python objects (to check whether they
    are pandas objects): 0.35 s of CPU in each Locust worker and collector process at its first
    Parquet part, hundreds of processes in a study or in the suite. Here it asks once while
    ``import pandas`` fails, and remembers that it has none. ``import pandas`` works again
    afterwards, but pyarrow then takes a Series for a plain sequence (a NaN stays NaN instead of
    becoming null): call this only in a process that never gives pyarrow a pandas object.
    """
    if "pandas" in sys.modules:
        return
    sys.meta_path.insert(0, _NoPandas)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(_NoPandas)


def _covered(directory: Path) -> tuple[list[Path], set[str]]:
    """(every non-hidden Parquet file, names of part files a compacted file already holds)."""
    files = sorted(p for p in directory.glob("*.parquet") if not p.name.startswith((".", "_")))
    spans: dict[str, list[tuple[int, int]]] = {}
    for path in files:
        match = COMPACTED_PATTERN.match(path.name)
        if match:
            spans.setdefault(match["prefix"], []).append((int(match["first"]),
                                                           int(match["last"])))
    covered = set()
    for path in files:
        if COMPACTED_PATTERN.match(path.name):
            continue
        match = PART_PATTERN.match(path.name)
        if match and any(a <= int(match["part"]) <= b for a, b in spans.get(match["prefix"], ())):
            covered.add(path.name)
    return files, covered


def visible_part_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The files a reader of a table must read: closed parts and compacted files, each row once."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    files, covered = _covered(directory)
    return [p for p in files if p.name not in covered]


def remove_covered_parts(directory: str | os.PathLike[str]) -> int:
    """Delete part files that a compacted file holds (left behind by a crash mid-compaction)."""
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    files, covered = _covered(directory)
    for path in files:
        if path.name in covered:
            path.unlink(missing_ok=True)
    return len(covered)


def compact_parts(directory: Path, prefix: str, first: int, last: int, schema: pa.Schema) -> Path:
    """Merge parts ``first..last`` of ``prefix`` into one file, atomically; delete the parts."""
    sources = [directory / f"{prefix}-{n:06d}.parquet" for n in range(first, last + 1)]
    sources = [p for p in sources if p.exists()]
    final = directory / f"{prefix}-{first:06d}-to-{last:06d}.parquet"

    def merge(tmp: Path) -> None:
        pending: list[pa.Table] = []
        pending_rows = 0
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for path in sources:
                # Parts written before a column was added still merge (missing ones as nulls).
                table = pq.read_table(path)
                table = pa.Table.from_pydict(
                    {f.name: (table.column(f.name) if f.name in table.column_names
                              else pa.nulls(table.num_rows, f.type)) for f in schema},
                    schema=schema)
                pending.append(table)
                pending_rows += table.num_rows
                if pending_rows >= COMPACT_ROWS_PER_GROUP:
                    writer.write_table(pa.concat_tables(pending))
                    pending, pending_rows = [], 0
            if pending:
                writer.write_table(pa.concat_tables(pending))

    write_atomic(final, merge)  # from here readers skip the covered parts
    # Arrow's allocator keeps freed buffers for reuse; hand the merge's back to the system so a
    # long run's RSS does not step up at each compaction.
    pa.default_memory_pool().release_unused()
    for path in sources:
        path.unlink(missing_ok=True)
    return final


def compact_parts_in_child(directory: Path, prefix: str, first: int, last: int,
                           schema: pa.Schema, timeout_s: float = 3600.0) -> Path:
    """:func:`compact_parts` in a child process (the same merge, atomic the same way); the
    schema goes to it on stdin. Raises ``subprocess.CalledProcessError`` if the merge failed:
    the parts are then still there, and the next compaction covers them."""
    subprocess.run(
        [sys.executable, "-m", "collectors.parquet_sink", str(directory), prefix, str(first),
         str(last)],
        input=schema.serialize().to_pybytes(), check=True, timeout=timeout_s,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return directory / f"{prefix}-{first:06d}-to-{last:06d}.parquet"


class RollingParquetWriter:
    def __init__(
        self,
        directory: str | os.PathLike[str],
        schema: pa.Schema,
        *,
        prefix: str = "part",
        flush_interval_s: float = 2.0,
        max_buffered_rows: int = 50_000,
        compact_every_s: float = 0.0,
        compact_in_child: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.schema = schema
        self.prefix = prefix
        self.flush_interval_s = flush_interval_s
        self.max_buffered_rows = max_buffered_rows
        self._rows: list[Mapping[str, Any]] = []
        self._batches: list[pa.RecordBatch] = []
        self._buffered = 0
        self._part = 0
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()
        self.rows_written = 0
        self.files_written = 0
        self.compact_every_s = compact_every_s
        self._compacted_through = 0  # parts 1.._compacted_through are merged
        self._last_compact = time.monotonic()
        self.compactions = 0
        self.compact_in_child = compact_in_child
        self._compacting = False

    def append_rows(self, rows: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            before = len(self._rows)
            self._rows.extend(rows)
            self._buffered += len(self._rows) - before
        if self._buffered >= self.max_buffered_rows:
            self.flush()

    def append_frame(self, frame: Any) -> None:
        """Append a pandas DataFrame with this writer's columns."""
        table = pa.Table.from_pandas(frame, schema=self.schema, preserve_index=False)
        for batch in table.combine_chunks().to_batches():
            self.append_batch(batch)

    def append_batch(self, batch: pa.RecordBatch) -> None:
        with self._lock:
            self._batches.append(batch)
            self._buffered += batch.num_rows
        if self._buffered >= self.max_buffered_rows:
            self.flush()

    def append_columns(self, columns: Mapping[str, list[Any]]) -> None:
        """Append a column batch (dict of equal-length lists), e.g. as sent by a worker."""
        batch = pa.RecordBatch.from_pydict(
            {f.name: columns.get(f.name) for f in self.schema}, schema=self.schema
        )
        with self._lock:
            self._batches.append(batch)
            self._buffered += batch.num_rows
        if self._buffered >= self.max_buffered_rows:
            self.flush()

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush >= self.flush_interval_s:
            self.flush()
        if self.compact_every_s > 0 and (
                time.monotonic() - self._last_compact >= self.compact_every_s):
            self.compact()

    def compact(self) -> Path | None:
        """Merge this writer's parts written since the last compaction into one file."""
        with self._lock:
            self._last_compact = time.monotonic()
            first, last = self._compacted_through + 1, self._part
            if last < first or self._compacting:
                return None
            self._compacting = True
        # Outside the lock: parts first..last are closed files that no flush touches again
        # (a flush writes part last+1 on), so appends and flushes go on during the merge.
        try:
            if self.compact_in_child:
                merged = compact_parts_in_child(self.directory, self.prefix, first, last,
                                                self.schema)
            else:
                merged = compact_parts(self.directory, self.prefix, first, last, self.schema)
        finally:
            with self._lock:
                self._compacting = False
        with self._lock:
            self._compacted_through = last
            self.compactions += 1
        return merged

    def flush(self) -> Path | None:
        with self._lock:
            rows, batches = self._rows, self._batches
            self._rows, self._batches, self._buffered = [], [], 0
            self._last_flush = time.monotonic()
            if not rows and not batches:
                return None
            if rows:
                batches.append(pa.RecordBatch.from_pylist(rows, schema=self.schema))
            table = pa.Table.from_batches(batches, schema=self.schema)
            self._part += 1
            name = f"{self.prefix}-{self._part:06d}.parquet"
            final = self.directory / name
            # Write then rename: a concurrent dataset reader never sees a half-written file.
            write_atomic(final, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
            self.rows_written += table.num_rows
            self.files_written += 1
            return final

    def close(self) -> None:
        self.flush()
        if self.compact_every_s > 0:
            self.compact()


def main(argv: list[str] | None = None) -> int:
    """The child of :func:`compact_parts_in_child`: merge one writer's parts (schema on stdin)."""
    p = argparse.ArgumentParser(prog="python -m collectors.parquet_sink")
    p.add_argument("directory", type=Path)
    p.add_argument("prefix")
    p.add_argument("first", type=int)
    p.add_argument("last", type=int)
    args = p.parse_args(argv)
    schema = pa.ipc.read_schema(pa.py_buffer(sys.stdin.buffer.read()))
    compact_parts(args.directory, args.prefix, args.first, args.last, schema)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
