"""The verdict between a study's configurations: verdict.parquet and its text.

Pure functions over the roll-up frames (:mod:`dashboards.analysis.study`): the points with their
bootstrap draws and the capacity rows in, the verdict rows out. Definitions:
``docs/METRICS-STUDIES.md`` ("Intervals, steady state and the verdict") and
:mod:`dashboards.analysis.study_stats`.

``<study_dir>/rollup/verdict.parquet``: for each pair of configurations (A before B in study
order) rows of ``kind``:

- ``max load``: the ratio B / A of max sustainable loads with its interval (``change``, ``lo``,
  ``hi``); when both held the SLO at every load measured its text says that, with the
  throughput difference, instead of a ratio of two lower bounds;
- ``summary``: otherwise, the throughput difference at the highest load both measured (and
  the task time's, where the SLO names it);
- ``at load``: at every load both measured, each SLO figure (``<tag>_<pct>_s``, the task
  time ``task_<pct>_s`` where the SLO names it (drawn over tasks; no interval where either
  side had too few tasks), ``error_rate``) and each throughput figure
  (:data:`THROUGHPUT_FIGURES`): ``value_a``, ``value_b``, ``change`` = B - A with its
  interval ``lo`` / ``hi``, ``relative`` = B / A - 1 with its interval ``rel_lo`` /
  ``rel_hi`` (the same draws' ratio), ``within_noise``;
- ``frontier``: a range of per-user speed (``speed_lo``, ``speed_hi``, tok/s per user) where
  ``outcome`` ("a", "b", "tie", "only a", "only b") holds on the throughput-interactivity curve,
  ``lo`` / ``hi`` the extremes of B / A's interval there (:func:`frontier.frontier_segments`);
- ``efficiency``: one per configuration (``config_a``; ``config_b`` empty), its efficiency at
  its max sustainable load (capacity.parquet's efficiency columns) in words.

Every row has ``text``, the sentence :func:`format_verdict` prints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from dashboards.analysis import frontier, study_search, study_stats
from dashboards.analysis.runs import ALL_ROW
from dashboards.analysis.slo import LATENCY_TAGS
from dashboards.analysis.study_stats import generator_limited

THROUGHPUT_FIGURES = {  # figure -> (label, unit) of the verdict's throughput rows
    "achieved_req_per_s": ("req/s", "req/s"),
    "goodput_req_per_s": ("goodput", "req/s"),
    "output_tok_per_s": ("output tok/s", "tok/s"),
    "per_user_tok_s": ("per-user speed", "tok/s"),
}
VERDICT_COLUMNS = ("config_a", "config_b", "kind", "offered_load", "figure", "value_a",
                   "value_b", "change", "lo", "hi", "relative", "rel_lo", "rel_hi",
                   "within_noise", "speed_lo", "speed_hi", "outcome", "text")
LOAD_UNITS = {"concurrency": "users", "rate": "req/s"}


def arrivals_unit(rows: pd.DataFrame) -> str:
    """"sessions/s" or "tasks/s" where rate steps or points count them (``arrival_unit``,
    METRICS-STUDIES.md "Sessions and tasks under a rate plan"), else ""."""
    if "arrival_unit" not in rows or "load_kind" not in rows or set(
            rows["load_kind"].dropna().astype(str)) != {"rate"}:
        return ""
    units = {str(u) for u in rows["arrival_unit"].dropna().unique()} - {""}
    return f"{units.pop()}/s" if len(units) == 1 else ""


def figure_draws(draws: Any, figure: str) -> np.ndarray:
    """A point's bootstrap draws of ``figure``; per-user speed from P50 TPOT's."""
    if draws is None:
        return np.empty(0)
    if figure == "per_user_tok_s":
        tpot = draws.values.get("tpot_p50_s", np.empty(0))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(tpot > 0, 1.0 / tpot, np.nan)
    return np.asarray(draws.values.get(figure, np.empty(0)))


def _row(a: str, b: str, kind: str, text: str, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(VERDICT_COLUMNS, math.nan)
    row.update({"config_a": a, "config_b": b, "kind": kind, "figure": "", "outcome": "",
                "within_noise": False, "text": text, **values})
    return row


def _at_load(a: str, b: str, load: float, figure: str, va: float, vb: float, da: Any,
             db: Any, bent: Sequence[str] = ()) -> dict[str, Any]:
    """One figure's change B - A at one load, with its intervals (``bent``: the
    configurations whose generator bent the figures there)."""
    xa, xb = figure_draws(da, figure), figure_draws(db, figure)
    lo, hi = study_stats.difference_interval(xa, xb) if xa.size and xb.size else (
        math.nan, math.nan)
    rel_lo, rel_hi = study_stats.relative_interval(xa, xb) if xa.size and xb.size else (
        math.nan, math.nan)
    noise = study_stats.within_noise(lo, hi)
    relative = vb / va - 1 if va else math.nan
    if figure in THROUGHPUT_FIGURES:
        label, unit = THROUGHPUT_FIGURES[figure]
        text = f"at {load:g}: {label} {b} vs {a} = " + (
            f"{_pct(relative)} [{_pct(rel_lo)}, {_pct(rel_hi)}]" if va or vb != vb else
            f"{vb - va:+.1f} {unit} [{lo:+.1f}, {hi:+.1f}] ({a}: 0)")
    elif figure.startswith("task_"):
        text = f"at {load:g}: {task_clause(figure, a, b, vb - va, lo, hi)}"
    else:
        scale, unit = (1e3, "ms") if figure.endswith("_s") else (100.0, "pp")
        label = (figure.removesuffix("_s").replace("_", " ").upper()
                 if figure.endswith("_s") else "error rate")
        text = (f"at {load:g}: {label} {b} - {a} = {(vb - va) * scale:+.1f} {unit} "
                f"[{lo * scale:+.1f}, {hi * scale:+.1f}]")
    text += (" within noise" if noise else "") + (
        f" (CAUTION: {' and '.join(bent)}'s generator bent the figures here, see "
        "validity_reasons)" if bent else "")
    return _row(a, b, "at load", text,
                offered_load=float(load), figure=figure, value_a=va, value_b=vb,
                change=vb - va, lo=lo, hi=hi, relative=relative, rel_lo=rel_lo, rel_hi=rel_hi,
                within_noise=noise)


def task_clause(figure: str, a: str, b: str, change: float, lo: float, hi: float) -> str:
    """ "task P95 b - a = +3.22 s [+2.71, +3.80]" (no interval where it has none)."""
    interval = f" [{lo:+.2f}, {hi:+.2f}]" if lo == lo and hi == hi else " (no interval)"
    label = figure.removeprefix("task_").removesuffix("_s").upper()
    return f"task {label} {b} - {a} = {change:+.2f} s{interval}"


def _pct(value: float) -> str:
    return "-" if value != value else f"{value * 100:+.0f}%"


def throughput_sentence(rows: Sequence[Mapping[str, Any]], a: str, b: str, unit: str) -> str:
    """"B completes 35% more req/s than A [28%, 41%] at 64 users, 33% more output tok/s
    [..], per-user speed 5% lower [..]" from one load's throughput rows."""
    parts = []
    for row in rows:
        if row["figure"] not in THROUGHPUT_FIGURES or row["relative"] != row["relative"]:
            continue
        label = THROUGHPUT_FIGURES[row["figure"]][0]
        rel, lo, hi = row["relative"], row["rel_lo"], row["rel_hi"]
        interval = f" [{_pct(lo)}, {_pct(hi)}]" if lo == lo else ""
        word = "more" if rel >= 0 else "less"
        noise = " (within noise)" if row["within_noise"] else ""
        if row["figure"] == "per_user_tok_s":
            parts.append(f"per-user speed {abs(rel) * 100:.0f}% "
                         f"{'higher' if rel >= 0 else 'lower'}{interval}{noise}")
        elif not parts:
            parts.append(f"{b} completes {abs(rel) * 100:.0f}% {word} {label} than {a}"
                         f"{interval}{noise} at {row['offered_load']:g} {unit}")
        else:
            parts.append(f"{abs(rel) * 100:.0f}% {word} {label}{interval}{noise}")
    return ", ".join(parts)


def _held_everywhere(points: pd.DataFrame, config: str, loads: Sequence[float]) -> bool:
    mine = points[(points["config"] == config) & points["offered_load"].isin(list(loads))]
    column = "sustainable" if "sustainable" in mine else "slo_met"
    return bool(len(mine)) and bool(mine[column].astype(bool).all())


def none_held_text(points: pd.DataFrame, a: str, b: str, cap_a: Mapping[str, Any],
                   cap_b: Mapping[str, Any], unit: str) -> str | None:
    """The max-load line where one configuration held none of its loads and the other held
    some: the one that held sustains more where the other failed its lowest load at or below
    what it held (their ratio then under lowest failed / highest held); else None."""
    held = {name: float(cap["max_sustainable_load"]) for name, cap in ((a, cap_a), (b, cap_b))}
    failed = [name for name, value in held.items() if value != value]
    if len(failed) != 1:
        return None
    (none,) = failed
    (other,) = [name for name in held if name != none]
    tried = points[points["config"] == none]
    if tried.empty or ("sustainable" in tried and tried["sustainable"].astype(bool).any()):
        return None
    lowest, best = float(tried["offered_load"].min()), held[other]
    if not lowest <= best:
        return None  # it failed only loads above all the other held: no order
    above = "" if bool((cap_a if other == a else cap_b).get("max_load_reached")) else (
        ", its limit above its sweep")
    return (f"{other} sustains more load than {none}: {none} held none of its loads (the "
            f"lowest {lowest:g} {unit}), {other} held {best:g} {unit}{above} ({none} / {other} "
            f"< {lowest / best:.2f}x)")


def verdict_table(points: pd.DataFrame, draws: Mapping[Any, Any], capacity: pd.DataFrame,
                  slo: Mapping[str, Any], configs: Sequence[str]) -> pd.DataFrame:
    """verdict.parquet (module docstring) of a study's points, their bootstrap draws (by
    (config, load, bucket)) and its capacity rows (with :func:`frontier.capacity_efficiency`'s
    columns where present)."""
    rows: list[dict[str, Any]] = []
    if points.empty or capacity.empty:
        return pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))
    by_config = capacity.set_index("config")
    pct = slo.get("percentile", "p95")
    figures = [f"{tag}_{pct}_s" for tag in LATENCY_TAGS if slo.get(f"{tag}_ms") is not None]
    if slo.get("task_ms") is not None and f"task_{pct}_s" in points:
        figures.append(f"task_{pct}_s")
    figures += ["error_rate", *(f for f in THROUGHPUT_FIGURES if f in points)]
    all_points = points[points["bucket"] == ALL_ROW]
    unit = arrivals_unit(all_points) or (LOAD_UNITS.get(str(all_points["load_kind"].iloc[0]),
                                                        "") if len(all_points) else "")
    names = [c for c in configs if c in by_config.index]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            rows += _pair(all_points, draws, by_config, figures, a, b, unit)
    for name in names:
        text = frontier.efficiency_text(name, by_config.loc[name], unit)
        if text:
            rows.append(_row(name, "", "efficiency", text))
    return pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))


def _pair(points: pd.DataFrame, draws: Mapping[Any, Any], by_config: pd.DataFrame,
          figures: Sequence[str], a: str, b: str, unit: str) -> list[dict[str, Any]]:
    """The verdict rows of one pair (module docstring)."""
    cap_a, cap_b = by_config.loc[a], by_config.loc[b]
    loads = sorted(set(points[points["config"] == a]["offered_load"])
                   & set(points[points["config"] == b]["offered_load"]))
    at_load = []
    for load in loads:
        pa_ = points[(points["config"] == a) & (points["offered_load"] == load)]
        pb_ = points[(points["config"] == b) & (points["offered_load"] == load)]
        da, db = draws.get((a, float(load), ALL_ROW)), draws.get((b, float(load), ALL_ROW))
        bent = [c for c, p in ((a, pa_), (b, pb_)) if generator_limited(p).any()]
        at_load += [_at_load(a, b, float(load), f, float(pa_[f].iloc[0]), float(pb_[f].iloc[0]),
                             da, db, bent) for f in figures]
    top = [r for r in at_load if loads and r["offered_load"] == float(loads[-1])]
    sentence = "; ".join(part for part in [throughput_sentence(top, a, b, unit)] + [
        task_clause(r["figure"], a, b, r["change"], r["lo"], r["hi"]) + (
            " within noise" if r["within_noise"] else "")
        for r in top if str(r["figure"]).startswith("task_") and r["change"] == r["change"]]
        if part)
    ratio = study_stats.ratio_interval(cap_a, cap_b)
    both_held = bool(loads) and all(_held_everywhere(points, c, loads) for c in (a, b)) and not (
        bool(cap_a.get("max_load_reached")) or bool(cap_b.get("max_load_reached")))
    if both_held:
        text = (f"both hold the SLO at every load measured "
                f"({', '.join(f'{x:g}' for x in loads)} {unit})"
                + (f"; {sentence}" if sentence else ""))
    else:  # a capacity flat within its noise near the SLO has no ratio (study_search)
        text = (study_search.unresolved_ratio_text(a, b, cap_a, cap_b)
                or none_held_text(points, a, b, cap_a, cap_b, unit)
                or study_stats.format_ratio(a, b, ratio, (study_stats.above_sweep(cap_a),
                                                          study_stats.above_sweep(cap_b))))
    rows = [_row(a, b, "max load", text, figure="max_sustainable_load",
                 value_a=cap_a["max_sustainable_load"], value_b=cap_b["max_sustainable_load"],
                 change=ratio[0], lo=ratio[1], hi=ratio[2], relative=ratio[0] - 1,
                 within_noise=study_stats.ratio_undecided(ratio[1], ratio[2]))]
    if sentence and not both_held:
        rows.append(_row(a, b, "summary", f"at {loads[-1]:g} {unit}, the highest load both "
                         f"measured: {sentence}", offered_load=float(loads[-1])))
    for segment in frontier.frontier_segments(points, draws, a, b):
        rows.append(_row(a, b, "frontier", segment["text"], figure=f"tok_s_per_{segment['per']}",
                         lo=segment["lo"], hi=segment["hi"], speed_lo=segment["speed_lo"],
                         speed_hi=segment["speed_hi"], outcome=segment["outcome"],
                         change=segment["ratio_lo"], relative=segment["ratio_hi"] - 1))
    return rows + at_load


def format_verdict(verdict: pd.DataFrame) -> str:
    """The verdict as lines for the terminal: each pair's headline, its frontier and the
    configurations' efficiency, then its changes per load (indented)."""
    order = {"max load": 0, "summary": 1, "frontier": 2, "at load": 3}
    pairs = list(dict.fromkeys(zip(verdict["config_a"], verdict["config_b"], strict=True)))
    rows = sorted(verdict.itertuples(index=False), key=lambda r: (
        r.kind == "efficiency", pairs.index((r.config_a, r.config_b)), order.get(r.kind, 4)))
    return "\n".join(("    " if row.kind == "at load" else
                      "  " if row.kind in ("frontier", "summary") else "") + str(row.text)
                     for row in rows)
