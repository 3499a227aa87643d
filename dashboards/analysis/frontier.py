"""Efficiency and the throughput-interactivity frontier of a study's configurations.

Pure functions over the roll-up frames (:mod:`dashboards.analysis.study`) and a step's GPU
telemetry (``collectors.schemas.GPU_SCHEMA``). Definitions (``docs/METRICS-STUDIES.md``,
"Efficiency and the frontier"):

- **Per-user speed** ``per_user_tok_s`` = 1 / P50 TPOT (output tokens per second one stream
  receives after its first token). The median: the reciprocal of the median TPOT is the median
  request's speed (a median commutes with 1/x), it is what serving teams plot on the
  throughput-interactivity curve, and a slow tail is judged by the SLO's own percentile beside
  it. Interval: the reciprocals of P50 TPOT's.
- **GPUs** ``gpu_count``: the GPUs of the step's telemetry whose mean utilisation over the
  measured window was at least :data:`BUSY_UTIL_PCT` (a GPU on the host that served nothing is
  not counted); NaN without GPU telemetry or when no GPU was busy (the telemetry then watched
  GPUs that did not serve this step, say a server on another host).
- **Energy** ``gpu_energy_j``: over the measured window, summed over those GPUs: NVML's
  cumulative energy counter (``energy_mj``) read at the window's ends (interpolated between its
  samples) where its samples span the window, else its slope between the samples inside the
  window times the window, else the mean ``power_w`` times the window
  (``gpu_energy_source``: ``counter`` | ``power``). ``gpu_power_w`` of a point: the energy of
  its parts over their windows.
- ``output_tok_per_gpu_s`` = output tok/s / GPUs; ``output_tok_per_j`` = output tok/s /
  ``gpu_power_w`` (tokens per joule; its interval is the throughput's, the power taken as
  measured); ``usd_per_m_output_tok`` = ``gpu_hour_usd`` / 3600 / output tok per GPU-second x
  1e6 (NaN without a price or a GPU count).
- **Frontier**: per configuration, its points (``all`` bucket) as (per-user speed, output tok/s
  per GPU, or per server when some configuration has no GPU count), each with its interval.
  Between two configurations (:func:`frontier_segments`), each curve's envelope on a common
  grid of per-user speeds: the most tok/s at that speed or faster (linear between the measured
  points, never past the fastest measured), the ratio B / A at each speed both curves were
  measured down to, with the
  2.5-97.5% quantiles of the same ratio on every bootstrap draw (the curve of draw k joins draw k
  of each point); B dominates where the interval is above 1, A where it is below, neither where
  it holds 1; beyond the other's fastest point only one configuration reaches.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from dashboards.analysis.runs import ALL_ROW
from dashboards.analysis.study_stats import CONFIDENCE

BUSY_UTIL_PCT = 1.0  # a GPU whose mean utilisation over the window is below did not serve
FRONTIER_GRID = 200  # per-user speeds the two curves are compared at
MIN_SEGMENT = 3  # grid points: a shorter run of one outcome joins its neighbour
_NS = 1_000_000_000
EFFICIENCY_COLUMNS = ("per_user_tok_s", "output_tok_per_gpu_s", "output_tok_per_j",
                      "usd_per_m_output_tok")
CAPACITY_COLUMNS = ("efficiency_load", "gpu_count", "gpu_power_w", *(
    f"{c}{s}" for c in EFFICIENCY_COLUMNS for s in ("", "_lo", "_hi")))
FRONTIER_COLUMNS = ("config", "offered_load", "per_user_tok_s", "per_user_tok_s_lo",
                    "per_user_tok_s_hi", "tok_s", "tok_s_lo", "tok_s_hi", "per", "sustainable")


# ----------------------------------------------------------------------------------- per step


def window_energy(gpu: pd.DataFrame, window: tuple[int, int]) -> dict[str, Any]:
    """``gpu_count``, ``gpu_energy_j``, ``gpu_energy_source`` of one step's measured window
    (module docstring); NaN / "" without GPU telemetry in it."""
    out: dict[str, Any] = {"gpu_count": math.nan, "gpu_energy_j": math.nan,
                           "gpu_energy_source": ""}
    if gpu.empty:
        return out
    rows = gpu[gpu["error"].isna()] if "error" in gpu else gpu
    start, end = window
    seconds = (end - start) / _NS
    inside = rows[(rows["wall_ns"] >= start) & (rows["wall_ns"] < end)]
    if inside.empty:
        return out
    keys = inside["host"].astype(str) + ":" + inside["gpu_index"].astype(str)
    util = inside["util_gpu_pct"].astype("float64").groupby(keys).mean()
    busy = list(util.index[util.fillna(0) >= BUSY_UTIL_PCT])
    if not busy:  # these GPUs did not serve this step (a server on another host): none known
        return out
    all_keys = rows["host"].astype(str) + ":" + rows["gpu_index"].astype(str)
    total, sources = 0.0, set()
    for key in busy:
        joules, source = _gpu_energy_j(rows[all_keys == key], start, end, seconds)
        if joules == joules:
            total += joules
            sources.add(source)
    out["gpu_count"] = float(len(busy))
    if sources:
        out["gpu_energy_j"] = total
        out["gpu_energy_source"] = "counter" if sources == {"counter"} else "power"
    return out


def _gpu_energy_j(rows: pd.DataFrame, start: int, end: int, seconds: float) -> tuple[float, str]:
    """One GPU's joules over [start, end): its energy counter, else its mean power."""
    if "energy_mj" in rows:
        counter = rows[rows["energy_mj"].notna()].sort_values("wall_ns")
        t = counter["wall_ns"].to_numpy(dtype=np.float64)
        e = counter["energy_mj"].to_numpy(dtype=np.float64)
        if t.size >= 2 and t[0] <= start and t[-1] >= end:
            return float(np.interp(end, t, e) - np.interp(start, t, e)) / 1e3, "counter"
        within = (t >= start) & (t < end)
        if within.sum() >= 2 and t[within][-1] > t[within][0]:
            slope = (e[within][-1] - e[within][0]) / (t[within][-1] - t[within][0])  # mJ/ns
            return float(slope * (end - start)) / 1e3, "counter"
    power = rows[(rows["wall_ns"] >= start) & (rows["wall_ns"] < end)]["power_w"]
    power = power.astype("float64").dropna()
    return (float(power.mean()) * seconds, "power") if len(power) else (math.nan, "")


def point_energy(rows: pd.DataFrame) -> dict[str, float]:
    """A point's ``gpu_count`` (the most of its parts) and ``gpu_power_w`` (its parts' energy
    over their windows, the parts with energy only) from its steps.parquet rows."""
    out = {"gpu_count": math.nan, "gpu_power_w": math.nan}
    if "gpu_count" in rows and rows["gpu_count"].notna().any():
        out["gpu_count"] = float(rows["gpu_count"].max())
    if "gpu_energy_j" in rows:
        energy = rows["gpu_energy_j"].to_numpy(dtype=np.float64)
        windows = rows["window_s"].to_numpy(dtype=np.float64)
        keep = np.isfinite(energy) & np.isfinite(windows)
        if keep.any() and windows[keep].sum() > 0:
            out["gpu_power_w"] = float(energy[keep].sum() / windows[keep].sum())
    return out


# ---------------------------------------------------------------------------------- per point


def efficiency_columns(points: pd.DataFrame, gpu_hour_usd: float | None = None) -> pd.DataFrame:
    """points.parquet with ``per_user_tok_s``, ``output_tok_per_gpu_s``, ``output_tok_per_j``
    and ``usd_per_m_output_tok``, each with ``_lo`` / ``_hi`` (module docstring)."""
    if points.empty:
        return points
    points = points.copy()
    for column in ("gpu_count", "gpu_power_w"):
        if column not in points:
            points[column] = math.nan
    gpus = points["gpu_count"].astype("float64")
    power = points["gpu_power_w"].astype("float64")
    for suffix, other in (("", ""), ("_lo", "_hi"), ("_hi", "_lo")):
        tpot = _column(points, f"tpot_p50_s{other}")
        tokens = _column(points, f"output_tok_per_s{suffix}")
        with np.errstate(divide="ignore", invalid="ignore"):
            points[f"per_user_tok_s{suffix}"] = np.where(tpot > 0, 1.0 / tpot, np.nan)
            points[f"output_tok_per_gpu_s{suffix}"] = np.where(gpus > 0, tokens / gpus, np.nan)
            points[f"output_tok_per_j{suffix}"] = np.where(power > 0, tokens / power, np.nan)
    return cost_columns(points, gpu_hour_usd)


def _column(frame: pd.DataFrame, name: str) -> np.ndarray:
    return (frame[name].to_numpy(dtype=np.float64) if name in frame
            else np.full(len(frame), np.nan))


def cost_columns(frame: pd.DataFrame, gpu_hour_usd: float | None) -> pd.DataFrame:
    """``usd_per_m_output_tok`` (with ``_lo`` / ``_hi``) of a frame holding
    ``output_tok_per_gpu_s``: the price of a million output tokens at ``gpu_hour_usd`` dollars
    per GPU-hour (NaN without a price)."""
    frame = frame.copy()
    price = float(gpu_hour_usd) if gpu_hour_usd else math.nan
    for suffix, other in (("", ""), ("_lo", "_hi"), ("_hi", "_lo")):
        per_gpu = _column(frame, f"output_tok_per_gpu_s{other}")
        with np.errstate(divide="ignore", invalid="ignore"):
            frame[f"usd_per_m_output_tok{suffix}"] = np.where(
                per_gpu > 0, price / 3600.0 / per_gpu * 1e6, np.nan)
    return frame


def capacity_efficiency(capacity: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """capacity.parquet with each configuration's efficiency at its max sustainable load (the
    most it serves within the SLO; NaN where no load held): ``efficiency_load``, ``gpu_count``,
    ``gpu_power_w`` and the :data:`EFFICIENCY_COLUMNS` with ``_lo`` / ``_hi``."""
    capacity = capacity.copy()
    names = list(CAPACITY_COLUMNS)
    values = {name: [math.nan] * len(capacity) for name in names}
    mine = points[points["bucket"] == ALL_ROW] if len(points) else points
    for i, row in enumerate(capacity.itertuples(index=False)):
        load = float(row.max_sustainable_load)
        if load != load or mine.empty:
            continue
        at = mine[(mine["config"] == row.config) & (mine["offered_load"] == load)]
        if at.empty:
            continue
        values["efficiency_load"][i] = load
        for name in names[1:]:
            if name in at:
                values[name][i] = float(at[name].iloc[0])
    for name, column in values.items():
        capacity[name] = column
    return capacity


def efficiency_text(config: str, row: Mapping[str, Any], unit: str = "",
                    gpu_hour_usd: float | None = None) -> str:
    """One configuration's efficiency at its max sustainable load in words (capacity.parquet's
    row); "" where no load held. ``gpu_hour_usd`` prices it anew (else the row's cost)."""
    load = row.get("efficiency_load", math.nan)
    if load is None or load != load:
        return ""
    parts = []
    per_gpu = row.get("output_tok_per_gpu_s", math.nan)
    if per_gpu == per_gpu:
        interval = _interval(row, "output_tok_per_gpu_s", ",.0f")
        parts.append(f"{per_gpu:,.0f} output tok/s per GPU{interval} "
                     f"({row.get('gpu_count', math.nan):g} GPU)")
    per_joule = row.get("output_tok_per_j", math.nan)
    if per_joule == per_joule:
        parts.append(f"{per_joule:.3g} output tok/J{_interval(row, 'output_tok_per_j', '.3g')}")
    cost = dict(cost_columns(pd.DataFrame([dict(row)]), gpu_hour_usd).iloc[0]) if (
        gpu_hour_usd) else row
    usd = cost.get("usd_per_m_output_tok", math.nan)
    if usd == usd:
        interval = _interval(cost, "usd_per_m_output_tok", ".3g")
        parts.append(f"${usd:.3g} per million output tokens{interval}")
    speed = row.get("per_user_tok_s", math.nan)
    if speed == speed:
        parts.append(f"{speed:.3g} tok/s per user")
    if not parts:
        return ""
    return f"{config} at {load:g} {unit} (its max sustainable load): " + ", ".join(parts)


def _interval(row: Mapping[str, Any], name: str, digits: str) -> str:
    lo, hi = row.get(f"{name}_lo", math.nan), row.get(f"{name}_hi", math.nan)
    if lo is None or hi is None or lo != lo or hi != hi:
        return ""
    return f" [{lo:{digits}}, {hi:{digits}}]"


# ----------------------------------------------------------------------------------- frontier


def frontier_per(points: pd.DataFrame) -> str:
    """"GPU" when every configuration's points know their GPU count, else "server"."""
    mine = points[points["bucket"] == ALL_ROW] if len(points) else points
    if mine.empty or "gpu_count" not in mine:
        return "server"
    known = mine.groupby("config")["gpu_count"].apply(lambda g: g.notna().all())
    return "GPU" if bool(known.all()) else "server"


def frontier_table(points: pd.DataFrame) -> pd.DataFrame:
    """frontier.parquet: one row per configuration x load (``all`` points): per-user speed and
    output tok/s per GPU (``per`` "GPU") or per server (``per`` "server"), with intervals."""
    mine = points[points["bucket"] == ALL_ROW] if len(points) else points
    if mine.empty or "per_user_tok_s" not in mine:
        return pd.DataFrame(columns=list(FRONTIER_COLUMNS))
    per = frontier_per(points)
    source = "output_tok_per_gpu_s" if per == "GPU" else "output_tok_per_s"
    out = pd.DataFrame({
        "config": mine["config"].astype(str), "offered_load": mine["offered_load"],
        "per_user_tok_s": mine["per_user_tok_s"], "per_user_tok_s_lo": mine["per_user_tok_s_lo"],
        "per_user_tok_s_hi": mine["per_user_tok_s_hi"], "tok_s": mine[source],
        "tok_s_lo": _column(mine, f"{source}_lo"), "tok_s_hi": _column(mine, f"{source}_hi"),
        "per": per,
        "sustainable": mine["sustainable"].astype(bool) if "sustainable" in mine else True})
    return out.sort_values(["config", "offered_load"], kind="stable").reset_index(drop=True)


def envelope(x: np.ndarray, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The most ``y`` at a speed of at least each ``grid`` value: the points sorted by ``x``
    joined linearly, then the highest at that speed or faster; NaN past the fastest point
    (below the slowest, every point is fast enough: the most of them, a lower bound)."""
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if x.size == 0:
        return np.full(grid.size, np.nan)
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    inside = grid <= x[-1]
    line = np.where(inside & (grid >= x[0]), np.interp(grid, x, y), np.nan)
    best = np.fmax.accumulate(line[::-1])[::-1]
    return np.where(inside, best, np.nan)


def _curve_draws(points: pd.DataFrame, draws: Mapping[Any, Any], config: str,
                 per: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(speeds, tok/s): loads x draws of one configuration, None where a draw is missing."""
    mine = points[(points["config"] == config) & (points["bucket"] == ALL_ROW)]
    xs, ys = [], []
    for row in mine.itertuples(index=False):
        d = draws.get((config, float(row.offered_load), ALL_ROW))
        if d is None or "tpot_p50_s" not in d.values or "output_tok_per_s" not in d.values:
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            xs.append(np.where(d.values["tpot_p50_s"] > 0, 1.0 / d.values["tpot_p50_s"], np.nan))
        gpus = float(row.gpu_count) if per == "GPU" else 1.0
        ys.append(d.values["output_tok_per_s"] / gpus)
    if not xs:
        return None
    width = min(a.size for a in (*xs, *ys))
    return np.vstack([a[:width] for a in xs]), np.vstack([a[:width] for a in ys])


def frontier_segments(points: pd.DataFrame, draws: Mapping[Any, Any], a: str, b: str
                      ) -> list[dict[str, Any]]:
    """Where B's frontier lies above A's, below it, level with it (within noise), or only one
    reaches, over ranges of per-user speed (module docstring). Each segment: ``speed_lo``,
    ``speed_hi`` (tok/s per user), ``outcome`` ("b" | "a" | "tie" | "only a" | "only b"),
    ``ratio_lo`` / ``ratio_hi`` (the least and most of B / A there), ``lo`` / ``hi`` (the
    interval's extremes there), ``per`` and ``text``."""
    table = frontier_table(points)
    per = frontier_per(points)
    curves = {c: table[table["config"] == c] for c in (a, b)}
    if any(len(c) < 1 or not c["per_user_tok_s"].notna().any() for c in curves.values()):
        return []
    speeds = np.concatenate([c["per_user_tok_s"].to_numpy(dtype=np.float64)
                             for c in curves.values()])
    speeds = speeds[np.isfinite(speeds)]
    # the measured speeds are grid points: a range ends exactly where a curve does
    grid = np.union1d(np.linspace(float(speeds.min()), float(speeds.max()), FRONTIER_GRID),
                      speeds)
    fa, fb = (envelope(curves[c]["per_user_tok_s"].to_numpy(dtype=np.float64),
                       curves[c]["tok_s"].to_numpy(dtype=np.float64), grid) for c in (a, b))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = fb / fa
    lo, hi = _ratio_interval(points, draws, a, b, per, grid)
    if not np.isfinite(lo).any():  # no draws (a roll-up written without them): the figures
        lo, hi = ratio, ratio
    top_a = float(curves[a]["per_user_tok_s"].max())
    top_b = float(curves[b]["per_user_tok_s"].max())
    # compared where both were measured down to: slower than a curve's slowest point its
    # envelope is only a lower bound (a heavier load might have given more)
    floor = max(float(curves[c]["per_user_tok_s"].min()) for c in (a, b))
    outcome = np.full(grid.size, "", dtype=object)
    outcome[np.isfinite(fa) & ~np.isfinite(fb) & (grid > top_b)] = "only a"
    outcome[np.isfinite(fb) & ~np.isfinite(fa) & (grid > top_a)] = "only b"
    both = np.isfinite(ratio) & (grid >= floor)
    outcome[both] = "tie"
    outcome[both & (lo > 1)] = "b"
    outcome[both & (hi < 1)] = "a"
    outcome = _merge_short(outcome)
    segments = []
    start = 0
    for i in range(1, grid.size + 1):
        if i < grid.size and outcome[i] == outcome[start]:
            continue
        if outcome[start]:
            # "above X only B reaches": X is the other's fastest, the grid point before
            only = str(outcome[start]).startswith("only") and start > 0
            speeds = grid[start - 1:i] if only else grid[start:i]
            part = slice(start, i)
            segments.append(_segment(str(outcome[start]), speeds, ratio[part], lo[part],
                                     hi[part], a, b, per))
        start = i
    return segments


def _ratio_interval(points: pd.DataFrame, draws: Mapping[Any, Any], a: str, b: str, per: str,
                    grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per grid speed, the 95% interval of B / A over the draws' envelopes (NaN where fewer
    than half of the draws reach that speed on both curves)."""
    nan = np.full(grid.size, np.nan)
    da, db = _curve_draws(points, draws, a, per), _curve_draws(points, draws, b, per)
    if da is None or db is None:
        return nan, nan
    width = min(da[0].shape[1], db[0].shape[1])
    ratios = np.empty((width, grid.size))
    for k in range(width):
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios[k] = (envelope(db[0][:, k], db[1][:, k], grid)
                         / envelope(da[0][:, k], da[1][:, k], grid))
    tail = (1 - CONFIDENCE) / 2 * 100
    enough = np.isfinite(ratios).sum(axis=0) >= max(10, width // 2)
    with np.errstate(all="ignore"):
        lo = np.where(enough, np.nanpercentile(np.where(enough, ratios, 1.0), tail, axis=0),
                      np.nan)
        hi = np.where(enough, np.nanpercentile(np.where(enough, ratios, 1.0), 100 - tail,
                                               axis=0), np.nan)
    return lo, hi


def _merge_short(outcome: np.ndarray) -> np.ndarray:
    """Runs of one outcome shorter than :data:`MIN_SEGMENT` grid points take the outcome
    before them (noise at an interval's edge would otherwise cut a range in pieces)."""
    out = outcome.copy()
    start = 0
    for i in range(1, out.size + 1):
        if i < out.size and out[i] == out[start]:
            continue
        if i - start < MIN_SEGMENT and start > 0 and out[start] and out[start - 1]:
            out[start:i] = out[start - 1]
        start = i
    return out


def _segment(outcome: str, speeds: np.ndarray, ratio: np.ndarray, lo: np.ndarray,
             hi: np.ndarray, a: str, b: str, per: str) -> dict[str, Any]:
    finite = ratio[np.isfinite(ratio)]
    seg = {"speed_lo": float(speeds[0]), "speed_hi": float(speeds[-1]), "outcome": outcome,
           "ratio_lo": float(finite.min()) if finite.size else math.nan,
           "ratio_hi": float(finite.max()) if finite.size else math.nan,
           "lo": float(np.nanmin(lo)) if np.isfinite(lo).any() else math.nan,
           "hi": float(np.nanmax(hi)) if np.isfinite(hi).any() else math.nan, "per": per}
    seg["text"] = segment_text(seg, a, b)
    return seg


def _range(lo: float, hi: float, digits: str = ".3g") -> str:
    left, right = f"{lo:{digits}}", f"{hi:{digits}}"
    return left if left == right else f"{left}-{right}"


def segment_text(segment: Mapping[str, Any], a: str, b: str) -> str:
    """One segment in words: "at 20-45 tok/s per user, B gives 1.3-1.6x the output tok/s per
    GPU of A"."""
    speeds = _range(segment["speed_lo"], segment["speed_hi"])
    what = f"output tok/s per {segment['per']}"
    outcome = segment["outcome"]
    if outcome in ("only a", "only b"):
        name = a if outcome == "only a" else b
        return f"above {segment['speed_lo']:.3g} tok/s per user only {name} reaches " \
               f"(up to {segment['speed_hi']:.3g})"
    if outcome == "tie":
        return (f"at {speeds} tok/s per user, {b} and {a} are level within noise "
                f"({b} / {a} = {_range(segment['ratio_lo'], segment['ratio_hi'], '.2f')}x)")
    if outcome == "b":
        return (f"at {speeds} tok/s per user, {b} gives "
                f"{_range(segment['ratio_lo'], segment['ratio_hi'], '.2f')}x the {what} of {a}")
    inverse = (1 / segment["ratio_hi"], 1 / segment["ratio_lo"])
    return (f"at {speeds} tok/s per user, {a} gives {_range(*inverse, '.2f')}x the {what} "
            f"of {b}")


def frontier_lines(segments: Sequence[Mapping[str, Any]]) -> str:
    """The segments as one sentence, in speed order."""
    return "; ".join(str(s["text"]) for s in sorted(segments, key=lambda s: s["speed_lo"]))
