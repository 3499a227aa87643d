"""A soak's series over the whole run, from its windows and telemetry (never the raw requests).

:func:`soak_series` gives one row per window (wall-clock start, ns) and one column per series:
latency percentiles, error rate and throughput from the ``windows`` table written during the
run, and per-window means of the telemetry tables: the server's RSS (its process tree), the RSS
of the Locust master, each worker and the collector, GPU memory and the KV-cache usage. The drift
report (:mod:`dashboards.analysis.drift`) and the Soak page both start from it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from collectors.itl_gaps import MERGED_GAP_WARN_SHARE, TTFT_BOUND_WARN_S
from collectors.run_folder import load_manifest, load_table
from collectors.schemas import (
    GPU_SCHEMA,
    GPU_TABLE,
    HOST_KIND_PROCESS,
    HOST_SCHEMA,
    HOST_TABLE,
    SERVER_METRICS_SCHEMA,
    SERVER_METRICS_TABLE,
    WINDOW_SCHEMA,
    WINDOWS_TABLE,
)
from collectors.server_figures import E2E, ITL, KV_USAGE, TTFT, select
from collectors.windows import window_start_ns
from dashboards.analysis.drift import attribute_client_drift, drift_report
from dashboards.analysis.runs import LAG_WARN_S

LATENCY_SERIES = [f"{tag}_{pct}_s" for tag in ("ttft", "tpot", "e2e")
                  for pct in ("p50", "p95", "p99")]
# The server's own figure of each client-side latency, judged against it in the drift report
# (a server mean against a client percentile: what matters is whether both trend)
SERVER_REFERENCES = {
    **{f"ttft_{p}_s": "server_ttft_mean_s" for p in ("p50", "p95", "p99")},
    **{f"tpot_{p}_s": "server_itl_mean_s" for p in ("p50", "p95", "p99")},
    **{f"e2e_{p}_s": "server_e2e_mean_s" for p in ("p50", "p95", "p99")},
}
MB = 1024.0 * 1024.0
# A window where the generator fell behind its schedule or read events together (METRICS.md
# self-checks, the run summary's limits) measured the generator as much as the server: its
# client-side latencies are left out of the drift report. A late read alone bends nothing
# (docs/results/generator-check/).
GENERATOR_CHECKS = {"schedule_lag_p99_s": LAG_WARN_S, "ttft_bound_p99_s": TTFT_BOUND_WARN_S,
                    "merged_gap_share": MERGED_GAP_WARN_SHARE}


def load_windows(run_dir: str | Path) -> pd.DataFrame:
    """The windows table, late rows folded in: one row per window start.

    Counts add up over a window's rows; percentiles are those of its on-time row.
    """
    raw = load_table(run_dir, WINDOWS_TABLE, WINDOW_SCHEMA)
    if raw.empty:
        return raw
    counts = ["requests", "ok", "errors", "not_sent", "prompt_tokens", "output_tokens"]
    summed = raw.groupby("window_start_ns")[counts].sum()
    on_time = (raw[~raw["late"].astype(bool)].sort_values("window_start_ns")
               .drop_duplicates("window_start_ns", keep="last").set_index("window_start_ns"))
    first = raw.groupby("window_start_ns")[["window_s", "segment"]].first()
    frame = first.join(summed).join(on_time[[*LATENCY_SERIES, *GENERATOR_CHECKS]], how="left")
    attempts = frame["ok"] + frame["errors"]
    frame["error_rate"] = np.where(attempts > 0, frame["errors"] / attempts.where(attempts > 0),
                                   np.nan)
    frame["req_per_s"] = frame["ok"] / frame["window_s"]
    frame["output_tok_per_s"] = frame["output_tokens"] / frame["window_s"]
    return frame.sort_index()


def _process_role(selector: str, name: str | None) -> str | None:
    if selector == "self":
        return "collector"
    if selector == "pid" or selector.startswith("child_of:"):
        return "server"
    if selector.startswith("name:"):
        if "--worker" in selector:
            return "worker"
        if "--master" in selector:
            return "master"
        # any other name: the server, watched by `swarmload collect --process-name REGEX` on
        # its own host (its rows reach the run folder with that collector's files)
        return "server"
    return None


def process_rss(run_dir: str | Path, window_s: float) -> pd.DataFrame:
    """Per-window mean RSS in MB: ``server_rss_mb`` (the server's process tree, summed),
    ``master_rss_mb``, ``worker<i>_rss_mb`` (workers in the order they appear in each segment)
    and ``collector_rss_mb``."""
    host = load_table(run_dir, HOST_TABLE, HOST_SCHEMA,
                      ["wall_ns", "kind", "selector", "pid", "rss_bytes"])
    host = host[(host["kind"] == HOST_KIND_PROCESS) & host["rss_bytes"].notna()]
    if host.empty:
        return pd.DataFrame()
    host = host.assign(role=[_process_role(s or "", None) for s in host["selector"]])
    host = host[host["role"].notna()]
    # Workers are numbered by first appearance; a resumed run's new workers take the numbers
    # again (rank modulo the workers alive at once), so each worker's series spans the run.
    first_seen = host[host["role"] == "worker"].groupby("pid")["wall_ns"].min().sort_values()
    order = {int(pid): rank for rank, pid in enumerate(first_seen.index)}
    workers_per_segment = max(1, _workers_alive_at_once(host))
    names = []
    for role, pid in zip(host["role"], host["pid"], strict=True):
        if role == "worker":
            names.append(f"worker{order[int(pid)] % workers_per_segment}_rss_mb")
        else:
            names.append(f"{role}_rss_mb")
    host = host.assign(series=names)
    # one value per sample and series (the server's tree summed), then the window's mean
    per_sample = host.groupby(["series", "wall_ns"])["rss_bytes"].sum().reset_index()
    per_sample["window_start_ns"] = window_start_ns(per_sample["wall_ns"].to_numpy(), window_s)
    table = per_sample.pivot_table(index="window_start_ns", columns="series",
                                   values="rss_bytes", aggfunc="mean") / MB
    return table


def _workers_alive_at_once(host: pd.DataFrame) -> int:
    workers = host[host["role"] == "worker"]
    if workers.empty:
        return 0
    return int(workers.groupby("wall_ns")["pid"].nunique().max())


def server_histogram_mean(metrics: pd.DataFrame, family: str, window_s: float) -> pd.Series:
    """Per-window mean of a server histogram (a figure of collectors.server_figures, e.g. the
    server's TTFT) from its ``_sum``/``_count`` counters: the change over each window, divided.
    The server's own figure, free of the load generator's delays; a counter that went back (the
    server restarted) leaves that window out."""
    rows = pd.concat([select(metrics, family, "_sum"), select(metrics, family, "_count")])
    rows = rows[rows["value"].notna()]
    if rows.empty:
        return pd.Series(dtype=float)
    per_scrape = rows.pivot_table(index="wall_ns", columns="sample", values="value",
                                  aggfunc="sum").dropna()
    if per_scrape.shape[1] < 2:
        return pd.Series(dtype=float)
    per_scrape["w"] = window_start_ns(per_scrape.index.to_numpy(), window_s)
    last = per_scrape.groupby("w").last()
    delta = last.diff()
    sums, counts = delta[f"{family}_sum"], delta[f"{family}_count"]
    mean = (sums / counts).where((counts > 0) & (sums >= 0))
    return mean


def gpu_and_kv(run_dir: str | Path, window_s: float) -> pd.DataFrame:
    """Per-window mean GPU memory used (GB, all GPUs), GPU utilisation (%, mean over GPUs), board
    power (W, all GPUs), KV-cache usage (0-1) and the server's own
    mean TTFT, E2E and inter-token latency (``server_ttft_mean_s``, ``server_e2e_mean_s``,
    ``server_itl_mean_s``, from its histograms, where scraped)."""
    parts = []
    gpu = load_table(run_dir, GPU_TABLE, GPU_SCHEMA,
                     ["wall_ns", "mem_used_bytes", "util_gpu_pct", "power_w"])
    gpu = gpu[gpu["mem_used_bytes"].notna()]
    if not gpu.empty:
        # one row per sampling instant: memory and power add up over GPUs, utilisation averages
        per_sample = gpu.groupby("wall_ns").agg(
            mem=("mem_used_bytes", "sum"), util=("util_gpu_pct", "mean"),
            power=("power_w", lambda p: p.sum(min_count=1))).reset_index()
        per_sample["w"] = window_start_ns(per_sample["wall_ns"].to_numpy(), window_s)
        per_window = per_sample.groupby("w")
        parts.append((per_window["mem"].mean() / 1e9).rename("gpu_mem_gb"))
        for column, name in (("util", "gpu_util_pct"), ("power", "gpu_power_w")):
            if per_sample[column].notna().any():
                parts.append(per_window[column].mean().rename(name))
    metrics = load_table(run_dir, SERVER_METRICS_TABLE, SERVER_METRICS_SCHEMA,
                         ["wall_ns", "sample", "value"])
    kv = select(metrics, KV_USAGE)
    kv = kv[kv["value"].notna()]
    if not kv.empty:
        per_sample = kv.groupby("wall_ns")["value"].mean().reset_index()
        per_sample["w"] = window_start_ns(per_sample["wall_ns"].to_numpy(), window_s)
        parts.append(per_sample.groupby("w")["value"].mean().rename("kv_cache_usage"))
    for family, name in ((TTFT, "server_ttft_mean_s"), (E2E, "server_e2e_mean_s"),
                         (ITL, "server_itl_mean_s")):
        mean = server_histogram_mean(metrics, family, window_s)
        if mean.notna().any() and all(p.name != name for p in parts):
            parts.append(mean.rename(name))
    if not parts:
        return pd.DataFrame()
    return pd.concat(parts, axis=1)


def soak_series(run_dir: str | Path, window_s: float | None = None) -> pd.DataFrame:
    """Every series of a soak, one row per window (index: window start, wall-clock ns)."""
    windows = load_windows(run_dir)
    if window_s is None:
        window_s = float(windows["window_s"].iloc[0]) if not windows.empty else 60.0
    series = [windows[[*LATENCY_SERIES, "error_rate", "req_per_s", "output_tok_per_s",
                       *GENERATOR_CHECKS]]
              if not windows.empty else pd.DataFrame()]
    series += [process_rss(run_dir, window_s), gpu_and_kv(run_dir, window_s)]
    series = [s for s in series if not s.empty]
    if not series:
        return pd.DataFrame()
    frame = pd.concat(series, axis=1).sort_index()
    frame.index.name = "window_start_ns"
    return frame


def segments(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's segments (``swarmload soak --resume``), with each gap before them."""
    return list((manifest.get("soak") or {}).get("segments") or [])


def generator_limited(series: pd.DataFrame) -> pd.Series:
    """True for windows where the generator did not keep up (see GENERATOR_CHECKS)."""
    limited = pd.Series(False, index=series.index)
    for column, limit in GENERATOR_CHECKS.items():
        if column in series:
            limited |= series[column].fillna(0.0) > limit
    return limited


def soak_drift(run_dir: str | Path, *, warmup_s: float, alpha: float, share: float
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(series, drift report) of a soak run folder.

    Client-side latencies of windows where the generator fell behind are left out (column
    ``left_out`` of the report says how many); the generator checks themselves are not series.
    A drifting client-side latency is then judged against the server's own figure
    (:data:`SERVER_REFERENCES`, :func:`dashboards.analysis.drift.attribute_client_drift`): a
    drift of the generator or the network is said so, not reported as the server's.
    """
    series = soak_series(run_dir)
    if series.empty:
        return series, drift_report(series)
    limited = generator_limited(series)
    measured = series.drop(columns=[c for c in GENERATOR_CHECKS if c in series])
    latency = [c for c in LATENCY_SERIES if c in measured]
    measured.loc[limited.to_numpy(), latency] = np.nan
    # A series with a value in fewer than half the windows (a worker seen briefly) says
    # nothing over the run; it stays in the series but not in the report.
    enough = [c for c in measured.columns
              if measured[c].notna().sum() >= max(2, len(measured) // 2)]
    report = drift_report(measured[enough], warmup_s=warmup_s, alpha=alpha, share=share)
    report = attribute_client_drift(report, measured, SERVER_REFERENCES, warmup_s=warmup_s,
                                    alpha=alpha, share=share)
    report["left_out"] = [int(limited.sum()) if name in latency else 0
                          for name in report["series"]]
    return series, report


def soak_totals(run_dir: str | Path) -> dict[str, Any]:
    """Counts over the whole run from its windows (no raw request is read)."""
    windows = load_windows(run_dir)
    if windows.empty:
        return {"windows": 0, "requests": 0}
    span_s = float(windows.index.max() - windows.index.min()) / 1e9 + float(
        windows["window_s"].iloc[0])
    attempts = int(windows["ok"].sum() + windows["errors"].sum())
    return {
        "windows": int(len(windows)),
        "requests": int(windows["requests"].sum()),
        "ok": int(windows["ok"].sum()),
        "errors": int(windows["errors"].sum()),
        "not_sent": int(windows["not_sent"].sum()),
        "error_rate": int(windows["errors"].sum()) / attempts if attempts else math.nan,
        "span_s": span_s,
        "mean_req_per_s": float(windows["ok"].sum()) / span_s if span_s else math.nan,
        "segments": sorted(int(s) for s in windows["segment"].unique()),
        "manifest_status": load_manifest(run_dir).get("status"),
    }


def rss_flatness(series: pd.DataFrame, warmup_s: float) -> pd.DataFrame:
    """Per RSS series, over the windows after warm-up: first, min, max and last per-window mean
    (MB) and the spread (max - min) as a share of the first: "flat within 10%" is spread <= 0.1."""
    columns = [c for c in series.columns if c.endswith("_rss_mb")]
    if series.empty or not columns:
        return pd.DataFrame(columns=["first_mb", "min_mb", "max_mb", "last_mb", "spread_share"])
    start = int(series.index.min()) + int(warmup_s * 1e9)
    after = series[np.asarray(series.index, dtype=np.int64) >= start]
    rows = {}
    for column in columns:
        values = after[column].dropna()
        if values.empty:
            continue
        first = float(values.iloc[0])
        rows[column] = {"first_mb": first, "min_mb": float(values.min()),
                        "max_mb": float(values.max()), "last_mb": float(values.iloc[-1]),
                        "spread_share": float(values.max() - values.min()) / first
                        if first else math.nan}
    return pd.DataFrame.from_dict(rows, orient="index")
