"""The study's search, read off the curve: each SLO figure against load, fitted monotone through
every measured point and its interval, where the fit crosses the SLO, and whether that crossing
is resolved at the precision asked.

For each figure the SLO names (``<tag>_<pct>_s`` of TTFT, ITL, TPOT, E2E; the task time
``task_<pct>_s``, its interval drawn over tasks; a point with too few tasks for one, or cached
before task draws, has its value as both ends; ``error_rate``; for
rate steps the shortfall ``1 - achieved_ratio`` against ``1 - 0.95``), the point values and
their 95% interval ends (``<figure>_lo`` / ``_hi`` of points.parquet) are each fitted
non-decreasing in load by weighted isotonic regression (``scipy.optimize.isotonic_regression``,
weights the repeats behind each point), so a noisy point pools with its neighbours instead of
making a crossing of its own. On the fitted curves, read linearly between measured loads:

- the **crossing** is where the point fit reaches the threshold (``inf`` when it never does in
  the measured range, the lowest load when it is over it there already);
- the **band** is where the upper fit reaches it (the lowest load that may fail) and where the
  lower fit does (the lowest load that surely fails);
- a load is **undecided** for the figure when its own interval holds the threshold.

A figure is **unresolved** (flat relative to its noise near the SLO) when two or more measured
loads more than ``2 x share`` apart are undecided: across that range the figure moves less
than its own noise, and more loads in between cannot tell where it crosses, only longer or
repeated steps can. The configuration's max sustainable load is **resolved** unless an
unresolved figure's undecided range starts at or below where every resolved figure crosses
(nothing else binds first); :func:`resolve_capacity` then says so in words ("P95 TTFT stays
within 600-1,100 ms from 72 to 216 users: the TTFT SLO does not bound this configuration at
this precision"), names the SLO that binds if any, and leaves no made-up capacity.

:func:`next_search_load` is the runner's next load for the SLO boundary: under and over the
binding figure's crossing, at least 0.8 x ``share`` away and as far as the fitted band's ends
(where the upper fit and the lower fit cross the threshold: a load there passes, or fails, in
nearly every bootstrap draw, which is what the max-load interval's ends need), the side with
the wider gap to the interval's end first, instead of the bracket's middle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from dashboards.analysis.slo import LATENCY_TAGS

SUSTAINABLE_RATIO = 0.95  # achieved / offered (dashboards.analysis.study, METRICS-STUDIES.md)
NEAR = 0.8  # the search measures the crossing x (1 -/+ NEAR x share)
DEFAULT_SHARE = 0.05  # the precision a study without refine: {share} is read at


@dataclass
class FigureFit:
    """One SLO figure's fit against load (module docstring)."""

    figure: str  # the points.parquet column, e.g. "ttft_p95_s"
    label: str  # "P95 TTFT"
    slo: str  # "TTFT", the SLO's own name
    threshold: float
    loads: np.ndarray
    values: np.ndarray
    fit: np.ndarray
    fit_lo: np.ndarray
    fit_hi: np.ndarray
    crossing: float  # inf: never reached in the measured range
    band: tuple[float, float]  # (the upper fit's crossing, the lower fit's)
    undecided: np.ndarray = field(default_factory=lambda: np.empty(0))
    resolved: bool = True

    @property
    def binds(self) -> bool:
        """The figure reaches its threshold within the measured loads."""
        return math.isfinite(self.crossing)


def _isotonic(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted non-decreasing least squares of the finite values (NaN stays NaN)."""
    from scipy.optimize import isotonic_regression  # noqa: PLC0415 - loaded when a curve is fitted

    keep = np.isfinite(values)
    out = np.full(values.shape, np.nan)
    if keep.any():
        out[keep] = isotonic_regression(values[keep], weights=weights[keep]).x
    return out


def crossing(loads: np.ndarray, fitted: np.ndarray, threshold: float) -> float:
    """The load where the (non-decreasing) fitted curve reaches ``threshold``, read linearly
    between measured loads: ``inf`` when it never does, the lowest load when it starts over."""
    keep = np.isfinite(fitted)
    x, y = loads[keep], fitted[keep]
    if not x.size:
        return math.inf
    over = np.nonzero(y >= threshold)[0]
    if not over.size:
        return math.inf
    i = int(over[0])
    if i == 0:
        return float(x[0])
    x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
    return float(x0 + (threshold - y0) / (y1 - y0) * (x1 - x0)) if y1 > y0 else float(x1)


def slo_figures(slo: Mapping[str, Any], load_kind: str) -> list[tuple[str, str, str, float]]:
    """(column, label, SLO name, threshold) of every figure the SLO judges."""
    pct = str(slo.get("percentile") or "p95")
    out = [(f"{tag}_{pct}_s", f"{pct.upper()} {tag.upper()}", tag.upper(),
            float(slo[f"{tag}_ms"]) / 1e3)
           for tag in LATENCY_TAGS if slo.get(f"{tag}_ms") is not None]
    if slo.get("task_ms") is not None:  # agent workloads
        out.append((f"task_{pct}_s", f"{pct.upper()} task time", "task time",
                    float(slo["task_ms"]) / 1e3))
    out.append(("error_rate", "error rate", "error-rate", float(slo.get("error_rate", 0.01))))
    if load_kind == "rate":
        out.append(("shortfall", "achieved/offered shortfall", "achieved >= 95% of offered",
                    1 - SUSTAINABLE_RATIO))
    return out


def _columns(points: pd.DataFrame, figure: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    def column(name: str) -> np.ndarray:
        return points[name].to_numpy(dtype=np.float64) if name in points else np.full(
            len(points), np.nan)

    if figure == "shortfall":
        value = 1 - column("achieved_ratio")
        lo, hi = 1 - column("achieved_ratio_hi"), 1 - column("achieved_ratio_lo")
    else:
        value, lo, hi = column(figure), column(f"{figure}_lo"), column(f"{figure}_hi")
    lo = np.where(np.isfinite(lo), np.minimum(lo, value), value)
    hi = np.where(np.isfinite(hi), np.maximum(hi, value), value)
    return value, lo, hi


def figure_fits(points: pd.DataFrame, slo: Mapping[str, Any],
                share: float = DEFAULT_SHARE) -> list[FigureFit]:
    """Every SLO figure of one configuration's ``all`` points, fitted (module docstring)."""
    if points.empty:
        return []
    mine = points.sort_values("offered_load")
    loads = mine["offered_load"].to_numpy(dtype=np.float64)
    weights = (mine["repeats"].to_numpy(dtype=np.float64) if "repeats" in mine
               else np.ones(len(mine)))
    weights = np.where(np.isfinite(weights) & (weights > 0), weights, 1.0)
    load_kind = str(mine["load_kind"].iloc[0]) if "load_kind" in mine else "concurrency"
    fits = []
    for figure, label, name, threshold in slo_figures(slo, load_kind):
        if figure not in mine and not (figure == "shortfall" and "achieved_ratio" in mine):
            continue
        value, lo, hi = _columns(mine, figure)
        if not np.isfinite(value).any():
            continue
        fit, fit_lo, fit_hi = (_isotonic(v, weights) for v in (value, lo, hi))
        # may pass (lo within the SLO) and may fail (hi over it)
        undecided = loads[np.isfinite(value) & (lo <= threshold) & (hi > threshold)]
        flat = bool(undecided.size >= 2 and undecided.max() > undecided.min() * (1 + 2 * share))
        fits.append(FigureFit(figure, label, name, threshold, loads, value, fit, fit_lo, fit_hi,
                              crossing(loads, fit, threshold),
                              (crossing(loads, fit_hi, threshold),
                               crossing(loads, fit_lo, threshold)),
                              undecided, not flat))
    return fits


def _ms(value: float, figure: str) -> str:
    if figure.endswith("_s"):
        return f"{value * 1e3:,.0f}" if value >= 0.0995 else f"{value * 1e3:,.1f}"
    return f"{value:.1%}"


def _range_text(fit: FigureFit, unit: str) -> str:
    inside = (fit.loads >= fit.undecided.min()) & (fit.loads <= fit.undecided.max())
    low, high = np.nanmin(fit.values[inside]), np.nanmax(fit.values[inside])
    unit_text = " ms" if fit.figure.endswith("_s") else ""
    return (f"{fit.label} stays within {_ms(low, fit.figure)}-{_ms(high, fit.figure)}"
            f"{unit_text} (SLO {_ms(fit.threshold, fit.figure)}{unit_text}) from "
            f"{fit.undecided.min():g} to {fit.undecided.max():g} {unit}".rstrip())


NO_CEILING = (math.nan, math.nan, math.nan)


def _fits(points: pd.DataFrame, slo: Mapping[str, Any], share: float,
          ceiling: tuple[float, float, float]) -> list[FigureFit]:
    """figure_fits, less the achieved shortfall once a load saturated the server: then the
    throughput ceiling (value, lo, hi) decides which loads the server keeps up with, sharply,
    and achieved / offered, which falls only 1% per 1% of load past it and carries the
    arrivals' noise, would read as flat near its own threshold."""
    fits = figure_fits(points, slo, share)
    return [f for f in fits if f.figure != "shortfall"] if ceiling[0] == ceiling[0] else fits


def resolution(points: pd.DataFrame, slo: Mapping[str, Any], share: float = DEFAULT_SHARE,
               unit: str = "", ceiling: tuple[float, float, float] = NO_CEILING
               ) -> tuple[bool, str, str]:
    """(resolved, the note that says why not, the SLO that binds or ""): module docstring.
    ``ceiling``: rate steps, the throughput ceiling with its interval once a load saturated
    the server (NaN else): it binds like a resolved figure."""
    fits = _fits(points, slo, share, ceiling)
    flat = [f for f in fits if not f.resolved]
    # (name, crossing, band) of every figure that crosses, the ceiling among them
    crossing_ones = sorted([(f.slo, f.crossing, f.band) for f in fits if f.resolved and f.binds]
                           + ([("throughput ceiling", ceiling[0], (ceiling[1], ceiling[2]))]
                              if ceiling[0] == ceiling[0] else []), key=lambda c: c[1])
    binding = crossing_ones[0] if crossing_ones else None
    if not flat:
        return True, "", binding[0] if binding else ""
    start = min(float(f.undecided.min()) for f in flat)
    if binding is not None and binding[2][1] < start:  # it surely fails before: it binds
        return True, "", binding[0]
    parts = [f"{_range_text(f, unit)}: the {f.slo} SLO does not bound this configuration at "
             "this precision" for f in flat]
    if binding is not None:
        name, at, (lo, hi) = binding
        what = name if name == "throughput ceiling" else f"the {name} SLO alone"
        parts.append(f"{what} allows {at:.3g} {unit} "
                     f"[{lo:.3g}, {'above the sweep' if math.isinf(hi) else f'{hi:.3g}'}]"
                     .replace("  ", " "))
    parts.append("longer or repeated steps (precision, repeats) can resolve it; more loads "
                 "cannot")
    return False, "; ".join(parts), binding[0] if binding else ""


def resolve_capacity(capacity: pd.DataFrame, points: pd.DataFrame, slo: Mapping[str, Any],
                     share: float = DEFAULT_SHARE) -> pd.DataFrame:
    """capacity.parquet gains ``resolved``, ``resolution_note`` and ``binding_slo``; an
    unresolved configuration's ``max_sustainable_load`` is NaN (its interval stays: the
    range the limit lies in) and its note starts with the resolution note."""
    capacity = capacity.copy()
    resolved, notes, binding = [], [], []
    for row in capacity.itertuples(index=False):
        mine = points[(points["config"] == row.config) & (points["bucket"] == "all")] if len(
            points) else points
        unit = {"rate": "req/s", "concurrency": "users"}.get(str(row.load_kind), "")
        ceiling = tuple(float(getattr(row, c, math.nan)) for c in (
            "throughput_ceiling", "throughput_ceiling_lo", "throughput_ceiling_hi"))
        ok, note, slo_name = resolution(mine, slo, share, unit, ceiling)  # type: ignore[arg-type]
        resolved.append(ok)
        notes.append(note)
        binding.append(slo_name)
    capacity["resolved"] = pd.Series(resolved, index=capacity.index, dtype=bool)
    capacity["resolution_note"] = notes
    capacity["binding_slo"] = binding
    unresolved = ~capacity["resolved"]
    if unresolved.any():
        capacity.loc[unresolved, "max_sustainable_load"] = math.nan
        capacity.loc[unresolved, "note"] = [
            "; ".join(p for p in (n, str(old or "")) if p)
            for n, old in zip(capacity.loc[unresolved, "resolution_note"],
                              capacity.loc[unresolved, "note"], strict=True)]
    return capacity


def _free(load: float, measured: Sequence[float], apart: float) -> bool:
    return all(abs(load - m) > apart * m for m in measured)


def next_search_load(points: pd.DataFrame, slo: Mapping[str, Any], share: float,
                     bracket: tuple[float, float], kind: str, unit: str = "",
                     ceiling: float = math.inf) -> tuple[float | None, str, bool]:
    """(the next load for the SLO boundary or None, why, stop): ``stop`` when the capacity is
    unresolved (no load would help); ``bracket``: the loads the limit lies between (the
    interval's low end, the lowest failing load above it); ``ceiling``: rate steps, the
    throughput ceiling once a load saturated the server (no load above it is sustainable,
    whatever its figures: the target is never above it). None without stop: the curve has no
    crossing to aim at inside the bracket (the caller bisects)."""
    bounds = (ceiling, math.nan, math.nan) if ceiling == ceiling and math.isfinite(
        ceiling) else NO_CEILING
    ok, note, _ = resolution(points, slo, share, unit, bounds)
    if not ok:
        return None, f"not resolvable: {note}", True
    fits = [f for f in _fits(points, slo, share, bounds) if f.resolved and f.binds]
    target, aim, band = math.inf, "", (math.nan, math.nan)
    if fits:
        fit = min(fits, key=lambda f: f.crossing)
        target, band = fit.crossing, fit.band
        aim = f"where the fitted {fit.label} crosses its SLO ({_ms(fit.threshold, fit.figure)}" + (
            " ms)" if fit.figure.endswith("_s") else ")")
    if ceiling == ceiling and ceiling < target:
        target, aim, band = ceiling, "the throughput ceiling", (math.nan, math.nan)
    low, high = bracket
    if not (low < target < high):
        return None, "", False
    measured = [float(v) for v in points["offered_load"]]
    apart = min(0.03, NEAR * share / 2)
    delta = NEAR * share * target
    # the interval's ends need a load that passes in (nearly) every draw and one that fails
    # in every draw: at or under where the fit's upper end crosses the threshold, at or over
    # where its lower end does, and never nearer the crossing than 0.8 x share
    below = min(target - delta, band[0]) if band[0] == band[0] and band[0] > low else (
        target - delta)
    above = max(target + delta, band[1]) if band[1] == band[1] and band[1] < high else (
        target + delta)
    order = ([below, above] if (below - low) / low >= (high - above) / above
             else [above, below]) if low > 0 and above > 0 else [below, above]
    for candidate in (*order, target):
        load = float(max(1, round(candidate))) if kind == "concurrency" else round(candidate, 3)
        if low < load < high and _free(load, measured, apart):
            side = ("under" if load < target else "over" if load > target else "at")
            return load, f"{side} {aim} at {target:.4g}", False
    return None, "", False


def unresolved_ratio_text(name_a: str, name_b: str, cap_a: Mapping[str, Any],
                          cap_b: Mapping[str, Any]) -> str | None:
    """The verdict's max-load line when either configuration's max sustainable load is not
    resolved (:func:`resolve_capacity`), else None."""
    unresolved = [(name, cap) for name, cap in ((name_a, cap_a), (name_b, cap_b))
                  if not bool(cap.get("resolved", True))]
    if not unresolved:
        return None
    return f"{name_b} vs {name_a}: no max-load ratio; " + "; ".join(
        f"{name}: {cap.get('resolution_note') or 'not resolved'}" for name, cap in unresolved)
