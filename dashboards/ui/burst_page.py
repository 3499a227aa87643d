"""The Burst page: what each spike did and how long the server took to recover.

Served through :mod:`dashboards.app` at ``/bursts``. Two views, chosen in the sidebar:

- **Study**: a study run with ``arrival: bursts`` (``?study=<name>``): its configurations compared
  on recovery from the same spike (bar chart and table), then one spike's timelines with every
  configuration overlaid. Reads only the burst roll-up (``rollup/bursts.parquet``,
  ``rollup/burst_timelines.parquet``).
- **Run**: one open-loop run (``?run=<run_id>``): its spike table and each spike's timelines,
  computed from the run folder by :mod:`dashboards.analysis.burst`.

Each timeline shades the spike, draws the configuration's baseline band and a dashed rule where it
recovered: offered vs achieved load, P95 TTFT per 1 s window, the server's waiting and running
requests. Charts are keyed ``chart-burst-load``, ``chart-burst-ttft``, ``chart-burst-queue``,
``chart-burst-recovery``; tables ``table-burst-spikes``, ``table-burst-comparison``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from collectors import run_folder
from dashboards import burst_charts
from dashboards.analysis import burst, study_data
from dashboards.app import results_dir_from
from dashboards.ui.widgets import markdown_table, show_chart

CACHE_TTL_S = 5.0
VIEWS = {"study": "Study: configurations compared", "run": "Run"}
SPIKE_TABLE = {  # column -> (heading, scale); times in ms or s as the heading says
    "start_s": ("start (s)", 1), "duration_s": ("length (s)", 1),
    "offered_peak_rps": ("offered peak (req/s)", 1),
    "baseline_ttft_p50_s": ("baseline P50 TTFT (ms)", 1e3),
    "baseline_ttft_p95_s": ("baseline P95 TTFT (ms)", 1e3),
    "baseline_tpot_p95_s": ("baseline P95 TPOT (ms)", 1e3),
    "baseline_error_rate": ("baseline errors (%)", 100), "baseline_waiting": ("baseline queue", 1),
    "peak_ttft_p95_s": ("peak P95 TTFT (ms)", 1e3), "peak_waiting": ("peak queue", 1),
    "peak_running": ("peak running", 1), "peak_kv_cache_usage": ("peak KV cache (%)", 100),
    "failed": ("failed", 1), "dropped": ("dropped", 1), "recovery_s": ("recovery (s)", 1),
    "queue_recovery_s": ("queue back (s)", 1),
}
COMPARISON_TABLE = {
    "spikes": ("spikes", 1), "recovered": ("recovered", 1),
    "recovery_s": ("recovery, median (s)", 1), "recovery_max_s": ("recovery, longest (s)", 1),
    "queue_recovery_s": ("queue back, median (s)", 1),
    "baseline_ttft_p95_s": ("baseline P95 TTFT (ms)", 1e3),
    "peak_ttft_p95_s": ("peak P95 TTFT (ms)", 1e3), "peak_waiting": ("peak queue", 1),
    "failed": ("failed", 1), "dropped": ("dropped", 1),
}


def table_text(frame: pd.DataFrame, columns: dict[str, tuple[str, float]], index: str) -> str:
    """A Markdown table of the chosen columns, scaled and rounded, "-" for missing values."""
    out = pd.DataFrame(index=frame[index].astype(str).rename(index))
    for column, (heading, scale) in columns.items():
        if column not in frame:
            continue
        values = pd.to_numeric(frame[column], errors="coerce").to_numpy() * scale
        out[heading] = ["-" if not np.isfinite(v) else f"{v:,.0f}" if abs(v) >= 100
                        else f"{v:.3g}" for v in values]
    return markdown_table(out)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def burst_studies(results_dir: str) -> pd.DataFrame:
    studies = study_data.list_studies(results_dir)
    if studies.empty:
        return studies
    keep = [burst.load_study_bursts(path) is not None for path in studies["path"]]
    return studies[keep].reset_index(drop=True)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=8)
def cached_study_bursts(study_dir: str, fingerprint: tuple[int, ...]) -> Any:
    return burst.load_study_bursts(study_dir)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def open_loop_runs(results_dir: str) -> pd.DataFrame:
    runs = run_folder.list_runs(results_dir)
    steps = study_data.list_step_runs(results_dir)
    runs = pd.concat([runs, steps], ignore_index=True) if len(steps) else runs
    if runs.empty:
        return runs
    keep = [bool((run_folder.load_manifest(p).get("load") or {}).get("plan")) for p in runs["path"]]
    return runs[keep].reset_index(drop=True)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=8)
def cached_run_bursts(run_dir: str, fingerprint: tuple[int, int]) -> Any:
    return burst.burst_report(run_dir)


def _pick(label: str, options: list[str], key: str, param: str) -> str:
    if st.session_state.get(key) not in options:
        wanted = st.query_params.get(param)
        st.session_state[key] = wanted if wanted in options else options[0]
    chosen = st.sidebar.selectbox(label, options, key=key)
    st.query_params[param] = chosen
    return chosen


TIMELINE_KEYS = ("chart-burst-load", "chart-burst-ttft", "chart-burst-queue")


def timeline_specs(timelines: pd.DataFrame, spikes: pd.DataFrame,
                   configs: list[str]) -> list[str]:
    """The three timelines of one spike, as JSON with sorted keys (the images' cache key)."""
    charts = (burst_charts.load_timeline, burst_charts.ttft_timeline,
              burst_charts.queue_timeline)
    return [json.dumps(chart(timelines, spikes, configs), sort_keys=True) for chart in charts]


def show_timelines(specs: list[str], interactive: bool) -> None:
    charts = st.columns(2)
    for i, (key, spec) in enumerate(zip(TIMELINE_KEYS, specs, strict=True)):
        with charts[i % 2], st.container(key=key):
            show_chart(spec, interactive)
    st.caption("Shaded: the spike. Band: the baseline (P95 TTFT from the baseline's P50 up to "
               "10% over its P95; the waiting queue up to its limit). Dashed rule: recovered "
               "(every later window back in the band, up to the next spike or the end).")


def bursts_fingerprint(study_dir: str) -> tuple[int, ...]:
    """The study's fingerprint and the burst roll-up's mtimes (ns): a cache key that changes
    on each rewrite of either."""
    rollup = Path(study_dir) / run_folder.ROLLUP_DIR
    files = (rollup / burst.BURSTS_FILE, rollup / burst.BURST_TIMELINES_FILE)
    return study_data.study_fingerprint(study_dir) + tuple(
        f.stat().st_mtime_ns if f.is_file() else 0 for f in files)


def _study_configs(study_dir: str, spikes: pd.DataFrame) -> list[str]:
    meta = run_folder.load_study_meta(study_dir)
    return [c["name"] for c in meta.get("configurations") or []] or list(
        dict.fromkeys(spikes["config"]))


@st.cache_data(show_spinner=False, max_entries=8)
def cached_comparison(study_dir: str, fingerprint: tuple[int, ...]) -> tuple[str, str]:
    """The configurations' recovery compared, as the Markdown table and the bar chart's JSON,
    once per roll-up and server (with the timelines, building them from the roll-up was
    most of the script's time on each view)."""
    spikes, _ = cached_study_bursts(study_dir, fingerprint)
    configs = _study_configs(study_dir, spikes)
    comparison = burst.recovery_comparison(spikes, configs)
    return (table_text(comparison, COMPARISON_TABLE, "config"),
            json.dumps(burst_charts.recovery_bars(comparison, configs), sort_keys=True))


@st.cache_data(show_spinner=False, max_entries=32)
def cached_spike(study_dir: str, fingerprint: tuple[int, ...], step: int,
                 number: int) -> tuple[float, list[str], str]:
    """One spike of one step, every configuration: its start (s), its timelines' JSON and its
    Markdown table, once per roll-up, spike and server."""
    spikes, timelines = cached_study_bursts(study_dir, fingerprint)
    configs = _study_configs(study_dir, spikes)
    chosen = spikes[(spikes["step"] == step) & (spikes["spike"] == number)]
    lines = timelines[(timelines["step"] == step) & (timelines["spike"] == number)]
    return (float(chosen["start_s"].min()), timeline_specs(lines, chosen, configs),
            table_text(chosen, SPIKE_TABLE, "config"))


def show_study(study: pd.Series, interactive: bool) -> None:
    path = str(study["path"])
    fingerprint = bursts_fingerprint(path)
    loaded = cached_study_bursts(path, fingerprint)
    st.title(f"Bursts · study {study['name']}")
    if loaded is None:
        st.info("No burst roll-up yet (rollup/bursts.parquet).")
        return
    spikes, _ = loaded
    meta = run_folder.load_study_meta(path)
    burst_plan = (meta.get("load") or {}).get("burst") or {}
    if burst_plan:
        st.caption("Same spike for every configuration: "
                   + ", ".join(f"{k} {v}" for k, v in burst_plan.items()))
    table, bars = cached_comparison(path, fingerprint)
    columns = st.columns([3, 2])
    with columns[0], st.container(key="table-burst-comparison"):
        st.markdown(table)
    with columns[1], st.container(key="chart-burst-recovery"):
        show_chart(bars, interactive)
    steps = sorted(spikes["step"].unique())
    numbers = sorted(spikes["spike"].unique())
    picks = st.columns(2)
    step = picks[0].selectbox("Step (base load)", steps, format_func=lambda s: (
        f"step {s}: {spikes.loc[spikes['step'] == s, 'offered_load'].iloc[0]:g} req/s"))
    number = picks[1].selectbox("Spike", numbers)
    start_s, specs, spike_table = cached_spike(path, fingerprint, int(step), int(number))
    st.subheader(f"Spike {number} at {start_s:.0f} s, every configuration")
    show_timelines(specs, interactive)
    with st.container(key="table-burst-spikes"):
        st.markdown(spike_table)


def show_run(run: pd.Series, interactive: bool) -> None:
    path = str(run["path"])
    report = cached_run_bursts(path, run_folder.run_fingerprint(path))
    st.title(f"Bursts · run {run['run_id']}")
    if report is None:
        st.info("No spike in this run's schedule (a bursts plan, or an open-loop schedule with "
                "a stretch at least twice its median rate).")
        return
    spikes = report.spikes.assign(config=str(run["run_id"]))
    with st.container(key="table-burst-spikes"):
        st.markdown(table_text(spikes, SPIKE_TABLE, "spike"))
    for line in burst.spike_lines(report.spikes):
        st.caption(line)
    number = st.selectbox("Spike", list(report.timelines))
    timeline = report.timelines[number].assign(config=str(run["run_id"]))
    show_timelines(timeline_specs(timeline, spikes[spikes["spike"] == number],
                                  [str(run["run_id"])]), interactive)


def main() -> None:
    results_dir = results_dir_from(sys.argv[1:], os.environ)
    st.sidebar.caption(f"results: {results_dir.resolve()}")
    studies = burst_studies(str(results_dir))
    runs = open_loop_runs(str(results_dir))
    if studies.empty and runs.empty:
        st.title("Bursts")
        st.info(f"No open-loop runs or burst studies in {Path(results_dir).resolve()}: run a "
                "workload with a bursts plan (`swarmload run --workload W --plan spike.yaml`) or "
                "a study with `load: {arrival: bursts, burst: {...}}`.")
        return
    views = {k: v for k, v in VIEWS.items() if not (k == "study" and studies.empty)
             and not (k == "run" and runs.empty)}
    if st.session_state.get("burst_view") not in views:
        wanted = st.query_params.get("view")
        st.session_state["burst_view"] = wanted if wanted in views else next(iter(views))
    view = st.sidebar.radio("Show", list(views), key="burst_view", format_func=views.get)
    st.query_params["view"] = view
    interactive = st.sidebar.toggle("Interactive charts", key="burst_interactive")
    if view == "study":
        chosen = _pick("Study", list(studies["study_id"]), "burst_study", "study")
        show_study(studies[studies["study_id"] == chosen].iloc[0], interactive)
    else:
        chosen = _pick("Run", list(runs["run_id"]), "burst_run", "run")
        show_run(runs[runs["run_id"] == chosen].iloc[0], interactive)


if __name__ == "__main__":
    main()
