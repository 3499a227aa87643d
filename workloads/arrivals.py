"""Arrival plans: when each request of a workload is sent. A plan is a small YAML/JSON file
beside the workload (``DIR/arrivals.yaml``)::

    kind: bursts        # trace | poisson | gamma | bursts | closed
    base_rps: 2
    multiplier: 10      # spike rate = base_rps * multiplier
    spike_s: 10
    period_s: 60        # a spike every 60 s, the first at first_spike_s (default period_s / 2)
    spacing: even       # even: evenly spaced arrivals (exact per-second counts); poisson: random

Kinds and their keys (all open-loop kinds also take ``max_requests``):

- ``trace``: the log's own times (``trace_offset_s``). ``window_start_s`` / ``window_end_s``
  choose a part of the trace; then either ``time_scale`` (multiply offsets: 0.5 plays twice as
  fast) or ``fit_window_s`` (scale the chosen part to last W seconds); ``loop: true`` repeats it
  until the run's duration.
- ``poisson``: ``rate_rps``: exponential gaps.
- ``gamma``: ``rate_rps`` and ``cv``: gamma-distributed gaps with that coefficient of variation
  (burstiness; 1 is Poisson, above 1 burstier, below 1 more regular).
- ``bursts``: as above: rate ``base_rps``, ``multiplier`` times higher for ``spike_s`` seconds
  every ``period_s`` seconds.
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

from workloads.errors import PlanError

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


@dataclass(frozen=True)
class BurstsPlan:
    base_rps: float
    multiplier: float
    spike_s: float
    period_s: float
    first_spike_s: float | None = None  # default: period_s / 2
    spacing: str = "poisson"
    max_requests: int | None = None
    kind: str = "bursts"

    def validate(self) -> None:
        _positive(self, "base_rps", "multiplier", "spike_s", "period_s")
        if self.spike_s > self.period_s:
            raise PlanError(f"bursts plan: spike_s ({self.spike_s}) longer than period_s "
                            f"({self.period_s})")
        if self.spacing not in ("poisson", "even"):
            raise PlanError(f"bursts plan: spacing {self.spacing!r} not one of poisson, even")
        if self.first_spike_s is not None and self.first_spike_s < 0:
            raise PlanError("bursts plan: first_spike_s must be >= 0")

    @property
    def first_spike(self) -> float:
        return self.period_s / 2 if self.first_spike_s is None else self.first_spike_s

    def rate_at(self, t: float) -> float:
        """The planned arrival rate (requests/s) at ``t`` seconds into the run."""
        if t >= self.first_spike and (t - self.first_spike) % self.period_s < self.spike_s:
            return self.base_rps * self.multiplier
        return self.base_rps


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
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PlanError(f"{path}: cannot read arrival plan: {exc}") from exc
    return plan_from_dict(data)


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
    times, span = times * scale, span * scale
    if plan.loop:
        if duration_s is None:
            raise PlanError("trace plan: loop needs a duration")
        loops = int(np.ceil(duration_s / span))
        _check_size(loops * times.size)
        times = np.concatenate([times + i * span for i in range(loops)])
        rows = np.tile(rows, loops)
    return rows, times


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
        times = _synthetic_times(plan, duration_s, rng)
        rows = np.arange(times.size) % len(workload)
    keep = times < duration_s if duration_s is not None else np.ones(times.size, dtype=bool)
    rows, times = rows[keep], times[keep]
    order = np.argsort(times, kind="stable")
    frame = pd.DataFrame({"request_index": rows[order].astype("int64"),
                          "offset_s": times[order].astype("float64")})
    if plan.max_requests is not None:
        frame = frame.iloc[: plan.max_requests]
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
    peak = plan.base_rps * plan.multiplier
    _check_size(max(peak, plan.base_rps) * duration_s)
    edges = [0.0]
    start = plan.first_spike
    while start < duration_s:
        edges += [start, min(start + plan.spike_s, duration_s)]
        start += plan.period_s
    edges.append(duration_s)
    segments = []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        if b > a:
            segments.append(_uniform_segment(rng, a, b, plan.rate_at(a),
                                             even=plan.spacing == "even"))
    return np.concatenate(segments) if segments else np.empty(0)
