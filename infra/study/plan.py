"""``swarmload study plan STUDY.yaml [--budget 30m]``: every step and its estimated time, before
anything starts; with ``--budget`` the study is fitted to it and the plan says what it gave up.

    swarmload study plan infra/study/examples/sim-decision-grade.yaml
    swarmload study plan infra/study/examples/vllm-cpu-max-num-seqs.yaml --budget 20m

The estimate: each server start (:data:`START_S` per target kind, once per configuration, or per
repeat with ``restart_between_repeats``), each step's length (``step_duration_s``, or with
``precision`` ``min_s`` to ``max_s``) plus :data:`STEP_OVERHEAD_S` (the Locust master and workers
start and stop around every step; rate steps also drain), every listed load x ``repeats``, and
the refinement budget (``refine.max_steps`` x ``repeats``). ``load.auto`` counts its probes at
most (``max_steps``) and its sweep (``around``).

``--budget`` lowers, in this order and only as far as needed: ``precision.max_s`` (down to
``min_s``), ``refine.max_steps`` (down to 2, then 0), ``repeats`` (down to 2, then 1). It prints
what it changed and the interval half-width the study can then expect (intervals narrow as one
over the square root of the requests behind them); write the changes into the study file to run
the fitted study.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from infra.study.spec import StudySpec, StudySpecError, load_study
from locustfiles.config import parse_duration

START_S = {"sim": 3.0, "vllm-cpu": 120.0, "vllm": 150.0}  # seconds until a target serves
STEP_OVERHEAD_S = 13.0  # master + workers start, schedule, stop (measured on 2 busy cores)
RATE_DRAIN_S = 4.0  # a rate step's requests still in flight after its schedule


@dataclass(frozen=True)
class PlannedStep:
    config: str
    repeat: int
    load: float | None  # None: a load the study finds as it goes (probe, refinement)
    phase: str  # sweep | probe | refine
    seconds: float  # its estimated wall time, start-up overhead included
    note: str = ""


def step_seconds(spec: StudySpec, longest: bool = False) -> float:
    """One step's wall time: its load (``precision.max_s`` when ``longest``) and overhead."""
    length = spec.step_duration_s
    if spec.precision is not None and longest:
        length = spec.precision.max_s
    drain = RATE_DRAIN_S if spec.load.kind == "rate" else 0.0
    return length + STEP_OVERHEAD_S + drain


def plan_steps(spec: StudySpec) -> tuple[list[PlannedStep], float]:
    """(every step in run order with its estimate, server start-up seconds in all)."""
    steps: list[PlannedStep] = []
    starts = 0.0
    each = step_seconds(spec, longest=True)
    for config in spec.configurations:
        start = START_S.get(config.target, 0.0)
        starts += start * (spec.repeats if spec.restart_between_repeats else 1)
        if spec.load.auto is None:
            loads: list[float | None] = list(spec.steps_for(config))
        else:
            auto = spec.load.auto
            steps += [PlannedStep(config.name, 1, None, "probe", each, "at most")
                      for _ in range(auto.max_steps)]
            loads = [None] * len(auto.around)
        for repeat in range(1, spec.repeats + 1):
            ordered = loads if repeat % 2 or spec.repeat_order != "alternate" else loads[::-1]
            steps += [PlannedStep(config.name, repeat, load, "sweep", each) for load in ordered]
        if spec.refine is not None:
            for _ in range(spec.refine.max_steps):
                steps += [PlannedStep(config.name, repeat, None, "refine", each, "at most")
                          for repeat in range(1, spec.repeats + 1)]
    return steps, starts


def total_seconds(spec: StudySpec) -> float:
    steps, starts = plan_steps(spec)
    return starts + sum(s.seconds for s in steps)


def fit_budget(spec: StudySpec, budget_s: float) -> tuple[StudySpec, list[str]]:
    """The study lowered (module docstring) until its estimate fits ``budget_s``, and what
    changed; the first change that fits wins."""
    notes: list[str] = []
    if total_seconds(spec) <= budget_s:
        return spec, notes
    if spec.precision is not None and spec.precision.max_s > spec.precision.min_s:
        lowered = spec
        for max_s in sorted({spec.precision.min_s * k for k in (1, 2, 3)}, reverse=True):
            if max_s >= spec.precision.max_s:
                continue
            lowered = replace(spec, precision=replace(spec.precision, max_s=max_s))
            if total_seconds(lowered) <= budget_s:
                break
        notes.append(f"precision.max_s {spec.precision.max_s:g} -> "
                     f"{lowered.precision.max_s:g} s" if lowered.precision else "")
        spec = lowered
    first = spec
    for max_steps in (2, 0):
        if total_seconds(spec) <= budget_s or spec.refine is None:
            break
        if spec.refine.max_steps > max_steps:
            spec = replace(spec, refine=replace(spec.refine, max_steps=max_steps))
    if first.refine is not None and spec.refine is not None and (
            spec.refine.max_steps != first.refine.max_steps):
        notes.append(f"refine.max_steps {first.refine.max_steps} -> {spec.refine.max_steps}")
    for repeats in (2, 1):
        if total_seconds(spec) <= budget_s:
            break
        if spec.repeats > repeats:
            spec = replace(spec, repeats=repeats)
    if spec.repeats != first.repeats:
        notes.append(f"repeats {first.repeats} -> {spec.repeats}")
    if total_seconds(spec) > budget_s:
        notes.append(f"still {total_seconds(spec) / 60:.1f} min: fewer loads or configurations "
                     "are needed to fit")
    return spec, notes


def expected_half_width(before: StudySpec, after: StudySpec) -> str:
    """How much wider the intervals get (1 / sqrt(requests behind each figure))."""
    def requests(spec: StudySpec) -> float:
        length = spec.precision.max_s if spec.precision else spec.step_duration_s
        return spec.repeats * max(length - spec.warmup_s - spec.cooldown_s, 1e-9)

    factor = math.sqrt(requests(before) / requests(after))
    if before.precision is not None:
        return (f"{before.precision.metric} interval: about ±"
                f"{before.precision.half_width_pct * factor:.1f}% at a load that needed "
                f"max_s (the target was ±{before.precision.half_width_pct:g}%)")
    return f"intervals about {factor:.2f}x as wide as the file's"


def fit_for_run(spec: StudySpec, budget_s: float) -> tuple[StudySpec, str]:
    """``swarmload study run --budget``: the study fitted to ``budget_s`` (:func:`fit_budget`)
    and the line that says what it lowered; ValueError (one line, for ``--budget``) when even
    the lowest settings do not fit."""
    fitted, notes = fit_budget(spec, budget_s)
    need = total_seconds(fitted)
    if need > budget_s:
        lowest = [f"repeats {fitted.repeats}",
                  f"refine.max_steps {fitted.refine.max_steps if fitted.refine else 0}"]
        if fitted.precision is not None:
            lowest.append(f"precision.max_s {fitted.precision.max_s:g}")
        raise ValueError(f"got {budget_s / 60:g} min; this study needs at least {need / 60:.1f} "
                         f"min ({', '.join(lowest)}); allowed: {math.ceil(need / 60)}m or more, "
                         "or fewer loads or configurations in the study file")
    if not notes:
        return spec, f"budget {budget_s / 60:g} min: fits as written (estimate {need / 60:.1f} min)"
    return fitted, (f"budget {budget_s / 60:g} min: {'; '.join(n for n in notes if n)} (estimate "
                    f"{need / 60:.1f} min); {expected_half_width(spec, fitted)}")


def _half_width(record: dict[str, Any], value: str, lo: str, hi: str) -> str:
    v, low, high = (float(record.get(k, math.nan)) for k in (value, lo, hi))
    if not (v == v and low == low and high == high) or v == 0:
        return "-"
    if math.isinf(high):
        return "open above (no load failed)"
    return f"±{(high - low) / 2 / abs(v) * 100:.1f}%"


def precision_lines(spec: StudySpec, capacity: pd.DataFrame, points: pd.DataFrame
                    ) -> list[str]:
    """What precision the study reached, per configuration: the half-widths of its max
    sustainable load and knee intervals and, with ``precision``, the widest of its metric's
    intervals over the loads (each in % of the value)."""
    lines = []
    for record in capacity.to_dict("records"):
        max_load = _half_width(record, "max_sustainable_load", "max_load_lo", "max_load_hi")
        parts = [f"max sustainable load {max_load}",
                 f"knee {_half_width(record, 'knee_load', 'knee_lo', 'knee_hi')}"]
        precision = spec.precision
        if precision is not None and f"{precision.column}_lo" in points:
            mine = points[(points["config"] == record["config"]) & (points["bucket"] == "all")]
            widths = ((mine[f"{precision.column}_hi"] - mine[f"{precision.column}_lo"]) / 2
                      / mine[precision.column]).abs()
            if widths.notna().any():
                at = widths.idxmax()
                parts.append(f"{precision.metric} at worst ±{widths[at] * 100:.1f}% (at "
                             f"{mine.loc[at, 'offered_load']:g}; the target was "
                             f"±{precision.half_width_pct:g}%)")
        lines.append(f"{record['config']}: " + ", ".join(parts))
    return lines


def format_plan(spec: StudySpec) -> str:
    steps, starts = plan_steps(spec)
    unit = spec.load.unit
    lines = [f"study {spec.name}: {len(spec.configurations)} configuration(s), repeats "
             f"{spec.repeats} ({spec.repeat_order}), {spec.load.kind} steps ({unit})"]
    lines.append(f"{'#':>4} {'configuration':<16} {'repeat':>6} {'load':>10} {'phase':<7} "
                 f"{'est.':>7}")
    for number, step in enumerate(steps, 1):
        load = "found" if step.load is None else f"{step.load:g}"
        lines.append(f"{number:>4} {step.config:<16} {step.repeat:>6} {load:>10} "
                     f"{step.phase:<7} {step.seconds:>6.0f}s"
                     + (f"  ({step.note})" if step.note else ""))
    total = starts + sum(s.seconds for s in steps)
    shortest = starts + sum(step_seconds(spec) for s in steps if not s.note)
    lines.append(f"server starts {starts:.0f} s; {len(steps)} steps; estimate {total / 60:.1f} min"
                 + (f" (at least {shortest / 60:.1f} min: precise steps stop at min_s, the "
                    "search and probes may stop early)" if shortest < total else ""))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="swarmload study plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study_file")
    parser.add_argument("--budget", default=None, metavar="DURATION",
                        help="fit the study into this long (30m, 1h, 900): lower precision, "
                        "refinement and repeats, and say what it reached")
    args = parser.parse_args(argv)
    try:
        spec = load_study(args.study_file)
        budget = None if args.budget is None else parse_duration(args.budget)
    except (StudySpecError, ValueError) as exc:
        where = "--budget" if args.budget is not None and not isinstance(exc, StudySpecError) \
            else ""
        print(f"swarmload study plan: {where + ': ' if where else ''}{exc}", file=sys.stderr)
        return 2
    if budget is not None:
        fitted, notes = fit_budget(spec, budget)
        print(format_plan(fitted))
        if notes:
            print(f"to fit {budget / 60:g} min: " + "; ".join(n for n in notes if n))
            print(expected_half_width(spec, fitted))
        else:
            print(f"fits {budget / 60:g} min as written")
        return 0
    print(format_plan(spec))
    return 0
