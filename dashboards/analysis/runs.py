"""Run-folder analysis: plain functions over DataFrames, shared by the CLI and the dashboard.

Reads ``results/<run_id>/`` (``manifest.json``, ``requests/*.parquet`` with
:data:`collectors.schemas.REQUEST_SCHEMA`, ``gpu/*.parquet`` with :data:`GPU_SCHEMA`) and computes
the figures defined in ``docs/METRICS.md``:

- latency percentiles (P50/P90/P95/P99/P99.9) exactly, with ``numpy.percentile`` (linear method),
  from the raw values of **ok requests only**; ITL percentiles use every inter-token gap
  (the exploded ``itl_s`` list column), not the per-request summaries;
- error rate = failed / (ok + failed), overall and per error class;
- throughput (ok requests/s, output tokens/s of ok requests) over the measured window.

Usage::

    from collectors import run_folder
    from dashboards.analysis import runs
    df = run_folder.load_requests("results/run-1")
    summary = runs.summarize_requests(df)          # index: short, medium, long, all
    print(runs.format_summary(summary))

or ``swarmload summary results/run-1`` (:mod:`infra.summary`). Nothing here imports Streamlit;
the dashboard page (``dashboards/app.py``) only lays out what these functions return.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from collectors.itl_gaps import (
    MERGED_GAP_WARN_SHARE,
    TTFT_BOUND_WARN_S,
    gaps_by_row,
    merged_reads,
)
from collectors.percentiles import percentile, percentiles
from collectors.request_columns import BY_NAME, OPTIONAL, REQUEST_COLUMNS, REQUIRED
from collectors.run_folder import load_manifest, load_requests
from collectors.schemas import (
    GENERATOR_OUTCOMES,
    OUTCOME_CANCELLED,
    OUTCOME_OK,
    OUTCOMES,
)
from dashboards.analysis import sessions as session_figures
from dashboards.analysis.envelope import even_positions

BUCKET_ORDER = ("short", "medium", "long")
ALL_ROW = "all"
# column-name tag -> percentile; "p999" is P99.9 (a dot in a column name breaks attribute access)
PERCENTILES: dict[str, float] = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}
# Every list below is derived from the request columns' declarations
# (collectors/request_columns.py: what the summary reads, its latencies, counts and means).
_LATENCIES = [(column.name, column.latency) for column in REQUEST_COLUMNS
              if column.latency is not None]
_BY_TAG = {latency.tag: latency for _, latency in _LATENCIES}
# metric tag -> REQUEST_SCHEMA column; summary columns are f"{tag}_{pct}_s", e.g. "ttft_p95_s"
_ALWAYS = sorted((lat.order, lat.tag, name) for name, lat in _LATENCIES if lat.order is not None)
LATENCY_METRICS: dict[str, str] = {tag: name for _, tag, name in _ALWAYS}
# what summarize_requests reads; loading only these keeps big runs cheap
SUMMARY_COLUMNS = tuple(column.name for column in REQUEST_COLUMNS if column.summary == REQUIRED)
# summarized when present (runs recorded before they existed lack them): queued TTFT of
# open-loop plans, and the answer TTFT of reasoning models, beside the four latency metrics
EXTRA_LATENCY_METRICS: dict[str, str] = {latency.tag: name for name, latency in _LATENCIES
                                         if latency.order is None}
SUMMARY_OPTIONAL_COLUMNS = tuple(column.name for column in REQUEST_COLUMNS
                                 if column.summary == OPTIONAL)
# metric tag -> how tables name it ("TTFT", "queued TTFT")
LATENCY_TITLES: dict[str, str] = {tag: latency.title for tag, latency in _BY_TAG.items()}
# true/false column -> what the summary says after its count (when any request has it)
COUNTED_COLUMNS: dict[str, str] = {column.name: column.count for column in REQUEST_COLUMNS
                                   if column.count}
# column -> the throughput table's title of its mean over ok requests (``mean_<column>``)
MEAN_COLUMNS: dict[str, str] = {column.name: column.mean for column in REQUEST_COLUMNS
                                if column.mean}
# what the Run page's summary loads: the summary's columns and those of the means it shows
RUN_PAGE_COLUMNS = (*SUMMARY_COLUMNS,
                    *(name for name in MEAN_COLUMNS if name not in SUMMARY_COLUMNS))
# the Run page's latency tiles: (label, summary column), the latencies' headline percentiles
HEADLINE_METRICS: tuple[tuple[str, str], ...] = tuple(
    (f"{pct.upper()} {_BY_TAG[tag].title} (ms)", f"{tag}_{pct}_s")
    for tag in LATENCY_METRICS for pct in _BY_TAG[tag].headline)

_NS = 1_000_000_000
_MAX_SCATTER_POINTS = 20_000




def default_window(df: pd.DataFrame) -> tuple[int, int] | None:
    """(first sent_wall_ns, last completion) of the requests, in ns; ``None`` with no requests.

    A completion is ``sent_wall_ns + e2e_s``; a request without ``e2e_s`` (e.g. connect error)
    ends when it was sent.
    """
    if df.empty:
        return None
    sent = df["sent_wall_ns"].to_numpy(dtype=np.int64)
    e2e_ns = np.nan_to_num(df["e2e_s"].to_numpy(dtype=np.float64), nan=0.0) * _NS
    end = sent + np.round(e2e_ns).astype(np.int64)
    return int(sent.min()), int(end.max())


def trimmed_window(
    df: pd.DataFrame, warmup_s: float = 0.0, cooldown_s: float = 0.0
) -> tuple[int, int] | None:
    """The default window less ``warmup_s`` at its start and ``cooldown_s`` at its end.

    ``None`` when nothing is trimmed or there are no requests (use the default window);
    ``ValueError`` when the trims leave no time.
    """
    full = default_window(df)
    if full is None or (warmup_s <= 0 and cooldown_s <= 0):
        return None
    start = full[0] + round(max(warmup_s, 0.0) * _NS)
    end = full[1] - round(max(cooldown_s, 0.0) * _NS)
    if end <= start:
        length = (full[1] - full[0]) / _NS
        raise ValueError(
            f"warm-up {warmup_s} s + cool-down {cooldown_s} s leave nothing of a {length:.2f} s run"
        )
    return start, end


def _bucket_names(buckets: pd.Series) -> list[str]:
    present = set(buckets.dropna().unique())
    known = [b for b in BUCKET_ORDER if b in present]
    return known + sorted(present - set(BUCKET_ORDER))


def _error_classes(outcomes: pd.Series) -> list[str]:
    present = set(outcomes.dropna().unique()) - {OUTCOME_OK} - set(GENERATOR_OUTCOMES)
    known = [o for o in OUTCOMES if o in present]
    return known + sorted(present - set(OUTCOMES))


def _summary_row(
    group: pd.DataFrame, itl_gaps: np.ndarray, error_classes: list[str], window_s: float,
    schedule_span_s: float = 0.0, merged: pd.DataFrame | None = None,
) -> dict[str, Any]:
    is_ok = group["outcome"] == OUTCOME_OK
    # Requests the generator never sent or never finished (dropped at the in-flight cap, lost
    # with a worker, cancelled in flight at the end) say nothing about the server: counted
    # apart, not as errors.
    generator = group["outcome"].isin(GENERATOR_OUTCOMES)
    ok = group[is_ok]
    n_ok = int(is_ok.sum())
    n_cancelled = int((group["outcome"] == OUTCOME_CANCELLED).sum())
    n_not_sent = int(generator.sum()) - n_cancelled
    n_failed = int(len(group) - n_ok - n_not_sent - n_cancelled)
    attempts = n_ok + n_failed
    row: dict[str, Any] = {
        "requests": int(len(group)),
        "ok": n_ok,
        "errors": n_failed,
        "not_sent": n_not_sent,
        "cancelled": n_cancelled,  # in flight when the run ended (or at Ctrl-C)
        "error_rate": n_failed / attempts if attempts else math.nan,
    }
    for name in COUNTED_COLUMNS:  # e.g. resent; 0 for runs recorded before the column
        row[name] = (int(group[name].fillna(False).astype(bool).sum())
                     if name in group.columns else 0)
    counts = group["outcome"].value_counts()
    for outcome in error_classes:
        row[f"err_{outcome}"] = int(counts.get(outcome, 0)) / attempts if attempts else math.nan
    for tag, column in LATENCY_METRICS.items():
        if column == "itl_s":
            values = itl_gaps  # every gap, not the per-request summaries
        else:
            values = ok[column].to_numpy(dtype=np.float64, na_value=np.nan)
        figures = percentiles(values, list(PERCENTILES.values()))
        for name, value in zip(PERCENTILES, figures, strict=True):
            row[f"{tag}_{name}_s"] = value
    output_tokens = ok["output_tokens"].to_numpy(dtype=np.float64, na_value=np.nan)
    has_window = window_s > 0
    row["window_s"] = window_s
    row["req_per_s"] = n_ok / window_s if has_window else math.nan
    row["output_tok_per_s"] = float(np.nansum(output_tokens)) / window_s if has_window else math.nan
    offered = int(group["scheduled_wall_ns"].notna().sum())
    # over the schedule's own span when summarizing the whole run (a drain after the schedule
    # would otherwise dilute it), over the window when one was chosen
    offered_over = schedule_span_s if schedule_span_s else window_s
    row["offered_req_per_s"] = offered / offered_over if offered_over > 0 and offered \
        else math.nan
    row["schedule_span_s"] = schedule_span_s or math.nan
    for name in MEAN_COLUMNS:  # prompt and output tokens, ...; absent columns have none
        if name in ok.columns:
            row[f"mean_{name}"] = _nanmean(ok[name].to_numpy(dtype=np.float64, na_value=np.nan))
    lag = group["schedule_lag_s"].to_numpy(dtype=np.float64, na_value=np.nan)
    row["schedule_lag_p50_s"] = percentile(lag, PERCENTILES["p50"])
    row["schedule_lag_p99_s"] = percentile(lag, PERCENTILES["p99"])
    row["schedule_lag_max_s"] = float(np.nanmax(lag)) if (~np.isnan(lag)).any() else math.nan
    for tag, column in EXTRA_LATENCY_METRICS.items():
        values = (ok[column].to_numpy(dtype=np.float64, na_value=np.nan)
                  if column in ok.columns else np.array([], dtype=np.float64))
        if tag == "answer_ttft" and "reasoning_events" in ok.columns and not (
                ok["reasoning_events"].fillna(0) > 0).any():
            values = np.array([], dtype=np.float64)  # no reasoning: the same as TTFT
        figures = percentiles(values, list(PERCENTILES.values()))
        for name, value in zip(PERCENTILES, figures, strict=True):
            row[f"{tag}_{name}_s"] = value
    row["streamed_share"] = (float(group["streamed"].fillna(True).mean())
                             if "streamed" in group.columns and len(group) else math.nan)
    if "read_delay_s" in group.columns:  # runs recorded before the column existed lack it
        delay = group["read_delay_s"].to_numpy(dtype=np.float64, na_value=np.nan)
        row["read_delay_p99_s"] = percentile(delay, PERCENTILES["p99"])
    else:
        row["read_delay_p99_s"] = math.nan
    gaps = int(itl_gaps.size)
    row["merged_gap_share"] = float((itl_gaps == 0.0).sum()) / gaps if gaps else math.nan
    bound = (merged["ttft_bound_s"].to_numpy(dtype=np.float64) if merged is not None
             else np.empty(0))
    row["merged_first_share"] = float((bound > 0).mean()) if bound.size else math.nan
    row["ttft_bound_p99_s"] = percentile(bound, PERCENTILES["p99"]) if bound.size \
        else math.nan
    row["ttft_bound_max_s"] = float(bound.max()) if bound.size else math.nan
    return row


def _nanmean(values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else math.nan


def summarize_requests(df: pd.DataFrame, window: tuple[int, int] | None = None) -> pd.DataFrame:
    """Per-bucket summary of request records (REQUEST_SCHEMA columns, see SUMMARY_COLUMNS).

    Index ``bucket``: short, medium, long (those present, in that order; other bucket names
    after them), then ``all`` (every request, bucketed or not). Columns:

    - ``requests``, ``ok``, ``errors`` (counts), ``error_rate`` = errors / (ok + errors);
    - ``err_<outcome>``: rate of each failure class present in ``df`` (same denominator);
    - ``<metric>_<pct>_s`` for metric in ttft/itl/tpot/e2e and pct in p50/p90/p95/p99/p999
      (P99.9), in seconds, exact over ok requests; ITL over every inter-token gap;
    - ``window_s``; ``req_per_s`` (ok requests / window), ``output_tok_per_s`` (output tokens of
      ok requests / window), ``offered_req_per_s`` (requests that carry a schedule / the
      schedule's own span ``schedule_span_s`` by default, / the window when one is given);
    - sessions and agent tasks (``session_id``), without a window: ``arrival_unit``
      ("sessions", "tasks"; "" elsewhere and on bucket rows), ``arrivals`` and
      ``offered_arrivals_per_s`` (the ``all`` row: sessions / their arrivals' own span, as
      ``schedule_span_s`` for requests; an open-loop plan's load, whose later turns are sent
      as answers come);
    - ``queued_ttft_<pct>_s`` (open-loop: first token - scheduled), ``answer_ttft_<pct>_s``
      (reasoning models only), ``schedule_lag_p50_s`` / ``_p99_s`` / ``_max_s``,
      ``streamed_share`` (NaN where the columns are absent);
    - ``mean_prompt_tokens``, ``mean_output_tokens`` (ok requests), ``schedule_lag_p99_s``,
      ``read_delay_p99_s`` (the generator's own read delay, see REQUEST_SCHEMA);
    - events the generator read together (:func:`merged_reads`, ok requests):
      ``merged_gap_share`` (ITL gaps of exactly 0), ``merged_first_share`` (requests whose
      first token was read with later ones), ``ttft_bound_p99_s`` / ``ttft_bound_max_s`` (how
      late their TTFT may read).

    ``window=(start_ns, end_ns)`` (wall-clock ns) keeps requests sent in ``[start, end)`` and
    divides by its length; by default the window runs from the first send to the last completion.
    Every row shares one window, so the bucket throughputs add up to the ``all`` row.
    """
    missing = [c for c in SUMMARY_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"request frame lacks column(s) {missing}; load it with load_requests")
    if window is not None:
        start_ns, end_ns = window
        if end_ns <= start_ns:
            raise ValueError(f"window end {end_ns} must be after its start {start_ns}")
        sent = df["sent_wall_ns"]
        df = df[(sent >= start_ns) & (sent < end_ns)]
        schedule_span_s = 0.0
    else:
        window = default_window(df)
        schedule_span_s = _schedule_span_s(df)
    window_s = (window[1] - window[0]) / _NS if window is not None else 0.0
    error_classes = _error_classes(df["outcome"])
    df = df.reset_index(drop=True)
    gaps, gap_row = gaps_by_row(df["itl_s"])
    ok_rows = (df["outcome"] == OUTCOME_OK).to_numpy()
    masks = [(name, (df["bucket"] == name).to_numpy()) for name in _bucket_names(df["bucket"])]
    masks.append((ALL_ROW, np.ones(len(df), dtype=bool)))
    merged = merged_reads(gaps, gap_row, len(df))
    rows = {}
    for name, mask in masks:
        group_gaps = gaps[(mask & ok_rows)[gap_row]]
        rows[name] = _summary_row(df[mask], group_gaps, error_classes, window_s,
                                  schedule_span_s, merged[mask & ok_rows])
    summary = pd.DataFrame.from_dict(rows, orient="index")
    summary.index.name = "bucket"
    summary["arrival_unit"], summary["arrivals"], summary["offered_arrivals_per_s"] = (
        "", 0, math.nan)
    if schedule_span_s:  # no window: a study's step counts its own (sessions.arrival_figures)
        unit = session_figures.arrival_unit(df) if "session_id" in df else ""
        if unit:
            arrivals = session_figures.per_arrival(df)["arrival_ns"].rename("scheduled_wall_ns")
            span = _schedule_span_s(arrivals.to_frame())
            summary.loc[ALL_ROW, ["arrival_unit", "arrivals"]] = unit, len(arrivals)
            summary.loc[ALL_ROW, "offered_arrivals_per_s"] = (len(arrivals) / span if span > 0
                                                              else math.nan)
    return summary


def _schedule_span_s(df: pd.DataFrame) -> float:
    """The schedule's own span: first to last scheduled arrival, plus one mean gap (N arrivals
    fill N gaps), so N / span is the plan's rate: a 120 s plan at 5 req/s says 5.00, however long
    the drain after it took (counted over the whole run it said 3.45). 0 without a schedule."""
    scheduled = df["scheduled_wall_ns"].dropna()
    n = len(scheduled)
    if n < 2:
        return 0.0
    return float(scheduled.max() - scheduled.min()) / _NS * n / (n - 1)


# what offers load in an open-loop plan: none of it was offered under a closed one
OFFERED_COLUMNS = ("offered_req_per_s", "offered_arrivals_per_s")
CLOSED_LOAD_KINDS = ("closed", "closed-loop")  # the manifest's load.kind: a closed plan, users


def summarize_run(run_dir: str | Path, window: tuple[int, int] | None = None) -> pd.DataFrame:
    """:func:`summarize_requests` of a run folder, loading only the columns it needs. A
    closed-loop run offered no load: its sessions' and tasks' records carry a schedule all the
    same (each leased when one ended; later turns and calls from answers), so its manifest's
    plan decides."""
    columns = [*SUMMARY_COLUMNS, *SUMMARY_OPTIONAL_COLUMNS]
    summary = summarize_requests(load_requests(run_dir, columns), window)
    if (load_manifest(run_dir).get("load") or {}).get("kind") in CLOSED_LOAD_KINDS:
        for column in OFFERED_COLUMNS:
            if column in summary:
                summary[column] = math.nan
    return summary


# ----------------------------------------------------------------------------- tables and charts


def format_ms(seconds: float) -> str:
    """Seconds as milliseconds with two decimals ("218.14"); ``-`` for a missing value."""
    return "-" if seconds is None or math.isnan(seconds) else f"{seconds * 1e3:.2f}"


def format_number(value: float, digits: int = 2) -> str:
    """A float with ``digits`` decimals; ``-`` for a missing value."""
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def format_percent(rate: float) -> str:
    """A fraction as a percentage with two decimals ("3.91%"); ``-`` for a missing value."""
    return "-" if rate is None or math.isnan(rate) else f"{rate * 100:.2f}%"


def latency_table_ms(
    summary: pd.DataFrame, percentiles: Sequence[str] = ("p50", "p95", "p99")
) -> pd.DataFrame:
    """Latency percentiles in ms per bucket, columns like ``"TTFT P95"`` (metric-major order)."""
    table = pd.DataFrame(index=summary.index)
    for tag in LATENCY_METRICS:
        for pct in percentiles:
            label = "P99.9" if pct == "p999" else pct.upper()
            table[f"{tag.upper()} {label}"] = summary[f"{tag}_{pct}_s"] * 1e3
    return table


def error_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Error counts and rates (in %) per bucket: ``errors``, ``error %``, one ``% <class>`` each."""
    table = pd.DataFrame(index=summary.index)
    table["requests"] = summary["requests"]
    table["errors"] = summary["errors"]
    table["error %"] = summary["error_rate"] * 100
    for column in summary.columns:
        if column.startswith("err_"):
            table[f"% {column[4:]}"] = summary[column] * 100
    return table


def throughput_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Throughput and token means per bucket; ``offered req/s`` only for open-loop runs, with
    ``offered sessions/s`` or ``offered tasks/s`` before it where the plan's arrivals are those."""
    table = pd.DataFrame(
        {
            "req/s": summary["req_per_s"],
            "output tok/s": summary["output_tok_per_s"],
            "offered req/s": summary["offered_req_per_s"],
        },
        index=summary.index,
    )
    if table["offered req/s"].isna().all():
        table = table.drop(columns="offered req/s")  # closed-loop users have no schedule
    elif "offered_arrivals_per_s" in summary:
        # sessions and agent tasks arrive on the plan, their later calls as answers come: the
        # plan's load is in its own unit, beside the requests it led to
        unit = summary["arrival_unit"].get(ALL_ROW) if "arrival_unit" in summary else None
        if isinstance(unit, str) and unit:  # "" on bucket rows and for lone requests
            table.insert(table.columns.get_loc("offered req/s"), f"offered {unit}/s",
                         summary["offered_arrivals_per_s"])
    for name, title in MEAN_COLUMNS.items():
        column = summary.get(f"mean_{name}")
        # an optional column's mean only where the run has it
        if column is not None and (BY_NAME[name].summary == REQUIRED or column.notna().any()):
            table[title] = column
    return table


def run_origin_ns(manifest: dict[str, Any], requests: pd.DataFrame | None = None) -> int | None:
    """Time zero for the run's charts: ``started_at`` of the manifest, else the first send."""
    started = manifest.get("started_at")
    if isinstance(started, str):
        try:
            parsed = datetime.fromisoformat(started.replace("Z", "+00:00"))
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return int(round(parsed.timestamp() * 1e6)) * 1000
    if requests is not None and not requests.empty:
        return int(requests["sent_wall_ns"].min())
    return None


def latency_over_time(
    df: pd.DataFrame,
    origin_ns: int | None = None,
    metric: str = "ttft_s",
    max_points: int = _MAX_SCATTER_POINTS,
) -> pd.DataFrame:
    """Ok requests as points: ``t_s`` (sent time, s since origin), ``<metric>`` in ms, ``bucket``.

    The column is named after the metric, e.g. ``ttft_ms``. Thinned to at most ``max_points`` by
    an even stride over send order, so a chart of a long run stays light.
    """
    out_name = metric.removesuffix("_s") + "_ms"
    ok = df[(df["outcome"] == OUTCOME_OK) & df[metric].notna()].sort_values("sent_wall_ns")
    ok = ok.iloc[even_positions(len(ok), max_points)]
    if origin_ns is None:
        origin_ns = int(ok["sent_wall_ns"].min()) if len(ok) else 0
    return pd.DataFrame(
        {
            "t_s": (ok["sent_wall_ns"].to_numpy(dtype=np.int64) - origin_ns) / _NS,
            out_name: ok[metric].to_numpy(dtype=np.float64) * 1e3,
            "bucket": ok["bucket"].fillna("unbucketed").to_numpy(dtype=object),
        }
    )


GPU_CHART_COLUMNS: dict[str, str] = {
    "util_gpu_pct": "GPU utilisation (%)",
    "mem_used_gib": "Memory used (GiB)",
    "power_w": "Power (W)",
    "temperature_c": "Temperature (°C)",
    "sm_clock_mhz": "SM clock (MHz)",
}


def gpu_timeseries(gpu: pd.DataFrame, origin_ns: int | None = None) -> pd.DataFrame:
    """GPU samples for line charts: ``t_s``, ``gpu`` ("host:index"), the GPU_CHART_COLUMNS.

    Samples that carry an ``error`` (GPU unreadable then) are dropped.
    """
    good = gpu[gpu["error"].isna()] if "error" in gpu else gpu
    good = good.sort_values("wall_ns")
    if origin_ns is None:
        origin_ns = int(good["wall_ns"].min()) if len(good) else 0
    return pd.DataFrame(
        {
            "t_s": (good["wall_ns"].to_numpy(dtype=np.int64) - origin_ns) / _NS,
            "gpu": (good["host"].astype(str) + ":" + good["gpu_index"].astype(str)).to_numpy(),
            "util_gpu_pct": good["util_gpu_pct"].to_numpy(dtype=np.float64, na_value=np.nan),
            "mem_used_gib": good["mem_used_bytes"].to_numpy(dtype=np.float64, na_value=np.nan)
            / 2**30,
            "power_w": good["power_w"].to_numpy(dtype=np.float64, na_value=np.nan),
            "temperature_c": good["temperature_c"].to_numpy(dtype=np.float64, na_value=np.nan),
            "sm_clock_mhz": good["sm_clock_mhz"].to_numpy(dtype=np.float64, na_value=np.nan),
        }
    )


def manifest_facts(manifest: dict[str, Any]) -> dict[str, str]:
    """The manifest's key facts as label -> text, for a header; missing keys read ``-``."""

    def text(value: Any) -> str:
        if value is None or value == "" or value == {}:
            return "-"
        if isinstance(value, dict):
            return ", ".join(f"{k}={v}" for k, v in value.items())
        return str(value)

    target = manifest.get("target") or {}
    workload = manifest.get("workload") or {}
    load = manifest.get("load") or {}
    gpu = manifest.get("gpu") or {}
    versions = manifest.get("versions") or {}
    return {
        "Run": text(manifest.get("run_id")),
        "Started": text(manifest.get("started_at")),
        "Ended": text(manifest.get("ended_at") or "running (no end time yet)"),
        "Target": text(target.get("kind")),
        "Model": text(target.get("model")),
        "Base URL": text(target.get("base_url")),
        "Workload": text(workload.get("kind")),
        "Mix": text(workload.get("mix")),
        "Users": text(load.get("users")),
        "Workers": text(load.get("workers")),
        "Spawn rate": text(load.get("spawn_rate")),
        "Duration (s)": text(load.get("duration_s")),
        "GPU": "available" if gpu.get("available") else f"unavailable ({text(gpu.get('reason'))})",
        "Versions": text(versions),
        "Labels": text(manifest.get("labels")),
    }


# ----------------------------------------------------------------------------------- terminal


# Above this P99 schedule lag the generator, not the server, shaped the run (METRICS.md).
LAG_WARN_S = 0.010
GENERIC_REMEDY = "Add workers or lower the rate."


def generator_warnings(summary: pd.DataFrame, lag_limit_s: float = LAG_WARN_S,
                       remedy: str = GENERIC_REMEDY) -> list[str]:
    """Loud warnings where the load generator, not the server, made the figures: it fell behind
    its plan, read events together that the server sent apart (their times are the later
    ones'), or dropped arrivals. ``remedy``: what to change, from what limited the generator
    (:func:`dashboards.analysis.generator_cpu.generator_remedy`)."""
    if summary.empty or ALL_ROW not in summary.index:
        return []
    row = summary.loc[ALL_ROW]
    warnings = []
    lag = row.get("schedule_lag_p99_s", math.nan)
    if lag == lag and lag > lag_limit_s:
        warnings.append(
            f"GENERATOR FELL BEHIND: P99 schedule lag {lag * 1e3:.1f} ms > "
            f"{lag_limit_s * 1e3:.0f} ms; latencies include the generator's own queueing. "
            f"{remedy}")
    # A late read alone bends nothing (event times are the kernel's); events read together do.
    bound = row.get("ttft_bound_p99_s", math.nan)
    share = row.get("merged_gap_share", math.nan)
    late_ttft = bound == bound and bound > TTFT_BOUND_WARN_S
    merged_itl = share == share and share > MERGED_GAP_WARN_SHARE
    if late_ttft or merged_itl:
        first = row.get("merged_first_share", math.nan)
        parts = []
        if late_ttft:
            parts.append(f"the first token of {first:.1%} of requests was read with later "
                         f"ones: TTFT may read late by up to {bound * 1e3:.1f} ms at P99 (max "
                         f"{row.get('ttft_bound_max_s', math.nan) * 1e3:.1f} ms)")
        if merged_itl:
            parts.append(f"{share:.1%} of ITL gaps were read together: they show 0 and the "
                         "gap before them the sum")
        warnings.append(f"GENERATOR READ EVENTS TOGETHER (each takes the later one's time): "
                        f"{'; '.join(parts)}. {remedy}")
    not_sent = int(row.get("not_sent", 0) or 0)
    if not_sent:
        warnings.append(
            f"GENERATOR DID NOT SEND {not_sent} scheduled request(s) (dropped at the in-flight "
            "cap, or lost with a worker): see outcome column."
        )
    return warnings


ERROR_BOUND_COLUMNS = ("ttft_bound_p99_s", "merged_gap_share", "schedule_lag_p99_s")


def error_bound(summary: pd.DataFrame) -> dict[str, float | None]:
    """By how much the generator may have bent the figures (the ``all`` row): how late TTFT
    may read at P99 (events read together), the share of ITL gaps merged, and the P99 schedule
    lag; None where unknown. The run's manifest keeps them beside its validity."""
    if summary.empty or ALL_ROW not in summary.index:
        return dict.fromkeys(ERROR_BOUND_COLUMNS)
    row = summary.loc[ALL_ROW]
    values = {c: row.get(c, math.nan) for c in ERROR_BOUND_COLUMNS}
    return {c: float(v) if v == v and v is not None else None for c, v in values.items()}


def validity_text(validity: dict[str, Any] | None) -> str:
    """A run's validity (its manifest's ``validity``: :func:`error_bound` beside the verdict)
    in one line: ``valid``, or the verdict and by how much the generator bent the figures;
    ``-`` for a run recorded before validity existed."""
    if not validity:
        return "-"
    verdict = str(validity.get("verdict") or "valid")
    if verdict == "valid":
        return verdict
    parts = []
    bound, share = validity.get("ttft_bound_p99_s"), validity.get("merged_gap_share")
    lag = validity.get("schedule_lag_p99_s")
    if bound and bound > TTFT_BOUND_WARN_S:
        parts.append(f"TTFT may read up to {bound * 1e3:.1f} ms late at P99")
    if share and share > MERGED_GAP_WARN_SHARE:
        parts.append(f"{share:.1%} of ITL gaps merged")
    if lag and lag > LAG_WARN_S:
        parts.append(f"schedule lag P99 {lag * 1e3:.1f} ms")
    if not parts and validity.get("reasons"):
        parts.append(str(validity["reasons"][0]).split(";")[0])
    return verdict + (f": {', '.join(parts)}" if parts else "")


def _present(row: pd.Series, tag: str) -> bool:
    value = row.get(f"{tag}_p50_s", math.nan)
    return value is not None and value == value


def format_summary(summary: pd.DataFrame, remedy: str = GENERIC_REMEDY) -> str:
    """A compact fixed-width text table of :func:`summarize_requests`; latencies in ms;
    ``remedy`` ends its generator warnings (:func:`generator_warnings`)."""
    if summary.empty or int(summary["requests"].sum()) == 0:
        return "no requests recorded"
    names = [str(name) for name in summary.index]
    width = max(8, *(len(n) for n in names))
    window_s = float(summary["window_s"].iloc[-1])
    lines = [f"window {window_s:.2f} s", ""]
    header = (
        f"{'bucket':<{width}} {'requests':>9} {'ok':>9} {'errors':>7} {'error%':>8} "
        f"{'req/s':>9} {'out tok/s':>11} {'prompt tok':>11} {'output tok':>11}"
    )
    lines.append(header)
    for name, row in zip(names, summary.itertuples(index=False), strict=True):
        lines.append(
            f"{name:<{width}} {row.requests:>9d} {row.ok:>9d} {row.errors:>7d} "
            f"{format_percent(row.error_rate):>8} {format_number(row.req_per_s):>9} "
            f"{format_number(row.output_tok_per_s, 1):>11} "
            f"{format_number(row.mean_prompt_tokens, 1):>11} "
            f"{format_number(row.mean_output_tokens, 1):>11}"
        )
    all_row = summary.loc[ALL_ROW]
    if all_row.get("offered_req_per_s", 0) and all_row["offered_req_per_s"] > 0:
        span = all_row.get("schedule_span_s", math.nan)
        over = (f" over the schedule's {span:.1f} s" if span == span
                else f" over the {window_s:.1f} s window")
        offered = [f"{format_number(all_row['offered_req_per_s'])} req/s{over}"]
        unit, arrivals = all_row.get("arrival_unit"), all_row.get("offered_arrivals_per_s")
        if isinstance(unit, str) and unit and arrivals == arrivals:  # sessions, tasks
            span = float(all_row["arrivals"]) / arrivals
            offered = [f"{format_number(arrivals)} {unit}/s over their arrivals' {span:.1f} s",
                       f"  their requests: {offered[0]} (later ones sent as answers came)"]
        lines += ["", f"open-loop: offered {offered[0]}, not sent "
                  f"{int(all_row.get('not_sent', 0))}", *offered[1:],
                  f"schedule lag ms: P50 {format_ms(all_row.get('schedule_lag_p50_s'))}, "
                  f"P99 {format_ms(all_row['schedule_lag_p99_s'])}, "
                  f"max {format_ms(all_row.get('schedule_lag_max_s'))}"]
    streamed = all_row.get("streamed_share", math.nan)
    if streamed == streamed and streamed < 1.0:
        lines += ["", "non-streaming requests: no TTFT, ITL or TPOT (E2E and usage only)"]
    cancelled = int(all_row.get("cancelled", 0) or 0)
    if cancelled:
        lines += ["", f"cancelled {cancelled}: in flight when the run ended (each recorded with "
                  "how long it had waited; not in error rates or percentiles)"]
    for name, note in COUNTED_COLUMNS.items():
        count = int(all_row.get(name, 0) or 0)
        if count:
            lines += ["", f"{name} {count}: {note}"]
    read_delay = all_row.get("read_delay_p99_s", math.nan)
    if read_delay == read_delay:
        lines += ["", f"generator read delay P99 {format_ms(read_delay)} ms "
                  "(kernel receive time to the worker's read; not in the latencies)"]
        share = all_row.get("merged_gap_share", math.nan)
        if share == share and share > 0:
            lines.append(f"events read together: {share:.2%} of ITL gaps; TTFT may read late "
                         f"by up to {format_ms(all_row.get('ttft_bound_p99_s'))} ms at P99")
    error_columns = [c for c in summary.columns if c.startswith("err_")]
    if error_columns:
        all_row = summary.loc[ALL_ROW]
        attempts = int(all_row["ok"] + all_row["errors"])
        parts = [
            f"{c[4:]} {format_percent(all_row[c])} ({round(all_row[c] * attempts)})"
            for c in error_columns
        ]
        lines += ["", "errors by class (all): " + ", ".join(parts)]
    pct_labels = ["P99.9" if p == "p999" else p.upper() for p in PERCENTILES]
    tag_width = 11 if any(_present(row, tag) for _, row in summary.iterrows()
                          for tag in EXTRA_LATENCY_METRICS) else 5
    heading = "latency ms (ok requests)"
    tag_width = max(tag_width, len(heading) - width - 1)  # percentile columns under the heading
    lines += [
        "",
        f"{heading:<{width + tag_width + 1}} "
        + " ".join(f"{label:>10}" for label in pct_labels),
    ]
    for name, (_, row) in zip(names, summary.iterrows(), strict=True):
        extra = [tag for tag in EXTRA_LATENCY_METRICS if _present(row, tag)]
        for i, tag in enumerate([*LATENCY_METRICS, *extra]):
            cells = " ".join(f"{format_ms(row[f'{tag}_{p}_s']):>10}" for p in PERCENTILES)
            label = name if i == 0 else ""
            title = LATENCY_TITLES.get(tag, tag.upper())
            lines.append(f"{label:<{width}} {title:<{tag_width}} {cells}")
    warnings = generator_warnings(summary, remedy=remedy)
    if warnings:
        lines += ["", *(f"WARNING: {w}" for w in warnings)]
    return "\n".join(lines)
