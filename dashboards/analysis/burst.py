"""Bursts: what each spike of an open-loop run did, and how long the server took to recover.

Plain functions over DataFrames (no Streamlit). For every spike of a run:

- **baseline** before it (up to ``baseline_s``, after the previous spike's recovery): P50/P95
  TTFT and TPOT over its ok requests (exact, as ``summarize_requests``), error rate, and the
  server's waiting queue (``vllm:num_requests_waiting``, mean of the 1 s windows and their top);
- **peak** from the spike's start to its recovery (or to the next spike): the highest window P95
  TTFT, waiting queue, running requests and KV-cache usage; requests **failed** (server errors)
  and **dropped** (generator outcomes: over the in-flight cap, lost with a worker, cancelled);
- **recovery time** (METRICS.md, "Over time"): from the end of the spike to the first window after
  which every window's P95 TTFT stays within ``tolerance`` (10%) of the baseline P95 (or no
  higher than the worst baseline window: a window that looks like the baseline is recovered) and
  the waiting queue is back to its baseline (within 10% of the baseline's top, or within one
  request of it for a near-empty queue), up to the next spike or the end of the data. Windows
  hold the requests that *arrived* (were scheduled) in them, so a window is recovered when a user
  arriving then is served as before the spike. A window with arrivals but no ok request is not
  recovered; a window with no arrivals and no scrape says nothing either way. At low base rates
  a window's P95 is its slowest request or two, so one slow request long after the spike holds
  recovery back: ``queue_recovery_s`` (the queue criterion alone) is given beside it, and
  ``back_s``, the first window back within the band (when a backlog has drained, what a
  prediction from the server's capacity gives; a later blip leaves it be).

Windows are ``window_s`` (1 s) long and laid out per spike from its end, so the spike's end is a
window edge and a recovery time is a whole number of windows.

Spikes come from the run's ``bursts`` plan (``manifest["load"]["plan"]`` and the schedule start in
``replay_events``); for any other open-loop run they are found in the schedule: runs of 1 s
windows whose offered load (arrivals: requests, and sessions or agent tasks by their first
scheduled call, not their later turns or calls) is at least ``factor`` times the run's median.
A closed-loop run has no schedule, hence no spikes.

Usage::

    report = burst_report(run_dir)          # None when the run has no spikes
    report.spikes                           # one row per spike (SPIKE_COLUMNS)
    report.timelines[1]                     # spike 1's windows (TIMELINE_COLUMNS)
    print("\\n".join(spike_lines(report.spikes)))
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from collectors.atomic import write_atomic
from collectors.percentiles import percentile
from collectors.run_folder import (
    ROLLUP_DIR,
    load_manifest,
    load_requests,
    load_server_metrics,
    read_study,
)
from collectors.schemas import GENERATOR_OUTCOMES, OUTCOME_OK
from collectors.server_figures import KV_USAGE, RUNNING, WAITING
from collectors.windows import window_stats
from dashboards.analysis.telemetry import clock_offsets, server_series
from workloads.arrivals import BurstsPlan, ClosedPlan, plan_from_dict

WINDOW_S = 1.0
TOLERANCE = 0.10  # METRICS.md: P95 TTFT within 10% of its pre-spike baseline
BASELINE_S = 30.0  # longest stretch before a spike taken as its baseline
SKIP_START_S = 1.0  # the run's first second (connections opening) is no one's baseline
SPIKE_FACTOR = 2.0  # schedule-found spikes: offered load >= 2x the run's median
UNKNOWN = "recovery unknown"  # a note's start when a spike cannot be judged
QUEUE_SLACK = 1.0  # a queue within one request of a near-empty baseline is back
_NS = 1_000_000_000

SPIKE_COLUMNS = (
    "spike", "source", "start_s", "duration_s", "planned_peak_rps", "offered_peak_rps",
    "baseline_s", "baseline_offered_rps", "baseline_ttft_p50_s", "baseline_ttft_p95_s",
    "baseline_tpot_p50_s", "baseline_tpot_p95_s", "baseline_error_rate", "baseline_waiting",
    "baseline_waiting_top", "ttft_limit_s", "queue_limit", "peak_ttft_p95_s", "peak_waiting",
    "peak_running", "peak_kv_cache_usage", "requests", "failed", "dropped", "recovered",
    "recovery_s", "back_s", "queue_recovery_s", "horizon_s", "note",
)
TIMELINE_COLUMNS = (
    "t_s", "window_start_ns", "phase", "offered_rps", "achieved_rps", "requests", "ok", "failed",
    "dropped", "error_rate", "ttft_p50_s", "ttft_p95_s", "tpot_p95_s", "waiting", "running",
    "kv_cache_usage", "ttft_ok", "queue_ok", "error_ok",
)


@dataclass(frozen=True)
class Spike:
    """One spike on the reference wall clock (ns); ``peak_rps`` is the planned top rate (NaN for
    spikes found in the schedule)."""

    start_ns: int
    end_ns: int
    peak_rps: float = float("nan")
    source: str = "plan"  # plan | schedule


@dataclass
class BurstReport:
    origin_ns: int  # time zero of start_s (the schedule's start)
    spikes: pd.DataFrame  # SPIKE_COLUMNS, one row per spike
    timelines: dict[int, pd.DataFrame] = field(default_factory=dict)  # spike -> windows


# ----------------------------------------------------------------------------- finding spikes


def schedule_origin_ns(manifest: dict[str, Any], run_dir: str | Path | None = None) -> int | None:
    """When the open-loop schedule's offset 0 fell (``schedule_start`` in the replay events)."""
    events = manifest.get("replay_events")
    if events is None and run_dir is not None:
        path = Path(run_dir) / "replay_events.json"
        events = json.loads(path.read_text()) if path.is_file() else None
    for event in events or []:
        if event.get("event") == "schedule_start" and event.get("t0_wall_ns"):
            return int(event["t0_wall_ns"])
    return None


def plan_spikes(plan: dict[str, Any] | None, origin_ns: int, duration_s: float) -> list[Spike]:
    """The spikes of a ``bursts`` plan (its dict form, as in the manifest) on the wall clock."""
    if not plan or plan.get("kind") != "bursts":
        return []

    known = set(BurstsPlan.__dataclass_fields__)
    parsed = plan_from_dict({k: v for k, v in plan.items() if k in known})
    assert isinstance(parsed, BurstsPlan)
    return [Spike(origin_ns + int(round(a * _NS)), origin_ns + int(round(b * _NS)), parsed.peak)
            for a, b in parsed.spikes(duration_s)]


def arrival_times(requests: pd.DataFrame) -> np.ndarray:
    """Scheduled times of the arrivals: each request outside a session, each session's (or
    agent task's) first scheduled call; a later turn or a sub-agent's call is the session's
    reaction to its own answers, not load offered."""
    scheduled = requests["scheduled_wall_ns"]
    if "session_id" not in requests:
        return scheduled.dropna().to_numpy(dtype=np.int64)
    alone = scheduled[requests["session_id"].isna()]
    first = scheduled.groupby(requests["session_id"], sort=False).min()
    return pd.concat([alone, first]).dropna().to_numpy(dtype=np.int64)


def schedule_spikes(scheduled_ns: np.ndarray, origin_ns: int, window_s: float = WINDOW_S,
                    factor: float = SPIKE_FACTOR) -> list[Spike]:
    """Spikes found in a schedule: maximal runs of windows whose scheduled count is at least
    ``factor`` x the median window's and clear of Poisson noise (median + 3 sqrt(median))."""
    times = np.asarray(scheduled_ns, dtype=np.int64)
    if times.size == 0:
        return []
    width = int(window_s * _NS)
    index = (times - origin_ns) // width
    index = index[index >= 0]
    if index.size == 0:
        return []
    counts = np.bincount(index)
    median = float(np.median(counts))
    threshold = max(factor * median, median + 3 * np.sqrt(max(median, 1.0)), 1.0)
    high = counts >= threshold
    spikes, k = [], 0
    while k < high.size:
        if not high[k]:
            k += 1
            continue
        end = k
        while end < high.size and high[end]:
            end += 1
        spikes.append(Spike(origin_ns + k * width, origin_ns + end * width,
                            source="schedule"))
        k = end
    return spikes


# ------------------------------------------------------------------------------------ windows


def prepare_requests(requests: pd.DataFrame) -> pd.DataFrame:
    """The columns burst analysis needs: ``arrival_ns`` (scheduled, else sent), ``done_ns``
    (completion of ok requests), ``ok``, ``failed`` (server-side errors), ``dropped``
    (generator outcomes), ``ttft_s``, ``tpot_s``."""
    scheduled = requests.get("scheduled_wall_ns")
    sent = requests["sent_wall_ns"].astype("int64")
    arrival = sent if scheduled is None else scheduled.fillna(sent).astype("int64")
    outcome = requests["outcome"].astype(str)
    ok = (outcome == OUTCOME_OK).to_numpy()
    dropped = outcome.isin(GENERATOR_OUTCOMES).to_numpy()
    e2e = requests["e2e_s"].to_numpy(dtype=np.float64, na_value=np.nan)
    done = np.where(ok & np.isfinite(e2e), sent.to_numpy() + np.nan_to_num(e2e) * _NS, np.nan)
    frame = pd.DataFrame({
        "arrival_ns": arrival.to_numpy(dtype=np.int64),
        "done_ns": done,
        "ok": ok,
        "failed": ~ok & ~dropped,
        "dropped": dropped,
        "outcome": outcome.to_numpy(),
        "e2e_s": e2e,
    })
    for column in ("ttft_s", "tpot_s", "prompt_tokens", "output_tokens"):
        frame[column] = (requests[column].to_numpy(dtype=np.float64, na_value=np.nan)
                         if column in requests else np.nan)
    return frame


def windows(prepared: pd.DataFrame, server: dict[str, pd.DataFrame], start_ns: int, count: int,
            window_s: float = WINDOW_S) -> pd.DataFrame:
    """``count`` windows from ``start_ns``: offered (scheduled arrivals/s) and achieved (ok
    completions/s) load, requests arriving in each window with their outcomes and exact
    P50/P95 TTFT, P95 TPOT (the soak's :func:`collectors.windows.window_stats` on arrival time),
    and each server series' mean over the window's scrapes.

    ``server`` maps ``waiting``/``running``/``kv_cache_usage`` to frames of ``ref_ns``,
    ``value`` (one value per scrape; see :func:`server_frames`)."""
    width = int(window_s * _NS)
    edges = start_ns + np.arange(count + 1, dtype=np.int64) * width
    arrival = prepared["arrival_ns"].to_numpy()
    inside = prepared[(arrival >= edges[0]) & (arrival < edges[-1])]
    stats = window_stats(inside, window_s, origin_ns=start_ns, time_column="arrival_ns")
    stats = stats.set_index(stats["window_start_ns"].astype("int64")).reindex(edges[:-1])
    requests = stats["requests"].fillna(0).astype("int64").to_numpy()
    done_where = np.searchsorted(edges, prepared["done_ns"].to_numpy(), side="right") - 1
    done_counts = np.bincount(done_where[(done_where >= 0) & (done_where < count)],
                              minlength=count)
    frame = pd.DataFrame({
        "window_start_ns": edges[:-1],
        "offered_rps": requests / window_s,
        "achieved_rps": done_counts / window_s,
        "requests": requests,
        "ok": stats["ok"].fillna(0).astype("int64").to_numpy(),
        "failed": stats["errors"].fillna(0).astype("int64").to_numpy(),
        "dropped": stats["not_sent"].fillna(0).astype("int64").to_numpy(),
        "error_rate": stats["error_rate"].astype("float64").to_numpy(),
        "ttft_p50_s": stats["ttft_p50_s"].astype("float64").to_numpy(),
        "ttft_p95_s": stats["ttft_p95_s"].astype("float64").to_numpy(),
        "tpot_p95_s": stats["tpot_p95_s"].astype("float64").to_numpy(),
    })
    for name in ("waiting", "running", "kv_cache_usage"):
        series = server.get(name)
        if series is None or series.empty:
            frame[name] = np.nan
            continue
        at = np.searchsorted(edges, series["ref_ns"].to_numpy(dtype=np.int64), side="right") - 1
        within = (at >= 0) & (at < count)
        means = pd.Series(series["value"].to_numpy()[within]).groupby(at[within]).mean()
        frame[name] = means.reindex(range(count)).to_numpy()
    return frame


def server_frames(server_metrics: pd.DataFrame | None,
                  manifest: dict[str, Any] | None = None) -> dict[str, pd.DataFrame]:
    """The waiting queue, running requests and KV-cache usage, one value per scrape (summed
    over label sets and targets; KV usage averaged), on the reference clock."""
    if server_metrics is None or server_metrics.empty:
        return {}

    offsets = clock_offsets(manifest)
    out = {}
    for name, sample, agg in (("waiting", WAITING, "sum"), ("running", RUNNING, "sum"),
                              ("kv_cache_usage", KV_USAGE, "mean")):
        series = server_series(server_metrics, sample, agg, offsets)
        if not series.empty:
            out[name] = series.groupby("ref_ns", as_index=False)["value"].agg(
                "mean" if agg == "mean" else "sum")
    return out


# ------------------------------------------------------------------------------ one spike


def analyze_spike(prepared: pd.DataFrame, server: dict[str, pd.DataFrame], spike: Spike, *,
                  not_before_ns: int, horizon_ns: int, window_s: float = WINDOW_S,
                  baseline_s: float = BASELINE_S, tolerance: float = TOLERANCE,
                  errors: bool = False) -> tuple[dict[str, Any], pd.DataFrame]:
    """One spike's figures (a row of SPIKE_COLUMNS, without ``spike``/``start_s``) and its
    timeline (TIMELINE_COLUMNS), windows laid out from the spike's end.

    ``not_before_ns``: the baseline starts no earlier (the run's start, or the previous spike's
    recovery); ``horizon_ns``: recovery must hold up to here (the next spike, or the data's end).
    ``errors``: a window is recovered only if its error rate is also back within the band (no
    higher than the baseline's by ``tolerance`` nor than its worst window: a fault drill's
    criterion, ``dashboards.analysis.faults``); bursts judge TTFT and the queue only.
    """
    width = int(window_s * _NS)
    spike_windows = max(int(np.ceil((spike.end_ns - spike.start_ns) / width)), 1)
    room_s = (spike.end_ns - spike_windows * width - not_before_ns) / _NS
    before = max(int(min(baseline_s, room_s) // window_s), 0)
    after = max(int((horizon_ns - spike.end_ns) // width), 0)
    start_ns = spike.end_ns - (before + spike_windows) * width
    view = windows(prepared, server, start_ns, before + spike_windows + after, window_s)
    phase = np.array(["baseline"] * before + ["spike"] * spike_windows + ["after"] * after)
    view.insert(0, "phase", phase)
    view.insert(0, "t_s", (view["window_start_ns"] - spike.start_ns) / _NS)
    note = []

    base_lo, base_hi = start_ns, start_ns + before * width
    arrival = prepared["arrival_ns"].to_numpy()
    in_base = (arrival >= base_lo) & (arrival < base_hi)
    base = prepared[in_base]
    base_ok = base[base["ok"]]
    attempts = int(base["ok"].sum() + base["failed"].sum())
    base_view = view[view["phase"] == "baseline"]
    row: dict[str, Any] = {
        "source": spike.source,
        "duration_s": (spike.end_ns - spike.start_ns) / _NS,
        "planned_peak_rps": spike.peak_rps,
        "baseline_s": before * window_s,
        "baseline_offered_rps": len(base) / (before * window_s) if before else float("nan"),
        "baseline_ttft_p50_s": percentile(base_ok["ttft_s"].to_numpy(), 50),
        "baseline_ttft_p95_s": percentile(base_ok["ttft_s"].to_numpy(), 95),
        "baseline_tpot_p50_s": percentile(base_ok["tpot_s"].to_numpy(), 50),
        "baseline_tpot_p95_s": percentile(base_ok["tpot_s"].to_numpy(), 95),
        "baseline_error_rate": base["failed"].sum() / attempts if attempts else float("nan"),
        "baseline_waiting": float(base_view["waiting"].mean()),
        "baseline_waiting_top": float(base_view["waiting"].max()),
    }
    spike_view = view[view["phase"] == "spike"]
    row["offered_peak_rps"] = float(spike_view["offered_rps"].max()) if len(spike_view) else 0.0

    # A window no worse than the worst baseline window looks like the baseline: recovered,
    # even where the baseline's own windows spread more than the tolerance.
    ttft_limit = max(row["baseline_ttft_p95_s"] * (1 + tolerance),
                     float(base_view["ttft_p95_s"].max()) if len(base_view) else -np.inf)
    row["ttft_limit_s"] = ttft_limit
    queue_top = row["baseline_waiting_top"]
    queue_limit = (max(queue_top * (1 + tolerance), queue_top + QUEUE_SLACK)
                   if np.isfinite(queue_top) else np.inf)
    row["queue_limit"] = queue_limit
    ttft = view["ttft_p95_s"].to_numpy()
    arrivals = view["requests"].to_numpy()
    view["ttft_ok"] = np.where(np.isfinite(ttft), ttft <= ttft_limit, arrivals == 0)
    waiting = view["waiting"].to_numpy()
    view["queue_ok"] = np.where(np.isfinite(waiting), waiting <= queue_limit, True)
    view["error_ok"] = True
    if errors:
        base_rate = row["baseline_error_rate"]
        error_limit = max(base_rate * (1 + tolerance) if np.isfinite(base_rate) else 0.0,
                          float(base_view["error_rate"].max()) if len(base_view) and
                          base_view["error_rate"].notna().any() else 0.0)
        rate = view["error_rate"].to_numpy(dtype=np.float64)
        view["error_ok"] = np.where(np.isfinite(rate), rate <= error_limit, True)

    after_view = view[view["phase"] == "after"]
    good = (after_view["ttft_ok"] & after_view["queue_ok"] & after_view["error_ok"]).to_numpy()
    recovered, recovery_s = False, float("nan")
    if not np.isfinite(ttft_limit):
        note.append(f"{UNKNOWN}: no baseline before the spike")
    elif not good.size:
        note.append(f"{UNKNOWN}: no window after the spike (the schedule or the next spike "
                    "came first)")
    elif good[-1]:
        bad = np.flatnonzero(~good)
        first_good = int(bad[-1]) + 1 if bad.size else 0
        recovered, recovery_s = True, first_good * window_s
        if first_good == good.size - 1 and good.size > 1:
            note.append("recovered in the last window before the horizon: check a longer run")
    else:
        note.append(f"not recovered within {after * window_s:g} s")
    # The first window back in the band: when the backlog was gone. A backlog's drain time
    # (what a prediction from capacity gives) is this; recovery_s waits out every later blip.
    first_back = np.flatnonzero(good) if np.isfinite(ttft_limit) else np.array([], dtype=int)
    row["back_s"] = float(first_back[0]) * window_s if first_back.size else float("nan")
    # The server's side alone: when its queue was back for good. Next to the recovery time it
    # tells a slow drain from later TTFT noise (a window of two requests has its slowest as P95).
    queue_back = after_view["queue_ok"].to_numpy()
    queue_recovery_s = float("nan")
    if server and queue_back.size and queue_back[-1] and np.isfinite(queue_top):
        still = np.flatnonzero(~queue_back)
        queue_recovery_s = (int(still[-1]) + 1 if still.size else 0) * window_s
    row["queue_recovery_s"] = queue_recovery_s
    if server and not np.isfinite(queue_top):
        note.append("no queue scrape in the baseline")
    if not server:
        note.append("no server metrics: recovery on TTFT only")

    # the peak: from the spike's start to its recovery (or the horizon)
    last = len(view) if not recovered else before + spike_windows + int(recovery_s / window_s)
    peak_view = view.iloc[before:max(last, before + spike_windows)]
    peak_lo = spike.start_ns
    peak_hi = int(view["window_start_ns"].iloc[-1]) + width if not recovered else (
        spike.end_ns + int(recovery_s * _NS))
    in_peak = (arrival >= peak_lo) & (arrival < max(peak_hi, spike.end_ns))
    row.update({
        "peak_ttft_p95_s": float(peak_view["ttft_p95_s"].max()),
        "peak_waiting": float(peak_view["waiting"].max()),
        "peak_running": float(peak_view["running"].max()),
        "peak_kv_cache_usage": float(peak_view["kv_cache_usage"].max()),
        "requests": int(in_peak.sum()),
        "failed": int(prepared["failed"].to_numpy()[in_peak].sum()),
        "dropped": int(prepared["dropped"].to_numpy()[in_peak].sum()),
        "recovered": recovered,
        "recovery_s": recovery_s,
        "horizon_s": (horizon_ns - spike.end_ns) / _NS,
        "note": "; ".join(note),
    })
    return row, view[list(TIMELINE_COLUMNS)]


# ------------------------------------------------------------------------------------ a run


def analyze(requests: pd.DataFrame, spikes: list[Spike], origin_ns: int,
            server: dict[str, pd.DataFrame] | None = None, *, end_ns: int | None = None,
            window_s: float = WINDOW_S, baseline_s: float = BASELINE_S,
            tolerance: float = TOLERANCE, skip_start_s: float = SKIP_START_S) -> BurstReport:
    """Every spike of a run: the spike table and each spike's timeline."""
    server = server or {}
    prepared = prepare_requests(requests)
    if end_ns is None:  # after the last arrival no window can show a user's TTFT
        end_ns = int(prepared["arrival_ns"].max()) + 1 if len(prepared) else origin_ns
    spikes = sorted(spikes, key=lambda s: s.start_ns)
    rows, timelines = [], {}
    not_before = origin_ns + int(skip_start_s * _NS)
    for number, spike in enumerate(spikes, start=1):
        horizon = spikes[number].start_ns if number < len(spikes) else end_ns
        row, view = analyze_spike(prepared, server, spike, not_before_ns=not_before,
                                  horizon_ns=horizon, window_s=window_s,
                                  baseline_s=baseline_s, tolerance=tolerance)
        row.update(spike=number, start_s=(spike.start_ns - origin_ns) / _NS)
        rows.append(row)
        timelines[number] = view
        not_before = (spike.end_ns + int(row["recovery_s"] * _NS) if row["recovered"]
                      else horizon)
    table = pd.DataFrame(rows, columns=list(SPIKE_COLUMNS))
    return BurstReport(origin_ns, table, timelines)


def burst_report(run_dir: str | Path, window_s: float = WINDOW_S,
                 tolerance: float = TOLERANCE) -> BurstReport | None:
    """The burst analysis of a run folder, or None when it has no spike (closed-loop runs, or
    an open-loop schedule without one)."""
    manifest = load_manifest(run_dir)
    load = manifest.get("load") or {}
    plan = load.get("plan")
    if not plan or plan.get("kind") == ClosedPlan.kind:
        return None
    requests = load_requests(run_dir)
    if requests.empty:
        return None
    origin = schedule_origin_ns(manifest, run_dir)
    scheduled = requests["scheduled_wall_ns"].dropna().to_numpy(dtype=np.int64)
    if origin is None:
        if scheduled.size == 0:
            return None
        origin = int(scheduled.min())
    duration = float(load.get("duration_s") or (scheduled.max() - origin) / _NS + window_s)
    spikes = plan_spikes(plan, origin, duration) or schedule_spikes(arrival_times(requests),
                                                                    origin, window_s)
    if not spikes:
        return None
    server = server_frames(load_server_metrics(run_dir, [WAITING, RUNNING, KV_USAGE]),
                           manifest)
    end = min(int(requests["sent_wall_ns"].max()), origin + int(duration * _NS)) + 1
    return analyze(requests, spikes, origin, server, end_ns=end, window_s=window_s,
                   tolerance=tolerance)


# --------------------------------------------------------------------------------- text


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms" if np.isfinite(seconds) else "n/a"


def spike_lines(spikes: pd.DataFrame) -> list[str]:
    """One line per spike for the terminal: peak P95 TTFT, failed requests, recovery time."""
    lines = []
    for row in spikes.itertuples(index=False):
        recovery = (f"recovered in {row.recovery_s:.0f} s" if row.recovered
                    else row.note if row.note.startswith(UNKNOWN)
                    else "NOT recovered" + (f" ({row.note})" if row.note else ""))
        queue = getattr(row, "queue_recovery_s", float("nan"))
        if np.isfinite(queue) and not (row.recovered and queue == row.recovery_s):
            recovery += f"; server queue back in {queue:.0f} s"
        peak = (f", planned {row.planned_peak_rps:g} req/s" if np.isfinite(row.planned_peak_rps)
                else f", offered up to {row.offered_peak_rps:g} req/s")
        lines.append(
            f"spike {row.spike} at {row.start_s:.1f} s ({row.duration_s:g} s{peak}): peak P95 "
            f"TTFT {_ms(row.peak_ttft_p95_s)} (baseline {_ms(row.baseline_ttft_p95_s)}), "
            f"failed {row.failed}, dropped {row.dropped}, {recovery}")
    return lines


MAX_SPIKE_LINES = 12  # a bursty trace can hold hundreds of spikes: the page lists them all


def format_bursts(report: BurstReport | None, max_lines: int = MAX_SPIKE_LINES) -> str:
    """The spike lines under a heading (the first ``max_lines``, then how many more), or ""
    when there are no spikes."""
    if report is None or report.spikes.empty:
        return ""
    lines = spike_lines(report.spikes)
    more = len(lines) - max_lines
    if more > 0:
        recovered = report.spikes["recovered"].astype(bool)
        lines = [*lines[:max_lines], f"... and {more} more spikes ({int(recovered.sum())} of "
                 f"{len(lines)} recovered, longest {report.spikes['recovery_s'].max():.0f} s): "
                 "see the Bursts page"]
    return "\n".join(["", "bursts (1 s windows; recovery = P95 TTFT within 10% of baseline "
                      "and queue back):", *lines])


# ------------------------------------------------------------------------------------ studies

BURSTS_FILE = "bursts.parquet"  # <study>/rollup/: one row per configuration x step x spike
BURST_TIMELINES_FILE = "burst_timelines.parquet"  # <study>/rollup/: their windows
COMPARISON_COLUMNS = (
    "config", "spikes", "recovered", "recovery_s", "recovery_max_s", "queue_recovery_s",
    "peak_ttft_p95_s",
    "baseline_ttft_p95_s", "peak_waiting", "failed", "dropped",
)


def study_bursts(study_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(spikes, timelines) of every done step of a study: the spike table with ``config``,
    ``step``, ``offered_load`` (the base rate) and ``run_dir`` in front, and every spike's
    windows with ``config``, ``step`` and ``spike``."""
    study_dir = Path(study_dir)
    spikes, timelines = [], []
    for entry in read_study(study_dir).get("steps", []):
        if entry.get("status") != "done":
            continue
        report = burst_report(study_dir / entry["run_dir"])
        if report is None or report.spikes.empty:
            continue
        table = report.spikes.copy()
        table.insert(0, "run_dir", entry["run_dir"])
        table.insert(0, "offered_load", float(entry["offered_load"]))
        table.insert(0, "step", int(entry["step"]))
        table.insert(0, "config", entry["config"])
        spikes.append(table)
        for number, view in report.timelines.items():
            timelines.append(view.assign(config=entry["config"], step=int(entry["step"]),
                                         spike=number))
    return (pd.concat(spikes, ignore_index=True) if spikes
            else pd.DataFrame(columns=["config", "step", "offered_load", "run_dir",
                                       *SPIKE_COLUMNS]),
            pd.concat(timelines, ignore_index=True) if timelines
            else pd.DataFrame(columns=[*TIMELINE_COLUMNS, "config", "step", "spike"]))


def write_study_bursts(study_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Compute :func:`study_bursts` and write it to ``<study>/rollup/`` (temporary file, then a
    rename), so the pages and the export read roll-ups only."""
    spikes, timelines = study_bursts(study_dir)
    out = Path(study_dir) / ROLLUP_DIR
    out.mkdir(parents=True, exist_ok=True)
    for frame, name in ((spikes, BURSTS_FILE), (timelines, BURST_TIMELINES_FILE)):
        write_atomic(out / name, partial(frame.to_parquet, index=False))
    return spikes, timelines


def load_study_bursts(study_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The written burst roll-up of a study, or None when it has none."""
    out = Path(study_dir) / ROLLUP_DIR
    if not (out / BURSTS_FILE).is_file():
        return None
    spikes = pd.read_parquet(out / BURSTS_FILE)
    timelines_path = out / BURST_TIMELINES_FILE
    timelines = pd.read_parquet(timelines_path) if timelines_path.is_file() else pd.DataFrame()
    return (spikes, timelines) if len(spikes) else None


def recovery_comparison(spikes: pd.DataFrame, configs: list[str] | None = None) -> pd.DataFrame:
    """Configurations side by side on the same spikes: how many recovered, median and longest
    recovery time, the worst peak P95 TTFT and queue, failed and dropped requests in all."""
    rows = []
    names = configs or list(dict.fromkeys(spikes["config"]))
    for name in names:
        group = spikes[spikes["config"] == name]
        if group.empty:
            continue
        recovered = group[group["recovered"].astype(bool)]
        rows.append({
            "config": name,
            "spikes": len(group),
            "recovered": len(recovered),
            # a spike never recovered has no time: the median is over those that did, and
            # ``recovered`` < ``spikes`` says so
            "recovery_s": float(recovered["recovery_s"].median()) if len(recovered) else np.nan,
            "recovery_max_s": float(recovered["recovery_s"].max()) if len(recovered) else np.nan,
            "queue_recovery_s": (float(group["queue_recovery_s"].median())
                                 if "queue_recovery_s" in group else np.nan),
            "peak_ttft_p95_s": float(group["peak_ttft_p95_s"].max()),
            "baseline_ttft_p95_s": float(group["baseline_ttft_p95_s"].median()),
            "peak_waiting": float(group["peak_waiting"].max()),
            "failed": int(group["failed"].sum()),
            "dropped": int(group["dropped"].sum()),
        })
    return pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))


def comparison_lines(comparison: pd.DataFrame) -> list[str]:
    """One line per configuration for the terminal."""
    lines = []
    for row in comparison.itertuples(index=False):
        recovery = (f"recovery {row.recovery_s:.0f} s (longest {row.recovery_max_s:.0f} s)"
                    if row.recovered else "never recovered")
        if np.isfinite(row.queue_recovery_s):
            recovery += f", server queue back in {row.queue_recovery_s:.0f} s"
        lines.append(f"{row.config}: {row.recovered}/{row.spikes} spikes recovered, {recovery}, "
                     f"peak P95 TTFT {_ms(row.peak_ttft_p95_s)}, peak queue "
                     f"{row.peak_waiting:g}, failed {row.failed}, dropped {row.dropped}")
    return lines
