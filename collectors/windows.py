"""Fixed wall-clock windows over request records (METRICS.md, "Over time").

:func:`window_stats` is a pure function: request records (REQUEST_SCHEMA columns) in, one row
per window out (WINDOW_SCHEMA columns): counts, errors per class, exact percentiles of TTFT,
TPOT and E2E, tokens and throughput. The same function serves a soak's per-minute windows and a
burst's 1 s windows.

:class:`WindowAggregator` runs it during a run: the master feeds it every batch of records it
stores, and it writes each window once the window is over and ``grace_s`` has passed (records
reach the master when their request ends, so a window waits for its long requests). A record
that arrives after its window was written goes into a ``late`` row of the same window: counts
stay exact, the late row's percentiles cover only the late records. Memory holds only the open
windows, so it is bounded by rate x (window + grace), never by the run's length.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from collectors.itl_gaps import gaps_by_row, merged_reads
from collectors.percentiles import percentile, percentiles
from collectors.schemas import GENERATOR_OUTCOMES, OUTCOME_OK, WINDOW_SCHEMA

# The request columns a window needs (the rest of a record is never kept).
WINDOW_INPUT_COLUMNS = (
    "outcome", "sent_wall_ns", "ttft_s", "tpot_s", "e2e_s", "prompt_tokens", "output_tokens",
    "schedule_lag_s", "read_delay_s", "itl_s",
)
# what a record's ITL gaps come down to as soon as it arrives (read_together): the lists
# themselves are never kept
READ_TOGETHER_COLUMNS = ("gaps", "merged_gaps", "ttft_bound_s")
WINDOW_LATENCIES = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}
WINDOW_PERCENTILES = {"p50": 50.0, "p95": 95.0, "p99": 99.0}


def window_start_ns(wall_ns: np.ndarray | int, window_s: float, origin_ns: int = 0) -> Any:
    """Start of the window holding ``wall_ns`` (windows are aligned on ``origin_ns``)."""
    width = int(round(window_s * 1e9))
    return origin_ns + ((np.asarray(wall_ns, dtype=np.int64) - origin_ns) // width) * width


def read_together(records: pd.DataFrame) -> pd.DataFrame:
    """``records`` with their ``itl_s`` lists replaced by :data:`READ_TOGETHER_COLUMNS` (each
    request's gaps, those read together, how late its TTFT may read:
    :func:`collectors.itl_gaps.merged_reads`); unchanged without ``itl_s``."""
    if "itl_s" not in records:
        return records
    records = records.reset_index(drop=True)
    gaps, gap_row = gaps_by_row(records["itl_s"])
    merged = merged_reads(gaps, gap_row, len(records))
    return records.drop(columns="itl_s").assign(
        gaps=np.bincount(gap_row, minlength=len(records)),
        merged_gaps=merged["merged_gaps"].to_numpy(),
        ttft_bound_s=merged["ttft_bound_s"].to_numpy())


def window_stats(records: pd.DataFrame, window_s: float, *, origin_ns: int = 0,
                 time_column: str = "sent_wall_ns", late: bool = False,
                 segment: int = 0) -> pd.DataFrame:
    """One row per window that holds at least one record, oldest first (WINDOW_SCHEMA).

    Windows are ``[origin_ns + k * window_s, origin_ns + (k + 1) * window_s)`` on ``time_column``
    (default: when the request was sent). Latency percentiles are exact (linear interpolation,
    as the run summary's) over the window's ``ok`` requests; requests the generator never sent
    (dropped, worker_lost, cancelled) are counted apart from server errors, as in the summary.
    """
    columns = [f.name for f in WINDOW_SCHEMA]
    if records.empty:
        return pd.DataFrame({name: pd.Series(dtype=object) for name in columns})
    records = read_together(records)
    starts = window_start_ns(records[time_column].to_numpy(dtype=np.int64), window_s, origin_ns)
    frame = records.assign(_window=starts)
    rows = []
    for start, group in frame.groupby("_window", sort=True):
        rows.append(_window_row(group, int(start), window_s, late=late, segment=segment))
    return pd.DataFrame(rows, columns=columns)


def _window_row(group: pd.DataFrame, start_ns: int, window_s: float, *, late: bool,
                segment: int) -> dict[str, Any]:
    outcome = group["outcome"]
    is_ok = (outcome == OUTCOME_OK).to_numpy()
    not_sent = outcome.isin(GENERATOR_OUTCOMES).to_numpy()
    n_ok, n_not_sent = int(is_ok.sum()), int(not_sent.sum())
    n_errors = int(len(group) - n_ok - n_not_sent)
    attempts = n_ok + n_errors
    by_class = outcome[~is_ok].value_counts()
    ok = group[is_ok]
    out_tokens = float(np.nansum(ok["output_tokens"].to_numpy(dtype=np.float64, na_value=np.nan)))
    row: dict[str, Any] = {
        "window_start_ns": start_ns,
        "window_s": float(window_s),
        "segment": segment,
        "late": late,
        "requests": int(len(group)),
        "ok": n_ok,
        "errors": n_errors,
        "not_sent": n_not_sent,
        "error_rate": n_errors / attempts if attempts else np.nan,
        "errors_by_class": json.dumps({str(k): int(v) for k, v in sorted(by_class.items())}),
        "prompt_tokens": int(np.nansum(ok["prompt_tokens"].to_numpy(dtype=np.float64,
                                                                     na_value=np.nan))),
        "output_tokens": int(out_tokens),
        "req_per_s": n_ok / window_s,
        "output_tok_per_s": out_tokens / window_s,
    }
    # the generator's own health in the window (METRICS.md self-checks): did it keep up?
    for column in ("schedule_lag_s", "read_delay_s"):
        row[f"{column[:-2]}_p99_s"] = (percentile(group[column], 99.0) if column in group
                                       else np.nan)
    gaps = float(ok["gaps"].sum()) if "gaps" in ok else 0.0
    row["merged_gap_share"] = float(ok["merged_gaps"].sum()) / gaps if gaps else np.nan
    row["ttft_bound_p99_s"] = (percentile(ok["ttft_bound_s"], 99.0)
                               if "ttft_bound_s" in ok and len(ok) else np.nan)
    for tag, column in WINDOW_LATENCIES.items():
        pcts = percentiles(ok[column], list(WINDOW_PERCENTILES.values()))
        for name, value in zip(WINDOW_PERCENTILES, pcts, strict=True):
            row[f"{tag}_{name}_s"] = value
    return row


class WindowAggregator:
    """Per-window buffers of the few columns a window needs; closed windows go to ``write``.

    ``write`` takes a DataFrame of WINDOW_SCHEMA rows (for example a RollingParquetWriter's
    ``append_rows``). ``origin_ns`` aligns the windows (the run's start, so a resumed run keeps
    the same grid).
    """

    def __init__(self, write: Callable[[pd.DataFrame], None], *, window_s: float = 60.0,
                 grace_s: float = 120.0, origin_ns: int = 0, segment: int = 0,
                 clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.write = write
        self.window_s = window_s
        self.grace_ns = int(grace_s * 1e9)
        self.width_ns = int(round(window_s * 1e9))
        self.origin_ns = origin_ns
        self.segment = segment
        self.clock_ns = clock_ns
        self.open: dict[int, list[pd.DataFrame]] = {}
        self.closed_before_ns = -(2**62)  # windows starting before this are written
        self.late: list[pd.DataFrame] = []
        self.windows_written = 0
        self.records_seen = 0

    def add(self, columns: Mapping[str, Sequence[Any]]) -> None:
        """One batch of request records (a dict of equal-length columns)."""
        frame = read_together(pd.DataFrame({name: columns[name] for name in WINDOW_INPUT_COLUMNS
                                            if name in columns}))
        if frame.empty:
            return
        self.records_seen += len(frame)
        frame["sent_wall_ns"] = frame["sent_wall_ns"].astype(np.int64)
        starts = window_start_ns(frame["sent_wall_ns"].to_numpy(), self.window_s, self.origin_ns)
        is_late = starts < self.closed_before_ns
        if is_late.any():
            self.late.append(frame[is_late])
            frame, starts = frame[~is_late], starts[~is_late]
        for start in np.unique(starts):
            self.open.setdefault(int(start), []).append(frame[starts == start])

    def open_records(self) -> int:
        return sum(len(part) for parts in self.open.values() for part in parts)

    def close_due(self, now_ns: int | None = None, *, everything: bool = False) -> int:
        """Write every window that ended more than ``grace_s`` ago (all when ``everything``)."""
        now_ns = self.clock_ns() if now_ns is None else now_ns
        due = sorted(start for start in self.open
                     if everything or start + self.width_ns + self.grace_ns <= now_ns)
        frames = []
        for start in due:
            records = pd.concat(self.open.pop(start), ignore_index=True)
            frames.append(window_stats(records, self.window_s, origin_ns=self.origin_ns,
                                       segment=self.segment))
        if due:
            self.closed_before_ns = max(self.closed_before_ns, due[-1] + self.width_ns)
        if self.late:
            records = pd.concat(self.late, ignore_index=True)
            self.late = []
            frames.append(window_stats(records, self.window_s, origin_ns=self.origin_ns,
                                       late=True, segment=self.segment))
        if not frames:
            return 0
        rows = pd.concat(frames, ignore_index=True)
        self.write(rows)
        self.windows_written += int((~rows["late"].astype(bool)).sum())
        return len(rows)
