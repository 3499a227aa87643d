"""The Soak page: a long run's series over the whole run, with a drift verdict per series.

Served through :mod:`dashboards.app` at ``/soak`` (``?run=<run_id>&hour=<n>``). Reads only what a
soak writes to stay cheap over days: the ``windows`` table (per-minute latency, errors,
throughput) and the telemetry tables (RSS of the server, master, workers and collector; GPU
memory; KV-cache usage), never the raw requests. The drift report (worst first) comes from the
manifest once the soak has ended, computed from the same series while it runs. Gaps between
segments (a crash, then ``--resume``) are shaded. "Zoom" shows any one hour of the run.

Charts are drawn on the server and shown as Markdown images (the Study page's
:func:`dashboards.ui.widgets.show_chart`: nothing for the browser to load or lay out but one
image a chart), each line thinned to its envelope per pixel column
(:mod:`dashboards.analysis.envelope`: 72 hours' 4,320 windows a series draw the same picture from
at most 4 points a pixel), as palette PNGs (10-13 kB a chart on a 72-hour soak, against 35-140 kB
of SVG). "Interactive charts" draws every window with Vega in the browser instead.

Charts are keyed ``chart-soak-latency``, ``chart-soak-rss``, ``chart-soak-throughput``,
``chart-soak-errors``, ``chart-soak-gpu``; tables ``table-soak-totals``, ``table-soak-verdicts``.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from collectors import run_folder
from dashboards import soak_charts
from dashboards.analysis import early_warning, soak
from dashboards.analysis.drift import (
    VERDICT_GENERATOR_DOWN,
    VERDICT_GENERATOR_UP,
    VERDICT_NONE,
    VERDICT_SHORT,
)
from dashboards.app import results_dir_from
from dashboards.ui.widgets import markdown_table, show_chart

CACHE_TTL_S = 10.0
DEFAULT_WARMUP_S = 300.0
WHOLE_RUN = "whole run"
LATENCY = ["ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "tpot_p95_s", "e2e_p95_s",
           "server_ttft_mean_s"]


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def soak_runs(results_dir: str) -> pd.DataFrame:
    runs = run_folder.list_runs(results_dir)
    if runs.empty:
        return runs
    keep = [bool(run_folder.load_manifest(p).get("soak")) for p in runs["path"]]
    return runs[keep].reset_index(drop=True)


# keyed on the run's fingerprint (files and manifest): recomputed when the run writes, never
# for a finished run (no time-to-live: every view of it after the first reads no file)
@st.cache_data(show_spinner=False, max_entries=4)
def cached_soak(run_dir: str, fingerprint: tuple[int, int]) -> tuple[pd.DataFrame, pd.DataFrame,
                                                                      dict[str, Any]]:
    manifest = run_folder.load_manifest(run_dir)
    settings = manifest.get("soak") or {}
    stored = (manifest.get("drift") or {}).get("series")
    series = soak.soak_series(run_dir, settings.get("window_s"))
    if stored and manifest.get("status") != "running":
        report = pd.DataFrame(stored)
        for column in report.columns.drop(["series", "verdict", "mk_trend", "attribution",
                                           "server_reference"], errors="ignore"):
            report[column] = pd.to_numeric(report[column], errors="coerce")  # JSON null -> nan
    else:
        _, report = soak.soak_drift(run_dir, warmup_s=float(settings.get("warmup_s") or
                                                            DEFAULT_WARMUP_S),
                                    alpha=float(settings.get("drift_p") or 0.01),
                                    share=float(settings.get("drift_share") or 0.10))
    return series, report, manifest


def _fmt(value: float) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def verdict_table(report: pd.DataFrame) -> str:
    rows = []
    for row in report.itertuples():
        change = ("-" if row.verdict == VERDICT_SHORT or not math.isfinite(row.change_share)
                  else f"{row.change_share * 100:+.1f}%")
        rows.append({
            "series": row.series, "verdict": row.verdict, "start": _fmt(row.start_level),
            "slope / h [95% CI]": (f"{_fmt(row.slope_per_h)} [{_fmt(row.slope_low_per_h)}, "
                                   f"{_fmt(row.slope_high_per_h)}]"),
            "change over run": change,
            "Mann-Kendall p": "-" if not math.isfinite(row.mk_p) else f"{row.mk_p:.2g}",
            "drift is the": getattr(row, "attribution", "") or "",
        })
    return markdown_table(pd.DataFrame(rows).set_index("series"))


def _gaps(manifest: dict[str, Any], origin_ns: int) -> list[tuple[float, float]]:
    spans = []
    segments = soak.segments(manifest)
    for before, after in zip(segments, segments[1:], strict=False):
        end_ns = before.get("ended_wall_ns")
        start_ns = after.get("started_wall_ns")
        if end_ns and start_ns:
            spans.append(((end_ns - origin_ns) / 3.6e12, (start_ns - origin_ns) / 3.6e12))
    return spans


def show_run(run: pd.Series, interactive: bool) -> None:
    path = str(run["path"])
    series, report, manifest = cached_soak(path, run_folder.run_fingerprint(path))
    st.title(f"Soak · run {run['run_id']}")
    if series.empty:
        st.info("No windows yet: the first is written a minute or so after the soak starts.")
        return
    origin = int(series.index.min())
    hours_total = (int(series.index.max()) - origin) / 3.6e12
    segments = soak.segments(manifest)
    gaps = _gaps(manifest, origin)
    gap_text = ", ".join(f"{b - a:.2f} h" if b - a > 0.05 else f"{(b - a) * 3600:.0f} s"
                         for a, b in gaps)
    st.caption(f"status {manifest.get('status')} · {hours_total:.2f} h of windows · "
               f"{len(segments)} segment(s)" + (f" · gaps (shaded): {gap_text}" if gaps else ""))
    generator = report[report["verdict"].isin([VERDICT_GENERATOR_UP, VERDICT_GENERATOR_DOWN])]
    flagged = report[~report["verdict"].isin([VERDICT_NONE, VERDICT_SHORT,
                                              VERDICT_GENERATOR_UP, VERDICT_GENERATOR_DOWN])]
    # plain Markdown, not st.error/st.success: each element kind loads its own code in the
    # browser on the first view
    if len(flagged):
        st.markdown("**Drift:** " + ", ".join(f"`{name}`" for name in flagged["series"]))
    else:
        st.markdown("**No series drifts** (Mann-Kendall p < 0.01 and a change over 10% of the "
                    "start).")
    if len(generator):
        st.markdown("**Drift in the generator or network, not the server** (the server's own "
                    "figure is flat; the gap trends with the client): "
                    + ", ".join(f"`{name}`" for name in generator["series"]))
    with st.container(key="table-soak-verdicts"):
        st.markdown(verdict_table(report))
    warnings = early_warning.load_early_warning(path)
    if not warnings.empty:
        flagged_early = warnings[warnings["flagged"].astype(bool)]
        st.markdown("**Early warning** (each significant trend carried on to the planned end "
                    "and to its limit): " + ("; ".join(flagged_early["text"]) if len(
                        flagged_early) else "none reaches its limit or moves its series by the "
                    "drift share by the planned end."))
        with st.container(key="table-soak-early-warning"):
            st.markdown(markdown_table(early_warning.warning_table(warnings).set_index(
                "series")))
    # over the series: a latency left out in over half the windows is not in the report at all
    left_out = int(soak.generator_limited(series).sum())
    if left_out:
        st.caption(f"Client-side latencies leave out {left_out} window(s) where the generator "
                   "fell behind (schedule lag or read delay P99 over 10 ms).")
    hours = [WHOLE_RUN] + [str(h) for h in range(int(math.floor(hours_total)) + 1)]
    if st.session_state.get("soak_hour") not in hours:
        wanted = st.query_params.get("hour")
        st.session_state["soak_hour"] = wanted if wanted in hours else WHOLE_RUN
    # a selectbox like the sidebar's: no other widget's code to load on the first view
    hour = st.selectbox("Zoom (hour of the run)", hours, key="soak_hour")
    st.query_params["hour"] = hour
    view = series
    if hour != WHOLE_RUN:
        h = int(hour)
        at = (series.index.to_numpy() - origin) / 3.6e12
        view = series[(at >= h) & (at < h + 1)]
    verdicts = dict(zip(report["series"], report["verdict"], strict=True))
    trends = {r.series: (r.start_h, r.start_level, r.slope_per_h) for r in report.itertuples()
              if r.verdict not in (VERDICT_NONE, VERDICT_SHORT, VERDICT_GENERATOR_UP,
                                   VERDICT_GENERATOR_DOWN)
              and math.isfinite(getattr(r, "start_h", math.nan))}
    # an image shows no more of a line than its envelope per pixel column: drawn from that alone
    thin = None if interactive else 4 * soak_charts.WIDTH
    common = {"origin_ns": origin, "verdicts": verdicts, "trends": trends, "gaps": gaps,
              "max_points": thin}
    rss = [c for c in series.columns if c.endswith("_rss_mb")]
    specs = [
        ("chart-soak-latency", soak_charts.timeline(
            view, LATENCY, title="Latency per window", y_title="ms", scale=1e3, **common)),
        ("chart-soak-rss", soak_charts.timeline(
            view, rss, title="Resident memory (RSS)", y_title="MB", **common)),
        ("chart-soak-throughput", soak_charts.timeline(
            view, ["req_per_s"], title="Throughput", y_title="ok requests/s", **common)),
        ("chart-soak-errors", soak_charts.timeline(
            view, ["error_rate"], title="Error rate", y_title="%", scale=100, **common)),
    ]
    gpu = [c for c in ("gpu_mem_gb", "kv_cache_usage") if c in series.columns]
    if gpu:
        specs.append(("chart-soak-gpu", soak_charts.timeline(
            view, gpu, title="GPU memory (GB) and KV cache (0-1)", y_title="", **common)))
    if "gpu_util_pct" in series.columns:
        specs.append(("chart-soak-gpu-util", soak_charts.timeline(
            view, ["gpu_util_pct"], title="GPU utilisation", y_title="%", **common)))
    columns = st.columns(2)
    for i, (key, spec) in enumerate(specs):
        with columns[i % 2], st.container(key=key):
            show_chart(spec, interactive, raster=True)
    st.caption("Dashed: the Theil-Sen line of a drifting series, from the end of warm-up. "
               "Latency is per window over its ok requests (exact percentiles).")


def main() -> None:
    results_dir = results_dir_from(sys.argv[1:], os.environ)
    st.sidebar.caption(f"results: {results_dir.resolve()}")
    runs = soak_runs(str(results_dir))
    if runs.empty:
        st.title("Soak")
        st.info(f"No soak runs in {Path(results_dir).resolve()}: start one with "
                "`swarmload soak --duration 24h ...`.")
        return
    names = list(runs["run_id"])
    if st.session_state.get("soak_run") not in names:
        wanted = st.query_params.get("run")
        st.session_state["soak_run"] = wanted if wanted in names else names[0]
    chosen = st.sidebar.selectbox("Soak run", names, key="soak_run")
    st.query_params["run"] = chosen
    interactive = st.sidebar.toggle("Interactive charts", key="soak_interactive")
    show_run(runs[runs["run_id"] == chosen].iloc[0], interactive)


if __name__ == "__main__":
    main()
