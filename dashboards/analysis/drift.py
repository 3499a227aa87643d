"""Drift over a long run (METRICS.md, "Over time"): trend test, slope per hour, verdict per series.

Pure functions over per-window series (one row per window, one column per series, index the
window's start in wall-clock ns). A series **drifts** when, over the windows after warm-up,

- the Mann-Kendall trend test (``pymannkendall.original_test``) gives p < ``alpha`` (0.01), and
- its Theil-Sen slope (``scipy.stats.theilslopes``) over the whole span changes the series by
  more than ``share`` (10%) of its starting level (the Theil-Sen line's value at the first
  window after warm-up).

The slope is reported per hour with its confidence interval (``ci``, 95% by default), whatever
the verdict. A series whose starting level is 0 (an error rate that starts clean) drifts when the
test is significant and the slope is not 0.

A client-side latency includes the load generator and the network: a generator on a busy machine
delays its own reads, and when that machine's load changes during the run its latencies trend
with no change in the server. :func:`attribute_client_drift` judges each drifting client series
against the server's own figure of the same latency (its histogram, scraped): when the server's
figure does not drift and the gap (client minus server) trends the same way as the client series,
the verdict is ``generator drifts up/down`` (the drift is in the generator or the network, not
the server) and the series is not among :func:`drifting`'s.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
import pymannkendall
from scipy import stats

DEFAULT_ALPHA = 0.01
DEFAULT_SHARE = 0.10
DEFAULT_CI = 0.95
MIN_WINDOWS = 8  # fewer windows after warm-up say nothing about a trend

VERDICT_UP = "drifts up"
VERDICT_DOWN = "drifts down"
VERDICT_NONE = "no drift"
VERDICT_SHORT = "too few windows"
VERDICT_GENERATOR_UP = "generator drifts up"
VERDICT_GENERATOR_DOWN = "generator drifts down"
_VERDICT_RANK = {VERDICT_UP: 0, VERDICT_DOWN: 0, VERDICT_GENERATOR_UP: 1,
                 VERDICT_GENERATOR_DOWN: 1, VERDICT_NONE: 2, VERDICT_SHORT: 3}

# What a client-side drift is put down to (report column ``attribution``)
ATTRIBUTED_SERVER = "server"  # the server's own figure drifts the same way
ATTRIBUTED_GENERATOR = "generator/network"  # the server's does not; the gap trends with the client
ATTRIBUTED_UNCONFIRMED = "client only"  # no server figure, or it and the gap say nothing clear


@dataclass(frozen=True)
class SeriesDrift:
    """The drift figures of one series (units: the series' own, per hour)."""

    series: str
    verdict: str
    windows: int
    hours: float
    start_level: float
    slope_per_h: float
    slope_low_per_h: float
    slope_high_per_h: float
    change_over_run: float  # slope x hours
    change_share: float  # change_over_run / |start_level| (nan when start_level is 0)
    slope_share_per_h: float  # slope_per_h / |start_level|
    mk_p: float
    mk_trend: str  # pymannkendall's: increasing / decreasing / no trend
    start_h: float = math.nan  # hours of the first window used (where start_level is)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def series_drift(name: str, hours: np.ndarray, values: np.ndarray, *,
                 alpha: float = DEFAULT_ALPHA, share: float = DEFAULT_SHARE,
                 ci: float = DEFAULT_CI) -> SeriesDrift:
    """Drift figures of one series: ``hours`` since any origin, ``values`` at those times."""
    hours = np.asarray(hours, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    keep = np.isfinite(hours) & np.isfinite(values)
    hours, values = hours[keep], values[keep]
    span = float(hours.max() - hours.min()) if hours.size else 0.0
    if hours.size < MIN_WINDOWS or span <= 0:
        nan = math.nan
        return SeriesDrift(name, VERDICT_SHORT, int(hours.size), span, nan, nan, nan, nan, nan,
                           nan, nan, nan, "no trend", nan)
    order = np.argsort(hours, kind="stable")
    hours, values = hours[order], values[order]
    if np.all(values == values[0]):  # constant: no trend, and scipy/pymannkendall need spread
        level = float(values[0])
        return SeriesDrift(name, VERDICT_NONE, int(hours.size), span, level, 0.0, 0.0, 0.0, 0.0,
                           0.0 if level else math.nan, 0.0 if level else math.nan, 1.0,
                           "no trend", float(hours[0]))
    slope, intercept, low, high = stats.theilslopes(values, hours, alpha=ci)
    mk = pymannkendall.original_test(values, alpha=alpha)
    start_level = float(intercept + slope * hours[0])
    change = float(slope * span)
    base = abs(start_level)
    change_share = change / base if base > 0 else math.nan
    significant = bool(mk.p < alpha)
    big = abs(change_share) > share if base > 0 else slope != 0
    verdict = VERDICT_NONE
    if significant and big:
        verdict = VERDICT_UP if slope > 0 else VERDICT_DOWN
    return SeriesDrift(
        series=name, verdict=verdict, windows=int(hours.size), hours=span,
        start_level=start_level, slope_per_h=float(slope), slope_low_per_h=float(low),
        slope_high_per_h=float(high), change_over_run=change, change_share=change_share,
        slope_share_per_h=float(slope) / base if base > 0 else math.nan,
        mk_p=float(mk.p), mk_trend=str(mk.trend), start_h=float(hours[0]),
    )


def drift_report(series: pd.DataFrame, *, warmup_s: float = 0.0, alpha: float = DEFAULT_ALPHA,
                 share: float = DEFAULT_SHARE, ci: float = DEFAULT_CI) -> pd.DataFrame:
    """One row per column of ``series`` (index: window start, wall-clock ns), worst first.

    Windows starting within ``warmup_s`` of the first window are left out. Worst first: series
    that drift, largest share of change first; then the rest by share; series too short last.
    """
    columns = list(SeriesDrift.__dataclass_fields__)
    if series.empty:
        return pd.DataFrame(columns=columns)
    start_ns = np.asarray(series.index, dtype=np.int64)
    origin = int(start_ns.min())
    after = start_ns >= origin + int(warmup_s * 1e9)
    hours = (start_ns[after] - origin) / 3.6e12
    rows = [series_drift(str(name), hours, series[name].to_numpy(dtype=np.float64)[after],
                         alpha=alpha, share=share, ci=ci).as_dict() for name in series.columns]
    return _sort(pd.DataFrame(rows, columns=columns))


def drifting(report: pd.DataFrame) -> list[str]:
    """Names of the series whose verdict is a drift (not one put down to the generator)."""
    return report.loc[report["verdict"].isin([VERDICT_UP, VERDICT_DOWN]), "series"].tolist()


def generator_drifting(report: pd.DataFrame) -> list[str]:
    """Names of the client series whose drift is the generator's or the network's."""
    return report.loc[report["verdict"].isin([VERDICT_GENERATOR_UP, VERDICT_GENERATOR_DOWN]),
                      "series"].tolist()


def _sort(frame: pd.DataFrame) -> pd.DataFrame:
    rank = frame["verdict"].map(_VERDICT_RANK)
    magnitude = frame["change_share"].abs().fillna(0.0)
    frame = frame.assign(_rank=rank, _mag=-magnitude).sort_values(["_rank", "_mag"], kind="stable")
    return frame.drop(columns=["_rank", "_mag"]).reset_index(drop=True)


def attribute_client_drift(report: pd.DataFrame, series: pd.DataFrame,
                           references: dict[str, str], *, warmup_s: float = 0.0,
                           alpha: float = DEFAULT_ALPHA, share: float = DEFAULT_SHARE,
                           ci: float = DEFAULT_CI) -> pd.DataFrame:
    """``report`` (of :func:`drift_report` over ``series``) with each client series judged
    against the server's own figure: ``references`` maps a client series (e.g. ``ttft_p99_s``)
    to the server's (e.g. ``server_ttft_mean_s``), both columns of ``series``.

    Adds ``server_reference`` (the server series used, "" when none), ``gap_slope_per_h`` and
    ``gap_mk_p`` (the trend of client minus server over the same windows) and ``attribution``
    of each drifting client series: ``server`` when the server's figure drifts the same way;
    ``generator/network`` when the server's does not drift (Mann-Kendall p >= ``alpha``, or a
    change of at most ``share`` of its start) while the gap trends the same way as the client
    (p < ``alpha``); then the verdict becomes ``generator drifts up/down``. Otherwise
    ``client only``: the client drift stands, but nothing from the server confirms it.
    """
    frame = report.copy()
    frame["server_reference"] = ""
    frame["attribution"] = ""
    frame["gap_slope_per_h"] = math.nan
    frame["gap_mk_p"] = math.nan
    if frame.empty:
        return frame
    by_name = {name: i for i, name in enumerate(frame["series"])}
    for client, server in references.items():
        if client not in by_name:
            continue
        i = by_name[client]
        row = frame.iloc[i]
        has_server = server in series.columns and server in by_name
        if has_server:
            frame.iat[i, frame.columns.get_loc("server_reference")] = server
        if row["verdict"] not in (VERDICT_UP, VERDICT_DOWN):
            continue
        attribution = ATTRIBUTED_UNCONFIRMED
        if has_server:
            server_row = frame.iloc[by_name[server]]
            both = series[[client, server]].dropna()
            gap = pd.DataFrame({"gap": both[client] - both[server]}, index=both.index)
            origin = int(np.asarray(series.index, dtype=np.int64).min())
            start_ns = np.asarray(gap.index, dtype=np.int64)
            after = start_ns >= origin + int(warmup_s * 1e9)
            gap_drift = series_drift("gap", (start_ns[after] - origin) / 3.6e12,
                                     gap["gap"].to_numpy()[after], alpha=alpha, share=share,
                                     ci=ci)
            frame.iat[i, frame.columns.get_loc("gap_slope_per_h")] = gap_drift.slope_per_h
            frame.iat[i, frame.columns.get_loc("gap_mk_p")] = gap_drift.mk_p
            same_sign = np.sign(gap_drift.slope_per_h) == np.sign(row["slope_per_h"])
            if server_row["verdict"] == row["verdict"]:
                attribution = ATTRIBUTED_SERVER
            elif (server_row["verdict"] == VERDICT_NONE and gap_drift.mk_p < alpha
                  and same_sign):
                attribution = ATTRIBUTED_GENERATOR
                frame.iat[i, frame.columns.get_loc("verdict")] = (
                    VERDICT_GENERATOR_UP if row["verdict"] == VERDICT_UP
                    else VERDICT_GENERATOR_DOWN)
        frame.iat[i, frame.columns.get_loc("attribution")] = attribution
    return _sort(frame)


def format_drift(report: pd.DataFrame) -> str:
    """The report as text lines, worst first (for the soak's summary)."""
    attributed = "attribution" in report
    lines = [f"{'series':<22} {'verdict':<21} {'start':>12} {'slope/h [95% CI]':>36} "
             f"{'change':>8} {'MK p':>8}" + ("  drift is the ..." if attributed else "")]
    for row in report.itertuples():
        if row.verdict == VERDICT_SHORT:
            lines.append(f"{row.series:<22} {row.verdict:<21} ({row.windows} windows)")
            continue
        ci = f"{_num(row.slope_per_h)} [{_num(row.slope_low_per_h)}, {_num(row.slope_high_per_h)}]"
        share = "n/a" if math.isnan(row.change_share) else f"{row.change_share * 100:+.1f}%"
        where = ""
        if attributed and row.attribution:
            where = f"  {row.attribution}"
            if row.server_reference:
                where += f" (vs {row.server_reference})"
        lines.append(f"{row.series:<22} {row.verdict:<21} {_num(row.start_level):>12} {ci:>36} "
                     f"{share:>8} {row.mk_p:>8.2g}{where}")
    return "\n".join(lines)


def _num(value: float) -> str:
    if math.isnan(value):
        return "nan"
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value:.4g}"
    if magnitude >= 100:
        return f"{value:.0f}"
    return f"{value:.4g}"
