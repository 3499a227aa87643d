"""Telemetry of a run folder, and its join with the requests on one wall-clock axis.

Plain functions over DataFrames (no Streamlit). Tables (schemas in ``collectors.schemas``):
``gpu``, ``gpu_processes``, ``server_metrics`` (long format), ``host``, beside ``requests``.

Clocks: every row carries a wall-clock time from the host that wrote it. A manifest may give each
host's offset, ``manifest["hosts"][i] = {"host": "gpu-1", "clock_offset_s": 0.012, ...}``, meaning
*that host's clock minus the reference clock* (the Locust master's); :func:`reference_ns` subtracts
it, so all tables land on the reference axis. Hosts without an offset are taken as exact. A
request's host is the first field of its ``worker_id`` (``"<host>:<pid>:<index>"``); a telemetry
row's is its ``host`` column.

Usage::

    requests = run_folder.load_requests(run_dir)
    view = per_window(requests, run_folder.load_gpu(run_dir),
                      run_folder.load_server_metrics(run_dir), freq="10s",
                      manifest=run_folder.load_manifest(run_dir))
    view[["ttft_p95_s", "gpu_util_pct", "gpu_power_w", "num_requests_running", "kv_cache_usage"]]

    per_step(requests, steps, ...)   # steps: rows of (step, start_wall_ns, end_wall_ns)

Columns of the joined view, per window or step (NaN where no data fell in it):
- ``requests``, ``ok``, ``errors``: requests *sent* in the window; ``ttft_p50_s``, ``ttft_p95_s``,
  ``e2e_p95_s``: exact percentiles (numpy, linear) over its ok requests, as METRICS.md defines;
- ``gpu_util_pct``: mean over GPUs of each GPU's mean utilisation; ``gpu_power_w`` and
  ``gpu_mem_used_bytes``: sums over GPUs of each GPU's mean; ``gpu_count``: GPUs seen; error rows
  (a GPU unreadable then) are left out;
- ``num_requests_running`` / ``num_requests_waiting``: mean over scrapes of the value summed over
  label sets (engines), summed over scrape targets; ``num_requests_running_max`` the largest;
  ``kv_cache_usage``: mean of vLLM's ``kv_cache_usage_perc`` (a fraction, 1 = full), averaged over
  targets; ``preemptions``: increase of ``vllm:num_preemptions_total`` between the window's first
  and last scrape, summed over targets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from collectors.percentiles import percentile
from collectors.run_folder import (
    load_gpu,
    load_manifest,
    load_requests,
    load_server_metrics,
    load_table,
)
from collectors.schemas import (
    OUTCOME_OK,
    SERVER_METRICS_SCHEMA,
    SERVER_METRICS_TABLE,
)
from collectors.server_figures import (
    FIGURES,
    KV_USAGE,
    PREEMPTIONS,
    RUNNING,
    SPEC_ACCEPT_RATE,
    SPEC_ACCEPTED,
    SPEC_DRAFTED,
    WAITING,
    MetricMap,
    absent,
    engine_of,
    select,
)

_NS = 1_000_000_000



def clock_offsets(manifest: Mapping[str, Any] | None) -> dict[str, float]:
    """host -> clock offset in seconds (host clock minus reference) from ``manifest["hosts"]``."""
    offsets: dict[str, float] = {}
    for entry in (manifest or {}).get("hosts") or []:
        if entry.get("host") is not None and entry.get("clock_offset_s") is not None:
            offsets[str(entry["host"])] = float(entry["clock_offset_s"])
    return offsets


def request_hosts(requests: pd.DataFrame) -> pd.Series:
    """The host of each request, from ``worker_id`` ("<host>:<pid>:<index>")."""
    return requests["worker_id"].astype(str).str.split(":", n=1).str[0]


def reference_ns(
    times_ns: pd.Series, hosts: pd.Series | None, offsets: Mapping[str, float]
) -> pd.Series:
    """Wall-clock times moved onto the reference clock: ``t - offset(host)``, as int64 ns."""
    times = times_ns.astype("int64")
    if hosts is None or not offsets:
        return times
    shift = (hosts.map(offsets).fillna(0.0) * _NS).round().astype("int64")
    return times - shift


# -------------------------------------------------------------------------------- server metrics


def server_series(
    server: pd.DataFrame,
    sample: str | Sequence[str],
    agg: str = "sum",
    offsets: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """One value per scrape for a sample: columns ``ref_ns``, ``target``, ``value``.

    ``sample``: a server figure (collectors.server_figures: whichever engine's name for it the
    run holds), or sample names (alternatives: the first present wins). Label sets (e.g.
    several engines, or a model label) are combined with ``agg`` ("sum", "mean", "max").
    """
    names = [sample] if isinstance(sample, str) else list(sample)
    ok = server[server["error"].isna()] if "error" in server else server
    chosen = next((n for n in names if (ok["sample"] == n).any()), None)
    if isinstance(sample, str) and sample in FIGURES:
        ok, chosen = select(ok, sample), sample
        chosen = chosen if not ok.empty else None
    if chosen is None:
        return pd.DataFrame(
            {
                "ref_ns": pd.Series(dtype="int64"),
                "target": pd.Series(dtype=str),
                "value": pd.Series(dtype="float64"),
            }
        )
    rows = ok[ok["sample"] == chosen]
    ref = reference_ns(rows["wall_ns"], rows["host"], offsets or {})
    frame = pd.DataFrame(
        {
            "ref_ns": ref.to_numpy(),
            "target": rows["target"].to_numpy(),
            "value": rows["value"].astype("float64").to_numpy(),
        }
    )
    return (
        frame.groupby(["target", "ref_ns"], as_index=False)["value"]
        .agg(agg)
        .sort_values("ref_ns", kind="stable")
        .reset_index(drop=True)
    )


# ------------------------------------------------------------------------------------------- join


def _request_figures(requests: pd.DataFrame, keys: pd.Series) -> pd.DataFrame:
    if requests.empty:
        return pd.DataFrame()
    frame = pd.DataFrame(
        {
            "key": keys.to_numpy(),
            "ok": (requests["outcome"] == OUTCOME_OK).to_numpy(),
            "ttft_s": requests["ttft_s"].to_numpy(dtype=np.float64, na_value=np.nan),
            "e2e_s": requests["e2e_s"].to_numpy(dtype=np.float64, na_value=np.nan),
        }
    )
    frame = frame.dropna(subset=["key"])
    out = {}
    for key, group in frame.groupby("key", sort=True):
        ok = group[group["ok"]]
        out[key] = {
            "requests": len(group),
            "ok": len(ok),
            "errors": len(group) - len(ok),
            "ttft_p50_s": percentile(ok["ttft_s"], 50),
            "ttft_p95_s": percentile(ok["ttft_s"], 95),
            "e2e_p95_s": percentile(ok["e2e_s"], 95),
        }
    return pd.DataFrame.from_dict(out, orient="index")


def _gpu_figures(
    gpu: pd.DataFrame, key_of: Callable[[pd.Series], pd.Series], offsets: Mapping[str, float]
) -> pd.DataFrame:
    ok = gpu[gpu["error"].isna()] if "error" in gpu else gpu
    if ok.empty:
        return pd.DataFrame()
    frame = pd.DataFrame(
        {
            "key": key_of(reference_ns(ok["wall_ns"], ok["host"], offsets)).to_numpy(),
            "gpu": (ok["host"].astype(str) + ":" + ok["gpu_index"].astype(str)).to_numpy(),
            "util": ok["util_gpu_pct"].to_numpy(dtype=np.float64, na_value=np.nan),
            "power": ok["power_w"].to_numpy(dtype=np.float64, na_value=np.nan),
            "mem": ok["mem_used_bytes"].to_numpy(dtype=np.float64, na_value=np.nan),
        }
    ).dropna(subset=["key"])
    per_gpu = frame.groupby(["key", "gpu"]).mean(numeric_only=True)
    grouped = per_gpu.groupby(level="key")
    return pd.DataFrame(
        {
            "gpu_util_pct": grouped["util"].mean(),
            "gpu_power_w": grouped["power"].sum(min_count=1),
            "gpu_mem_used_bytes": grouped["mem"].sum(min_count=1),
            "gpu_count": grouped.size(),
        }
    )


def _server_figures(
    server: pd.DataFrame, key_of: Callable[[pd.Series], pd.Series], offsets: Mapping[str, float]
) -> pd.DataFrame:
    if server.empty:
        return pd.DataFrame()
    columns: dict[str, pd.Series] = {}

    def by_key(series: pd.DataFrame) -> Any:
        series = series.assign(key=key_of(series["ref_ns"]).to_numpy()).dropna(subset=["key"])
        return series.groupby(["key", "target"])["value"]

    for name, sample in (("num_requests_running", RUNNING), ("num_requests_waiting", WAITING)):
        series = server_series(server, sample, "sum", offsets)
        if series.empty:
            continue
        grouped = by_key(series)
        columns[name] = grouped.mean().groupby(level="key").sum()
        if name == "num_requests_running":
            columns["num_requests_running_max"] = grouped.max().groupby(level="key").sum()
    kv = server_series(server, KV_USAGE, "mean", offsets)
    if not kv.empty:
        columns["kv_cache_usage"] = by_key(kv).mean().groupby(level="key").mean()
    preempt = server_series(server, PREEMPTIONS, "sum", offsets)
    if not preempt.empty:
        grouped = by_key(preempt)
        columns["preemptions"] = (grouped.max() - grouped.min()).groupby(level="key").sum()
    accept = _spec_accept_rate(server, by_key, offsets)
    if accept is not None:
        columns["spec_accept_rate"] = accept
    return pd.DataFrame(columns)


def _spec_accept_rate(server: pd.DataFrame, by_key: Callable[[pd.DataFrame], Any],
                      offsets: Mapping[str, float]) -> pd.Series | None:
    """Speculative decoding's accepted share of draft tokens per key: the growth of the accepted
    counter over the drafted one (vLLM, llama.cpp), else the mean of the engine's own rate
    (SGLang); None where the engine shows neither or drafted nothing."""
    accepted = server_series(server, SPEC_ACCEPTED, "sum", offsets)
    drafted = server_series(server, SPEC_DRAFTED, "sum", offsets)
    if not accepted.empty and not drafted.empty:
        grew = [(g.max() - g.min()).groupby(level="key").sum()
                for g in (by_key(accepted), by_key(drafted))]
        rate = (grew[0] / grew[1]).where(grew[1] > 0)
        return rate if rate.notna().any() else None
    gauge = server_series(server, SPEC_ACCEPT_RATE, "mean", offsets)
    return None if gauge.empty else by_key(gauge).mean().groupby(level="key").mean()


def _join(
    requests: pd.DataFrame | None,
    gpu: pd.DataFrame | None,
    server: pd.DataFrame | None,
    key_of: Callable[[pd.Series], pd.Series],
    manifest: Mapping[str, Any] | None,
) -> pd.DataFrame:
    offsets = clock_offsets(manifest)
    parts = []
    if requests is not None and not requests.empty:
        ref = reference_ns(requests["sent_wall_ns"], request_hosts(requests), offsets)
        parts.append(_request_figures(requests, key_of(ref)))
    if gpu is not None and not gpu.empty:
        parts.append(_gpu_figures(gpu, key_of, offsets))
    if server is not None and not server.empty:
        parts.append(_server_figures(server, key_of, offsets))
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame()
    joined = pd.concat(parts, axis=1, sort=False).sort_index()
    for column in ("requests", "ok", "errors"):
        if column in joined:
            joined[column] = joined[column].fillna(0).astype("int64")
    return joined


def per_window(
    requests: pd.DataFrame | None,
    gpu: pd.DataFrame | None = None,
    server: pd.DataFrame | None = None,
    freq: str = "10s",
    manifest: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """Requests and telemetry per fixed window (pandas ``freq``, e.g. "10s", "1min").

    Index: window start (UTC timestamps, reference clock), named ``window``; columns as the
    module docstring lists. Windows where nothing at all happened are absent.
    """

    def key_of(ref_ns: pd.Series) -> pd.Series:
        return pd.Series(
            pd.to_datetime(ref_ns.to_numpy(dtype="int64"), unit="ns", utc=True).floor(freq),
            index=ref_ns.index,
        )

    joined = _join(requests, gpu, server, key_of, manifest)
    joined.index = pd.DatetimeIndex(joined.index, name="window")
    return joined


def per_step(
    requests: pd.DataFrame | None,
    steps: pd.DataFrame | Sequence[Mapping[str, Any]],
    gpu: pd.DataFrame | None = None,
    server: pd.DataFrame | None = None,
    manifest: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """Requests and telemetry per load step: ``steps`` rows ``step``, ``start_wall_ns``,
    ``end_wall_ns`` (reference clock, end exclusive, steps not overlapping).

    Index: the step labels, in ``steps`` order; a step with no data has a row of NaN/0.
    """
    table = pd.DataFrame(list(steps)) if not isinstance(steps, pd.DataFrame) else steps
    table = table.sort_values("start_wall_ns", kind="stable").reset_index(drop=True)
    starts = table["start_wall_ns"].to_numpy(dtype=np.int64)
    ends = table["end_wall_ns"].to_numpy(dtype=np.int64)
    labels = table["step"].to_numpy(dtype=object)

    def key_of(ref_ns: pd.Series) -> pd.Series:
        values = ref_ns.to_numpy(dtype=np.int64)
        pos = np.searchsorted(starts, values, side="right") - 1
        inside = (pos >= 0) & (values < ends[np.clip(pos, 0, None)])
        keys = np.where(inside, labels[np.clip(pos, 0, None)], None)
        return pd.Series(keys, index=ref_ns.index, dtype=object)

    joined = _join(requests, gpu, server, key_of, manifest)
    order = list(table["step"])
    joined = joined.reindex(order)
    for column in ("requests", "ok", "errors", "gpu_count"):
        if column in joined:
            joined[column] = joined[column].fillna(0).astype("int64")
    joined.index.name = "step"
    return joined


# Columns of :func:`windows_since` worth a chart, with their axis labels.
WINDOW_CHART_COLUMNS = {
    "ttft_p95_ms": "P95 TTFT (ms)",
    "num_requests_running": "running requests (server)",
    "num_requests_waiting": "waiting requests (server)",
    "kv_cache_usage": "KV-cache usage",
    "spec_accept_rate": "draft acceptance rate (server)",
    "gpu_util_pct": "GPU utilisation (%)",
}


# the server figure behind each window column (collectors.server_figures)
WINDOW_FIGURES = {"num_requests_running": RUNNING, "num_requests_waiting": WAITING,
                  "kv_cache_usage": KV_USAGE, "preemptions": PREEMPTIONS}


def server_engine(run_dir: str | Path) -> MetricMap | None:
    """The engine whose /metrics the run scraped (by its names; None: no scrape, or an engine
    without a metric map)."""
    samples = load_table(run_dir, SERVER_METRICS_TABLE, SERVER_METRICS_SCHEMA, ["sample"])
    return engine_of(samples["sample"].dropna().unique())


def absent_columns(engine: MetricMap | None) -> dict[str, str]:
    """``{window column: "not exposed by <engine>"}`` for the server figures the run's engine
    does not have: a page says so in place of the chart (never an empty one)."""
    reasons = absent(engine, WINDOW_FIGURES.values())
    return {column: reasons[f] for column, f in WINDOW_FIGURES.items() if f in reasons}


def windows_since(run_dir: str | Path, origin_ns: int, freq: str = "5s") -> pd.DataFrame:
    """:func:`per_window` of a run folder, with ``t_s`` (window start, seconds since
    ``origin_ns``) and ``ttft_p95_ms``, ready for a chart on the run's own time axis."""
    requests = load_requests(run_dir, ["sent_wall_ns", "worker_id", "outcome", "ttft_s",
                                       "e2e_s"])
    try:
        manifest = load_manifest(run_dir)
    except (OSError, ValueError):
        manifest = {}
    windows = per_window(requests, load_gpu(run_dir), load_server_metrics(run_dir), freq,
                         manifest)
    if windows.empty:
        return windows
    out = windows.reset_index()
    out["t_s"] = (out["window"].astype("int64") - origin_ns) / 1e9
    if "ttft_p95_s" in out:
        out["ttft_p95_ms"] = out["ttft_p95_s"] * 1e3
    return out
