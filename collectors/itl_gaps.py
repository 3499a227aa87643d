"""Inter-token gaps as flat arrays, and the events a worker read together.

Shared by the run summary (``dashboards.analysis.runs``), the study's cohorts and the accuracy
bench; here, below them all, so that the master's soak windows (``collectors.windows``) can
count them too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # a worker's live health reads this module's limits; it never loads pandas
    import pandas as pd

# Events read together past these and the figures are the generator's as much as the server's:
# TTFT may read late by more than this at P99 (the accuracy goal, docs/BENCHMARKS.md), or this
# share of ITL gaps merged (the run summary, the soak windows, the live health gauge)
TTFT_BOUND_WARN_S = 0.001
MERGED_GAP_WARN_SHARE = 0.01


def gaps_by_row(itl: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Every inter-token gap as one float64 array, and the row position each gap belongs to.

    Flattened once per summary, so each bucket's gaps are one boolean index away; the file
    stores gaps as float32 and they are compared as float64.
    """
    lists = [v if isinstance(v, (list, np.ndarray)) else () for v in itl.to_numpy(dtype=object)]
    lengths = np.fromiter((len(v) for v in lists), dtype=np.int64, count=len(lists))
    present = [np.asarray(v) for v in lists if len(v)]
    flat = np.concatenate(present).astype(np.float64) if present else np.empty(0, np.float64)
    return flat, np.repeat(np.arange(len(lists)), lengths)


def merged_reads(gaps: np.ndarray, gap_row: np.ndarray, rows: int) -> pd.DataFrame:
    """Per request (``rows`` of them, from :func:`gaps_by_row`): events the worker read
    together, which its kernel receive stamps cannot time apart.

    Each event's time is the kernel's receive stamp of the read that brought it; a read that
    brought several events stamps them all with its last bytes' time (ITL gap exactly 0). A
    worker late by less than one token gap reads every event alone and its times are exact,
    however late it read (``read_delay_s``); once later tokens land while it is busy, the
    earlier ones take their time. Columns: ``merged_gaps`` (gaps of exactly 0),
    ``lead_merged`` (the first token's read also brought that many later ones) and
    ``ttft_bound_s``: how late TTFT may read, ``lead_merged`` x the request's mean non-zero gap
    (0 where nothing merged). Measured against a target of known timing
    (docs/results/generator-check/): TTFT error > 1 ms in 128 of 1,657 requests, 127 of them
    with ``lead_merged`` > 0 and their error within 1.2 ms of the bound at P75; none of the 848
    requests without a merged gap had an ITL error over 0.34 ms, with read delays to 24 ms.
    A server that writes several events at once also shows merged gaps: the bound is an upper
    one ("may be late by up to").
    """
    merged = gaps == 0.0
    merged_n = np.bincount(gap_row[merged], minlength=rows)
    lengths = np.bincount(gap_row, minlength=rows)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    # each row's first gap that is not 0 (gap_row is sorted: its rows' gaps are adjacent)
    open_at = np.flatnonzero(~merged)
    open_rows = gap_row[open_at]
    first = np.concatenate(([True], open_rows[1:] != open_rows[:-1])) if open_at.size else (
        np.zeros(0, dtype=bool))
    lead = lengths.copy()  # every gap 0: the whole answer came in one read
    lead[open_rows[first]] = open_at[first] - starts[open_rows[first]]
    open_n = lengths - merged_n
    open_sum = np.bincount(gap_row, weights=gaps, minlength=rows)  # a 0 adds nothing
    mean_gap = np.divide(open_sum, open_n, out=np.zeros(rows), where=open_n > 0)
    import pandas as pd  # noqa: PLC0415 - see the module's imports

    return pd.DataFrame({"merged_gaps": merged_n, "lead_merged": lead,
                         "ttft_bound_s": lead * mean_gap})
