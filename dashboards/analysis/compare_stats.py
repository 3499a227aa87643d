"""Is a difference real: bootstrap intervals for the change of a figure between two samples.

A figure of a run (P95 TTFT, error rate, throughput) is an estimate from a finite number of
requests; two runs of one configuration never give the same number. :func:`compare_figure` puts
an interval around the change from baseline A to candidate B by resampling each side's raw
per-request values (the nonparametric bootstrap, percentile method, the two samples resampled
independently) and gives a verdict:

- ``worse`` / ``better``: the whole interval lies on one side of zero **and** the point change is
  at least ``min_effect`` (a difference too small to matter is not reported, however sure);
- ``within noise`` otherwise.

Several figures are judged at once, so the intervals are simultaneous: each is drawn at
``1 - (1 - level) / m`` for ``m`` figures (Bonferroni), so that two runs of one configuration
come out "within noise" on *every* figure in about ``level`` of repeats, not on each figure alone.

Resampling without the n x draws cost. A bootstrap replicate of a quantile only needs the k-th
smallest of n resampled values, and resampling with replacement draws n indices uniformly from
1..n: the k-th smallest index is ``ceil(n * U(k))`` with ``U(k) ~ Beta(k, n - k + 1)``, the k-th
order statistic of n uniforms. So a replicate is one Beta draw and one lookup in the sorted
sample: exactly the distribution :func:`scipy.stats.bootstrap` samples (quantile method
``inverted_cdf``), in O(n log n + draws) instead of O(n x draws), which keeps a million-request
step under a second. The test suite checks the two agree. Proportions (error rate) resample as
``Binomial(n, p) / n`` and counts over a window (throughput) as ``Poisson(count)``, the same idea.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

Verdict = Literal["worse", "better", "within noise", "no data"]
# "higher" is worse for latencies and error rates, "lower" is worse for throughput.
WorseWhen = Literal["higher", "lower"]

DEFAULT_LEVEL = 0.95
DEFAULT_DRAWS = 4000
# a change smaller than this share (relative figures) is "within noise" even when it is sure
DEFAULT_MIN_EFFECT = 0.02
# for rates (error rate), changes are absolute: 0.5 percentage points
DEFAULT_MIN_RATE_EFFECT = 0.005


@dataclass(frozen=True)
class FigureChange:
    """One figure compared between baseline A and candidate B.

    ``change`` is relative (B / A - 1) for latencies and throughputs and absolute (B - A) for
    rates (``relative`` says which); ``low``/``high`` bound it at the simultaneous level.
    """

    figure: str
    a: float
    b: float
    change: float
    low: float
    high: float
    n_a: int
    n_b: int
    relative: bool
    verdict: Verdict
    level: float


def simultaneous_level(level: float, figures: int) -> float:
    """The per-figure confidence level that makes ``figures`` intervals hold together."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return 1.0 - (1.0 - level) / max(int(figures), 1)


def quantile_replicates(
    values: np.ndarray, q: float, draws: int, rng: np.random.Generator
) -> np.ndarray:
    """Bootstrap replicates of the ``q`` quantile (0..1) of ``values`` (NaN dropped).

    Exactly the distribution of ``np.quantile(resample, q, method="inverted_cdf")`` over
    resamples with replacement of the same size (see the module docstring).
    """
    ordered = np.sort(values[~np.isnan(values)])
    n = ordered.size
    if n == 0:
        return np.full(draws, math.nan)
    k = min(max(math.ceil(n * q), 1), n)  # 1-based rank of the inverted_cdf quantile
    u = rng.beta(k, n - k + 1, size=draws)
    index = np.clip(np.ceil(u * n).astype(np.int64) - 1, 0, n - 1)
    return ordered[index]


def proportion_replicates(
    successes: int, n: int, draws: int, rng: np.random.Generator
) -> np.ndarray:
    """Bootstrap replicates of a proportion ``successes / n``."""
    if n <= 0:
        return np.full(draws, math.nan)
    return rng.binomial(n, successes / n, size=draws) / n


def count_replicates(count: float, draws: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap replicates of an event count over a fixed window (Poisson)."""
    return rng.poisson(max(count, 0.0), size=draws).astype(np.float64)


def verdict_of(
    change: float, low: float, high: float, worse_when: WorseWhen, min_effect: float
) -> Verdict:
    """``worse``/``better`` when the interval excludes 0 and the change is big enough to matter."""
    if any(math.isnan(x) for x in (change, low, high)):
        return "no data"
    if abs(change) < min_effect or low <= 0.0 <= high:
        return "within noise"
    higher = low > 0.0
    return "worse" if higher == (worse_when == "higher") else "better"


def _no_data(figure: str, n_a: int, n_b: int, relative: bool, level: float) -> FigureChange:
    nan = math.nan
    return FigureChange(figure, nan, nan, nan, nan, nan, n_a, n_b, relative, "no data", level)


def _interval(replicates: np.ndarray, level: float) -> tuple[float, float]:
    good = replicates[np.isfinite(replicates)]
    if good.size == 0:
        return math.nan, math.nan
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(good, [tail, 1.0 - tail])
    return float(low), float(high)


def compare_quantile(
    figure: str,
    a: np.ndarray,
    b: np.ndarray,
    q: float,
    *,
    level: float,
    worse_when: WorseWhen = "higher",
    min_effect: float = DEFAULT_MIN_EFFECT,
    draws: int = DEFAULT_DRAWS,
    rng: np.random.Generator,
) -> FigureChange:
    """The ``q`` quantile of B relative to A's: B / A - 1 with its interval."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    a = a[~np.isnan(a)]
    b = b[~np.isnan(b)]
    if a.size == 0 or b.size == 0:
        return _no_data(figure, int(a.size), int(b.size), True, level)
    point_a = float(np.quantile(a, q))
    point_b = float(np.quantile(b, q))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = quantile_replicates(b, q, draws, rng) / quantile_replicates(a, q, draws, rng)
        change = point_b / point_a - 1.0 if point_a > 0 else math.nan
    low, high = _interval(ratio - 1.0, level)
    return FigureChange(figure, point_a, point_b, change, low, high, int(a.size), int(b.size),
                        True, verdict_of(change, low, high, worse_when, min_effect), level)


def compare_proportion(
    figure: str,
    a_hits: int,
    a_n: int,
    b_hits: int,
    b_n: int,
    *,
    level: float,
    min_effect: float = DEFAULT_MIN_RATE_EFFECT,
    draws: int = DEFAULT_DRAWS,
    rng: np.random.Generator,
) -> FigureChange:
    """A rate where higher is worse (error rate): B - A in absolute terms, with its interval."""
    if a_n <= 0 or b_n <= 0:
        return _no_data(figure, a_n, b_n, False, level)
    point_a, point_b = a_hits / a_n, b_hits / b_n
    diff = proportion_replicates(b_hits, b_n, draws, rng) - proportion_replicates(
        a_hits, a_n, draws, rng)
    low, high = _interval(diff, level)
    change = point_b - point_a
    return FigureChange(figure, point_a, point_b, change, low, high, a_n, b_n, False,
                        verdict_of(change, low, high, "higher", min_effect), level)


def compare_rate(
    figure: str,
    a_count: float,
    a_window_s: float,
    b_count: float,
    b_window_s: float,
    *,
    level: float,
    n_a: int,
    n_b: int,
    min_effect: float = DEFAULT_MIN_EFFECT,
    draws: int = DEFAULT_DRAWS,
    rng: np.random.Generator,
    scale_a: float = 1.0,
    scale_b: float = 1.0,
) -> FigureChange:
    """A throughput (events / window, higher is better): B / A - 1 with a Poisson interval.

    ``scale_*`` turns a request count into what is reported (e.g. output tokens per request),
    so that tokens/s varies with the number of requests, not with each token independently.
    """
    if a_window_s <= 0 or b_window_s <= 0 or a_count <= 0:
        return _no_data(figure, n_a, n_b, True, level)
    point_a = a_count * scale_a / a_window_s
    point_b = b_count * scale_b / b_window_s
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (count_replicates(b_count, draws, rng) * scale_b / b_window_s) / (
            count_replicates(a_count, draws, rng) * scale_a / a_window_s)
    low, high = _interval(ratio - 1.0, level)
    change = point_b / point_a - 1.0
    return FigureChange(figure, point_a, point_b, change, low, high, n_a, n_b, True,
                        verdict_of(change, low, high, "lower", min_effect), level)
