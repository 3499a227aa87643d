"""``swarmload study plan STUDY.yaml [--budget 30m]``: every step and its estimated time, before
anything starts; with ``--budget`` the study is fitted to it and the plan says what it gave up.

    swarmload study plan infra/study/examples/sim-decision-grade.yaml
    swarmload study plan infra/study/examples/vllm-cpu-max-num-seqs.yaml --budget 20m
    swarmload study plan STUDY.yaml --budget 20m --measured results/studies/<dir>

The estimate: each server start (:data:`START_S`, each engine's own estimate, or the starts a
study measured, once per configuration, or per repeat with ``restart_between_repeats``), each
step's length plus :data:`STEP_OVERHEAD_S` (the Locust master and workers start and stop around
every step; rate steps also drain), every listed load x ``repeats``, and the refinement budget
(``refine.max_steps`` x ``repeats``). ``load.auto`` counts its probes at most (``max_steps``) and
its sweep (``around``).

A step's length: ``step_duration_s``; with ``precision`` it is sized from what the study measured
of the server (:class:`Measured`: ``study_state.json`` and ``study.json`` ``measured``, or
``--measured STUDY_DIR`` of an earlier study of the same server): long enough for
``half_width_pct`` at the measured noise (a 95% interval narrows as one over the square root of
the seconds behind it), between ``min_s`` and ``max_s``, and never shorter than
``min_e2e_multiple`` x the measured E2E P95 (:func:`floor_s`), not even to fit a budget. Before
anything is measured a precise step is planned at ``max_s``; ``study run`` measures the first
step and fits the budget again (:func:`fit_for_run`).

``--budget`` gives up, in this order and only as far as needed: refinement loads
(``refine.max_steps`` down to 2), repeats (down to 2), listed loads (down to 3 a configuration:
the interior load closest to its neighbours goes first; under ``load.auto`` its ``around``
fractions), the search (``refine.max_steps`` 0), loads (down to 2), repeats (down to 1), and only
then step length (``precision.max_s``, down to the longer of ``min_s`` and the E2E floor). It
prints what it gave up in one block and the interval half-width the study can then expect; write
the changes into the study file to run the fitted study.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from infra.study.spec import MIN_E2E_MULTIPLE, StudySpec, StudySpecError, load_study
from infra.targets.registry import ENGINES
from locustfiles.config import parse_duration

# seconds until a target serves: each engine's own estimate (infra.targets.engine.Engine.start_s)
START_S = {name: engine.start_s for name, engine in ENGINES.items()}
# master + workers start, schedule, stop, until the study measured its own (Measured): 13 s on
# 2 busy cores; 4-6 s on the 16-core GPU host (a 7B study on an H100, 2026-12-06)
STEP_OVERHEAD_S = 13.0
OVERHEADS_KEPT = 20  # the step overheads a study keeps (the latest), whose median it plans with
RATE_DRAIN_S = 4.0  # a rate step's requests still in flight after its schedule
STATE_KEY = "measured"  # study_state.json / study.json: what the study measured of its servers
MIN_KEPT_LOADS = (3, 2)  # listed loads a budget keeps per configuration, first and at the end


@dataclass(frozen=True)
class Measured:
    """What a study measured of its servers, kept in ``study_state.json`` (and ``study.json``)
    under ``measured``::

        {"starts": [{"config": "a", "target": "vllm", "seconds": 151.2}, ...],
         "step_overheads_s": [4.6, 5.1, ...],
         "configs": {"a": {"e2e_p95_s": {"24": 2.9, "72": 3.4},
                           "noise": {"metric": "ttft_p95", "bootstrap": 31.0, "parts": 12.0,
                                     "repeats": 50.0}}},
         "first": {"config": "a", "load": 24.0, "e2e_p95_s": 2.9, "noise": 31.0}}

    ``e2e_p95_s``: per load, the largest E2E P95 of its steps (the server's own timescale).
    ``noise``: the precision metric's noise as ``k``, the half-width of its 95% interval in % of
    its value times the square root of the measured window's seconds (a window of ``w`` s gives
    about ±k/sqrt(w) %), the largest seen: ``bootstrap`` (the requests of one repeat, all its
    parts), ``parts`` (the spread between the parts of one repeat), ``repeats`` (the spread
    between repeats of one load). ``first``: the study's first (configuration, load), frozen when
    it was measured: what ``--budget`` is fitted with, on the first run and on ``--resume``.
    ``step_overheads_s``: each step's seconds beyond its load (its wall time less its length,
    and the gap since the step before it), the latest :data:`OVERHEADS_KEPT`; their median
    replaces :data:`STEP_OVERHEAD_S` once measured."""

    e2e_p95_s: Mapping[str, Mapping[float, float]] = field(default_factory=dict)
    noise: Mapping[str, float] = field(default_factory=dict)  # config -> k
    starts: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    first: Mapping[str, Any] | None = None
    step_overheads_s: tuple[float, ...] = ()

    @classmethod
    def from_state(cls, data: Mapping[str, Any] | None) -> Measured:
        """From ``study_state.json``'s ``measured`` (None or a study before it: nothing)."""
        data = data or {}
        configs = data.get("configs") or {}
        starts: dict[str, tuple[float, ...]] = {}
        for start in data.get("starts") or []:
            starts[start["config"]] = (*starts.get(start["config"], ()), float(start["seconds"]))
        noise = {}
        for name, entry in configs.items():
            values = [v for k, v in (entry.get("noise") or {}).items()
                      if k != "metric" and isinstance(v, int | float) and v == v]
            if values:
                noise[name] = max(values)
        overheads = tuple(float(v) for v in data.get("step_overheads_s") or [])
        return cls({name: {float(load): float(v) for load, v in (entry.get("e2e_p95_s") or {}
                                                                   ).items()}
                    for name, entry in configs.items()}, noise, starts, data.get("first"),
                   overheads)

    @classmethod
    def from_study_dir(cls, study_dir: str | Path) -> Measured:
        """``study_state.json`` of a study folder; ValueError (one line) when it has none."""
        path = Path(study_dir) / "study_state.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{study_dir}: no readable study_state.json ({exc})") from None
        return cls.from_state(data.get(STATE_KEY))

    def fitting(self) -> Measured:
        """What ``--budget`` fits with: the first measurement for every configuration (fixed
        once taken, so a resumed study fits as it did) and every start measured."""
        first = self.first
        if not first:
            return Measured(starts=self.starts, step_overheads_s=self.step_overheads_s)
        return Measured({first["config"]: {float(first["load"]): float(first["e2e_p95_s"])}},
                        {first["config"]: float(first["noise"])} if first.get("noise") else {},
                        self.starts, first, self.step_overheads_s)

    def e2e(self, config: str, load: float | None) -> float | None:
        """The E2E P95 to expect at ``load`` (None: the largest measured): at a load measured
        or between two, the largest at it or below, or the power law ``e2e ~ load^g``
        through the measured loads beside it if larger; above every load measured, that law
        through the two highest, g kept within 0..1 (0 while the server keeps up, 1 once a
        closed loop's throughput is flat and each user more waits in line); under every
        load, the lowest measured; unmeasured, the study's first measurement (another
        configuration's), else unknown."""
        mine = self.e2e_p95_s.get(config) or {}
        if not mine:
            return float(self.first["e2e_p95_s"]) if self.first else None
        if load is None:
            return max(mine.values())
        below = {at: v for at, v in mine.items() if at <= load}
        if not below:
            return min(mine.values())
        top = max(below)
        above = [at for at in mine if at > top]
        pair = ((top, min(above)) if above else
                (max(at for at in mine if at < top), top) if len(mine) > 1 else None)
        if load == top or pair is None:
            return max(below.values())
        (low, high) = pair
        growth = min(max(math.log(mine[high] / mine[low]) / math.log(high / low), 0.0), 1.0)
        return max(max(below.values()), mine[top] * (load / top) ** growth)

    def noise_k(self, config: str) -> float | None:
        if config in self.noise:
            return self.noise[config]
        return float(self.first["noise"]) if self.first and self.first.get("noise") else None

    def start_s(self, config: str, target: str) -> float:
        """One start of ``config``: its measured mean, else :data:`START_S` of its kind."""
        mine = self.starts.get(config)
        if mine:
            return sum(mine) / len(mine)
        return START_S.get(target, 0.0)


NOTHING = Measured()


def e2e_multiple(spec: StudySpec) -> float:
    return spec.precision.min_e2e_multiple if spec.precision else MIN_E2E_MULTIPLE


def floor_s(spec: StudySpec, measured: Measured, config: str, load: float | None) -> float:
    """The shortest step at ``load``: ``min_e2e_multiple`` x the E2E P95 to expect there
    (0 before anything is measured)."""
    e2e = measured.e2e(config, load)
    return e2e_multiple(spec) * e2e if e2e else 0.0


def spread_k(values: list[float], windows: list[float]) -> float:
    """:attr:`Measured.noise`'s k from the spread of one figure over separate runs of one load
    (the parts of a repeat, or the repeats): the half-width of the 95% range of one run (1.96
    standard deviations) in % of their mean, times the square root of their mean window; NaN
    for fewer than two."""
    if len(values) < 2 or not all(v == v for v in values):
        return math.nan
    mean = sum(values) / len(values)
    if mean == 0:
        return math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return 1.96 * sd / abs(mean) * 100 * math.sqrt(sum(windows) / len(windows))


def window_s(spec: StudySpec, length_s: float) -> float:
    """The measured window of a step of ``length_s`` (warm-up and cool-down cut)."""
    return max(length_s - spec.warmup_s - spec.cooldown_s, 1e-9)


def needed_s(spec: StudySpec, k: float) -> float:
    """The step length whose window brings a noise of ``k`` (Measured.noise) to the asked
    half-width: the window goes as (k / half-width)^2."""
    assert spec.precision is not None
    return (k / spec.precision.half_width_pct) ** 2 + spec.warmup_s + spec.cooldown_s


def unit_seconds(spec: StudySpec, measured: Measured, config: str, load: float | None) -> float:
    """Seconds of load one (repeat, load) takes: ``step_duration_s``; with ``precision`` what
    the measured noise needs, within ``min_s`` .. ``max_s`` (``max_s`` before the noise is
    measured), and never under :func:`floor_s`."""
    if spec.precision is None:
        return spec.step_duration_s
    low = max(spec.precision.min_s, floor_s(spec, measured, config, load))
    k = measured.noise_k(config)
    need = spec.precision.max_s if k is None else needed_s(spec, k)
    return min(max(need, low), max(spec.precision.max_s, low))


@dataclass(frozen=True)
class PlannedStep:
    config: str
    repeat: int
    load: float | None  # None: a load the study finds as it goes (probe, refinement)
    phase: str  # sweep | probe | refine
    seconds: float  # its estimated wall time, start-up overhead included
    note: str = ""
    length_s: float = 0.0  # its load's seconds (step_duration_s, or the precise length)
    floor_s: float = 0.0  # the shortest it may be: min_e2e_multiple x the E2E P95 expected


def overhead_s(spec: StudySpec, measured: Measured = NOTHING) -> float:
    """A step's seconds beyond its load: the master and workers around it (the median the study
    measured, else :data:`STEP_OVERHEAD_S`), a rate step's drain (a measured overhead holds
    it already)."""
    if measured.step_overheads_s:
        return float(statistics.median(measured.step_overheads_s))
    return STEP_OVERHEAD_S + (RATE_DRAIN_S if spec.load.kind == "rate" else 0.0)


def plan_steps(spec: StudySpec, measured: Measured = NOTHING
               ) -> tuple[list[PlannedStep], float]:
    """(every step in run order with its estimate, server start-up seconds in all)."""
    steps: list[PlannedStep] = []
    starts = 0.0

    def step(config: str, repeat: int, load: float | None, phase: str,
             note: str = "") -> PlannedStep:
        length = unit_seconds(spec, measured, config, load)
        return PlannedStep(config, repeat, load, phase, length + overhead_s(spec, measured), note,
                           length,
                           floor_s(spec, measured, config, load))

    for config in spec.configurations:
        start = measured.start_s(config.name, config.target)
        starts += start * (spec.repeats if spec.restart_between_repeats else 1)
        if spec.load.auto is None:
            loads: list[float | None] = list(spec.steps_for(config))
        else:
            auto = spec.load.auto
            steps += [step(config.name, 1, None, "probe", "at most")
                      for _ in range(auto.max_steps)]
            loads = [None] * len(auto.around)
        for repeat in range(1, spec.repeats + 1):
            ordered = loads if repeat % 2 or spec.repeat_order != "alternate" else loads[::-1]
            steps += [step(config.name, repeat, load, "sweep") for load in ordered]
        if spec.refine is not None:
            for _ in range(spec.refine.max_steps):
                steps += [step(config.name, repeat, None, "refine", "at most")
                          for repeat in range(1, spec.repeats + 1)]
    return steps, starts


def total_seconds(spec: StudySpec, measured: Measured = NOTHING) -> float:
    steps, starts = plan_steps(spec, measured)
    return starts + sum(s.seconds for s in steps)


# ------------------------------------------------------------------------------------ budget


def thin_loads(loads: tuple[float, ...]) -> tuple[float, ...] | None:
    """``loads`` less the one that matters least (None: none can go): never the lowest or
    the highest (the range the curve spans); of the rest, the one whose neighbours are closest
    (on a log scale), whose loss leaves the smallest gap."""
    ordered = sorted(loads)
    candidates = list(range(1, len(ordered) - 1))
    if not candidates:
        return None
    gone = min(candidates, key=lambda i: (math.log(ordered[i + 1] / ordered[i - 1])
                                          if ordered[i - 1] > 0 else math.inf, -i))
    return tuple(v for i, v in enumerate(ordered) if i != gone)


def _fewer_refinements(spec: StudySpec, least: int) -> Iterator[StudySpec]:
    while spec.refine is not None and spec.refine.max_steps > least:
        spec = replace(spec, refine=replace(spec.refine, max_steps=spec.refine.max_steps - 1))
        yield spec


def _fewer_repeats(spec: StudySpec, least: int) -> Iterator[StudySpec]:
    while spec.repeats > least:
        spec = replace(spec, repeats=spec.repeats - 1)
        yield spec


def _fewer_loads(spec: StudySpec, least: int) -> Iterator[StudySpec]:
    """One load less at a time, from the configuration with the most (``load.auto``: one
    ``around`` fraction less), down to ``least`` each."""
    while True:
        if spec.load.auto is not None:
            around = spec.load.auto.around
            thinner = thin_loads(around) if len(around) > least else None
            if thinner is None:
                return
            spec = replace(spec, load=replace(spec.load, auto=replace(spec.load.auto,
                                                                      around=thinner)))
            yield spec
            continue
        configs = sorted(spec.configurations, key=lambda c: -len(spec.steps_for(c)))
        for config in configs:
            loads = spec.steps_for(config)
            thinner = thin_loads(loads) if len(loads) > least else None
            if thinner is not None:
                spec = replace(spec, configurations=tuple(
                    replace(c, steps=thinner) if c.name == config.name else c
                    for c in spec.configurations))
                yield spec
                break
        else:
            return


def _shorter_steps(spec: StudySpec, measured: Measured) -> Iterator[StudySpec]:
    """``precision.max_s`` lower, never under ``min_s`` nor the longest E2E floor."""
    precision = spec.precision
    if precision is None:
        return
    floor = max([floor_s(spec, measured, c.name, None) for c in spec.configurations] or [0.0])
    low, current = max(precision.min_s, floor), precision.max_s
    for share in (0.75, 0.5, 0.35, 0.25, 0.0):
        max_s = round(max(precision.max_s * share, low), 1)
        if max_s < current:
            current = max_s
            yield replace(spec, precision=replace(precision, max_s=max_s))


def fit_budget(spec: StudySpec, budget_s: float, measured: Measured = NOTHING
               ) -> tuple[StudySpec, list[str]]:
    """The study with as much given up (module docstring) as its estimate needs to fit
    ``budget_s`` (all of it when even that does not fit), and what was given up, one line
    each."""
    stages: list[Callable[[StudySpec], Iterator[StudySpec]]] = [
        lambda s: _fewer_refinements(s, 2), lambda s: _fewer_repeats(s, 2),
        lambda s: _fewer_loads(s, MIN_KEPT_LOADS[0]), lambda s: _fewer_refinements(s, 0),
        lambda s: _fewer_loads(s, MIN_KEPT_LOADS[1]), lambda s: _fewer_repeats(s, 1),
        lambda s: _shorter_steps(s, measured)]
    fitted = spec
    for stage in stages:
        for lower in stage(fitted):
            fitted = lower
            if total_seconds(fitted, measured) <= budget_s:
                break
        if total_seconds(fitted, measured) <= budget_s:
            break
    return fitted, given_up(spec, fitted)


def given_up(before: StudySpec, after: StudySpec) -> list[str]:
    """What ``after`` leaves out of ``before``, one line each."""
    notes = []
    if before.refine is not None and after.refine is not None and (
            after.refine.max_steps != before.refine.max_steps):
        notes.append(f"refine.max_steps {before.refine.max_steps} -> "
                     f"{after.refine.max_steps} (search loads per configuration, at most)")
    if after.repeats != before.repeats:
        notes.append(f"repeats {before.repeats} -> {after.repeats}")
    if before.load.auto is not None and after.load.auto is not None and (
            after.load.auto.around != before.load.auto.around):
        notes.append("load.auto.around " + ", ".join(
            f"{a:g}" for a in before.load.auto.around if a not in after.load.auto.around)
            + " (keeps " + ", ".join(f"{a:g}" for a in after.load.auto.around) + ")")
    for old, new in zip(before.configurations, after.configurations, strict=True):
        dropped = [v for v in before.steps_for(old) if v not in after.steps_for(new)]
        if dropped:
            notes.append(f"loads of {old.name}: " + ", ".join(f"{v:g}" for v in dropped)
                         + " (keeps " + ", ".join(f"{v:g}" for v in after.steps_for(new))
                         + f" {before.load.unit})")
    if before.precision and after.precision and after.precision.max_s != before.precision.max_s:
        notes.append(f"precision.max_s {before.precision.max_s:g} -> "
                     f"{after.precision.max_s:g} s")
    return notes


def expected_half_width(before: StudySpec, after: StudySpec,
                        measured: Measured = NOTHING) -> str:
    """The interval to expect at the longest step: with the noise measured, k over the square
    root of every repeat's window; before, how much wider than the file's (1 / sqrt(requests
    behind each figure))."""
    precision = before.precision
    ks = [k for c in after.configurations if (k := measured.noise_k(c.name)) is not None]
    if precision is not None and ks:
        worst = max(ks)
        length = min(unit_seconds(after, measured, c.name, None) for c in after.configurations)
        half = worst / math.sqrt(window_s(after, length))
        return (f"{precision.metric} interval of one repeat: about ±{half:.1f}% at the "
                f"noisiest load measured (the target is ±{precision.half_width_pct:g}%)")

    def requests(spec: StudySpec) -> float:
        length = spec.precision.max_s if spec.precision else spec.step_duration_s
        return spec.repeats * window_s(spec, length)

    factor = math.sqrt(requests(before) / requests(after))
    if precision is not None:
        return (f"{precision.metric} interval: about ±{precision.half_width_pct * factor:.1f}% "
                f"at a load that needed max_s (the target was ±{precision.half_width_pct:g}%)")
    return f"intervals about {factor:.2f}x as wide as the file's"


def floor_line(spec: StudySpec, measured: Measured) -> str:
    """What the budget kept: the step length and why."""
    multiple = e2e_multiple(spec)
    e2e = max((v for c in spec.configurations if (v := measured.e2e(c.name, None))),
              default=None)
    if spec.precision is None:
        kept = f"step_duration_s {spec.step_duration_s:g} s"
        if e2e:
            kept += f" ({spec.step_duration_s / e2e:.0f} x the E2E P95 measured, {e2e:g} s)"
        return f"kept: {kept}; a budget never shortens a step"
    if not e2e:
        return (f"kept: steps of {spec.precision.min_s:g}-{spec.precision.max_s:g} s; no step "
                f"will be shorter than {multiple:g} x the E2E P95, measured at the first step")
    floor = multiple * e2e
    above = (f", over precision.max_s {spec.precision.max_s:g} s: steps run at the floor"
             if floor > spec.precision.max_s else f"; precision.max_s {spec.precision.max_s:g} s")
    return (f"kept: no step shorter than {multiple:g} x E2E P95 ({e2e:.2f} s measured: "
            f"{floor:.0f} s){above}")


def fit_block(spec: StudySpec, fitted: StudySpec, budget_s: float,
              measured: Measured = NOTHING) -> list[str]:
    """The lines that say how the study fits ``budget_s``: what it gave up, what it kept,
    the estimate and the interval to expect."""
    need, got = total_seconds(spec, measured), total_seconds(fitted, measured)
    _steps, starts = plan_steps(fitted, measured)
    measured_starts = sum(1 for c in fitted.configurations if measured.starts.get(c.name))
    estimate = (f"estimate {got / 60:.1f} min (server starts {starts / 60:.1f} min, "
                f"{measured_starts} of {len(fitted.configurations)} measured)")
    if need <= budget_s:
        return [f"budget {budget_s / 60:g} min: fits as written; {estimate}"]
    notes = given_up(spec, fitted)
    lines = [f"budget {budget_s / 60:g} min: the study as written needs about {need / 60:.1f} "
             "min; given up, least needed first:"]
    lines += [f"  - {note}" for note in notes]
    lines += [f"  {floor_line(fitted, measured)}", f"  {estimate}",
              f"  {expected_half_width(spec, fitted, measured)}"]
    return lines


def fit_for_run(spec: StudySpec, budget_s: float, measured: Measured = NOTHING,
                strict: bool = True) -> tuple[StudySpec, list[str]]:
    """``swarmload study run --budget``: the study fitted to ``budget_s`` (:func:`fit_budget`,
    with the study's first measurement: :meth:`Measured.fitting`) and the lines that say what
    it gave up. When even the least study does not fit (steps are never shortened under their
    E2E floor to make it fit): ValueError (one line, for ``--budget``), or with ``strict``
    False (the study runs already: the first step measured a slower server than estimated, or
    ``--resume``) the least study and a line that says it runs over."""
    fitting = measured.fitting()
    fitted, _notes = fit_budget(spec, budget_s, fitting)
    need = total_seconds(fitted, fitting)
    lines = fit_block(spec, fitted, budget_s, fitting)
    if need > budget_s:
        lowest = [f"repeats {fitted.repeats}",
                  f"refine.max_steps {fitted.refine.max_steps if fitted.refine else 0}",
                  f"{min(len(fitted.steps_for(c)) for c in fitted.configurations)} loads"
                  if fitted.load.auto is None else f"{len(fitted.load.auto.around)} around"]
        if fitted.precision is not None:
            lowest.append(f"precision.max_s {fitted.precision.max_s:g}")
        problem = (f"got {budget_s / 60:g} min; this study needs at least {need / 60:.1f} min "
                   f"({', '.join(lowest)})")
        if strict:
            raise ValueError(f"{problem}; allowed: {math.ceil(need / 60)}m or more, or fewer "
                             "loads or configurations in the study file")
        lines.append(f"  over budget: {problem}; it goes on with the least study, its steps "
                     "no shorter than the E2E floor")
    return fitted, lines


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


def repeat_lines(spec: StudySpec, steps: pd.DataFrame) -> list[str]:
    """Repeat-to-repeat agreement, one load per configuration: the highest load the most
    repeats measured, each repeat's ``precision`` metric (without: TTFT at the SLO percentile)
    and achieved req/s (its parts' mean), and how far apart they are in % of their mean."""
    column = spec.precision.column if spec.precision else f"ttft_{spec.slo.percentile}_s"
    name = spec.precision.metric if spec.precision else f"ttft_{spec.slo.percentile}"
    figures = [(column, name, 1e3, "ms")] if column != "achieved_req_per_s" else []
    figures.append(("achieved_req_per_s", "achieved", 1.0, "req/s"))
    lines = []
    rows = steps[steps["bucket"] == "all"] if "bucket" in steps else steps
    for config, mine in rows.groupby("config", sort=False):
        repeats = mine.groupby("offered_load")["repeat"].nunique()
        if repeats.empty or repeats.max() < 2:
            continue
        load = max(repeats[repeats == repeats.max()].index)
        at = mine[mine["offered_load"] == load].groupby("repeat")[[f for f, *_ in figures]]
        means = at.mean()
        parts = []
        for figure, label, scale, unit in figures:
            values = means[figure].dropna()
            if len(values) < 2 or not values.mean():
                continue
            apart = (values.max() - values.min()) / abs(values.mean()) * 100
            shown = " / ".join(f"{v * scale:.{0 if scale > 1 else 1}f}" for v in values)
            parts.append(f"{label} {shown} {unit} ({apart:.1f}% apart)")
        if parts:
            lines.append(f"{config} at {load:g} {spec.load_unit}, {int(repeats.max())} "
                         f"repeats: " + "; ".join(parts))
    return lines


def format_plan(spec: StudySpec, measured: Measured = NOTHING) -> str:
    steps, starts = plan_steps(spec, measured)
    unit = spec.load_unit
    lines = [f"study {spec.name}: {len(spec.configurations)} configuration(s), repeats "
             f"{spec.repeats} ({spec.repeat_order}), {spec.load.kind} steps ({unit})"]
    lines.append(f"{'#':>4} {'configuration':<16} {'repeat':>6} {'load':>10} {'phase':<7} "
                 f"{'length':>7} {'est.':>7}")
    for number, step in enumerate(steps, 1):
        load = "found" if step.load is None else f"{step.load:g}"
        lines.append(f"{number:>4} {step.config:<16} {step.repeat:>6} {load:>10} "
                     f"{step.phase:<7} {step.length_s:>6.0f}s {step.seconds:>6.0f}s"
                     + (f"  ({step.note})" if step.note else ""))
    total = starts + sum(s.seconds for s in steps)
    shortest = starts + sum(s.seconds for s in steps if not s.note)
    lines.append(f"server starts {starts:.0f} s; {len(steps)} steps; estimate {total / 60:.1f} min"
                 + (f" (at least {shortest / 60:.1f} min: the search and probes may stop early)"
                    if shortest < total else ""))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="swarmload study plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study_file")
    parser.add_argument("--budget", default=None, metavar="DURATION",
                        help="fit the study into this long (30m, 1h, 900): give up search "
                        "loads, repeats and listed loads before step length, and say what")
    parser.add_argument("--measured", default=None, metavar="STUDY_DIR",
                        help="size steps and starts from what this study folder measured of "
                        "the server (its E2E P95, noise and start times)")
    args = parser.parse_args(argv)
    where = ""
    try:
        spec = load_study(args.study_file)
        where = "--measured"
        measured = NOTHING if args.measured is None else Measured.from_study_dir(args.measured)
        where = "--budget"
        budget = None if args.budget is None else parse_duration(args.budget)
    except StudySpecError as exc:
        print(f"swarmload study plan: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"swarmload study plan: {where}: {exc}", file=sys.stderr)
        return 2
    if budget is not None:
        fitted, _notes = fit_budget(spec, budget, measured)
        print(format_plan(fitted, measured))
        print("\n".join(fit_block(spec, fitted, budget, measured)))
        if total_seconds(fitted, measured) > budget:
            print(f"does not fit {budget / 60:g} min even so: fewer loads or configurations "
                  "are needed (steps are never shortened under their E2E floor)")
        return 0
    print(format_plan(spec, measured))
    return 0
