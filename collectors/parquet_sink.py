"""Rolling Parquet writer: bounded memory, closed part files readable while a run goes on.

Rows are buffered as Python dicts (or column batches) and written as a new, closed part file
whenever ``flush_interval_s`` has passed or ``max_buffered_rows`` is reached, so a reader with
``pyarrow.dataset`` always sees complete files and a crash loses at most one interval.

Usage::

    sink = RollingParquetWriter(run_dir / "requests", REQUEST_SCHEMA, prefix="master")
    sink.append_rows([{...}, {...}])
    sink.maybe_flush()   # call periodically
    sink.close()         # flushes what is left
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from collectors.atomic import write_atomic


class RollingParquetWriter:
    def __init__(
        self,
        directory: str | os.PathLike[str],
        schema: pa.Schema,
        *,
        prefix: str = "part",
        flush_interval_s: float = 2.0,
        max_buffered_rows: int = 50_000,
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

    def append_rows(self, rows: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            before = len(self._rows)
            self._rows.extend(rows)
            self._buffered += len(self._rows) - before
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
