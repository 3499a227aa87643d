"""GPU figures per load step of a study, and drift over a plain run: the GPU headline's tables.

Pure functions over a study folder (``swarmload study run``) or a run folder:

- :func:`gpu_step_table`: one row per configuration x step: the step's load, throughput, latency
  and SLO verdict (from ``rollup/steps.parquet``) beside the GPU samples taken inside the step's
  measured window (``window_start_ns``..``window_end_ns``): utilisation mean and P95 (NVML's
  "a kernel ran" share of each sample period, %), power mean and max (W), device memory used
  (GB; vLLM reserves its KV cache up front, so this is flat: the KV-cache usage column says how
  much of it the step filled), SM clock mean (MHz), and energy per output token (mean power /
  output tok/s, J).
- :func:`run_drift`: the drift report (:func:`dashboards.analysis.drift.drift_report`) of a plain
  ``swarmload run`` (no ``windows`` table, unlike ``swarmload soak``): series per fixed window
  built from its request records and telemetry (:func:`dashboards.analysis.telemetry.per_window`
  plus TPOT percentiles and throughput).
- :func:`utilisation_chart`: GPU utilisation (mean, with the P95 above it) against offered load,
  one line per configuration (Altair; ``save(path)`` writes PNG through vl-convert).

Command line: ``python -m infra.tools.device.gpu_steps STUDY_DIR [--soak RUN_DIR] [--chart PNG]``
prints both tables as Markdown.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from collectors.run_folder import (
    ROLLUP_DIR,
    STEPS_FILE,
    load_gpu,
    load_manifest,
    load_requests,
    load_server_metrics,
    load_table,
)
from collectors.schemas import GPU_SCHEMA, GPU_TABLE
from dashboards.analysis.drift import drift_report
from dashboards.analysis.runs import ALL_ROW
from dashboards.analysis.telemetry import per_window

GPU_COLUMNS = ["wall_ns", "gpu_index", "util_gpu_pct", "power_w", "mem_used_bytes",
               "sm_clock_mhz", "error"]
STEP_COLUMNS = ["config", "step", "offered_load", "achieved_req_per_s", "output_tok_per_s",
                "ttft_p50_s", "ttft_p95_s", "tpot_p95_s", "error_rate", "sustainable",
                "kv_cache_usage_mean", "num_requests_running_mean", "num_requests_waiting_mean"]


def gpu_step_table(study_dir: str | Path) -> pd.DataFrame:
    """One row per configuration x step (``all`` bucket) with the GPU figures of its window."""
    study_dir = Path(study_dir)
    steps = pd.read_parquet(study_dir / ROLLUP_DIR / STEPS_FILE)
    steps = steps[steps["bucket"] == ALL_ROW].sort_values(["config", "offered_load"])
    rows = []
    for _, step in steps.iterrows():
        row: dict[str, Any] = {c: step[c] for c in STEP_COLUMNS if c in step}
        gpu = load_table(study_dir / str(step["run_dir"]), GPU_TABLE, GPU_SCHEMA, GPU_COLUMNS)
        inside = gpu[(gpu["wall_ns"] >= step["window_start_ns"])
                     & (gpu["wall_ns"] < step["window_end_ns"]) & gpu["error"].isna()]
        # Per sample time, summed (power, memory) or averaged (utilisation, clock) over GPUs.
        per_tick = inside.groupby("wall_ns").agg(
            util=("util_gpu_pct", "mean"), power=("power_w", "sum"),
            mem=("mem_used_bytes", "sum"), clock=("sm_clock_mhz", "mean"))
        row.update(
            gpu_samples=len(per_tick),
            gpu_util_mean_pct=per_tick["util"].mean(),
            gpu_util_p95_pct=per_tick["util"].quantile(0.95) if len(per_tick) else np.nan,
            power_mean_w=per_tick["power"].mean(), power_max_w=per_tick["power"].max(),
            mem_used_gb=per_tick["mem"].mean() / 1e9, sm_clock_mean_mhz=per_tick["clock"].mean(),
        )
        tok_s = row.get("output_tok_per_s", np.nan)
        row["joules_per_output_token"] = (row["power_mean_w"] / tok_s
                                          if tok_s and tok_s == tok_s else np.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def run_series(run_dir: str | Path, window_s: float = 15.0) -> pd.DataFrame:
    """Per-window series of a run (index: window start, wall-clock ns) for the drift report."""
    run_dir = Path(run_dir)
    requests = load_requests(run_dir)
    manifest = load_manifest(run_dir)
    view = per_window(requests, load_gpu(run_dir), load_server_metrics(run_dir),
                      f"{window_s:g}s", manifest)
    ok = requests[requests["outcome"] == "ok"].copy()
    ok["window"] = pd.to_datetime(ok["sent_wall_ns"], unit="ns", utc=True).dt.floor(
        f"{window_s:g}s")
    grouped = ok.groupby("window")
    extra = pd.DataFrame({
        "tpot_p50_s": grouped["tpot_s"].quantile(0.50),
        "tpot_p95_s": grouped["tpot_s"].quantile(0.95),
        "req_per_s": grouped.size() / window_s,
        "output_tok_per_s": grouped["output_tokens"].sum() / window_s,
    })
    series = view.join(extra, how="left")
    keep = [c for c in ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s", "e2e_p95_s",
                        "req_per_s", "output_tok_per_s", "gpu_util_pct", "gpu_power_w",
                        "gpu_mem_used_bytes", "kv_cache_usage", "num_requests_running",
                        "num_requests_waiting") if c in series]
    series = series[keep]
    # The last window is cut short by the end of the run (fewer sends): leave it out.
    series = series.iloc[:-1]
    series.index = pd.Index(series.index.asi8, name="window_start_ns")
    return series


def run_drift(run_dir: str | Path, window_s: float = 15.0, warmup_s: float = 30.0,
              **options: Any) -> pd.DataFrame:
    """:func:`drift_report` of :func:`run_series` (``options``: alpha, share, ci)."""
    return drift_report(run_series(run_dir, window_s), warmup_s=warmup_s, **options)


def utilisation_chart(table: pd.DataFrame, unit: str = "users") -> Any:
    """GPU utilisation against offered load, one colour per configuration (Altair chart)."""
    import altair as alt  # not a dependency: this write-up script's own

    data = table[["config", "offered_load", "gpu_util_mean_pct", "gpu_util_p95_pct",
                  "output_tok_per_s"]].copy()
    base = alt.Chart(data).encode(
        x=alt.X("offered_load:Q", title=f"offered load ({unit})"),
        color=alt.Color("config:N", title="configuration"))
    mean = base.mark_line(point=True).encode(
        y=alt.Y("gpu_util_mean_pct:Q", title="GPU utilisation (%)", scale=alt.Scale(
            domain=[0, 100])),
        tooltip=["config", "offered_load", "gpu_util_mean_pct", "gpu_util_p95_pct",
                 "output_tok_per_s"])
    p95 = base.mark_line(strokeDash=[4, 3], opacity=0.6).encode(y="gpu_util_p95_pct:Q")
    tokens = base.mark_line(point=alt.OverlayMarkDef(shape="square")).encode(
        y=alt.Y("output_tok_per_s:Q", title="output tok/s"))
    left = (mean + p95).properties(width=420, height=260,
                                   title="GPU utilisation (mean; dashed: P95 of 10 Hz samples)")
    right = tokens.properties(width=420, height=260, title="output tokens per second")
    return alt.hconcat(left, right)


def _markdown(frame: pd.DataFrame) -> str:
    head = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "---|" * len(frame.columns)
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(False)]
    return "\n".join([head, rule, *body])


def format_step_table(table: pd.DataFrame) -> str:
    """The capacity-per-step table as Markdown (ms, %, W, GB)."""
    out = pd.DataFrame({
        "config": table["config"], "users": table["offered_load"].map("{:g}".format),
        "req/s": table["achieved_req_per_s"].map("{:.1f}".format),
        "output tok/s": table["output_tok_per_s"].map("{:,.0f}".format),
        "P50 / P95 TTFT ms": [f"{a * 1e3:.0f} / {b * 1e3:.0f}"
                              for a, b in zip(table["ttft_p50_s"], table["ttft_p95_s"],
                                              strict=True)],
        "P95 TPOT ms": (table["tpot_p95_s"] * 1e3).map("{:.1f}".format),
        "SLO": table["sustainable"].map({True: "met", False: "**missed**"}),
        "GPU util mean / P95 %": [f"{a:.0f} / {b:.0f}" for a, b in
                                  zip(table["gpu_util_mean_pct"], table["gpu_util_p95_pct"],
                                      strict=True)],
        "power mean / max W": [f"{a:.0f} / {b:.0f}" for a, b in
                               zip(table["power_mean_w"], table["power_max_w"], strict=True)],
        "memory GB": table["mem_used_gb"].map("{:.1f}".format),
        "KV cache used %": (table["kv_cache_usage_mean"] * 100).map("{:.2f}".format),
        "mJ / token": (table["joules_per_output_token"] * 1e3).map("{:.1f}".format),
    })
    return _markdown(out)


def format_drift_table(report: pd.DataFrame) -> str:
    out = pd.DataFrame({
        "series": report["series"], "verdict": report["verdict"],
        "start level": report["start_level"].map("{:.4g}".format),
        "change over the run": report["change_share"].map(
            lambda v: "-" if v != v else f"{v:+.1%}"),
        "Mann-Kendall p": report["mk_p"].map("{:.3g}".format),
        "windows": report["windows"],
    })
    return _markdown(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m infra.tools.device.gpu_steps",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study_dir")
    p.add_argument("--soak", default=None, help="a run folder: print its drift report too")
    p.add_argument("--window-s", type=float, default=15.0)
    p.add_argument("--warmup-s", type=float, default=30.0)
    p.add_argument("--chart", default=None, help="write the utilisation chart here (.png)")
    args = p.parse_args(argv)
    table = gpu_step_table(args.study_dir)
    print(format_step_table(table))
    if args.chart:
        utilisation_chart(table).save(args.chart, scale_factor=1.5)
        print(f"\nchart: {args.chart}")
    if args.soak:
        print()
        print(format_drift_table(run_drift(args.soak, args.window_s, args.warmup_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
