"""Steady state (MSER-5), the cluster bootstrap and the verdict on series of known shape."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dashboards.analysis import study_stats as ss

_NS = 1_000_000_000


def test_mser_cuts_a_warm_up_where_it_ends_and_keeps_a_flat_series_whole() -> None:
    rng = np.random.default_rng(1)
    flat = rng.normal(1.0, 0.1, 600)
    cut, settled = ss.mser_truncation(flat)
    assert settled and cut <= 30
    warming = np.concatenate([np.linspace(3.0, 1.0, 150), rng.normal(1.0, 0.1, 450)])
    cut, settled = ss.mser_truncation(warming)
    assert settled and 100 <= cut <= 175  # the ramp (150 observations) is cut, not the rest


def test_mser_calls_a_series_that_keeps_growing_unsettled() -> None:
    rng = np.random.default_rng(2)
    growing = np.linspace(0.1, 5.0, 600) + rng.normal(0, 0.05, 600)
    _cut, settled = ss.mser_truncation(growing)
    assert not settled


def _requests(ttft: np.ndarray, start_ns: int, rate: float) -> pd.DataFrame:
    sent = start_ns + (np.arange(ttft.size) / rate * _NS).astype(np.int64)
    return pd.DataFrame({"sent_wall_ns": sent, "outcome": "ok", "ttft_s": ttft,
                         "e2e_s": ttft + 0.2})


def test_steady_state_starts_the_window_after_a_slow_start() -> None:
    rng = np.random.default_rng(3)
    ttft = np.concatenate([np.linspace(1.0, 0.1, 200), rng.normal(0.1, 0.01, 600)])
    start = 10 * _NS
    frame = _requests(ttft, start, rate=20.0)  # 40 s of requests, the first 10 s slow
    state = ss.steady_state(frame, (start, start + 40 * _NS))
    assert state.settled and 8.0 <= state.cut_s <= 12.0
    assert state.start_ns == start + round(state.cut_s * _NS)


def test_steady_state_labels_a_step_that_never_settles_and_keeps_its_window() -> None:
    rng = np.random.default_rng(4)
    ttft = np.linspace(0.1, 3.0, 800) + rng.normal(0, 0.01, 800)
    start = 10 * _NS
    state = ss.steady_state(_requests(ttft, start, 20.0), (start, start + 40 * _NS))
    assert not state.settled and state.start_ns == start
    assert "TTFT did not settle" in state.reasons


def test_steady_state_never_cuts_past_half_the_requests_of_a_bursty_step() -> None:
    """Two agent tasks of 13 calls early in a 135 s window (0.05 tasks/s on real vLLM): the
    completions per second are 0 from 62 s on, and MSER on them cut 64 s: every request."""
    start = 10 * _NS
    sent = np.concatenate([np.linspace(0, 20, 13), np.linspace(35, 60, 13)])
    frame = pd.DataFrame({"sent_wall_ns": start + (sent * _NS).astype(np.int64),
                          "outcome": "ok", "ttft_s": 2.0, "e2e_s": 1.0})
    state = ss.steady_state(frame, (start, start + 135 * _NS))
    assert not state.settled and state.start_ns == start  # the window keeps its requests
    assert "completions/s: MSER would cut" in state.reasons
    assert "past half the step's requests" in state.reasons


def _cohort(ttft: np.ndarray, rate: float, rng: np.random.Generator) -> ss.Cohort:
    n = ttft.size
    sent = np.sort(rng.uniform(0, n / rate, n))
    ok = np.ones(n, bool)
    return ss.Cohort({"ttft": ttft, "e2e": ttft + 0.5}, ok, np.zeros(n, bool), ok,
                     np.full(n, 16.0), sent + ttft + 0.5, n / rate * n / (n - 1), rate,
                     n / rate)


def test_the_interval_of_a_percentile_covers_the_truth_about_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(5)
    truth = -math.log(0.05)  # P95 of an exponential of mean 1
    covered = 0
    trials = 60
    for _ in range(trials):
        cohorts = [_cohort(rng.exponential(1.0, 400), 20.0, rng) for _ in range(3)]
        draws = ss.bootstrap_point(cohorts, draws=300, rng=rng)
        lo, hi = draws.interval("ttft_p95_s")
        covered += lo <= truth <= hi
    assert covered >= 0.85 * trials


def test_repeats_that_disagree_widen_the_interval_beyond_within_run_noise() -> None:
    rng = np.random.default_rng(6)
    same = [_cohort(rng.exponential(1.0, 500), 20.0, rng) for _ in range(3)]
    apart = [_cohort(rng.exponential(scale, 500), 20.0, rng) for scale in (0.7, 1.0, 1.4)]
    width_same = np.diff(ss.bootstrap_point(same, rng=rng).interval("ttft_p50_s"))[0]
    width_apart = np.diff(ss.bootstrap_point(apart, rng=rng).interval("ttft_p50_s"))[0]
    assert width_apart > 2 * width_same


def test_throughput_interval_holds_arrival_noise() -> None:
    rng = np.random.default_rng(7)
    draws = ss.bootstrap_point([_cohort(rng.exponential(0.1, 400), 20.0, rng)], rng=rng)
    lo, hi = draws.interval("achieved_req_per_s")
    assert lo < 20.0 < hi and (hi - lo) / 20.0 > 0.05  # ~ 1/sqrt(400) each side


def test_itl_percentiles_get_an_interval_drawn_by_request_with_all_its_gaps() -> None:
    rng = np.random.default_rng(10)
    cohorts = []
    for _ in range(2):
        n = 300
        cohort = _cohort(rng.exponential(0.1, n), 20.0, rng)
        # a tenth of the requests are slow: every one of their 16 gaps is 4x longer
        slow = rng.random(n) < 0.1
        gaps = [rng.exponential(0.04 if s else 0.01, 16) for s in slow]
        cohort.itl_gaps = np.concatenate(gaps)
        cohort.itl_row = np.repeat(np.arange(n), 16)
        cohorts.append(cohort)
    draws = ss.bootstrap_point(cohorts, rng=rng)
    lo, hi = draws.interval("itl_p95_s")
    pooled = np.percentile(np.concatenate([c.itl_gaps for c in cohorts]), 95)
    assert lo < pooled < hi and (hi - lo) / pooled > 0.02
    # past one gap per request the sorted gaps are thinned evenly, never to more
    assert ss.thin_sorted(9600, 600).size == 600 and ss.thin_sorted(10, 600).size == 10


def test_max_load_interval_spans_the_gap_between_the_last_step_held_and_the_first_failed() -> None:
    loads = [10.0, 20.0, 30.0]
    flags = [True, True, False]
    draws = np.array([[True] * 100, [True] * 100, [False] * 100])
    metric = np.tile(np.array([[0.1], [0.12], [2.0]]), (1, 100))
    from dashboards.analysis.study import find_knee

    out = ss.capacity_intervals(loads, flags, draws, metric, knee_load=20.0, max_load=20.0,
                                knee_of=lambda x, y: find_knee(x, y)["knee_load"])
    assert out["max_load_lo"] == 20.0 and out["max_load_hi"] == 30.0
    assert out["knee_lo"] == pytest.approx(15.0) and out["knee_hi"] == pytest.approx(25.0)


def test_a_load_above_the_throughput_ceiling_is_not_sustainable_in_any_draw() -> None:
    # C = 60: 48 and 57 held; 62 came within 97% of offered (past the 95% rule) and 66
    # saturated the server at 60: the ceiling says 62 is above what the server delivers
    achieved = np.array([48.0, 57.0, 60.1, 60.0])
    ceiling, per_draw = ss.throughput_ceiling(
        achieved, achieved / np.array([48.0, 57.0, 62.0, 66.0]) < 0.95,
        achieved[:, None] + np.random.default_rng(9).normal(0, 0.3, (4, 200)))
    assert ceiling == pytest.approx(60.1) and per_draw is not None
    assert 59.5 < np.percentile(per_draw, 2.5) and np.percentile(per_draw, 97.5) < 61.0
    loads = np.array([48.0, 57.0, 62.0, 66.0])
    held = np.ones((4, 200), dtype=bool)
    held[3] = False
    held &= loads[:, None] <= per_draw[None, :]
    out = ss.capacity_intervals(loads, [True, True, False, False], held, np.zeros((4, 200)),
                                math.nan, 57.0, lambda x, y: math.nan)
    assert out["max_load_lo"] == 57.0 and out["max_load_hi"] == 62.0  # holds C = 60
    # no load saturated: no ceiling (a sweep below capacity delivers what it offers)
    assert math.isnan(ss.throughput_ceiling(achieved[:2], [False, False])[0])


def test_the_saturation_throughput_is_unbiased_where_the_ceilings_maximum_is_not() -> None:
    # C = 60: three loads saturated the server, each completing 60 +- noise; one held below
    rng = np.random.default_rng(4)
    hits_c = hits_max = 0
    for _ in range(40):
        achieved = np.array([48.0, *(60.0 + rng.normal(0, 0.4, 3))])
        saturated = np.array([False, True, True, True])
        draws = achieved[:, None] + rng.normal(0, 0.4, (4, 400))
        value, per_draw = ss.saturation_throughput(achieved, saturated, draws)
        ceiling, ceiling_draws = ss.throughput_ceiling(achieved, saturated, draws)
        assert value == pytest.approx(achieved[1:].mean()) and ceiling >= value
        assert per_draw is not None and ceiling_draws is not None
        hits_c += np.percentile(per_draw, 2.5) <= 60.0 <= np.percentile(per_draw, 97.5)
        hits_max += np.percentile(ceiling_draws, 2.5) <= 60.0 <= np.percentile(ceiling_draws,
                                                                               97.5)
    assert hits_c >= 36  # a 95% interval holds C in (about) 95% of the trials
    assert hits_max <= 32  # the maximum's draws sit above C: its interval misses from below
    assert math.isnan(ss.saturation_throughput([48.0, 57.0], [False, False])[0])


def test_ratio_and_noise_words() -> None:
    a = {"max_sustainable_load": 10.0, "max_load_lo": 9.0, "max_load_hi": 11.0}
    b = {"max_sustainable_load": 29.0, "max_load_lo": 27.0, "max_load_hi": 31.0}
    ratio = ss.ratio_interval(a, b)
    assert ratio[0] == pytest.approx(2.9) and ratio[1] == pytest.approx(27 / 11)
    assert "sustains 2.90x the load of a [2.45, 3.44]" in ss.format_ratio("a", "b", ratio)
    same = ss.ratio_interval(a, {"max_sustainable_load": 10.5, "max_load_lo": 9.5,
                                 "max_load_hi": 11.5})
    assert "within noise" in ss.format_ratio("a", "b", same)
    # the H100 pilot: seqs-256 held 216 users, its limit above the sweep; seqs-64 held 24 and
    # failed 216. B / A < 216 / 216: decided, though the interval's end is 1.00
    held_all = {"max_sustainable_load": 216.0, "max_load_lo": 216.0, "max_load_hi": math.inf}
    failed = {"max_sustainable_load": 24.0, "max_load_lo": 24.0, "max_load_hi": 216.0}
    less = ss.ratio_interval(held_all, failed)
    assert (less[1], less[2]) == (0.0, 1.0) and not ss.ratio_undecided(less[1], less[2])
    text = ss.format_ratio("seqs-256", "seqs-64", less)
    assert text.startswith("seqs-64 sustains less load than seqs-256") and "noise" not in text
    more = ss.ratio_interval(failed, held_all)
    assert ss.format_ratio("seqs-64", "seqs-256", more).startswith(
        "seqs-256 sustains more load than seqs-64")
    # A above its sweep at 216, B's limit in [100, 300): undecided, and said so
    bracket = {"max_sustainable_load": 100.0, "max_load_lo": 100.0, "max_load_hi": 300.0}
    assert "within noise" in ss.format_ratio("a", "b", ss.ratio_interval(held_all, bracket))
    assert ss.within_noise(*ss.difference_interval(np.zeros(100), rng_normal(100)))
    # B failed even its lowest load in some draws (its interval's lower end 0) while A failed a
    # load too: a 0 lower end of B / A, no limit above a sweep; once read as "A's limit is above
    # its sweep"
    failed_a = {"max_sustainable_load": 4.0, "max_load_lo": 3.0, "max_load_hi": 5.0}
    shaky_b = {"max_sustainable_load": 1.0, "max_load_lo": 0.0, "max_load_hi": 2.0}
    shaky = ss.ratio_interval(failed_a, shaky_b)
    text = ss.format_ratio("a", "b", shaky, (ss.above_sweep(failed_a), ss.above_sweep(shaky_b)))
    assert "above its sweep" not in text and text.startswith("b sustains 0.25x the load of a")


def rng_normal(n: int) -> np.ndarray:
    return np.random.default_rng(8).normal(0, 1, n)
