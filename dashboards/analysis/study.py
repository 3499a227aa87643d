"""Study analysis: per step and per configuration figures of a sweep, and the roll-up files.

A study folder (written by ``swarmload study run``, ``infra/study/runner.py``) holds one run
folder per configuration and step, ``<study_dir>/<config>/step-<k>/`` (an ordinary swarmload
run folder), and ``<study_dir>/study.json``. :func:`rollup_study` (re)builds the roll-up from
them; the dashboard reads only the roll-up, so the first view of a huge study costs two small
Parquet reads.

Definitions (``docs/METRICS-STUDIES.md``):

- **Measured window** of a step: ``[t0 + warmup_s, t0 + step_duration_s - cooldown_s)`` where t0 is
  the first scheduled send (open-loop) or the first send (closed-loop). The step's *cohort* is the
  requests sent in the window; the run's drain (requests still in flight after the schedule) is
  outside the window but the cohort's late completions are kept.
- **Latency percentiles** (P50/P95/P99 of TTFT, ITL (every gap), TPOT, E2E): exact, over the ok
  requests of the cohort (``dashboards.analysis.summarize_requests``).
- **Offered load**: the step's setting, ``users`` (load_kind ``concurrency``) or scheduled req/s
  (``rate``; sessions/s or tasks/s for those workloads: :func:`achieved_ratio`);
  ``offered_req_per_s`` is the measured one, scheduled cohort requests / window length.
- **Achieved req/s**: ok cohort requests / the span over which the cohort completed, that span
  being ``(last completion - first completion) * n / (n - 1)`` over all n cohort completions. Over
  capacity the cohort completes more slowly than it arrived (the achieved rate is the capacity);
  under it the span equals the window. Counting completions inside a fixed window instead would
  mix in requests sent before it and add the noise of two Poisson edges (about 6% at 70 requests).
  Output tok/s and goodput use the same span; every bucket row shares the ``all`` row's span, so
  the bucket rows add up to it.
- **Error rate** = failed / (ok + failed), overall and ``err_<class>`` per class; requests the
  generator never sent (``not_sent``) are counted apart.
- **Goodput**: ok cohort requests that met every per-request SLO (TTFT, TPOT, E2E; an ITL SLO is
  judged at the percentile only) / the completion span.
- **SLO met** (``slo_met``): each SLO metric at the study's percentile within its threshold and the
  error rate at most the SLO's; with ``task_ms`` (agent workloads) also the task time of the
  tasks whose first call was sent in the window (``task_<pct>_s``,
  :mod:`dashboards.analysis.tasks`). **Sustainable** (``sustainable``): SLO met and, for
  ``rate`` steps, achieved >= 95% of offered (``offered_req_per_s``; for sessions and tasks
  their arrivals, :func:`achieved_ratio`); across repeats
  (points.parquet), a rate point whose offered load is above the configuration's throughput
  ceiling (the most it delivered, once some load saturated it: :func:`apply_throughput_ceiling`)
  is not.
- **Max sustainable load**: the highest offered load whose ``all`` row is sustainable;
  ``max_load_reached`` is true when a higher step of the sweep failed (the limit lies between),
  false when every step passed (the limit is higher than tested) or none did (lower).
- **Knee**: where the latency curve's light-load and heavy-load asymptotes meet (asymptotic
  bounds analysis: Lazowska et al., *Quantitative System Performance*, ch. 5, the saturation
  point). Closed-loop (concurrency) steps: latency above the knee grows linearly with the
  users (R = N / X_max), so the knee is the **bend** of the curve, below. Open-loop (rate)
  steps: the heavy-load asymptote is vertical, at the throughput ceiling (above it the queue
  grows without bound), so once a load saturated the server the knee is the ceiling
  (:func:`apply_saturation_knee`), with the ceiling's interval; the bend is kept beside it
  (``bend_load``): on a queue with c slots waiting starts near rho = 1 - 1/sqrt(c)
  (Halfin-Whitt), so the P50 TTFT of a simulator with 32-72 slots leaves its floor 2-5% under
  its capacity, and a bend read as the knee would sit there. Before any load saturated, an
  open-loop knee is the bend, as a candidate (``knee_reached`` false).
- **Bend**: on the curve offered load -> ``<knee_metric>`` at ``knee_percentile`` (default the SLO
  percentile; ``all`` row),
  made monotone by isotonic regression (:func:`monotone`: a noisy step is pooled with its
  neighbours, so neither a dip nor a spike at low load makes a bend), interpolated
  linearly on a dense grid (Kneedle's threshold scales with the point spacing; a handful of steps
  would never pass it), Kneedle (``kneed.KneeLocator``, curve="convex", direction="increasing",
  S=1, online) and, of its knees, the interior measured load furthest below the chord; the
  bend lies between that load's neighbours, and it is the breakpoint there of the
  continuous two-segment line that fits every point best (:func:`breakpoint_between`,
  segmented regression), so it does not snap to whichever step fell nearest. Rate steps read
  the curve on the arrivals each load received (:func:`knee_axis`).
  ``knee_reached`` is true when Kneedle finds a bend and latency past it at least doubles
  (:data:`KNEE_GROWTH`): the sweep went into the steep part. Otherwise the knee columns hold
  Kneedle's candidate (or NaN) and the flag is false.

Roll-up files (the contract with the dashboard; times are seconds, wall clocks in ns since the
epoch, rates per second):

``<study_dir>/rollup/steps.parquet``: one row per configuration x step x bucket (``short``,
``medium``, ``long`` where present, and ``all``). Columns: ``config``, ``step`` (int, run order),
``bucket``, ``load_kind`` ("concurrency" | "rate"), ``offered_load`` (users or scheduled req/s, the
step's setting), ``offered_req_per_s`` (measured; NaN for closed-loop), ``achieved_req_per_s``,
``output_tok_per_s``, ``goodput_req_per_s``, ``achieved_ratio`` (achieved / offered_req_per_s;
NaN for closed-loop; for sessions and tasks the arrivals' ratio), ``arrival_unit``
("sessions", "tasks" or ""), and for sessions and tasks ``arrivals``, ``arrivals_ok``,
``offered_arrivals_per_s``, ``achieved_arrivals_per_s``, ``arrival_span_s``,
``requests_per_arrival`` (:func:`dashboards.analysis.sessions.arrival_figures`,
:func:`paced_arrivals`; METRICS-STUDIES.md, "Sessions and tasks
under a rate plan"), ``{ttft,itl,tpot,e2e}_{p50,p95,p99}_s``, ``requests``, ``ok``, ``errors``,
``not_sent``, ``error_rate``, ``err_<class>`` for every failure class of
``collectors.schemas.OUTCOMES`` (rates, 0 when absent), ``slo_met``, ``sustainable`` (bools),
``schedule_lag_p99_s``, ``window_start_ns``, ``window_end_ns``, ``window_s``, ``completion_span_s``,
``validity`` / ``validity_reasons`` (:func:`step_validity`; capacity's note names the invalid
steps its curve and knee include, ``invalid_steps`` counts them),
``run_dir`` (relative to the study folder); for a session workload the session figures
(:func:`dashboards.analysis.sessions.step_figures`) and for an agent workload the task figures
(:func:`dashboards.analysis.tasks.step_figures`: ``tasks``, ``tasks_ok``, ``task_p50_s`` ...
``task_p99_s``, ``task_generator_delay_p99_s``), and per-step telemetry means repeated on every
bucket row (NaN when that table is absent): ``gpu_util_mean`` (%), ``power_w_mean`` (W, summed over
GPUs), ``num_requests_running_mean``, ``num_requests_waiting_mean``, ``kv_cache_usage_mean``
(fraction, 1 = full), and the GPUs that served and their energy over the window
(:func:`dashboards.analysis.frontier.window_energy`): ``gpu_count`` (GPUs whose mean
utilisation was at least 1%; NaN without GPU telemetry or with none busy), ``gpu_energy_j``
(J, summed over them: NVML's energy counter, else mean power x window), ``gpu_energy_source``
("counter" | "power" | ""). With ``server_traces: true``, where TTFT went per bucket
(``dashboards/analysis/server_traces.py``, METRICS.md): ``span_explained`` (ok requests joined to
vLLM's span) and ``span_<x>_p50_s`` / ``span_<x>_p95_s`` for ``client_ttft``, ``server_ttft``,
``before_server``, ``api_server``, ``queue``, ``prefill``, ``delivery``.

``<study_dir>/rollup/capacity.parquet``: one row per configuration: ``config``, ``load_kind``,
``steps`` (steps measured), ``max_sustainable_load`` (NaN when no step passed),
``max_load_reached``, ``knee_load``, ``knee_reached``, ``knee_latency_s`` (the monotone curve's
value at the knee), ``metric`` (e.g. "ttft_p95_s": the curve's column), ``queue_knee_load``
(the same method on the server's mean ``num_requests_waiting``: where its queue starts to build;
NaN without server metrics), ``slo`` (JSON text of the SLO), ``curve`` (JSON text: {"load":
[...], "latency_s": [...], "monotone_s": [...]}), ``note``; across repeats also ``bend_load``,
``bend_lo``, ``bend_hi`` (the latency curve's bend and its interval: the knee itself except for
saturated rate steps, see Knee), ``knee_kind`` ("saturation" | "bend"); ``resolved`` (bool:
false when an SLO figure stays within its noise of its threshold across a range of loads and
nothing binds before it; ``max_sustainable_load`` is then NaN, its interval the range the limit
lies in), ``resolution_note`` (why not, in words; "" when resolved; also leads ``note``) and
``binding_slo`` (the SLO whose fitted figure crosses its threshold first: "TTFT", "TPOT",
"error-rate", ...; "" when none does): :mod:`dashboards.analysis.study_search`; and each
configuration's efficiency at its max sustainable load (NaN where none held;
:func:`dashboards.analysis.frontier.capacity_efficiency`): ``efficiency_load``, ``gpu_count``,
``gpu_power_w``, ``per_user_tok_s``, ``output_tok_per_gpu_s``, ``output_tok_per_j``,
``usd_per_m_output_tok``, each of the last four with ``_lo`` / ``_hi``.

``<study_dir>/rollup/points.parquet``: one row per configuration x load x bucket over its repeats
and parts (:func:`points_table`): the steps.parquet figures with ``<figure>_lo`` / ``_hi``
(an agent workload's ``task_<pct>_s`` over its parts' ok tasks pooled, drawn per task from
the cohort's :data:`TASK_COHORT_COLUMN`; none under ``study_stats.min_units`` tasks),
``repeats``, ``parts``, ``gpu_count``, ``gpu_power_w`` (W: the parts' energy over their windows)
and the efficiency figures of :func:`dashboards.analysis.frontier.efficiency_columns` with their
intervals: ``per_user_tok_s`` (1 / P50 TPOT), ``output_tok_per_gpu_s``, ``output_tok_per_j``,
``usd_per_m_output_tok`` (at the study's ``gpu_hour_usd``; NaN without it).

``<study_dir>/rollup/frontier.parquet``: the throughput-interactivity curve, one row per
configuration x load (``all`` points): ``config``, ``offered_load``, ``per_user_tok_s`` (tok/s per
user), ``tok_s`` (output tok/s per GPU, or per server: ``per`` "GPU" | "server"), each with
``_lo`` / ``_hi``, ``sustainable``. study.json's ``frontier`` holds the same rows.

``<study_dir>/rollup/verdict.parquet``: :mod:`dashboards.analysis.study_verdict`.

``<study_dir>/study.json`` (written by the runner): ``name``, ``status`` ("running" |
"finished" | "interrupted" | "failed"), ``started_at``, ``ended_at`` (ISO 8601 UTC),
``configurations`` ([{name, target, args, steps}]), ``load`` ({kind, steps | auto, arrival}),
``slo``, ``step_duration_s``, ``warmup_s``, ``cooldown_s``, ``knee_metric``, ``knee_percentile``
(null: the SLO's), ``capacity_estimates`` (load.auto), ``steps`` ([{config, step, offered_load,
load_kind, run_dir (relative), status ("done" | "running" | "interrupted" | "failed"), phase
("probe" | "sweep"), stopped (why the configuration stopped after it, or null); with
``precision``, ``duration_s``; in a merged study also ``warmup_s``, ``cooldown_s``,
``steady_state``, ``expected_cache_hit_rate``: the measuring study's, which the roll-up reads
before the study's own}]), ``merged_from`` (only in a study joined by ``swarmload study merge``,
:mod:`infra.study.merge`: its sources, each {name, folder, started_at, ended_at, status,
configurations ({source's name: name here}), machines ([{host, platform, gpus}])}),
``gpu_hour_usd`` (the price of a GPU-hour the costs use, or null), ``capacity`` (the capacity
table's headline and efficiency columns), ``verdict`` (its sentences), ``frontier``
(frontier.parquet's rows), ``measured`` (what the study measured of its servers: each start's
seconds, each step's seconds beyond its load, each configuration's E2E P95 per load and noise;
:class:`infra.study.plan.Measured`).

Usage::

    steps, capacity = rollup_study("results/studies/my-study")   # also writes the files
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from collectors import run_folder
from collectors.atomic import write_atomic
from collectors.percentiles import percentiles
from collectors.run_folder import (
    CAPACITY_FILE,
    FRONTIER_FILE,
    POINTS_FILE,
    ROLLUP_DIR,
    STEPS_FILE,
    VERDICT_FILE,
    load_manifest,
    load_requests,
    read_study,
)
from collectors.schemas import OUTCOME_OK
from collectors.server_figures import (
    KV_USAGE,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    RUNNING,
    WAITING,
)
from dashboards.analysis import (
    burst,
    frontier,
    sessions,
    study_search,
    study_stats,
    tasks,
    telemetry,
)
from dashboards.analysis.generator_cpu import generator_cpu_warnings, run_remedy
from dashboards.analysis.runs import (
    ALL_ROW,
    SUMMARY_COLUMNS,
    generator_warnings,
    summarize_requests,
)
from dashboards.analysis.server_traces import step_ttft_parts
from dashboards.analysis.slo import LATENCY_TAGS, _slo_thresholds_s, meets_request_slos
from dashboards.analysis.study_stats import ERROR_CLASSES, generator_limited
from dashboards.analysis.study_verdict import arrivals_unit, format_verdict, verdict_table

SUSTAINABLE_RATIO = 0.95  # achieved / offered, METRICS-STUDIES.md
KNEE_GROWTH = 2.0  # latency past the knee must at least double for the knee to count as reached
KNEE_GRID_POINTS = 1001
BREAKPOINT_GRID = 101  # candidate breakpoints between the knee's neighbouring loads
ROLLUP_PERCENTILES = ("p50", "p95", "p99")
TELEMETRY_COLUMNS = {  # telemetry.per_step column -> roll-up column
    "gpu_util_pct": "gpu_util_mean",
    "gpu_power_w": "power_w_mean",
    "num_requests_running": "num_requests_running_mean",
    "num_requests_waiting": "num_requests_waiting_mean",
    "kv_cache_usage": "kv_cache_usage_mean",
}
_NS = 1_000_000_000
_STEP_COLUMNS = (*SUMMARY_COLUMNS, "worker_id")


# ------------------------------------------------------------------------------------ per step


def step_window(requests: pd.DataFrame, step_duration_s: float, warmup_s: float,
                cooldown_s: float) -> tuple[int, int] | None:
    """``(start_ns, end_ns)`` of a step's measured window (module docstring); None if empty."""
    if requests.empty:
        return None
    scheduled = requests["scheduled_wall_ns"].dropna()
    origin = int(scheduled.min()) if len(scheduled) else int(requests["sent_wall_ns"].min())
    start = origin + round(warmup_s * _NS)
    end = origin + round((step_duration_s - cooldown_s) * _NS)
    if end <= start:
        raise ValueError(f"warm-up {warmup_s} s + cool-down {cooldown_s} s leave nothing of a "
                         f"{step_duration_s} s step")
    return start, end


def slo_met(row: Mapping[str, Any], slo: Mapping[str, Any]) -> bool:
    """The SLOs of ``slo`` hold on a summary row at ``slo['percentile']`` (a task time SLO on
    the row's ``task_<pct>_s``: :func:`dashboards.analysis.tasks.task_slo_met`)."""
    pct = slo.get("percentile", "p95")
    for tag, limit in _slo_thresholds_s(slo).items():
        value = row.get(f"{tag}_{pct}_s", math.nan)
        if value is None or not value <= limit:  # NaN (no ok request) fails
            return False
    if tasks.task_slo_met(row, slo) is False:
        return False
    error_rate = row.get("error_rate", math.nan)
    return bool(error_rate is not None and error_rate <= float(slo.get("error_rate", 0.01)))


def _completion_span_s(cohort: pd.DataFrame) -> float:
    sent = cohort["sent_wall_ns"].to_numpy(dtype=np.float64)
    e2e = np.nan_to_num(cohort["e2e_s"].to_numpy(dtype=np.float64, na_value=np.nan), nan=0.0)
    done = sent / _NS + e2e
    n = done.size
    if n < 2:
        return math.nan
    span = float(done.max() - done.min())
    return span * n / (n - 1) if span > 0 else math.nan


def achieved_ratio(row: Mapping[str, Any], load_kind: str) -> float:
    """Achieved / offered of a step or point row (NaN for concurrency steps): for sessions and
    tasks in the arrival plan's units (``achieved_arrivals_per_s`` / ``offered_arrivals_per_s``,
    :func:`dashboards.analysis.sessions.arrival_figures`), else in requests."""
    if load_kind != "rate":
        return math.nan
    arrivals = row.get("offered_arrivals_per_s", math.nan)
    achieved, offered = ((row.get("achieved_arrivals_per_s", math.nan), arrivals)
                         if arrivals == arrivals else
                         (row["achieved_req_per_s"], row["offered_req_per_s"]))
    return float(achieved / offered) if offered == offered and offered > 0 else math.nan


def paced_arrivals(figures: Mapping[str, float], achieved_req_per_s: float
                   ) -> dict[str, float]:
    """A step's arrival figures (:func:`dashboards.analysis.sessions.arrival_figures`); where
    the server fell behind (achieved below 95% of offered, and so is the pace below), achieved
    is the pace it served their requests at: achieved req/s / ``requests_per_arrival``. Over
    capacity the slope of end against arrival says that it fell behind, not by how much: it
    flattens where the later turns of early sessions wait with the first turns of late ones
    (a 2x overload of 4-turn sessions on the simulator ended at 5.17 sessions/s where the
    server did 2.49 sessions' requests a second, its capacity 2.5) and steepens where each
    turn queues anew. The span follows (``arrivals_ok`` / achieved), so repeats pool it."""
    out = dict(figures)
    achieved, offered = out["achieved_arrivals_per_s"], out["offered_arrivals_per_s"]
    paced = achieved_req_per_s / out["requests_per_arrival"]
    if achieved < SUSTAINABLE_RATIO * offered and paced < SUSTAINABLE_RATIO * offered:
        out["achieved_arrivals_per_s"] = paced
        out["arrival_span_s"] = out["arrivals_ok"] / paced if paced > 0 else math.nan
    return out


def summarize_step(requests: pd.DataFrame, window: tuple[int, int], slo: Mapping[str, Any],
                   load_kind: str, step_figures: Mapping[str, float] | None = None
                   ) -> pd.DataFrame:
    """One row per bucket (and ``all``) of a step's cohort; columns as steps.parquet lists.

    ``requests`` holds at least ``dashboards.analysis.SUMMARY_COLUMNS``; ``step_figures`` (the
    step's session and task figures) go on every row before its SLO is judged.
    """
    start, end = window
    sent = requests["sent_wall_ns"]
    cohort = requests[(sent >= start) & (sent < end)].reset_index(drop=True)
    summary = summarize_requests(cohort, window)
    span = _completion_span_s(cohort)
    ok = (cohort["outcome"] == OUTCOME_OK).to_numpy()
    good = meets_request_slos(cohort, slo)
    tokens = cohort["output_tokens"].to_numpy(dtype=np.float64, na_value=np.nan)
    if load_kind == "rate" and step_figures and "offered_arrivals_per_s" in step_figures:
        step_figures = paced_arrivals(step_figures, float(ok.sum()) / span)
    rows = []
    for bucket, srow in summary.iterrows():
        mask = np.ones(len(cohort), bool) if bucket == ALL_ROW else (
            cohort["bucket"] == bucket).to_numpy()
        row: dict[str, Any] = {"bucket": str(bucket), **(step_figures or {})}
        for tag in LATENCY_TAGS:
            for pct in ROLLUP_PERCENTILES:
                row[f"{tag}_{pct}_s"] = float(srow[f"{tag}_{pct}_s"])
        for key in ("requests", "ok", "errors", "not_sent", "cancelled"):
            row[key] = int(srow[key])
        row["error_rate"] = float(srow["error_rate"])
        for outcome in ERROR_CLASSES:
            rate = srow.get(f"err_{outcome}", math.nan)
            row[f"err_{outcome}"] = float(rate) if rate == rate else (
                0.0 if srow["ok"] + srow["errors"] else math.nan)
        has_span = span == span
        row["achieved_req_per_s"] = float((ok & mask).sum()) / span if has_span else math.nan
        row["output_tok_per_s"] = (float(np.nansum(tokens[ok & mask])) / span if has_span
                                   else math.nan)
        row["goodput_req_per_s"] = float((good & mask).sum()) / span if has_span else math.nan
        offered = float(srow["offered_req_per_s"]) if load_kind == "rate" else math.nan
        row["offered_req_per_s"] = offered
        row["achieved_ratio"] = achieved_ratio(row, load_kind)
        row["schedule_lag_p99_s"] = float(srow["schedule_lag_p99_s"])
        row["slo_met"] = slo_met(row, slo)
        row["sustainable"] = bool(row["slo_met"] and (
            load_kind != "rate" or (row["achieved_ratio"] == row["achieved_ratio"]
                                    and row["achieved_ratio"] >= SUSTAINABLE_RATIO)))
        row["window_start_ns"], row["window_end_ns"] = int(start), int(end)
        row["window_s"] = (end - start) / _NS
        row["completion_span_s"] = span
        rows.append(row)
    return pd.DataFrame(rows)


def step_telemetry(run_dir: str | Path, window: tuple[int, int]) -> dict[str, Any]:
    """Means of GPU and server telemetry over the window (NaN for tables not recorded), and the
    GPUs that served and their energy over it (:func:`frontier.window_energy`)."""
    out: dict[str, Any] = dict.fromkeys(TELEMETRY_COLUMNS.values(), math.nan)
    gpu = run_folder.load_gpu(run_dir)
    out.update(frontier.window_energy(gpu, window))
    server = run_folder.load_server_metrics(
        run_dir, [RUNNING, WAITING, KV_USAGE, PREEMPTIONS])
    if gpu.empty and server.empty:
        return out
    joined = telemetry.per_step(None, [{"step": 0, "start_wall_ns": window[0],
                                         "end_wall_ns": window[1]}], gpu, server)
    if not joined.empty:
        for source, target in TELEMETRY_COLUMNS.items():
            if source in joined:
                out[target] = float(joined[source].iloc[0])
    return out


COHORT_FILE = "study_cohort.parquet"  # a step's measured cohort, cached beside its run folder
STEP_ROWS_FILE = "study_step.parquet"  # a step's steps.parquet rows, cached beside its run folder
COHORT_COLUMNS = ("bucket", "outcome", "sent_wall_ns", "ttft_s", "itl_s", "tpot_s", "e2e_s",
                  "output_tokens")
# agent workloads' cohorts also carry, on each ok task's first send, its task time (NaN on
# every other record: tasks.opening_task_times): the draws over tasks
TASK_COHORT_COLUMN = "task_s"


def prefix_cache_rate(server: pd.DataFrame, window: tuple[int, int]) -> tuple[float, float]:
    """(hit rate, prompt tokens queried) of the server's prefix cache over ``window``: the
    growth of the prefix-cache hits over its queries (tokens; vLLM's ``prefix_cache_hits_total``
    over ``_queries_total``, or another engine's: collectors.server_figures) between the
    last scrape at or before its start and the last at or before its end (NaN without them)."""
    growth = []
    for sample in (PREFIX_HITS, PREFIX_QUERIES):
        series = telemetry.server_series(server, sample)
        times = series["ref_ns"].to_numpy(dtype=np.int64)
        values = series["value"].to_numpy(dtype=np.float64)
        before = values[times <= window[0]]
        until = values[times <= window[1]]
        if not until.size:
            return math.nan, math.nan
        growth.append(float(until[-1] - (before[-1] if before.size else values[0])))
    hits, queries = growth
    return (hits / queries if queries > 0 else math.nan), queries


def measure_step(run_dir: str | Path, *, config: str, step: int, offered_load: float,
                 load_kind: str, slo: Mapping[str, Any], step_duration_s: float,
                 warmup_s: float, cooldown_s: float, steady: str = "fixed",
                 expected_cache_hit_rate: float = 1.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(steps.parquet rows, the measured cohort's request rows) of one step's run folder.

    ``steady``: ``mser5`` starts the window where the step's series settled
    (:func:`dashboards.analysis.study_stats.steady_state`; never before ``warmup_s``), ``fixed``
    at ``warmup_s``. Rows gain ``settled``, ``steady_cut_s`` (seconds cut past ``warmup_s``),
    ``steady_reasons``, ``prefix_cache_hit_rate``, ``prefix_cache_queries``, for a session
    workload the session figures (:func:`dashboards.analysis.sessions.step_figures`), and
    ``cache_flagged`` (hit rate above ``expected_cache_hit_rate``). Empty frames when the run
    recorded nothing.
    """
    requests = load_requests(run_dir, _STEP_COLUMNS)
    window = step_window(requests, step_duration_s, warmup_s, cooldown_s)
    if window is None:
        return pd.DataFrame(), pd.DataFrame()
    server = run_folder.load_server_metrics(run_dir, [WAITING, PREFIX_HITS,
                                                     PREFIX_QUERIES])
    state = None
    if steady == "mser5":
        waiting = telemetry.server_series(server, WAITING).rename(
            columns={"ref_ns": "wall_ns"})
        state = study_stats.steady_state(requests, window, waiting)
        window = (state.start_ns, window[1])
    figures: dict[str, float] = {}
    unit = ""
    if load_requests(run_dir, ["session_id"])["session_id"].notna().any():  # sessions, tasks
        arrivals = load_requests(run_dir, sessions.ARRIVAL_COLUMNS)
        unit = sessions.arrival_unit(arrivals)
        figures.update(sessions.arrival_figures(arrivals, window))
        figures.update(sessions.step_figures(
            load_requests(run_dir, sessions.SESSION_COLUMNS), window, slo))
        task_records = load_requests(run_dir, tasks.TASK_COLUMNS)
        figures.update(tasks.step_figures(task_records, window))
        if "tasks" in figures and task_records["sent_wall_ns"].equals(requests["sent_wall_ns"]):
            # the same records in the same order: each ok task's time on its first send
            requests = requests.assign(**{TASK_COHORT_COLUMN: tasks.opening_task_times(
                task_records, window).to_numpy()})
    rows = summarize_step(requests, window, slo, load_kind, figures)
    rows["arrival_unit"] = unit
    for key, value in step_telemetry(run_dir, window).items():
        rows[key] = value
    rows["validity"], rows["validity_reasons"] = step_validity(run_dir, requests, window)
    rows["settled"] = True if state is None else state.settled
    rows["steady_cut_s"] = 0.0 if state is None else state.cut_s
    rows["steady_reasons"] = "" if state is None else state.reasons
    hit_rate, queries = prefix_cache_rate(server, window)
    rows["prefix_cache_hit_rate"], rows["prefix_cache_queries"] = hit_rate, queries
    rows["cache_flagged"] = bool(hit_rate == hit_rate and hit_rate > expected_cache_hit_rate)
    parts = step_ttft_parts(run_dir, window)  # studies with server_traces
    if parts is not None:
        rows = rows.merge(parts, on="bucket", how="left")
    rows.insert(0, "offered_load", float(offered_load))
    rows.insert(0, "load_kind", load_kind)
    rows.insert(0, "step", int(step))
    rows.insert(0, "config", config)
    sent = requests["sent_wall_ns"]
    cohort = requests[(sent >= window[0]) & (sent < window[1])]
    keep = [*COHORT_COLUMNS, *([TASK_COHORT_COLUMN] if TASK_COHORT_COLUMN in cohort else [])]
    return rows, cohort[keep].reset_index(drop=True)


def step_rollup(run_dir: str | Path, *, config: str, step: int, offered_load: float,
                load_kind: str, slo: Mapping[str, Any], step_duration_s: float,
                warmup_s: float, cooldown_s: float, steady: str = "fixed") -> pd.DataFrame:
    """The steps.parquet rows of one step's run folder (empty frame if it recorded nothing)."""
    return measure_step(run_dir, config=config, step=step, offered_load=offered_load,
                        load_kind=load_kind, slo=slo, step_duration_s=step_duration_s,
                        warmup_s=warmup_s, cooldown_s=cooldown_s, steady=steady)[0]


def step_validity(run_dir: str | Path, requests: pd.DataFrame,
                  window: tuple[int, int]) -> tuple[str, str]:
    """Did this step measure the server? ``valid``, ``generator_limited`` (the load generator
    fell behind in the window: schedule lag, read delay, a worker at a full core, requests it
    could not send) or ``crashed`` (a process of the step's run died), with the reasons."""
    manifest = load_manifest(run_dir)
    if manifest.get("status") == "crashed":
        crashes = ", ".join(f"{c.get('process')} {c.get('exit')}"
                            for c in manifest.get("crashes") or [])
        return "crashed", f"crashed: {crashes}"
    sent = requests["sent_wall_ns"]
    cohort = requests[(sent >= window[0]) & (sent < window[1])]
    reasons = generator_warnings(summarize_requests(cohort, window), remedy=run_remedy(run_dir))
    reasons += generator_cpu_warnings(run_dir)
    return ("generator_limited" if reasons else "valid"), "; ".join(reasons)


# ------------------------------------------------------------------------------ per configuration


def monotone(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Isotonic (non-decreasing) least-squares fit, by pool-adjacent-violators.

    A step whose latency is below an earlier one is averaged with it, so one noisy spike at a
    low load lowers into its neighbours instead of lifting the whole floor (as a cumulative
    maximum would); a true bend upward is kept.
    """
    blocks: list[list[float]] = []  # [mean, weight]
    for value in np.asarray(values, dtype=np.float64):
        blocks.append([float(value), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, weight = blocks.pop()
            left_mean, left_weight = blocks[-1]
            total = left_weight + weight
            blocks[-1] = [(left_mean * left_weight + mean * weight) / total, total]
    return np.concatenate([np.full(int(w), m) for m, w in blocks]) if blocks else np.empty(0)


def find_knee(loads: Sequence[float] | np.ndarray,
              latencies: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """Kneedle on the monotone latency-vs-load curve (points sorted by load, NaN dropped).

    Returns ``knee_load``, ``knee_latency_s`` (NaN without a candidate), ``knee_reached`` and the
    ``curve`` (load, latency_s, monotone_s).
    """
    from kneed import KneeLocator  # noqa: PLC0415 - third-party, loaded when a knee is sought

    x = np.asarray(loads, dtype=np.float64)
    y = np.asarray(latencies, dtype=np.float64)
    keep = ~np.isnan(x) & ~np.isnan(y)
    order = np.argsort(x[keep], kind="stable")
    x, y = x[keep][order], y[keep][order]
    mono = monotone(y) if y.size else y
    result: dict[str, Any] = {"knee_load": math.nan, "knee_latency_s": math.nan,
                              "knee_reached": False,
                              "curve": {"load": x.tolist(), "latency_s": y.tolist(),
                                        "monotone_s": mono.tolist()}}
    if x.size < 3 or mono[-1] <= mono[0]:
        return result
    # Kneedle's threshold (offline, S=1) is one mean x spacing below the peak of its difference
    # curve; with the 4-8 steps of a sweep that spacing is so coarse that no knee ever passes.
    # Interpolating the monotone curve linearly on a dense grid keeps its shape and fixes that;
    # the knee of a piecewise-linear curve is one of its vertices, so it snaps to a measured load.
    dense_x = np.linspace(x[0], x[-1], KNEE_GRID_POINTS)
    dense_y = np.interp(dense_x, x, mono)
    locator = KneeLocator(dense_x, dense_y, curve="convex", direction="increasing", S=1.0,
                          online=True)
    # kneed can report the curve's last point as a knee (seen on a 5-step sweep whose curve
    # flattens again at the end); a knee is interior by definition. Of the interior candidates,
    # the one furthest below the chord is Kneedle's maximum of its difference curve.
    chord = mono[0] + (x - x[0]) / (x[-1] - x[0]) * (mono[-1] - mono[0])
    candidates = {int(np.argmin(np.abs(x - float(k)))) for k in locator.all_knees}
    candidates = {i for i in candidates if 0 < i < x.size - 1 and chord[i] > mono[i]}
    if not candidates:
        return result
    at = max(candidates, key=lambda i: chord[i] - mono[i])
    # between the vertex's neighbours, and with two points at least on either segment
    knee = breakpoint_between(x, mono, float(max(x[at - 1], x[1])),
                              float(min(x[at + 1], x[-2])))
    knee_y = float(np.interp(knee, x, mono))
    result["knee_load"], result["knee_latency_s"] = knee, knee_y
    result["knee_reached"] = bool(knee < x[-1] and mono[-1] >= KNEE_GROWTH * knee_y)
    return result


def breakpoint_between(x: np.ndarray, y: np.ndarray, lo: float, hi: float) -> float:
    """The breakpoint ``k`` in ``[lo, hi]`` of the continuous two-segment line
    ``a + b x + c max(0, x - k)`` that fits the points ``(x, y)`` best (least squares over a grid
    of :data:`BREAKPOINT_GRID` values; segmented regression, Muggeo 2003).

    Kneedle finds which measured load the curve bends at; the bend itself lies between that
    load's neighbours, wherever the steps fell, and the broken line through every point says
    where.
    """
    ks = np.linspace(lo, hi, BREAKPOINT_GRID)
    design = np.stack(np.broadcast_arrays(np.ones_like(x), x, np.maximum(
        0.0, x[None, :] - ks[:, None])), axis=-1)  # k x points x 3
    try:  # every candidate's least squares at once, by its normal equations
        coef = np.linalg.solve(design.transpose(0, 2, 1) @ design,
                               (design.transpose(0, 2, 1) @ y)[:, :, None])[:, :, 0]
    except np.linalg.LinAlgError:
        coef = np.stack([np.linalg.lstsq(d, y, rcond=None)[0] for d in design])
    residuals = (((design @ coef[:, :, None])[:, :, 0] - y) ** 2).sum(axis=1)
    return float(ks[int(np.argmin(residuals))])


def knee_axis(rows: pd.DataFrame) -> np.ndarray:
    """The knee curve's load axis: the offered load, or for rate steps the arrivals each load
    actually received (``offered_req_per_s``, over its repeats): a Poisson plan of 60 req/s
    sends 60 +- 4% in a 9 s window, and where the latency bends depends on what arrived."""
    loads = rows["offered_load"].to_numpy(dtype=np.float64)
    if "offered_req_per_s" not in rows or not len(rows) or str(rows["load_kind"].iloc[0]) != (
            "rate"):
        return loads
    measured = rows["offered_arrivals_per_s" if _in_arrivals(rows) else
                    "offered_req_per_s"].to_numpy(dtype=np.float64)
    ordered = np.all(np.diff(measured[np.argsort(loads)]) > 0)
    return measured if np.isfinite(measured).all() and ordered else loads


def capacity_row(steps: pd.DataFrame, slo: Mapping[str, Any], knee_metric: str,
                 knee_percentile: str | None = None) -> dict[str, Any]:
    """Max sustainable load and knee of one configuration from its steps.parquet rows.

    The knee curve is ``<knee_metric>_<knee_percentile>_s`` (default: the SLO's percentile).
    """
    pct = knee_percentile or slo.get("percentile", "p95")
    metric = f"{knee_metric}_{pct}_s"
    rows = steps[steps["bucket"] == ALL_ROW].sort_values(["offered_load", "step"])
    rows = rows.drop_duplicates("offered_load", keep="last")  # a re-measured load: the last
    loads = rows["offered_load"].to_numpy(dtype=np.float64)
    passing = rows["sustainable"].to_numpy(dtype=bool)
    # a load the generator failed, not the server, bounds nothing: it is no SLO failure
    generator_failed = generator_failed_rows(rows)
    out: dict[str, Any] = {"load_kind": rows["load_kind"].iloc[0] if len(rows) else None,
                           "steps": int(len(rows)), "metric": metric,
                           "slo": json.dumps(dict(slo), sort_keys=True)}
    notes = []
    if passing.any():
        best = float(loads[passing].max())
        out["max_sustainable_load"] = best
        out["max_load_reached"] = bool(((loads > best) & ~generator_failed).any())
        if not out["max_load_reached"]:
            notes.append("the server met the SLO at every load it was measured at: its limit "
                         "is above them" if generator_failed.any() else
                         "every step was sustainable: the limit is above the highest step")
    else:
        out["max_sustainable_load"], out["max_load_reached"] = math.nan, False
        server_failed = loads[~generator_failed]
        if len(rows) and not len(server_failed):
            notes.append("no step was sustainable, and the generator, not the server, failed "
                         "at each: the server's limit is not measured")
        elif len(rows):
            notes.append("no step was sustainable: the limit is below the lowest step"
                         if server_failed.min() == loads.min() else
                         f"no step was sustainable: the limit is below {server_failed.min():g}, "
                         "the lowest load the server itself failed")
    knee = find_knee(knee_axis(rows), rows[metric].to_numpy(dtype=np.float64)) if len(
        rows) else find_knee([], [])
    # A step whose generator fell behind (or whose run crashed) may show the generator's own
    # queueing as the server's latency: the knee is never taken from such steps silently.
    invalid = (rows["validity"].fillna("valid") != "valid").to_numpy(dtype=bool) if (
        "validity" in rows) else np.zeros(len(rows), dtype=bool)
    out["invalid_steps"] = int(invalid.sum())
    if invalid.any():
        named = ", ".join(f"{load:g} ({verdict})" for load, verdict in zip(
            loads[invalid], rows["validity"][invalid], strict=True))
        notes.append(f"CAUTION: the generator did not fully measure the server at {named}; "
                     "the curve (and knee) include those steps, see validity_reasons")
    if generator_failed.any():
        notes.append("not taken as the server's limit (the generator, not the server, failed "
                      "there): " + ", ".join(f"{load:g}" for load in loads[generator_failed]))
    out["knee_load"], out["knee_reached"] = knee["knee_load"], knee["knee_reached"]
    out["knee_latency_s"] = knee["knee_latency_s"]
    out["curve"] = json.dumps(knee["curve"])
    if not knee["knee_reached"]:
        notes.append("no knee reached: latency never bent upward within the sweep"
                     if math.isnan(knee["knee_load"]) else
                     "knee candidate only: latency did not at least double past it")
    waiting = rows.get("num_requests_waiting_mean")
    if waiting is not None and waiting.notna().sum() >= 3:
        queue = find_knee(loads, waiting.to_numpy(dtype=np.float64))
        out["queue_knee_load"] = queue["knee_load"]
    else:
        out["queue_knee_load"] = math.nan
    out["note"] = "; ".join(notes)
    return out


def generator_failed_rows(rows: pd.DataFrame) -> np.ndarray:
    """Rows that missed the SLO where the generator may be why, not the server: generator-
    limited steps whose server kept up (a rate step delivered at least 95% of what arrived,
    under the throughput ceiling): what failed is the latency the generator bent. A server that
    fell behind its arrivals failed on its own, whatever the generator did."""
    failed = generator_limited(rows) & ~rows["sustainable"].to_numpy(dtype=bool)
    if "achieved_ratio" in rows:
        ratio = rows["achieved_ratio"].to_numpy(dtype=np.float64)
        failed &= ~(np.isfinite(ratio) & (ratio < SUSTAINABLE_RATIO))
    if "above_ceiling" in rows:
        failed &= ~rows["above_ceiling"].fillna(False).to_numpy(dtype=bool)
    return failed


def capacity_table(steps: pd.DataFrame, slo: Mapping[str, Any], knee_metric: str,
                   configs: Sequence[str] | None = None,
                   knee_percentile: str | None = None) -> pd.DataFrame:
    """capacity.parquet: one :func:`capacity_row` per configuration, in ``configs`` order."""
    names = list(configs) if configs is not None else list(dict.fromkeys(steps.get("config", [])))
    rows = []
    for name in names:
        mine = steps[steps["config"] == name] if len(steps) else steps
        rows.append({"config": name, **capacity_row(mine, slo, knee_metric, knee_percentile)})
    columns = ["config", "load_kind", "steps", "max_sustainable_load", "max_load_reached",
               "knee_load", "knee_reached", "knee_latency_s", "metric", "queue_knee_load", "slo",
               "curve", "invalid_steps", "note"]
    return pd.DataFrame(rows, columns=columns)


# ------------------------------------------------------------------------ across repeats: points


_SUMMED = ("requests", "ok", "errors", "not_sent", "cancelled", "window_s", "tasks")
_MEANED = (*TELEMETRY_COLUMNS.values(), "prefix_cache_hit_rate", "steady_cut_s")
_RATES = ("achieved_req_per_s", "output_tok_per_s", "goodput_req_per_s")


def _repeat_of(rows: pd.DataFrame) -> pd.Series:
    """Each step row's repeat (a study from before repeats: every run its own)."""
    if "repeat" in rows:
        return rows["repeat"].fillna(rows["step"]).astype(int)
    return rows["step"].astype(int)


def _clusters(rows: pd.DataFrame, cohorts: Mapping[str, pd.DataFrame], bucket: str,
              slo: Mapping[str, Any]) -> list[Any]:
    """One :class:`study_stats.Cohort` per repeat at one point: its parts' cohorts pooled."""
    clusters = []
    for _repeat, parts in rows.groupby(_repeat_of(rows), sort=True):
        frames = [cohorts[r] for r in parts["run_dir"] if r in cohorts]
        if not frames:
            continue
        frame = pd.concat(frames, ignore_index=True)
        # a task's calls span the buckets: every bucket's point draws all the step's tasks,
        # as its rows carry all of them (summarize_step)
        task_s = (frame[TASK_COHORT_COLUMN].to_numpy(dtype=np.float64, na_value=np.nan)
                  if all(TASK_COHORT_COLUMN in f for f in frames) else None)
        if task_s is not None:
            task_s = task_s[np.isfinite(task_s)]
        if bucket != ALL_ROW:
            frame = frame[frame["bucket"] == bucket].reset_index(drop=True)
        spans = parts["completion_span_s"].to_numpy(dtype=np.float64)
        windows = parts["window_s"].to_numpy(dtype=np.float64)
        offered = parts["offered_req_per_s"].to_numpy(dtype=np.float64)
        clusters.append(study_stats.cohort_from_frame(
            frame, meets_request_slos(frame, slo), float(np.nansum(spans)) or math.nan,
            float(np.nansum(offered * windows) / np.nansum(windows)) if np.isfinite(
                offered).all() else math.nan, float(np.nansum(windows)), task_s))
    return clusters


def _in_arrivals(rows: pd.DataFrame) -> bool:
    """The rows' load is counted in sessions or tasks (:func:`achieved_ratio`)."""
    return "offered_arrivals_per_s" in rows and bool(
        len(rows) and np.isfinite(rows["offered_arrivals_per_s"].to_numpy(np.float64)).all())


def _pooled_arrivals(rows: pd.DataFrame) -> dict[str, Any]:
    """A point's arrival figures over its repeats and parts: arrivals over their windows, the
    ok ones over their completion spans."""
    arrivals, ok = float(rows["arrivals"].sum()), float(rows["arrivals_ok"].sum())
    windows = float(rows["window_s"].sum())
    span = float(np.nansum(rows["arrival_span_s"].to_numpy(np.float64)))
    return {"arrival_unit": str(rows["arrival_unit"].iloc[0]), "arrivals": arrivals,
            "arrivals_ok": ok, "arrival_span_s": span or math.nan,
            "offered_arrivals_per_s": arrivals / windows if windows > 0 else math.nan,
            "achieved_arrivals_per_s": ok / span if span > 0 else math.nan}


def _point_row(rows: pd.DataFrame, clusters: Sequence[Any], slo: Mapping[str, Any],
               load_kind: str) -> dict[str, Any]:
    """A point's figures over every repeat and part of it (module docstring of study_stats)."""
    row: dict[str, Any] = {key: rows[key].iloc[0] for key in ("config", "bucket", "load_kind",
                                                              "offered_load")}
    row["step"] = int(rows["step"].max())
    row["repeats"] = int(_repeat_of(rows).nunique())
    row["parts"] = int(len(rows))
    for key in _SUMMED:
        if key in rows:
            row[key] = rows[key].sum()
    attempts = float(rows["ok"].sum() + rows["errors"].sum())
    row["error_rate"] = float(rows["errors"].sum()) / attempts if attempts else math.nan
    weights = (rows["ok"] + rows["errors"]).to_numpy(dtype=np.float64)
    for column in [c for c in rows.columns if c.startswith("err_")]:
        values = rows[column].to_numpy(dtype=np.float64)
        row[column] = float(np.average(values, weights=weights)) if weights.sum() else math.nan
    pooled = {tag: np.concatenate([c.latency[tag] for c in clusters]) if clusters else
              np.empty(0) for tag in ("ttft", "tpot", "e2e")}
    if clusters and all(c.itl_gaps is not None for c in clusters):  # every gap of every part
        pooled["itl"] = np.concatenate([c.itl_gaps for c in clusters])
    for tag in LATENCY_TAGS:
        for pct in ROLLUP_PERCENTILES:
            column = f"{tag}_{pct}_s"
            if tag in pooled and pooled[tag].size:
                row[column] = percentiles(pooled[tag], [float(pct[1:])])[0]
            else:  # ITL of cohorts cached without gaps: the requests' mean of the parts'
                values = rows[column].to_numpy(dtype=np.float64)
                ok = rows["ok"].to_numpy(dtype=np.float64)
                keep = np.isfinite(values) & (ok > 0)
                row[column] = float(np.average(values[keep], weights=ok[keep])) if keep.any() \
                    else math.nan
    spans = rows["completion_span_s"].to_numpy(dtype=np.float64)
    keep = np.isfinite(spans)
    for column in _RATES:
        values = rows[column].to_numpy(dtype=np.float64)
        row[column] = (float(np.sum(values[keep] * spans[keep]) / spans[keep].sum())
                       if keep.any() and spans[keep].sum() > 0 else math.nan)
    row["completion_span_s"] = float(spans[keep].sum()) if keep.any() else math.nan
    windows = rows["window_s"].to_numpy(dtype=np.float64)
    offered = rows["offered_req_per_s"].to_numpy(dtype=np.float64)
    row["offered_req_per_s"] = (float(np.sum(offered * windows) / windows.sum())
                                if load_kind == "rate" and windows.sum() else math.nan)
    if load_kind == "rate" and _in_arrivals(rows):
        row.update(_pooled_arrivals(rows))
    row["achieved_ratio"] = achieved_ratio(row, load_kind)
    row["schedule_lag_p99_s"] = float(rows["schedule_lag_p99_s"].max())
    row.update(_task_percentiles(rows, clusters))
    row["slo_met"] = slo_met(row, slo)
    row["sustainable"] = bool(row["slo_met"] and (
        load_kind != "rate" or (row["achieved_ratio"] == row["achieved_ratio"]
                                and row["achieved_ratio"] >= SUSTAINABLE_RATIO)))
    for column in _MEANED:
        if column in rows:
            row[column] = float(rows[column].mean())
    row.update(frontier.point_energy(rows))
    row["settled"] = bool(rows["settled"].all()) if "settled" in rows else True
    reasons = rows["steady_reasons"].fillna("") if "steady_reasons" in rows else pd.Series([])
    row["steady_reasons"] = "; ".join(dict.fromkeys(r for r in reasons if r))
    row["unsettled_parts"] = int((~rows["settled"].astype(bool)).sum()) if "settled" in rows \
        else 0
    row["cache_flagged"] = bool(rows["cache_flagged"].any()) if "cache_flagged" in rows \
        else False
    validity = rows["validity"].fillna("valid") if "validity" in rows else pd.Series(["valid"])
    bad = [v for v in validity if v != "valid"]
    row["validity"] = bad[0] if bad else "valid"
    row["validity_reasons"] = "; ".join(dict.fromkeys(
        r for r in (rows["validity_reasons"].fillna("") if "validity_reasons" in rows else [])
        if r))
    phases = set(rows["phase"].fillna("sweep")) if "phase" in rows else {"sweep"}
    row["phase"] = "refine" if "refine" in phases else ("probe" if phases == {"probe"}
                                                        else "sweep")
    return row


def _task_percentiles(rows: pd.DataFrame, clusters: Sequence[Any] = ()) -> dict[str, float]:
    """A point's task time percentiles over its parts: over their ok tasks pooled where every
    part's cohort carries its task times (:data:`TASK_COHORT_COLUMN`), else each part's,
    weighted by its tasks (cohorts cached before they carried them)."""
    if "tasks" not in rows:
        return {}
    weights = rows["tasks"].fillna(0).to_numpy(dtype=np.float64)
    out = {}
    columns = [c for c in rows.columns if c.startswith("task_p") and c.endswith("_s")]
    if clusters and all(c.task_s is not None for c in clusters):
        pooled = np.concatenate([c.task_s for c in clusters])
        for column in columns:
            out[column] = percentiles(pooled, [float(column[6:-2])])[0]
        return out
    for column in columns:
        values = rows[column].to_numpy(dtype=np.float64)
        keep = np.isfinite(values) & (weights > 0)
        out[column] = (float(np.average(values[keep], weights=weights[keep])) if keep.any()
                       else math.nan)
    return out


def _task_slo_undrawn(row: Mapping[str, Any], draws: Any, slo: Mapping[str, Any]) -> bool:
    """The point fails a task time SLO that its draws do not judge (too few tasks for the
    percentile's draws, or a cohort cached before task draws: study_stats.draw_sustainable
    then leaves it to the point's own figure)."""
    if f"task_{slo.get('percentile', 'p95')}_s" in draws.values:
        return False
    return tasks.task_slo_met(row, slo) is False


def _point_seed(seed: int, config: str, load: float, bucket: str) -> list[int]:
    return [seed, zlib.crc32(config.encode()), zlib.crc32(bucket.encode()),
            int(round(load * 1000))]


def points_table(steps: pd.DataFrame, cohorts: Mapping[str, pd.DataFrame],
                 slo: Mapping[str, Any], seed: int = 0,
                 cache: dict[Any, Any] | None = None) -> tuple[pd.DataFrame, dict[Any, Any]]:
    """(points.parquet, draws): one row per configuration x offered load x bucket over all its
    repeats and parts, every figure with ``<figure>_lo`` / ``<figure>_hi`` (95%, cluster
    bootstrap, :mod:`dashboards.analysis.study_stats`), and the draws per (config, load, bucket).

    ``cohorts``: each step's measured requests by its ``run_dir``; ``cache``: a dict kept by the
    caller, so a point whose runs did not change is not drawn again.
    """
    if steps.empty:
        return pd.DataFrame(), {}
    cache = {} if cache is None else cache
    out_rows, draws_of = [], {}
    for (config, load, bucket), rows in steps.groupby(["config", "offered_load", "bucket"],
                                                      sort=False):
        key = (config, float(load), bucket, tuple(rows["run_dir"]), json.dumps(
            dict(slo), sort_keys=True), seed)
        if key not in cache:
            load_kind = str(rows["load_kind"].iloc[0])
            clusters = _clusters(rows, cohorts, bucket, slo)
            draws = study_stats.bootstrap_point(clusters, rng=np.random.default_rng(
                _point_seed(seed, str(config), float(load), str(bucket))))
            row = _point_row(rows, clusters, slo, load_kind)
            if row.get("arrival_unit"):  # its ratio counts sessions or tasks: no draws of it
                draws.values.pop("achieved_ratio", None)
            for name in draws.values:
                row[f"{name}_lo"], row[f"{name}_hi"] = draws.interval(name)
            row["sustainable_draws"] = float(study_stats.draw_sustainable(
                draws, slo, load_kind, SUSTAINABLE_RATIO).mean()) if draws.values else math.nan
            if _task_slo_undrawn(row, draws, slo) or row.get("arrival_unit") and not (
                    row["achieved_ratio"] >= SUSTAINABLE_RATIO):  # no draws: the point's
                row["sustainable_draws"] = 0.0
            cache[key] = (row, draws)
        row, draws = cache[key]
        out_rows.append(row)
        draws_of[(config, float(load), bucket)] = draws
    points = pd.DataFrame(out_rows)
    order = {b: i for i, b in enumerate(("all", "short", "medium", "long"))}
    points = points.sort_values(["config", "offered_load"], kind="stable")
    points = points.sort_values("bucket", key=lambda b: b.map(order).fillna(9), kind="stable")
    return points.reset_index(drop=True), draws_of


def _ceiling_of(mine: pd.DataFrame, point_draws: Sequence[Any] | None = None,
                figure: Callable[..., tuple[float, np.ndarray | None]] = (
                    study_stats.throughput_ceiling)) -> tuple[float, np.ndarray | None]:
    """study_stats.throughput_ceiling (or another ``figure`` of the saturated loads, e.g.
    study_stats.saturation_throughput) of one configuration's ``all`` points (rate steps
    only)."""
    if not len(mine) or str(mine["load_kind"].iloc[0]) != "rate":
        return math.nan, None
    ratio = mine["achieved_ratio"].to_numpy(dtype=np.float64)
    saturated = np.isfinite(ratio) & (ratio < SUSTAINABLE_RATIO)
    if _in_arrivals(mine):  # the load counts sessions or tasks: so does what it delivered
        return figure(mine["achieved_arrivals_per_s"], saturated, None)
    draws = None
    if point_draws and all(d is not None and "achieved_req_per_s" in d.values
                           for d in point_draws):
        draws = np.vstack([d.values["achieved_req_per_s"] for d in point_draws])
    return figure(mine["achieved_req_per_s"], saturated, draws)


def apply_throughput_ceiling(points: pd.DataFrame) -> pd.DataFrame:
    """Rate points gain ``above_ceiling``: the offered load is above the most its
    configuration delivered once a load saturated it (study_stats.throughput_ceiling); such a
    point is not ``sustainable``, whatever its own achieved / offered."""
    if points.empty:
        return points
    points = points.copy()
    points["above_ceiling"] = False
    for config, mine in points[points["bucket"] == ALL_ROW].groupby("config", sort=False):
        ceiling, _ = _ceiling_of(mine)
        if ceiling == ceiling:
            above = (points["config"] == config) & (points["offered_load"] > ceiling)
            points.loc[above, "above_ceiling"] = True
            points.loc[above, "sustainable"] = False
    return points


def capacity_with_intervals(points: pd.DataFrame, draws: Mapping[Any, Any],
                            slo: Mapping[str, Any], knee_metric: str,
                            configs: Sequence[str] | None = None,
                            knee_percentile: str | None = None) -> pd.DataFrame:
    """capacity.parquet from the points: :func:`capacity_row` on each configuration's ``all``
    points, with ``max_load_lo/_hi`` and ``knee_lo/_hi`` (study_stats.capacity_intervals),
    ``throughput_ceiling`` with ``_lo`` / ``_hi`` (rate steps, once a load saturated the
    server; else NaN), ``repeats`` (fewest behind a point), ``requests``, ``refined`` (loads the
    search added),
    ``unsettled`` (loads with a part that never settled) and ``cache_flagged``."""
    capacity = capacity_table(points, slo, knee_metric, configs, knee_percentile)
    pct = knee_percentile or slo.get("percentile", "p95")
    metric = f"{knee_metric}_{pct}_s"
    extra = []
    for row in capacity.itertuples(index=False):
        mine = points[(points["config"] == row.config) & (points["bucket"] == ALL_ROW)] if len(
            points) else points
        mine = mine.sort_values("offered_load")
        if len(mine):  # a load the generator failed bounds no interval (capacity_row)
            mine = mine[~generator_failed_rows(mine)]
        loads = mine["offered_load"].to_numpy(dtype=np.float64) if len(mine) else np.empty(0)
        point_draws = [draws.get((row.config, float(load), ALL_ROW)) for load in loads]
        values: dict[str, Any] = dict.fromkeys(
            ("max_load_lo", "max_load_hi", "knee_lo", "knee_hi", "throughput_ceiling",
             "throughput_ceiling_lo", "throughput_ceiling_hi", "saturation_throughput",
             "saturation_throughput_lo", "saturation_throughput_hi"), math.nan)
        present = [d for d in point_draws if d is not None and d.values]
        if len(loads) and len(present) == len(point_draws):
            load_kind = str(mine["load_kind"].iloc[0])
            sustainable = np.vstack([study_stats.draw_sustainable(d, slo, load_kind,
                                                                  SUSTAINABLE_RATIO)
                                     for d in present])
            if slo.get("task_ms") is not None:  # task time without draws: the point's own
                sustainable &= ~np.array([_task_slo_undrawn(r, d, slo) for r, d in zip(
                    mine.to_dict("records"), present, strict=True)])[:, None]
            width = sustainable.shape[1]
            metric_draws = np.vstack([d.values.get(metric, np.full(width, np.nan))
                                      for d in present])
            ceiling, ceiling_draws = _ceiling_of(mine, present)
            if ceiling_draws is not None:  # a draw's loads above its own ceiling failed
                sustainable &= loads[:, None] <= ceiling_draws[None, :]
            values = study_stats.capacity_intervals(
                loads, mine["sustainable"].to_numpy(dtype=bool), sustainable, metric_draws,
                float(row.knee_load), float(row.max_sustainable_load),
                lambda x, y: float(find_knee(x, y)["knee_load"]), knee_axis(mine))
            values["throughput_ceiling"] = ceiling
            values["throughput_ceiling_lo"], values["throughput_ceiling_hi"] = (
                study_stats.Draws({"c": ceiling_draws}).interval("c")
                if ceiling_draws is not None else (math.nan, math.nan))
            saturation, saturation_draws = _ceiling_of(mine, present,
                                                       study_stats.saturation_throughput)
            values["saturation_throughput"] = saturation
            values["saturation_throughput_lo"], values["saturation_throughput_hi"] = (
                study_stats.Draws({"s": saturation_draws}).interval("s")
                if saturation_draws is not None else (math.nan, math.nan))
        values["bend_load"] = float(row.knee_load)
        values["bend_lo"], values["bend_hi"] = values["knee_lo"], values["knee_hi"]
        values["knee_kind"] = "bend"
        values["repeats"] = int(mine["repeats"].min()) if "repeats" in mine and len(mine) else 0
        values["requests"] = int(mine["requests"].sum()) if len(mine) else 0
        values["refined"] = int((mine.get("phase", pd.Series(dtype=str)) == "refine").sum())
        values["unsettled"] = int((~mine["settled"].astype(bool)).sum()) if "settled" in mine \
            else 0
        values["cache_flagged"] = int(mine["cache_flagged"].astype(bool).sum()) if (
            "cache_flagged" in mine) else 0
        extra.append(values)
    extra_frame = pd.DataFrame(extra, index=capacity.index)
    capacity = apply_saturation_knee(pd.concat([capacity.drop(columns=[
        c for c in extra_frame.columns if c in capacity]), extra_frame], axis=1))
    notes = []
    for row in capacity.itertuples(index=False):
        note = [row.note] if row.note else []
        if getattr(row, "repeats", 0) == 1:
            note.append("one repeat: the intervals hold within-run noise only, not run-to-run "
                        "variation (repeats: 2 or more)")
        if getattr(row, "unsettled", 0):
            note.append(f"{row.unsettled} load(s) never settled (steady_reasons)")
        if getattr(row, "cache_flagged", 0):
            note.append(f"{row.cache_flagged} load(s) read more from the prefix cache than the "
                        "workload shares")
        notes.append("; ".join(note))
    capacity["note"] = notes
    return capacity


def apply_saturation_knee(capacity: pd.DataFrame) -> pd.DataFrame:
    """Rate configurations whose sweep saturated the server take what it completed saturated
    (``saturation_throughput``: the mean achieved of the saturated loads) as their knee (module
    docstring, "Knee"), with its interval; ``knee_latency_s`` is the latency
    curve's value there, ``knee_reached`` true (a load went past it), ``knee_kind``
    "saturation". Others keep the bend."""
    capacity = capacity.copy()
    if "saturation_throughput" not in capacity:
        return capacity
    saturated = (capacity["load_kind"] == "rate") & capacity["saturation_throughput"].notna()
    for index in capacity.index[saturated]:
        row = capacity.loc[index]
        curve = json.loads(row["curve"]) if isinstance(row["curve"], str) else {}
        load, latency = curve.get("load") or [], curve.get("monotone_s") or []
        capacity.loc[index, "knee_load"] = float(row["saturation_throughput"])
        capacity.loc[index, "knee_lo"] = float(row["saturation_throughput_lo"])
        capacity.loc[index, "knee_hi"] = float(row["saturation_throughput_hi"])
        capacity.loc[index, "knee_latency_s"] = float(np.interp(
            row["saturation_throughput"], load, latency)) if len(load) else math.nan
        capacity.loc[index, "knee_reached"] = True
        capacity.loc[index, "knee_kind"] = "saturation"
        capacity.loc[index, "note"] = "; ".join(
            part for part in str(row["note"] or "").split("; ")
            if part and not part.startswith(("knee candidate only", "no knee reached")))
    return capacity


def read_cohorts(study_dir: str | Path, run_dirs: Sequence[str]) -> dict[str, pd.DataFrame]:
    """Each step's cached cohort (``<run_dir>/study_cohort.parquet``) that exists."""
    out = {}
    for run_dir in run_dirs:
        path = Path(study_dir) / run_dir / COHORT_FILE
        if path.is_file():
            out[run_dir] = pd.read_parquet(path)
    return out


def full_rollup(steps: pd.DataFrame, cohorts: Mapping[str, pd.DataFrame],
                study: Mapping[str, Any], configs: Sequence[str],
                cache: dict[Any, Any] | None = None
                ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(points, capacity, verdict) of a study's step rows and cohorts."""
    slo = study.get("slo") or {}
    points, draws = points_table(steps, cohorts, slo, int(study.get("seed") or 0), cache)
    points = frontier.efficiency_columns(apply_throughput_ceiling(points),
                                         study.get("gpu_hour_usd"))
    if points.empty:
        return points, capacity_table(points, slo, study.get("knee_metric", "ttft"), configs,
                                      study.get("knee_percentile")), pd.DataFrame()
    capacity = capacity_with_intervals(points, draws, slo, study.get("knee_metric", "ttft"),
                                       configs, study.get("knee_percentile"))
    capacity = study_search.resolve_capacity(capacity, points, slo, float(
        (study.get("refine") or {}).get("share") or study_search.DEFAULT_SHARE))
    capacity = frontier.capacity_efficiency(capacity, points)
    verdict = verdict_table(points, draws, capacity, slo, configs)
    return points, capacity, verdict


def rollup_study(study_dir: str | Path, write: bool = True,
                 gpu_hour_usd: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(steps, capacity) of a study from its ``study.json`` and step run folders
    (``gpu_hour_usd``: the price of a GPU-hour, in place of study.json's).

    Only steps whose status is ``done`` count; a step folder without its requests table
    contributes the rows and cohort cached when it ended (:data:`STEP_ROWS_FILE`,
    :data:`COHORT_FILE`). With ``write`` the roll-up files (steps, points,
    capacity, verdict) are written to ``<study_dir>/rollup/`` (each through a temporary file
    and a rename, so a reader never sees half a file).
    """
    study_dir = Path(study_dir)
    study = read_study(study_dir)
    if gpu_hour_usd:
        study["gpu_hour_usd"] = gpu_hour_usd
    slo = study.get("slo") or {}
    frames, cohorts = [], {}
    for entry in study.get("steps", []):
        if entry.get("status") != "done":
            continue
        run_dir = study_dir / entry["run_dir"]
        if not (run_dir / run_folder.REQUESTS_TABLE).exists() and (
                run_dir / STEP_ROWS_FILE).is_file() and (run_dir / COHORT_FILE).is_file():
            # a study kept without its raw tables (say, brought back from another machine):
            # the rows and cohort the runner cached when the step ended
            rows, cohort = (pd.read_parquet(run_dir / STEP_ROWS_FILE),
                            pd.read_parquet(run_dir / COHORT_FILE))
            label_step(rows, entry)
            frames.append(rows)
            cohorts[entry["run_dir"]] = cohort
            continue
        rows, cohort = measure_step(
            study_dir / entry["run_dir"], config=entry["config"], step=int(entry["step"]),
            offered_load=float(entry["offered_load"]), load_kind=entry["load_kind"], slo=slo,
            step_duration_s=float(entry.get("duration_s") or study["step_duration_s"]),
            # a merged study's steps keep the window of the study that measured them
            warmup_s=float(entry.get("warmup_s", study["warmup_s"])),
            cooldown_s=float(entry.get("cooldown_s", study["cooldown_s"])),
            steady=entry.get("steady_state") or study.get("steady_state") or "fixed",
            expected_cache_hit_rate=float(entry.get(
                "expected_cache_hit_rate", study.get("expected_cache_hit_rate", 1.0))))
        if not rows.empty:
            label_step(rows, entry)
            frames.append(rows)
            cohorts[entry["run_dir"]] = cohort
    steps = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["config", "step", "load_kind", "offered_load", "bucket", "sustainable"])
    configs = [c["name"] for c in study.get("configurations", [])]
    points, capacity, verdict = full_rollup(steps, cohorts, study, configs)
    if write:
        write_rollup(study_dir, steps, capacity, points, verdict)
    return steps, capacity


def label_step(rows: pd.DataFrame, entry: Mapping[str, Any]) -> None:
    """A step's rows gain where they sit in the study: config (a merged study may have renamed
    it), run_dir, repeat, part, phase."""
    rows["config"] = entry["config"]
    rows["run_dir"] = entry["run_dir"]
    rows["repeat"] = int(entry.get("repeat") or entry["step"])
    rows["part"] = int(entry.get("part") or 1)
    rows["phase"] = str(entry.get("phase") or "sweep")


def write_rollup(study_dir: str | Path, steps: pd.DataFrame, capacity: pd.DataFrame,
                 points: pd.DataFrame | None = None,
                 verdict: pd.DataFrame | None = None) -> None:
    """Write the roll-up files, each through a temporary file and a rename."""
    out = Path(study_dir) / ROLLUP_DIR
    out.mkdir(parents=True, exist_ok=True)
    frames = [(steps, STEPS_FILE), (capacity, CAPACITY_FILE)]
    frames += [(f, n) for f, n in ((points, POINTS_FILE), (verdict, VERDICT_FILE))
               if f is not None]
    if points is not None:
        frames.append((frontier.frontier_table(points), FRONTIER_FILE))
    for frame, name in frames:
        write_atomic(out / name, partial(frame.to_parquet, index=False))


def load_rollup(study_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The written roll-up files (steps, capacity) of a study folder."""
    out = Path(study_dir) / ROLLUP_DIR
    return pd.read_parquet(out / STEPS_FILE), pd.read_parquet(out / CAPACITY_FILE)


def format_capacity(capacity: pd.DataFrame, unit: str = "") -> str:
    """A short text table of capacity.parquet for the terminal (intervals where present)."""
    lines = [f"{'config':<16} {'max sustainable [95% interval]':>32} {'knee [95% interval]':>28} "
             f"{'knee latency':>13} {'repeats':>7} {'requests':>9}  metric"]
    for row in capacity.itertuples(index=False):
        best = _num(row.max_sustainable_load) + (
            "" if row.max_load_reached or row.max_sustainable_load != row.max_sustainable_load
            else "+")
        if not getattr(row, "resolved", True):  # study_search: no made-up capacity
            best = "not resolved"
        knee = _num(row.knee_load) + ("" if row.knee_reached or row.knee_load != row.knee_load
                                      else "?")
        if getattr(row, "knee_kind", "bend") == "saturation":
            knee = "*" + knee
        lines.append(
            f"{row.config:<16} {best + _interval(row, 'max_load'):>32} "
            f"{knee + _interval(row, 'knee'):>28} "
            f"{_num(row.knee_latency_s * 1e3, 1) + ' ms':>13} "
            f"{getattr(row, 'repeats', '-'):>7} {getattr(row, 'requests', '-'):>9}"
            f"  {row.metric}{'  (' + row.note + ')' if row.note else ''}")
    if unit:
        lines.append(f"(loads in {unit}; + : the limit is above the sweep; ? : knee candidate "
                     "only; * : the saturation point, the throughput ceiling)")
    return "\n".join(lines)


def _interval(row: Any, name: str) -> str:
    lo, hi = getattr(row, f"{name}_lo", math.nan), getattr(row, f"{name}_hi", math.nan)
    if lo is None or lo != lo:
        return ""
    return f" [{_num(lo)}, {'inf' if math.isinf(hi) else _num(hi)}]"


def _num(value: float, digits: int = 2) -> str:
    return "-" if value is None or value != value else f"{value:.{digits}f}"


def add_price_option(parser: argparse.ArgumentParser) -> None:
    """``--gpu-hour-usd`` of ``study rollup`` and ``study export`` (``study run``'s is
    ``locustfiles.config``'s ``study_gpu_hour_usd``)."""
    parser.add_argument("--gpu-hour-usd", type=_price, default=None, metavar="USD",
                        help="price of a GPU-hour in US dollars: the cost per million output "
                             "tokens (default: study.json's gpu_hour_usd)")


def _price(text: str) -> float:
    """``--gpu-hour-usd``: a number of US dollars, > 0 (argparse prints the error's line)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected US dollars per GPU-hour > 0, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """``swarmload study rollup STUDY_DIR``: rebuild the roll-up from the step run folders."""
    parser = argparse.ArgumentParser(
        prog="swarmload study rollup",
        description="Rebuild rollup/steps.parquet and rollup/capacity.parquet of a study folder "
                    "from its step run folders, and print the capacity table.")
    parser.add_argument("study_dir", type=Path)
    add_price_option(parser)
    args = parser.parse_args(argv)
    try:
        steps, capacity = rollup_study(args.study_dir, gpu_hour_usd=args.gpu_hour_usd)
    except FileNotFoundError as exc:
        print(f"swarmload study rollup: {exc}", file=sys.stderr)
        return 2
    kind = str(capacity["load_kind"].dropna().iloc[0]) if capacity["load_kind"].notna().any() \
        else ""
    print(format_capacity(capacity, arrivals_unit(steps)  # tasks/s, sessions/s of such plans
                          or {"rate": "req/s", "concurrency": "users"}.get(kind, "")))
    verdict_path = Path(args.study_dir) / ROLLUP_DIR / VERDICT_FILE
    if verdict_path.is_file() and len(verdict := pd.read_parquet(verdict_path)):
        print("verdict (95% intervals):")
        print(format_verdict(verdict))
    print(f"{len(steps)} step rows -> {args.study_dir / ROLLUP_DIR}")

    if (read_study(args.study_dir).get("load") or {}).get("arrival") == "bursts":
        spikes, _ = burst.write_study_bursts(args.study_dir)
        for line in burst.comparison_lines(burst.recovery_comparison(spikes)):
            print(line)
    return 0
