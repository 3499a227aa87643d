"""Decision-grade study figures: steady state, cluster-bootstrap intervals, the verdict.

Pure numpy/pandas over a step's cohort (the requests sent in its measured window); the study
roll-up (:mod:`dashboards.analysis.study`) calls these. Definitions (``docs/METRICS-STUDIES.md``,
"Studies: intervals"):

- **Steady state** (:func:`mser_truncation`, :func:`steady_state`): MSER-5 (White 1997; the
  warm-up rule Hoad, Robinson and Davies (2010) found best of 44) on the step's own series: each
  ok request's TTFT in send order (batches of 5 requests), and, given at least
  :data:`MIN_SECOND_POINTS` seconds, completions per second and the server's waiting queue per
  second (batches of 1 s). For each series the truncation ``d*`` minimises
  ``sum_{j>d}(Z_j - mean_d)^2 / (k - d)^2`` over the batch means ``Z``; the window starts at the
  latest cut of the series (never before ``warmup_s``). ``d*`` is searched over the first half
  of the series, as the method prescribes; a series whose ``d*`` lands on that half-way bound was
  still moving there (MSER's own rule for a run too short to reach steady state): the step is
  **unsettled**, keeps its fixed window, and says which series and where MSER stopped.
- **Intervals** (:func:`point_figures`): a two-stage cluster bootstrap, :data:`BOOTSTRAP` draws
  with the study's seed: draw the repeats with replacement, then each drawn repeat's requests
  with replacement (both at once, as multinomial counts: vectorised, no Python loop over draws).
  Latency percentiles are the weighted inverse CDF of the drawn requests (ITL: of their gaps,
  each gap weighing as its request was drawn); the error rate the
  drawn failed / (ok + failed); throughput (achieved, goodput, output tokens) the repeat's own
  figure (ok / completion span) times its drawn 1 s completion bins over its mean bin (a block
  bootstrap in time: arrival noise stays in, which a request draw alone would lose); the
  achieved / offered ratio varies with the repeat draw only. Interval: the 2.5% and 97.5%
  quantiles of the draws (95%). With one repeat the first stage draws that one: the interval
  then holds within-run noise only, and says so (``repeats`` 1).
- **Knee and max sustainable load** (:func:`capacity_intervals`): recomputed on every draw's
  curve (the same draw index at every load). Max sustainable load: the point figure is the
  highest sustainable load; its interval runs from the 2.5% quantile of the draws' highest
  sustainable load to the 97.5% quantile of the draws' lowest failing load above it, so it holds
  both the noise and the gap the steps leave (the true limit lies between the last step that held
  and the first that did not); in a rate study with a load that saturated the server, a draw
  also fails every load above its own throughput ceiling (:func:`throughput_ceiling`). Knee:
  the 2.5-97.5% quantiles of the draws' knees, widened to half the gap to the measured loads on
  either side of the load it bends at (the resolution of the steps is part of its
  uncertainty).
- **Verdict** (:func:`verdict`): for a pair of configurations, the ratio of max sustainable loads
  ``B / A`` with the interval ``[lo_B / hi_A, hi_B / lo_A]``; at each load both measured, the
  change of each SLO and throughput figure ``B - A`` with the 2.5-97.5% quantiles of the
  difference of independent draws, and ``B / A - 1`` with those of the draws' ratio
  (:func:`relative_interval`); "within noise" when the difference's interval holds zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from collectors.itl_gaps import gaps_by_row
from collectors.schemas import GENERATOR_OUTCOMES, OUTCOME_OK, OUTCOMES

MSER_BATCH = 5
MIN_SECOND_POINTS = 30  # per-second series shorter than this are not judged
MIN_BATCHES_LEFT = 5  # MSER never truncates to fewer batch means than this
BOOTSTRAP = 400  # draws per point
KNEE_DRAWS = 200  # draws whose curves are searched for a knee
CONFIDENCE = 0.95
_NS = 1_000_000_000
_MAX_CELLS = 4_000_000  # draws x requests held at once (int64: 32 MB)
LATENCY_TAGS = ("ttft", "tpot", "e2e")  # one value per request; ITL: every gap (itl_gaps)
INTERVAL_PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}
ROLLUP_PERCENTILES = ("p50", "p95", "p99")
THROUGHPUTS = ("achieved_req_per_s", "goodput_req_per_s", "output_tok_per_s")
MIN_UNITS = 5  # a figure drawn over units (tasks): no interval over fewer
MIN_TAIL_UNITS = 4  # ... nor over fewer units beyond its percentile (min_units)
ERROR_CLASSES = tuple(o for o in OUTCOMES if o != OUTCOME_OK and o not in GENERATOR_OUTCOMES)


# ---------------------------------------------------------------------------------- steady state


def mser_truncation(values: Sequence[float] | np.ndarray, batch: int = MSER_BATCH
                    ) -> tuple[int, bool]:
    """MSER-``batch`` on a series in time order: (observations to cut, settled).

    The truncation ``d*`` is searched over the first half of the batch means, as the method
    prescribes (its score grows unreliable as the tail it averages shrinks: a few homogeneous
    last batches can win); a ``d*`` on that boundary means the series was still moving at the
    step's middle: not settled, and the step too short to say where it would. NaN values are
    left out. Too short a series (fewer than ``2 * MIN_BATCHES_LEFT`` batches) is taken as
    settled with nothing cut: there is nothing to judge it on.
    """
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    k = x.size // batch
    if k < 2 * MIN_BATCHES_LEFT:
        return 0, True
    z = x[: k * batch].reshape(k, batch).mean(axis=1)
    # suffix sums give mean and squared deviation of z[d:] for every d at once
    tail = np.cumsum(z[::-1])[::-1]
    tail2 = np.cumsum((z * z)[::-1])[::-1]
    left = np.arange(k, 0, -1, dtype=np.float64)  # k - d
    sse = tail2 - tail * tail / left
    scores = np.maximum(sse, 0.0) / left**2
    half = k // 2
    d_star = int(np.argmin(scores[: half + 1]))
    return d_star * batch, d_star < half - 1


def per_second(times_ns: np.ndarray, values: np.ndarray | None, start_ns: int, end_ns: int
               ) -> np.ndarray:
    """Counts (``values`` None) or means of ``values`` per whole second of [start, end)."""
    seconds = int((end_ns - start_ns) // _NS)
    if seconds <= 0:
        return np.empty(0)
    index = ((times_ns - start_ns) // _NS).astype(np.int64)
    keep = (index >= 0) & (index < seconds)
    if values is None:
        return np.bincount(index[keep], minlength=seconds).astype(np.float64)
    sums = np.bincount(index[keep], weights=values[keep], minlength=seconds)
    counts = np.bincount(index[keep], minlength=seconds)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


@dataclass(frozen=True)
class SteadyState:
    """Where a step's measured window starts, and whether its series settled."""

    start_ns: int  # the window's start (the fixed one when unsettled)
    settled: bool
    cut_s: float  # seconds from the fixed window's start to where MSER would start it
    reasons: str  # the series that did not settle, and what MSER cut of each


def steady_state(requests: pd.DataFrame, window: tuple[int, int],
                 waiting: pd.DataFrame | None = None) -> SteadyState:
    """MSER-5 over the step's series in ``window`` (module docstring).

    ``requests``: the step's records (``sent_wall_ns``, ``outcome``, ``ttft_s``, ``e2e_s``);
    ``waiting``: the server's waiting queue (``wall_ns``, ``value``) or None.
    """
    start, end = window
    sent = requests["sent_wall_ns"].to_numpy(dtype=np.int64)
    in_window = (sent >= start) & (sent < end)
    cohort = requests[in_window]
    order = np.argsort(cohort["sent_wall_ns"].to_numpy(dtype=np.int64), kind="stable")
    cohort = cohort.iloc[order]
    cohort_sent = cohort["sent_wall_ns"].to_numpy(dtype=np.int64)
    ok = (cohort["outcome"] == "ok").to_numpy()
    ttft = cohort["ttft_s"].to_numpy(dtype=np.float64, na_value=np.nan)
    cuts: list[tuple[str, int, bool]] = []  # (series, cut at ns, settled)
    good = ok & np.isfinite(ttft)
    cut, settled = mser_truncation(ttft[good])
    cuts.append(("TTFT", int(cohort_sent[good][cut]) if cut else start, settled))
    e2e = np.nan_to_num(cohort["e2e_s"].to_numpy(dtype=np.float64, na_value=np.nan))
    done = cohort_sent + (e2e * _NS).astype(np.int64)
    series = [("completions/s", per_second(done[ok], None, start, end))]
    if waiting is not None and len(waiting):
        series.append(("server queue", per_second(
            waiting["wall_ns"].to_numpy(dtype=np.int64),
            waiting["value"].to_numpy(dtype=np.float64), start, end)))
    for name, values in series:
        if np.isfinite(values).sum() < MIN_SECOND_POINTS or not np.nanmax(values) >= 1:
            continue  # too short to judge, or no queue at all (a blip is not a trend)
        cut, settled = mser_truncation(values, batch=1)
        cuts.append((name, start + cut * _NS, settled))
    unsettled = [(n, c) for n, c, s in cuts if not s]
    latest = max(c for _, c, _ in cuts)
    cut_s = (latest - start) / _NS
    if unsettled:
        reasons = "; ".join(f"{n} did not settle (MSER would cut {(c - start) / _NS:.1f} s)"
                            for n, c in unsettled)
        return SteadyState(start, False, cut_s, reasons)
    # a per-second series' cut is judged on seconds, not requests: where the requests came in a
    # few bursts (the calls of a few agent tasks), a long quiet tail let it cut past most of
    # them, once past all. Half the requests is as far as MSER may cut (its first half).
    middle = int(cohort_sent[(cohort_sent.size - 1) // 2]) if cohort_sent.size else end
    if latest > middle:
        reasons = "; ".join(f"{n}: MSER would cut {(c - start) / _NS:.1f} s, past half the "
                            "step's requests" for n, c, _ in cuts if c > middle)
        return SteadyState(start, False, cut_s, reasons)
    return SteadyState(latest, True, cut_s, "")


# ------------------------------------------------------------------------------------ bootstrap


@dataclass
class Cohort:
    """One repeat's measured cohort at one load, as arrays (module docstring)."""

    latency: dict[str, np.ndarray]  # tag -> per-request value (NaN unless ok)
    ok: np.ndarray
    failed: np.ndarray
    good: np.ndarray  # ok and within every per-request SLO
    tokens: np.ndarray
    done_s: np.ndarray  # completion time, seconds (any origin)
    span_s: float  # completion span of the cohort (NaN with < 2 completions)
    offered_req_per_s: float = math.nan
    window_s: float = math.nan
    # every inter-token gap of the ok requests, and the request (row) each belongs to; None
    # where the cohort has no ``itl_s`` (a cohort cached before ITL intervals)
    itl_gaps: np.ndarray | None = None
    itl_row: np.ndarray | None = None
    # agent tasks: the times of the ok tasks that began in the window (the unit their draws
    # take); None where the cohort has none recorded (no tasks, or cached before task draws)
    task_s: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.ok.size)


def cohort_from_frame(cohort: pd.DataFrame, good: np.ndarray, span_s: float,
                      offered_req_per_s: float, window_s: float,
                      task_s: np.ndarray | None = None) -> Cohort:
    """A :class:`Cohort` from a cohort's request rows (``SUMMARY_COLUMNS``); ``task_s``: its
    ok tasks' times."""
    ok = (cohort["outcome"] == OUTCOME_OK).to_numpy()
    failed = cohort["outcome"].isin(ERROR_CLASSES).to_numpy()
    latency = {}
    for tag in LATENCY_TAGS:
        column = f"{tag}_s"
        if column not in cohort:
            continue
        array = cohort[column].to_numpy(dtype=np.float64, na_value=np.nan)
        latency[tag] = np.where(ok, array, np.nan)
    sent = cohort["sent_wall_ns"].to_numpy(dtype=np.float64) / _NS
    e2e = np.nan_to_num(cohort["e2e_s"].to_numpy(dtype=np.float64, na_value=np.nan))
    tokens = np.nan_to_num(cohort["output_tokens"].to_numpy(dtype=np.float64, na_value=np.nan))
    gaps = rows = None
    if "itl_s" in cohort:
        gaps, rows = gaps_by_row(cohort["itl_s"])
        keep = ok[rows] & np.isfinite(gaps)
        gaps, rows = gaps[keep], rows[keep]
    return Cohort(latency, ok, failed, np.asarray(good, dtype=bool), tokens, sent + e2e,
                  span_s, offered_req_per_s, window_s, gaps, rows, task_s)


def _weighted_quantile(sorted_values: np.ndarray, weights: np.ndarray, q: float) -> np.ndarray:
    """Per row of ``weights`` (draws x values, values sorted), the inverse-CDF ``q`` (0-1)."""
    if sorted_values.size == 0:
        return np.full(weights.shape[0], np.nan)
    cum = np.cumsum(weights, axis=1)
    total = cum[:, -1]
    target = q * total
    index = (cum < target[:, None]).sum(axis=1)
    out = sorted_values[np.minimum(index, sorted_values.size - 1)]
    return np.where(total > 0, out, np.nan)


def _bins(done_s: np.ndarray, mask: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Sums of ``weights`` (counts without) per 1 s bin of the completion span."""
    if done_s.size < 2:
        return np.zeros(1)
    lo, hi = float(done_s.min()), float(done_s.max())
    nbins = max(2, int(hi - lo))
    index = np.minimum(((done_s - lo) / max(hi - lo, 1e-9) * nbins).astype(np.int64), nbins - 1)
    w = mask.astype(np.float64) if weights is None else np.where(mask, weights, 0.0)
    return np.bincount(index, weights=w, minlength=nbins)


@dataclass
class Draws:
    """A point's bootstrap draws: figure -> array of :data:`BOOTSTRAP` values."""

    values: dict[str, np.ndarray] = field(default_factory=dict)

    def interval(self, name: str) -> tuple[float, float]:
        draws = self.values.get(name)
        if draws is None:
            return math.nan, math.nan
        return central_interval(draws, max(10, draws.size // 2))


def central_interval(draws: np.ndarray, least: int = 10) -> tuple[float, float]:
    """The :data:`CONFIDENCE` interval (2.5-97.5% quantiles) of the finite ``draws``; NaN where
    fewer than ``least`` are finite."""
    finite = draws[np.isfinite(draws)]
    if finite.size < least:
        return math.nan, math.nan
    tail = (1 - CONFIDENCE) / 2 * 100
    lo, hi = np.percentile(finite, [tail, 100 - tail])
    return float(lo), float(hi)


def min_units(pct: float) -> int:
    """The fewest units (tasks) a ``pct`` percentile's interval is drawn over: at least
    :data:`MIN_UNITS`, and :data:`MIN_TAIL_UNITS` beyond the percentile (a bootstrap never
    reaches past the largest unit: with fewer the upper end is the sample's and falls short)."""
    return max(MIN_UNITS, math.ceil(round(MIN_TAIL_UNITS / (1 - pct / 100), 6)))


def unit_quantile_draws(groups: Sequence[np.ndarray], multiplicity: np.ndarray,
                        rng: np.random.Generator, prefix: str,
                        pcts: Mapping[str, float] = INTERVAL_PERCENTILES
                        ) -> dict[str, np.ndarray]:
    """``<prefix>_<pct>_s`` draws of a figure with one value per unit (an agent task's time):
    each group's (repeat's) units drawn with replacement ``size x multiplicity`` times (the
    second stage of :func:`bootstrap_point`; ``multiplicity``: draws x groups), the weighted
    inverse-CDF percentile of the drawn units; none for a percentile whose units number fewer
    than :func:`min_units` (NaN values are left out)."""
    kept = [g[np.isfinite(g)] for g in groups]
    n = sum(g.size for g in kept)
    wanted = {pct: q for pct, q in pcts.items() if n and n >= min_units(q)}
    if not wanted:
        return {}
    values = np.concatenate(kept)
    order = np.argsort(values, kind="stable")
    weights = np.concatenate([
        rng.multinomial(g.size * multiplicity[:, i], np.full(g.size, 1.0 / g.size))
        if g.size else np.zeros((multiplicity.shape[0], 0), dtype=np.int64)
        for i, g in enumerate(kept)], axis=1)[:, order]
    return {f"{prefix}_{pct}_s": _weighted_quantile(values[order], weights, q / 100)
            for pct, q in wanted.items()}


def bootstrap_point(cohorts: Sequence[Cohort], draws: int = BOOTSTRAP,
                    rng: np.random.Generator | None = None) -> Draws:
    """Cluster-bootstrap draws of every figure of one (configuration, load) point."""
    rng = rng or np.random.default_rng(0)
    out = Draws()
    cohorts = [c for c in cohorts if c.n]
    if not cohorts:
        return out
    r = len(cohorts)
    multiplicity = rng.multinomial(r, np.full(r, 1.0 / r), size=draws)  # draws x repeats
    # stage two: each repeat's requests, drawn (n_c x multiplicity) times, as counts
    total = sum(c.n for c in cohorts)
    chunk = max(1, min(draws, _MAX_CELLS // max(total, 1)))
    pieces: dict[str, list[np.ndarray]] = {}
    for begin in range(0, draws, chunk):
        rows = slice(begin, min(draws, begin + chunk))
        weights = np.concatenate([
            rng.multinomial(c.n * multiplicity[rows, i], np.full(c.n, 1.0 / c.n))
            for i, c in enumerate(cohorts)], axis=1)
        for name, values in _request_figures(cohorts, weights).items():
            pieces.setdefault(name, []).append(values)
    out.values = {name: np.concatenate(parts) for name, parts in pieces.items()}
    # throughput: each repeat's figure x its drawn completion bins / their mean
    for name, mask_of, weight_of in (
            ("achieved_req_per_s", lambda c: c.ok, None),
            ("goodput_req_per_s", lambda c: c.good, None),
            ("output_tok_per_s", lambda c: c.ok, lambda c: c.tokens)):
        num = np.zeros(draws)
        den = np.zeros(draws)
        for i, c in enumerate(cohorts):
            if not c.span_s == c.span_s:
                continue
            bins = _bins(c.done_s, mask_of(c), None if weight_of is None else weight_of(c))
            figure = float((bins.sum()) / c.span_s)
            mean = bins.mean()
            m = multiplicity[:, i]
            drawn = rng.multinomial(bins.size * np.maximum(m, 1), np.full(bins.size,
                                                                          1 / bins.size))
            ratio = (drawn @ bins) / (np.maximum(m, 1) * bins.size) / mean if mean > 0 else (
                np.ones(draws))
            num += m * c.span_s * figure * ratio
            den += m * c.span_s
        out.values[name] = np.where(den > 0, num / np.maximum(den, 1e-12), np.nan)
    achieved = np.array([c.ok.sum() / c.span_s if c.span_s == c.span_s else np.nan
                         for c in cohorts])
    offered = np.array([c.offered_req_per_s for c in cohorts])
    spans = np.array([c.span_s if c.span_s == c.span_s else 0.0 for c in cohorts])
    windows = np.array([c.window_s for c in cohorts])
    if np.isfinite(offered).all() and np.isfinite(achieved).all():
        out.values["achieved_ratio"] = (multiplicity @ (achieved * spans)) / np.maximum(
            multiplicity @ spans, 1e-12) / np.maximum(
            (multiplicity @ (offered * windows)) / np.maximum(multiplicity @ windows, 1e-12),
            1e-12)
    if all(c.task_s is not None for c in cohorts):  # agent tasks: drawn per task, last (the
        # other figures keep the draws they had before)
        out.values.update(unit_quantile_draws([c.task_s for c in cohorts  # type: ignore[misc]
                                               ], multiplicity, rng, "task"))
    return out


def _request_figures(cohorts: Sequence[Cohort], weights: np.ndarray) -> dict[str, np.ndarray]:
    figures: dict[str, np.ndarray] = {}
    for tag in LATENCY_TAGS:
        if not all(tag in c.latency for c in cohorts):
            continue
        values = np.concatenate([c.latency[tag] for c in cohorts])
        finite = np.isfinite(values)
        order = np.argsort(values[finite], kind="stable")
        sorted_values = values[finite][order]
        w = weights[:, finite][:, order]
        for pct, q in INTERVAL_PERCENTILES.items():
            figures[f"{tag}_{pct}_s"] = _weighted_quantile(sorted_values, w, q / 100)
    itl = _itl_sorted(cohorts)
    if itl is not None:
        sorted_gaps, gap_rows = itl
        w = weights[:, gap_rows]  # each gap weighs as often as its request was drawn
        for pct, q in INTERVAL_PERCENTILES.items():
            figures[f"itl_{pct}_s"] = _weighted_quantile(sorted_gaps, w, q / 100)
    ok = np.concatenate([c.ok for c in cohorts]).astype(np.float64)
    failed = np.concatenate([c.failed for c in cohorts]).astype(np.float64)
    attempts = weights @ (ok + failed)
    with np.errstate(invalid="ignore", divide="ignore"):
        figures["error_rate"] = np.where(attempts > 0, (weights @ failed) / attempts, np.nan)
    return figures


def _itl_sorted(cohorts: Sequence[Cohort]) -> tuple[np.ndarray, np.ndarray] | None:
    """Every cohort's gaps sorted, and each one's request as a column of the draws' weights
    (None unless every cohort has gaps). ITL's percentiles are over gaps, not requests, so a
    request is drawn with all its gaps (a cluster): the interval holds that a slow request's
    gaps come together. Past one gap per request the sorted gaps are thinned to every k-th
    (:func:`thin_sorted`), which keeps every quantile to within one request's share."""
    if not cohorts or any(c.itl_gaps is None or c.itl_row is None for c in cohorts):
        return None
    offsets = np.cumsum([0, *(c.n for c in cohorts)])[:-1]
    gaps = np.concatenate([c.itl_gaps for c in cohorts if c.itl_gaps is not None])
    rows = np.concatenate([c.itl_row + off for c, off in zip(cohorts, offsets, strict=True)
                           if c.itl_row is not None])
    if gaps.size == 0:
        return None
    order = np.argsort(gaps, kind="stable")
    keep = thin_sorted(gaps.size, int(offsets[-1] + cohorts[-1].n))
    return gaps[order][keep], rows[order][keep]


def thin_sorted(size: int, limit: int) -> np.ndarray:
    """Positions of at most ``limit`` (at least 1) evenly spaced items of a sorted array of
    ``size``: every k-th, so the kept items' quantiles are the whole array's to 1/limit."""
    step = max(1, math.ceil(size / max(limit, 1)))
    return np.arange(0, size, step)


# ------------------------------------------------------------------------------ per point, curve


def draw_sustainable(draws: Draws, slo: Mapping[str, Any], load_kind: str,
                     ratio: float = 0.95) -> np.ndarray:
    """Per draw: every SLO held (and, for rate steps, achieved >= ``ratio`` x offered)."""
    n = next(iter(draws.values.values())).size if draws.values else 0
    held = np.ones(n, dtype=bool)
    pct = slo.get("percentile", "p95")
    for tag in (*LATENCY_TAGS, "itl", "task"):
        limit = slo.get(f"{tag}_ms")
        if limit is None:
            continue
        values = draws.values.get(f"{tag}_{pct}_s")
        if values is None:
            # a cohort cached before ITL draws, or task times with no draws (too few tasks,
            # cached before task draws): judged on the point only (the caller's)
            if tag in ("itl", "task"):
                continue
            return np.zeros(n, dtype=bool)
        held &= values <= float(limit) / 1e3
    errors = draws.values.get("error_rate")
    if errors is not None:
        held &= errors <= float(slo.get("error_rate", 0.01))
    if load_kind == "rate":
        achieved = draws.values.get("achieved_ratio")
        if achieved is not None:
            held &= achieved >= ratio
    return held


def throughput_ceiling(achieved: Sequence[float] | np.ndarray,
                       saturated: Sequence[bool] | np.ndarray,
                       achieved_draws: np.ndarray | None = None
                       ) -> tuple[float, np.ndarray | None]:
    """The most the server delivered, once some load saturated it (rate steps): (the point
    figure, its draws), NaN and None while no load saturated.

    ``achieved``: each load's achieved req/s; ``saturated``: each load whose achieved fell
    below 95% of its offered (the server fell behind); ``achieved_draws``: loads x draws.
    A load saturated shows the server's throughput ceiling (its queue never empties, so it
    completes at its capacity), which is far sharper than any one load's achieved / offered: no
    offered load above it is sustainable, however close to offered its own achieved came. Per
    draw: the highest achieved of that draw over every load (a load held delivered that much).
    """
    values = np.asarray(achieved, dtype=np.float64)
    if not np.asarray(saturated, dtype=bool).any() or not np.isfinite(values).any():
        return math.nan, None
    per_draw = None
    if achieved_draws is not None and achieved_draws.size:
        per_draw = np.nanmax(np.where(np.isfinite(achieved_draws), achieved_draws, -np.inf),
                             axis=0)
    return float(np.nanmax(values)), per_draw


def saturation_throughput(achieved: Sequence[float] | np.ndarray,
                          saturated: Sequence[bool] | np.ndarray,
                          achieved_draws: np.ndarray | None = None
                          ) -> tuple[float, np.ndarray | None]:
    """What the server completes once saturated (rate steps): the mean achieved req/s of the
    loads that saturated it, and per draw the same mean of that draw's achieved; NaN and None
    while no load saturated.

    Every saturated load completes at the server's capacity, so their mean estimates it without
    the upward pull of :func:`throughput_ceiling`'s maximum (the most of several noisy figures,
    whose bootstrap interval also misses from below: a maximum is the one statistic the
    bootstrap cannot draw). The open-loop knee is this figure (dashboards.analysis.study).
    """
    values = np.asarray(achieved, dtype=np.float64)
    mask = np.asarray(saturated, dtype=bool) & np.isfinite(values)
    if not mask.any():
        return math.nan, None
    per_draw = None
    if achieved_draws is not None and achieved_draws.size:
        per_draw = np.nanmean(achieved_draws[mask], axis=0)
    return float(values[mask].mean()), per_draw


def max_load_bounds(loads: np.ndarray, sustainable: np.ndarray) -> tuple[float, float]:
    """(highest sustainable load, lowest failing load above it): NaN where there is none."""
    if not sustainable.any():
        return math.nan, (float(loads.min()) if loads.size else math.nan)
    best = float(loads[sustainable].max())
    above = loads[(loads > best) & ~sustainable]
    return best, float(above.min()) if above.size else math.nan


def capacity_intervals(loads: Sequence[float] | np.ndarray,
                       sustainable: Sequence[bool] | np.ndarray,
                       sustainable_draws: np.ndarray, metric_draws: np.ndarray,
                       knee_load: float, max_load: float,
                       knee_of: Callable[[np.ndarray, np.ndarray], float],
                       knee_loads: Sequence[float] | np.ndarray | None = None
                       ) -> dict[str, float]:
    """Intervals of the max sustainable load and the knee from draws of every point.

    ``sustainable``: the point figures' flags per load; ``sustainable_draws`` and
    ``metric_draws``: loads x draws (the knee metric per draw); ``knee_load`` and ``max_load``:
    the point figures; ``knee_of(loads, latencies)``: the knee of one curve (the study's);
    ``knee_loads``: the knee curve's load axis where it is not ``loads`` (rate steps: the
    arrivals each load received, :func:`dashboards.analysis.study.knee_axis`).
    """
    x = np.asarray(loads, dtype=np.float64)
    order = np.argsort(x)
    x, sustainable_draws, metric_draws = x[order], sustainable_draws[order], metric_draws[order]
    kx = x if knee_loads is None else np.asarray(knee_loads, dtype=np.float64)[order]
    flags = np.asarray(sustainable, dtype=bool)[order]
    tail = (1 - CONFIDENCE) / 2 * 100
    out = dict.fromkeys(("max_load_lo", "max_load_hi", "knee_lo", "knee_hi"), math.nan)
    if x.size == 0 or sustainable_draws.shape[1] == 0:
        return out
    lows, highs = [], []
    for b in range(sustainable_draws.shape[1]):
        low, high = max_load_bounds(x, sustainable_draws[:, b])
        lows.append(low if low == low else 0.0)
        highs.append(high if high == high else (low if low == low else x.min()))
    if max_load == max_load:
        _, first_fail = max_load_bounds(x, flags)
        out["max_load_lo"] = min(float(np.percentile(lows, tail)), max_load)
        upper = float(np.percentile(highs, 100 - tail))
        # the limit is at least the last step that held, so never below it
        out["max_load_hi"] = max(upper, max_load)
        if first_fail != first_fail:  # no step failed: the limit is above the sweep
            out["max_load_hi"] = math.inf
    if knee_load == knee_load:
        knees = []
        for b in range(min(metric_draws.shape[1], KNEE_DRAWS)):
            column = metric_draws[:, b]
            if np.isfinite(column).sum() >= 3:
                knees.append(knee_of(kx, column))
        knees_arr = np.asarray(knees, dtype=np.float64)
        knees_arr = knees_arr[np.isfinite(knees_arr)]
        ks = np.sort(kx)
        at = int(np.argmin(np.abs(ks - knee_load)))
        below = (ks[at] - ks[at - 1]) / 2 if at > 0 else 0.0
        above = (ks[at + 1] - ks[at]) / 2 if at + 1 < ks.size else 0.0
        lo, hi = ((float(np.percentile(knees_arr, tail)), float(np.percentile(knees_arr,
                                                                             100 - tail)))
                  if knees_arr.size >= 10 else (knee_load, knee_load))
        out["knee_lo"] = min(lo, knee_load - below)
        out["knee_hi"] = max(hi, knee_load + above)
    return out


# -------------------------------------------------------------------------------------- verdict


def generator_limited(rows: pd.DataFrame) -> np.ndarray:
    """Rows whose step the load generator limited (their ``validity``:
    :func:`dashboards.analysis.study.step_validity`)."""
    if "validity" not in rows:
        return np.zeros(len(rows), dtype=bool)
    return (rows["validity"].fillna("valid") == "generator_limited").to_numpy(dtype=bool)



def ratio_interval(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[float, float, float]:
    """(B / A, lo, hi) of two configurations' max sustainable loads (module docstring)."""
    value_a, value_b = a["max_sustainable_load"], b["max_sustainable_load"]
    if not (value_a == value_a and value_b == value_b) or value_a <= 0:
        return math.nan, math.nan, math.nan
    lo_a, hi_a = a.get("max_load_lo", value_a), a.get("max_load_hi", value_a)
    lo_b, hi_b = b.get("max_load_lo", value_b), b.get("max_load_hi", value_b)
    lo = lo_b / hi_a if hi_a and hi_a == hi_a else math.nan
    hi = hi_b / lo_a if lo_a and lo_a == lo_a and lo_a > 0 else math.inf
    return value_b / value_a, lo, hi


def difference_interval(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """2.5-97.5% quantiles of ``b - a`` over independent draws (NaN where too few)."""
    n = min(a.size, b.size)
    return central_interval(b[:n] - a[:n])


def relative_interval(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """2.5-97.5% quantiles of ``b / a - 1`` over independent draws (NaN where too few)."""
    n = min(a.size, b.size)
    with np.errstate(divide="ignore", invalid="ignore"):
        return central_interval(b[:n] / a[:n] - 1)


def within_noise(lo: float, hi: float) -> bool:
    return bool(lo == lo and hi == hi and lo <= 0 <= hi)


def ratio_undecided(lo: float, hi: float) -> bool:
    """Whether a ratio interval of :func:`ratio_interval` holds 1. Its ends are open: ``hi``
    is B's lowest failing load over A's highest held one, so ``hi == 1`` says B failed a load A
    held (B sustains less); ``lo == 1`` the other way round."""
    return bool(lo == lo and hi == hi and lo < 1 < hi)


def above_sweep(capacity: Mapping[str, Any]) -> bool:
    """The configuration held every load it measured: its limit lies above its sweep."""
    hi = capacity.get("max_load_hi", math.nan)
    return bool(hi is not None and hi == math.inf)


def format_ratio(name_a: str, name_b: str, ratio: tuple[float, float, float],
                 above: tuple[bool, bool] | None = None) -> str:
    """ "seqs-32 sustains 2.9x the load of seqs-8 [2.6, 3.2]" (or "within noise"); where one
    limit lies above its sweep the ratio is a bound, and the sentence says which way.
    ``above``: whether A's and B's limits lie above their sweeps (:func:`above_sweep`); left
    out, read off the ratio (a 0 lower end: A's; an infinite upper end: B's), which a lower
    end of 0 of B's own limit, or of A's, reads wrongly."""
    value, lo, hi = ratio
    if value != value:
        return f"{name_b} vs {name_a}: no max sustainable load to compare"
    a_above, b_above = above if above is not None else (lo == 0, math.isinf(hi))
    if a_above and lo == 0 and math.isfinite(hi):  # A held every load: B / A is at most hi
        if hi <= 1:
            return (f"{name_b} sustains less load than {name_a}: {name_b} failed a load "
                    f"{name_a} held, and {name_a}'s limit is above its sweep ({name_b} / "
                    f"{name_a} < {hi:.2f}x)")
        return (f"{name_b} sustains at most {hi:.2f}x the load of {name_a} ({name_a}'s limit "
                f"is above its sweep; within noise)")
    if b_above and math.isinf(hi) and lo > 0:  # B held every load: B / A is at least lo
        if lo >= 1:
            return (f"{name_b} sustains more load than {name_a}: {name_a} failed a load "
                    f"{name_b} held, and {name_b}'s limit is above its sweep ({name_b} / "
                    f"{name_a} > {lo:.2f}x)")
        return (f"{name_b} sustains at least {lo:.2f}x the load of {name_a} ({name_b}'s limit "
                f"is above its sweep; within noise)")
    noise = " (within noise)" if ratio_undecided(lo, hi) else ""
    interval = f"[{lo:.2f}, {'∞' if math.isinf(hi) else f'{hi:.2f}'}]"
    return f"{name_b} sustains {value:.2f}x the load of {name_a} {interval}{noise}"
