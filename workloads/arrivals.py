"""Arrival plans: when each request of a workload is sent. A plan is a small YAML/JSON file
beside the workload (``DIR/arrivals.yaml``)::

    kind: bursts        # trace | poisson | gamma | bursts | closed
    base_rps: 2
    multiplier: 10      # spike rate = base_rps * multiplier (or peak_rps: 20)
    spike_s: 10
    period_s: 60        # a spike every 60 s, the first at first_spike_s (default period_s / 2)
    spacing: even       # even: evenly spaced arrivals (exact per-second counts); poisson: random;
                        # gamma: gamma gaps with coefficient of variation cv

Kinds and their keys (all open-loop kinds also take ``max_requests``):

- ``trace``: the log's own times (``trace_offset_s``). ``window_start_s`` / ``window_end_s``
  choose a part of the trace; then either ``time_scale`` (multiply offsets: 0.5 plays twice as
  fast) or ``fit_window_s`` (scale the chosen part to last W seconds); ``loop: true`` repeats it
  until the run's duration.
- ``poisson``: ``rate_rps``: exponential gaps.
- ``gamma``: ``rate_rps`` and ``cv``: gamma-distributed gaps with that coefficient of variation
  (burstiness; 1 is Poisson, above 1 burstier, below 1 more regular).
- ``bursts``: as above: rate ``base_rps``, ``multiplier`` times higher (or ``peak_rps``) for
  ``spike_s`` seconds every ``period_s`` seconds. ``shape``: ``step`` (the rate jumps) or ``ramp``
  (up over ``ramp_up_s``, down over ``ramp_down_s``; default half the spike each: a triangle).
  ``count``: how many spikes (default: every period to the end); ``count: 1`` is a single spike
  at ``first_spike_s`` and needs no ``period_s``. ``spike_mix``: the spike's own bucket shares
  (``100/0/0``: short prompts only) while the base load keeps the workload's mix. ``spacing:
  gamma`` with ``cv`` makes both base and spike arrivals gamma-distributed (CV 1 is Poisson).
- ``closed``: ``concurrency`` users sending back to back (``think_time_s`` between): no schedule.

``schedule(plan, workload, duration_s, seed)`` gives the open-loop schedule: a DataFrame with
``request_index`` (row of the workload to send) and ``offset_s`` (seconds from the run's start),
sorted by ``offset_s``. Synthetic kinds walk the workload in order, wrapping around; ``trace``
sends each row at its own (scaled) time. Same inputs and seed, same schedule.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from workloads.buckets import BUCKETS, parse_shares
from workloads.errors import PlanError, WorkloadError
from workloads.yaml_lines import key_lines, locate, yaml_error_line

MAX_ARRIVALS = 20_000_000  # a schedule bigger than this is a mistake in the plan


@dataclass(frozen=True)
class TracePlan:
    time_scale: float | None = None
    fit_window_s: float | None = None
    window_start_s: float = 0.0
    window_end_s: float | None = None
    loop: bool = False
    max_requests: int | None = None
    kind: str = "trace"

    def validate(self) -> None:
        if self.time_scale is not None and self.fit_window_s is not None:
            raise PlanError("trace plan: give time_scale or fit_window_s, not both")
        _positive(self, "time_scale", "fit_window_s")
        if self.window_start_s < 0:
            raise PlanError(f"trace plan: window_start_s must be >= 0, got {self.window_start_s}")
        if self.window_end_s is not None and self.window_end_s <= self.window_start_s:
            raise PlanError("trace plan: window_end_s must be after window_start_s")


@dataclass(frozen=True)
class PoissonPlan:
    rate_rps: float
    max_requests: int | None = None
    kind: str = "poisson"

    def validate(self) -> None:
        _positive(self, "rate_rps")


@dataclass(frozen=True)
class GammaPlan:
    rate_rps: float
    cv: float = 1.0
    max_requests: int | None = None
    kind: str = "gamma"

    def validate(self) -> None:
        _positive(self, "rate_rps", "cv")


SPIKE_SHAPES = ("step", "ramp")
SPACINGS = ("poisson", "even", "gamma")


@dataclass(frozen=True)
class BurstsPlan:
    base_rps: float
    spike_s: float
    multiplier: float | None = None  # spike rate = base_rps * multiplier ...
    peak_rps: float | None = None  # ... or given directly
    period_s: float | None = None  # required unless count == 1
    first_spike_s: float | None = None  # default: period_s / 2 (0 for a single spike: give it)
    shape: str = "step"
    ramp_up_s: float | None = None  # ramp only; default spike_s / 2
    ramp_down_s: float | None = None  # ramp only; default spike_s / 2
    count: int | None = None  # number of spikes; None: one every period_s to the end
    spike_mix: str | None = None  # bucket shares of the spike's arrivals, e.g. "100/0/0"
    spacing: str = "poisson"
    cv: float = 1.0  # gamma spacing only
    max_requests: int | None = None
    kind: str = "bursts"

    def validate(self) -> None:
        _positive(self, "base_rps", "multiplier", "peak_rps", "spike_s", "period_s", "cv")
        if (self.multiplier is None) == (self.peak_rps is None):
            raise PlanError("bursts plan: give the spike's height as multiplier or peak_rps "
                            "(one of them)")
        if self.shape not in SPIKE_SHAPES:
            raise PlanError(f"bursts plan: shape {self.shape!r} is not one of "
                            f"{list(SPIKE_SHAPES)}")
        if self.spacing not in SPACINGS:
            raise PlanError(f"bursts plan: spacing {self.spacing!r} is not one of "
                            f"{list(SPACINGS)}")
        if self.count is not None and (isinstance(self.count, bool)
                                       or not isinstance(self.count, int) or self.count < 1):
            raise PlanError(f"bursts plan: count must be an integer >= 1, got {self.count!r}")
        if self.period_s is None and self.count != 1:
            raise PlanError("bursts plan: period_s is required (only a single spike, count: 1, "
                            "goes without)")
        if self.period_s is not None and self.spike_s > self.period_s:
            raise PlanError(f"bursts plan: spike_s ({self.spike_s}) is longer than period_s "
                            f"({self.period_s})")
        if self.first_spike_s is not None and (
                not isinstance(self.first_spike_s, (int, float)) or self.first_spike_s < 0):
            raise PlanError(f"bursts plan: first_spike_s must be a number >= 0, got "
                            f"{self.first_spike_s!r}")
        if self.first_spike_s is None and self.period_s is None:
            raise PlanError("bursts plan: first_spike_s is required for a single spike "
                            "(count: 1): when it starts, in seconds from the run's start")
        for name in ("ramp_up_s", "ramp_down_s"):
            value = getattr(self, name)
            if value is None:
                continue
            if self.shape != "ramp":
                raise PlanError(f"bursts plan: {name} needs shape: ramp (shape is "
                                f"{self.shape!r})")
            if not isinstance(value, (int, float)) or value < 0:
                raise PlanError(f"bursts plan: {name} must be a number >= 0, got {value!r}")
        if self.shape == "ramp" and self.ramp_up + self.ramp_down > self.spike_s + 1e-9:
            raise PlanError(f"bursts plan: ramp_up_s + ramp_down_s ({self.ramp_up:g} + "
                            f"{self.ramp_down:g}) is longer than spike_s ({self.spike_s:g})")
        if self.spike_mix is not None:
            self.spike_shares()

    @property
    def peak(self) -> float:
        """The spike's (top) arrival rate, requests/s."""
        if self.peak_rps is not None:
            return self.peak_rps
        assert self.multiplier is not None  # validate() requires one of the two
        return self.base_rps * self.multiplier

    @property
    def first_spike(self) -> float:
        if self.first_spike_s is not None:
            return float(self.first_spike_s)
        assert self.period_s is not None  # validate(): only a single spike has no period
        return float(self.period_s) / 2

    @property
    def ramp_up(self) -> float:
        if self.shape != "ramp":
            return 0.0
        return self.spike_s / 2 if self.ramp_up_s is None else float(self.ramp_up_s)

    @property
    def ramp_down(self) -> float:
        if self.shape != "ramp":
            return 0.0
        return self.spike_s / 2 if self.ramp_down_s is None else float(self.ramp_down_s)

    def spike_shares(self) -> dict[str, float] | None:
        """The spike's bucket shares (``spike_mix``), or None: the workload's own mix."""
        if self.spike_mix is None:
            return None
        try:
            shares = parse_shares(str(self.spike_mix))
        except (ValueError, WorkloadError) as exc:
            raise PlanError(f"bursts plan: spike_mix {self.spike_mix!r}: {exc}; expected "
                            "short/medium/long shares like 100/0/0") from exc
        unknown = sorted(set(shares) - set(BUCKETS))
        if unknown or any(v < 0 for v in shares.values()) or sum(shares.values()) <= 0:
            raise PlanError(f"bursts plan: spike_mix {self.spike_mix!r}: expected non-negative "
                            f"shares of {list(BUCKETS)} like 100/0/0")
        total = sum(shares.values())
        return {k: v / total for k, v in shares.items() if v > 0}

    def spikes(self, duration_s: float) -> list[tuple[float, float]]:
        """Each spike as (start, end) seconds from the run's start, cut at ``duration_s``."""
        out: list[tuple[float, float]] = []
        start = self.first_spike
        while start < duration_s and (self.count is None or len(out) < self.count):
            out.append((start, min(start + self.spike_s, duration_s)))
            if self.period_s is None:
                break
            start += self.period_s
        return out

    def rate_at(self, t: float) -> float:
        """The planned arrival rate (requests/s) at ``t`` seconds into the run."""
        for start, _ in self.spikes(t + self.spike_s + 1.0):
            into = t - start
            if 0 <= into < self.spike_s:
                return self._spike_rate(into)
        return self.base_rps

    def _spike_rate(self, into: float) -> float:
        up, down, rise = self.ramp_up, self.ramp_down, self.peak - self.base_rps
        if up and into < up:
            return self.base_rps + rise * into / up
        if down and into > self.spike_s - down:
            return self.base_rps + rise * (self.spike_s - into) / down
        return self.peak

    def rate_knots(self, duration_s: float) -> tuple[np.ndarray, np.ndarray]:
        """The planned rate as a piecewise-linear curve through (time, rate) knots, from 0 to at
        least ``duration_s``; a step is two knots at one time."""
        times, rates = [0.0], [self.base_rps]
        for start, _ in self.spikes(duration_s):
            end = start + self.spike_s
            times += [start, start + self.ramp_up, end - self.ramp_down, end]
            rates += [self.base_rps, self.peak, self.peak, self.base_rps]
        times.append(max(duration_s, times[-1]))
        rates.append(self.base_rps)
        return np.asarray(times, dtype=np.float64), np.asarray(rates, dtype=np.float64)


@dataclass(frozen=True)
class ClosedPlan:
    concurrency: int
    think_time_s: float = 0.0
    kind: str = "closed"

    def validate(self) -> None:
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise PlanError(f"closed plan: concurrency must be an integer >= 1, got "
                            f"{self.concurrency!r}")
        if self.think_time_s < 0:
            raise PlanError("closed plan: think_time_s must be >= 0")


Plan = TracePlan | PoissonPlan | GammaPlan | BurstsPlan | ClosedPlan

PLAN_KINDS: dict[str, type] = {
    "trace": TracePlan,
    "poisson": PoissonPlan,
    "gamma": GammaPlan,
    "bursts": BurstsPlan,
    "closed": ClosedPlan,
}
OPEN_LOOP_KINDS = ("trace", "poisson", "gamma", "bursts")


def _positive(plan: Any, *names: str) -> None:
    for name in names:
        value = getattr(plan, name)
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            raise PlanError(f"{plan.kind} plan: {name} must be a number > 0, got {value!r}")


def plan_from_dict(data: dict[str, Any]) -> Plan:
    """A plan from its dict form; errors name unknown kinds/keys and list the valid ones."""
    if not isinstance(data, dict) or "kind" not in data:
        raise PlanError(f"an arrival plan needs 'kind', one of {list(PLAN_KINDS)}; got {data!r}")
    kind = data["kind"]
    cls = PLAN_KINDS.get(kind)
    if cls is None:
        raise PlanError(f"unknown arrival plan kind {kind!r}; valid kinds: {list(PLAN_KINDS)}")
    valid = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise PlanError(f"{kind} plan: unknown key(s) {unknown}; valid keys: {valid}")
    try:
        plan = cls(**data)
    except TypeError as exc:  # a required key is missing
        raise PlanError(f"{kind} plan: {exc}; valid keys: {valid}") from exc
    plan.validate()
    return plan


def parse_plan_spec(spec: str) -> Plan:
    """``kind:key=value,...`` (as on the command line), e.g. ``trace:fit_window_s=120``."""
    kind, _, rest = spec.partition(":")
    data: dict[str, Any] = {"kind": kind.strip()}
    for pair in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = pair.partition("=")
        if not sep:
            raise PlanError(f"arrival plan {spec!r}: expected key=value, got {pair!r}")
        data[key.strip()] = _scalar(value.strip())
    return plan_from_dict(data)


def _scalar(text: str) -> Any:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return yaml.safe_load(text)  # true/false/null; anything else stays a string


def load_plan(path: str | Path) -> Plan:
    """The plan in a YAML file; errors read ``FILE:LINE: problem`` (the line of the key)."""
    try:
        text = Path(path).read_text()
        data = yaml.safe_load(text)
    except OSError as exc:
        raise PlanError(f"{path}: cannot read arrival plan: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise PlanError(yaml_error_line(path, exc)) from exc
    try:
        return plan_from_dict(data)
    except PlanError as exc:
        line = locate(str(exc), key_lines(text))
        raise PlanError(f"{path}{f':{line}' if line else ''}: {exc}") from None


def save_plan(plan: Plan, path: str | Path) -> Path:
    data = {"kind": plan.kind, **{k: v for k, v in asdict(plan).items()
                                  if k != "kind" and v is not None}}
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))
    return Path(path)


# ---------------------------------------------------------------------------------------------


def _check_size(expected: float) -> None:
    if expected > MAX_ARRIVALS:
        raise PlanError(f"plan would schedule about {expected:.0f} requests (> {MAX_ARRIVALS}); "
                        "lower the rate or duration, or set max_requests")


def _uniform_segment(rng: np.random.Generator, a: float, b: float, rate: float,
                     even: bool) -> np.ndarray:
    if even:
        return a + np.arange(int(np.ceil((b - a) * rate - 1e-9))) / rate
    return np.sort(rng.uniform(a, b, size=rng.poisson(rate * (b - a))))


def _trace_times(plan: TracePlan, workload: pd.DataFrame,
                 duration_s: float | None) -> tuple[np.ndarray, np.ndarray]:
    rows, times, span = trace_pass(plan, workload)
    if plan.loop:
        if duration_s is None:
            raise PlanError("trace plan: loop needs a duration")
        loops = int(np.ceil(duration_s / span))
        _check_size(loops * times.size)
        times = np.concatenate([times + i * span for i in range(loops)])
        rows = np.tile(rows, loops)
    return rows, times


def trace_pass(plan: TracePlan, workload: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, float]:
    """One pass of a trace plan: (workload rows, offsets from the pass start, the pass's length).

    A looping plan repeats this pass every ``span`` seconds (a soak generates pass after pass).
    """
    if "trace_offset_s" not in workload or workload["trace_offset_s"].isna().all():
        raise PlanError("trace plan: the workload has no trace times (its log had no timestamps);"
                        " use poisson, gamma, bursts or closed")
    offsets = workload["trace_offset_s"].to_numpy(dtype="float64")
    end = plan.window_end_s if plan.window_end_s is not None else np.inf
    rows = np.flatnonzero((offsets >= plan.window_start_s) & (offsets < end))
    if not rows.size:
        raise PlanError(f"trace plan: no request in the window [{plan.window_start_s}, {end}) s; "
                        f"the trace spans [{np.nanmin(offsets):.3f}, {np.nanmax(offsets):.3f}] s")
    rows = rows[np.argsort(offsets[rows], kind="stable")]
    times = offsets[rows] - plan.window_start_s
    # The part's length: to the window's end if given, else one mean gap past the last request.
    if np.isfinite(end):
        span = end - plan.window_start_s
    else:
        span = times[-1] + (times[-1] - times[0]) / max(times.size - 1, 1)
        span = span if span > 0 else 1.0
    scale = plan.fit_window_s / span if plan.fit_window_s else (plan.time_scale or 1.0)
    return rows, times * scale, float(span * scale)


def schedule(plan: Plan, workload: pd.DataFrame, duration_s: float | None,
             seed: int = 0) -> pd.DataFrame:
    """The open-loop schedule: [request_index, offset_s] sorted by offset_s, within duration_s
    (None: the whole trace, for ``trace`` plans only)."""
    if plan.kind == "closed":
        raise PlanError("closed plans have no schedule: run closed-loop with the plan's "
                        f"concurrency ({getattr(plan, 'concurrency', '?')}); open-loop kinds: "
                        f"{list(OPEN_LOOP_KINDS)}")
    if plan.kind not in OPEN_LOOP_KINDS:
        raise PlanError(f"unknown arrival plan kind {plan.kind!r}; valid: {list(PLAN_KINDS)}")
    if len(workload) == 0:
        raise PlanError("the workload is empty")
    if duration_s is not None and duration_s <= 0:
        raise PlanError(f"duration_s must be > 0, got {duration_s}")
    rng = np.random.default_rng(seed)
    if isinstance(plan, TracePlan):
        rows, times = _trace_times(plan, workload, duration_s)
    else:
        if duration_s is None:
            raise PlanError(f"{plan.kind} plan needs a duration")
        times = np.sort(_synthetic_times(plan, duration_s, rng))
        rows = spike_rows(plan, workload, times, rng)
    keep = times < duration_s if duration_s is not None else np.ones(times.size, dtype=bool)
    rows, times = rows[keep], times[keep]
    order = np.argsort(times, kind="stable")
    frame = pd.DataFrame({"request_index": rows[order].astype("int64"),
                          "offset_s": times[order].astype("float64")})
    max_requests = getattr(plan, "max_requests", None)  # every open-loop plan has one
    if max_requests is not None:
        frame = frame.iloc[:max_requests]
    return frame.reset_index(drop=True)


def _synthetic_times(plan: Plan, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    if isinstance(plan, PoissonPlan):
        _check_size(plan.rate_rps * duration_s)
        return _uniform_segment(rng, 0.0, duration_s, plan.rate_rps, even=False)
    if isinstance(plan, GammaPlan):
        _check_size(plan.rate_rps * duration_s)
        shape = 1.0 / plan.cv**2
        scale = 1.0 / (plan.rate_rps * shape)
        chunks, total = [], 0.0
        while total < duration_s:
            gaps = rng.gamma(shape, scale, size=max(1024, int(plan.rate_rps * duration_s * 0.2)))
            chunks.append(gaps)
            total += float(gaps.sum())
        return np.cumsum(np.concatenate(chunks))
    assert isinstance(plan, BurstsPlan)
    _check_size(max(plan.peak, plan.base_rps) * duration_s)
    if plan.shape == "step" and plan.spacing in ("even", "poisson"):
        # Piece by piece at constant rates: "even" then gives exact per-second counts.
        edges = [0.0]
        for start, end in plan.spikes(duration_s):
            edges += [start, end]
        edges.append(duration_s)
        segments = [_uniform_segment(rng, a, b, plan.rate_at(a), even=plan.spacing == "even")
                    for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]
        return np.concatenate(segments) if segments else np.empty(0)
    return _time_rescaled(*plan.rate_knots(duration_s), plan.spacing, plan.cv, rng)


def _time_rescaled(knot_t: np.ndarray, knot_r: np.ndarray, spacing: str, cv: float,
                   rng: np.random.Generator) -> np.ndarray:
    """Arrivals of a time-varying rate (piecewise linear through the knots): a unit-rate process
    (even, Poisson or gamma gaps with ``cv``) laid out on the cumulative planned count and mapped
    back to time, so a ramp's arrivals follow the ramp and gamma gaps keep their CV."""
    lengths = np.diff(knot_t)
    areas = 0.5 * (knot_r[:-1] + knot_r[1:]) * lengths
    cumulative = np.concatenate([[0.0], np.cumsum(areas)])
    total = float(cumulative[-1])
    if spacing == "even":
        counts = np.arange(int(np.ceil(total - 1e-9)), dtype=np.float64)
    elif spacing == "poisson":
        counts = np.sort(rng.uniform(0.0, total, size=rng.poisson(total)))
    else:
        shape = 1.0 / cv**2
        chunks, reached = [], 0.0
        while reached < total:
            gaps = rng.gamma(shape, 1.0 / shape, size=max(1024, int(total * 0.2)))
            chunks.append(gaps)
            reached += float(gaps.sum())
        counts = np.cumsum(np.concatenate(chunks))
        counts = counts[counts < total]
    seg = np.clip(np.searchsorted(cumulative, counts, side="right") - 1, 0, len(areas) - 1)
    start, rate0 = knot_t[seg], knot_r[seg]
    slope = np.divide(knot_r[seg + 1] - rate0, lengths[seg], out=np.zeros_like(start),
                      where=lengths[seg] > 0)
    into = counts - cumulative[seg]
    flat = np.abs(slope) < 1e-12
    root = np.sqrt(np.maximum(rate0**2 + 2 * slope * into, 0.0))
    offset = np.where(flat, into / np.where(rate0 > 0, rate0, 1.0),
                      (root - rate0) / np.where(flat, 1.0, slope))
    return start + offset


def spike_rows(plan: Plan, workload: pd.DataFrame, times: np.ndarray,
               rng: np.random.Generator) -> np.ndarray:
    """The workload row of each arrival: in send order over the whole workload, except arrivals
    inside a spike of a plan with ``spike_mix``, which take rows of the spike's buckets (drawn by
    its shares, each bucket walked in order)."""
    rows = np.arange(times.size) % len(workload)
    shares = plan.spike_shares() if isinstance(plan, BurstsPlan) else None
    if shares is None or not times.size:
        return rows
    in_spike = np.zeros(times.size, dtype=bool)
    for start, end in plan.spikes(float(times.max()) + 1.0):  # type: ignore[union-attr]
        in_spike |= (times >= start) & (times < end)
    if "bucket" not in workload:
        raise PlanError("bursts plan: spike_mix needs a workload with a bucket column")
    buckets = workload["bucket"].to_numpy()
    missing = [b for b in shares if not (buckets == b).any()]
    if missing:
        raise PlanError(f"bursts plan: spike_mix {plan.spike_mix!r} asks for {missing} but the "  # type: ignore[union-attr]
                        f"workload has no such rows (it has {sorted(set(buckets))})")
    rows[~in_spike] = np.arange(int((~in_spike).sum())) % len(workload)
    names = list(shares)
    drawn = rng.choice(len(names), size=int(in_spike.sum()), p=[shares[n] for n in names])
    spike = np.empty(drawn.size, dtype=np.int64)
    for i, name in enumerate(names):
        members = np.flatnonzero(buckets == name)
        picked = drawn == i
        spike[picked] = members[np.arange(int(picked.sum())) % members.size]
    rows[in_spike] = spike
    return rows
