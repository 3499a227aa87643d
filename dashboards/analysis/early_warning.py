"""Early warning in a soak: each significant trend projected to the soak's planned end and to a
limit where one exists (METRICS.md, "Over time").

The drift verdict (:mod:`dashboards.analysis.drift`) needs a change of more than ``share`` (10%)
*within the run so far*: a memory creep of +8%/h has moved 8% after an hour and is not flagged,
although it will have grown sixfold by the end of a 72-hour soak. Here a series whose trend is
significant (Mann-Kendall p < ``alpha``) is **flagged early** when its Theil-Sen line, carried on
to the planned end, changes it by more than ``share`` of its start, or reaches its limit before
the planned end. The limits:

- ``server_rss_mb``: a stated memory limit (``--memory-limit``), else the host's memory; the
  other ``*_rss_mb`` (master, workers, collector): the host's memory;
- ``gpu_mem_gb``: the GPUs' memory;
- ``kv_cache_usage``: 1 (100%);
- a latency (``ttft_p95_s``, ...): its SLO, where one is given.

The time to a limit is (limit - the line's value now) / slope, for a slope towards the limit:
"server RSS +0.67 GB/h: reaches 24 GB in 9.5 h". Pure functions over a drift report and its
series; :func:`soak_early_warning` reads a soak folder for the soak's summary, its live view,
the Soak page and the Prometheus series (``early_warning.json``, read by the master).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from collectors.live_metrics import EARLY_WARNING_FILE as EARLY_WARNING_FILE  # its reader
from collectors.run_folder import load_manifest, load_table
from collectors.schemas import GPU_SCHEMA, GPU_TABLE, HOST_SCHEMA, HOST_TABLE
from dashboards.analysis.drift import DEFAULT_ALPHA, DEFAULT_SHARE, VERDICT_SHORT
from dashboards.analysis.soak import segments, soak_drift

KV_FULL = 1.0
MB_PER_GB = 1024.0
# what each series is called in a warning, and its unit ("MB" series are shown in GB from 1 GB)
LABELS = {"server_rss_mb": ("server RSS", "MB"), "master_rss_mb": ("master RSS", "MB"),
          "collector_rss_mb": ("collector RSS", "MB"), "gpu_mem_gb": ("GPU memory", "GB"),
          "kv_cache_usage": ("KV-cache usage", "share"), "error_rate": ("error rate", "share"),
          "req_per_s": ("ok requests/s", "/s"), "output_tok_per_s": ("output tokens/s", "/s")}


@dataclass(frozen=True)
class Limit:
    value: float
    what: str  # "host memory", "stated limit", "KV cache full", "SLO"


@dataclass(frozen=True)
class Warning:
    series: str
    flagged: bool
    slope_per_h: float
    slope_share_per_h: float
    level_now: float
    change_share: float  # the change within the run so far / |start| (the drift verdict's)
    hours_left: float  # from the last window to the planned end
    projected_at_end: float
    projected_change_share: float  # (projected at end - start) / |start|
    limit: float
    limit_what: str
    hours_to_limit: float  # nan: no limit, or the trend moves away from it
    text: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _label(series: str) -> tuple[str, str]:
    if series in LABELS:
        return LABELS[series]
    if series.endswith("_rss_mb"):
        return f"{series[:-7]} RSS", "MB"
    if series.endswith("_s"):
        words = series[:-2].split("_")
        named = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
        text = " ".join(named.get(w, w.upper() if w[:1] == "p" and w[1:].isdigit() else w)
                        for w in words)
        return text, "s"
    return series, ""


def _amount(value: float, unit: str, *, big: bool) -> str:
    if unit == "MB" and big:
        return f"{value / MB_PER_GB:.3g} GB"
    if unit == "share":
        return f"{value * 100:.3g}%"
    if unit == "s":
        return f"{value * 1000:.3g} ms"
    return f"{value:.3g} {unit}".rstrip()


def _rate(slope: float, unit: str, *, big: bool) -> str:
    sign = "+" if slope >= 0 else "-"
    return sign + _amount(abs(slope), unit, big=big) + "/h"


def _hours(h: float) -> str:
    if h < 1:
        return f"{h * 60:.0f} min"
    return f"{h:.1f} h" if h < 48 else f"{h / 24:.1f} days"


def project(row: dict[str, Any], *, hours_left: float, limit: Limit | None,
            alpha: float = DEFAULT_ALPHA, share: float = DEFAULT_SHARE) -> Warning | None:
    """The warning of one drift-report row (None when its trend is not significant)."""
    p = row.get("mk_p")
    if row.get("verdict") == VERDICT_SHORT or p is None or not p < alpha:
        return None
    slope = float(row["slope_per_h"])
    if slope == 0 or not math.isfinite(slope):
        return None
    start = float(row["start_level"])
    now = start + slope * float(row["hours"])  # the line at the last window
    at_end = now + slope * max(hours_left, 0.0)
    base = abs(start)
    projected_share = (at_end - start) / base if base > 0 else math.nan
    to_limit = math.nan  # every limit here is a ceiling: only a rising trend reaches it
    if limit is not None and math.isfinite(limit.value) and slope > 0:
        to_limit = max(0.0, (limit.value - now) / slope)
    reaches = math.isfinite(to_limit) and to_limit <= hours_left
    flagged = reaches or (abs(projected_share) > share if base > 0 else True)
    name = str(row["series"])
    label, unit = _label(name)
    big = unit == "MB" and max(abs(now), abs(limit.value) if limit else 0.0) >= MB_PER_GB
    text = f"{label} {_rate(slope, unit, big=big)}"
    if base > 0:
        text += f" ({float(row['slope_share_per_h']) * 100:+.1f}%/h)"
    if math.isfinite(to_limit) and limit is not None:
        text += (f": reaches {_amount(limit.value, unit, big=big)} ({limit.what}) in "
                 f"{_hours(to_limit)}" + ("" if reaches else ", after the planned end"))
    else:
        text += (f": {_amount(at_end, unit, big=big)} by the planned end "
                 f"(in {_hours(max(hours_left, 0.0))})")
    return Warning(series=name, flagged=flagged, slope_per_h=slope,
                   slope_share_per_h=float(row.get("slope_share_per_h", math.nan)),
                   level_now=now, change_share=float(row.get("change_share", math.nan)),
                   hours_left=hours_left, projected_at_end=at_end,
                   projected_change_share=projected_share,
                   limit=limit.value if limit else math.nan,
                   limit_what=limit.what if limit else "", hours_to_limit=to_limit, text=text)


def early_warnings(report: pd.DataFrame, *, last_window_ns: int, planned_end_ns: int,
                   limits: dict[str, Limit], alpha: float = DEFAULT_ALPHA,
                   share: float = DEFAULT_SHARE) -> pd.DataFrame:
    """One row per significant trend of ``report`` (flagged ones first, soonest limit first)."""
    hours_left = max(0.0, (planned_end_ns - last_window_ns) / 3.6e12)
    rows = []
    for row in report.to_dict("records"):
        warning = project(row, hours_left=hours_left, limit=limits.get(str(row["series"])),
                          alpha=alpha, share=share)
        if warning is not None:
            rows.append(warning.as_dict())
    frame = pd.DataFrame(rows, columns=list(Warning.__dataclass_fields__))
    if frame.empty:
        return frame
    frame = frame.assign(_soon=frame["hours_to_limit"].fillna(np.inf),
                         _flag=~frame["flagged"].astype(bool))
    return frame.sort_values(["_flag", "_soon"], kind="stable").drop(
        columns=["_soon", "_flag"]).reset_index(drop=True)


def soak_limits(series: pd.DataFrame, *, memory_limit_mb: float | None,
                host_memory_mb: float | None, gpu_memory_gb: float | None,
                slos: dict[str, float]) -> dict[str, Limit]:
    """The limit of each series a soak has (see the module docstring)."""
    limits: dict[str, Limit] = {}
    host = Limit(host_memory_mb, "host memory") if host_memory_mb else None
    for name in series.columns:  # every process on the host has at most the host's memory
        if name.endswith("_rss_mb") and host is not None:
            limits[name] = host
    if memory_limit_mb and "server_rss_mb" in series:  # the server's own limit, when stated
        limits["server_rss_mb"] = Limit(memory_limit_mb, "stated limit")
    if gpu_memory_gb and "gpu_mem_gb" in series:
        limits["gpu_mem_gb"] = Limit(gpu_memory_gb, "GPU memory")
    if "kv_cache_usage" in series:
        limits["kv_cache_usage"] = Limit(KV_FULL, "KV cache full")
    for name, value in slos.items():
        limits[name] = Limit(float(value), "SLO")
    return limits


def soak_early_warning(run_dir: str | Path, *, warmup_s: float, alpha: float, share: float,
                       now_ns: int | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """(warnings, facts) of a soak folder, running or done: its drift report projected to the
    planned end (the first segment's start plus ``--duration``) and to each series' limit
    (``soak.memory_limit_mb``, ``soak.slos`` in the manifest; the host's and GPUs' memory
    from the telemetry)."""
    manifest = load_manifest(run_dir)
    settings = manifest.get("soak") or {}
    series, report = soak_drift(run_dir, warmup_s=warmup_s, alpha=alpha, share=share)
    facts: dict[str, Any] = {"planned_end_ns": None, "last_window_ns": None}
    if series.empty or report.empty:
        return early_warnings(report.iloc[0:0], last_window_ns=0, planned_end_ns=0,
                              limits={}), facts
    parts = segments(manifest)
    started = (parts[0].get("started_wall_ns") if parts else None) or int(series.index.min())
    planned_end_ns = int(started + float((manifest.get("load") or {}).get("duration_s") or 0)
                         * 1e9)
    last = int(series.index.max()) if now_ns is None else now_ns
    host = load_table(run_dir, HOST_TABLE, HOST_SCHEMA, ["sys_mem_total_bytes"])
    host_mb = (float(host["sys_mem_total_bytes"].dropna().max()) / 1024**2
               if not host.empty and host["sys_mem_total_bytes"].notna().any() else None)
    gpu = load_table(run_dir, GPU_TABLE, GPU_SCHEMA, ["wall_ns", "mem_total_bytes"])
    gpu_gb = (float(gpu.groupby("wall_ns")["mem_total_bytes"].sum().max()) / 1e9
              if not gpu.empty and gpu["mem_total_bytes"].notna().any() else None)
    limits = soak_limits(series, memory_limit_mb=settings.get("memory_limit_mb"),
                         host_memory_mb=host_mb, gpu_memory_gb=gpu_gb,
                         slos=dict(settings.get("slos") or {}))
    facts.update(planned_end_ns=planned_end_ns, last_window_ns=last,
                 limits={k: asdict(v) for k, v in limits.items()})
    return early_warnings(report, last_window_ns=last, planned_end_ns=planned_end_ns,
                          limits=limits, alpha=alpha, share=share), facts


def format_warnings(warnings: pd.DataFrame) -> str:
    """The flagged warnings as lines for the soak's summary and live view."""
    flagged = warnings[warnings["flagged"].astype(bool)] if not warnings.empty else warnings
    if flagged.empty:
        return "early warning: none (no significant trend reaches its limit or moves its " \
               "series by the share by the planned end)"
    return "\n".join(f"early warning: {text}" for text in flagged["text"])


def load_early_warning(run_dir: str | Path) -> pd.DataFrame:
    """A soak's last early warning: ``early_warning.json`` (written while it runs, and again by
    its report at the end), else the manifest's copy; empty when there is none."""

    path = Path(run_dir) / EARLY_WARNING_FILE
    rows: list[dict[str, Any]] = []
    try:
        rows = json.loads(path.read_text()).get("warnings") or []
    except (OSError, ValueError):
        rows = list(load_manifest(run_dir).get("early_warning") or [])
    frame = pd.DataFrame(rows, columns=list(Warning.__dataclass_fields__))
    for column in frame.columns.drop(["series", "flagged", "limit_what", "text"]):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")  # JSON null -> nan
    return frame


def warning_table(warnings: pd.DataFrame) -> pd.DataFrame:
    """The warnings as the Soak page shows them, flagged first."""
    rows = []
    for row in warnings.itertuples():
        rows.append({
            "series": row.series, "early warning": "yes" if row.flagged else "no",
            "now": _plain(row.level_now), "slope / h": _plain(row.slope_per_h),
            "at planned end": _plain(row.projected_at_end),
            "limit": f"{_plain(row.limit)} ({row.limit_what})" if row.limit_what else "-",
            "time to limit": _hours(row.hours_to_limit) if math.isfinite(row.hours_to_limit)
            else "-",
        })
    return pd.DataFrame(rows, columns=["series", "early warning", "now", "slope / h",
                                       "at planned end", "limit", "time to limit"])


def _plain(value: float) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
