"""dashboards.analysis.study_search: the search reads the fitted curve, and a figure flat within
its noise near the SLO is reported unresolved, never as a capacity (no processes)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dashboards.analysis import study_search
from infra.study.runner import next_refinement

SLO = {"ttft_ms": 1000.0, "tpot_ms": 25.0, "error_rate": 0.01, "percentile": "p95"}


def _points(loads: list[float], ttft: list[float], tpot: list[float], noise: float,
            config: str = "a", kind: str = "concurrency") -> pd.DataFrame:
    ttft_arr, tpot_arr = np.asarray(ttft), np.asarray(tpot)
    return pd.DataFrame({
        "config": config, "bucket": "all", "load_kind": kind, "offered_load": loads,
        "repeats": 2, "ttft_p95_s": ttft_arr, "ttft_p95_s_lo": ttft_arr * (1 - noise),
        "ttft_p95_s_hi": ttft_arr * (1 + noise), "tpot_p95_s": tpot_arr,
        "tpot_p95_s_lo": tpot_arr * 0.95, "tpot_p95_s_hi": tpot_arr * 1.05,
        "error_rate": 0.0, "error_rate_lo": 0.0, "error_rate_hi": 0.0,
        "sustainable": (ttft_arr <= 1.0) & (tpot_arr <= 0.025)})


# the H100 run: vLLM admitted every user, P95 TTFT 607 -> 1,078 ms from 72 to 216
# users with +-36% between repeats, while TPOT grew 8.8 -> 28 ms
FLAT = _points([72, 108, 144, 216], [0.607, 0.80, 0.95, 1.078],
               [0.0088, 0.012, 0.020, 0.028], noise=0.36)


def test_a_flat_figure_near_its_slo_is_unresolved_and_says_which_slo_binds() -> None:
    ok, note, binding = study_search.resolution(FLAT, SLO, 0.05, "users")
    assert not ok and binding == "TPOT"
    assert note.startswith("P95 TTFT stays within 800-1,078 ms (SLO 1,000 ms) from 108 to 216 "
                           "users: the TTFT SLO does not bound this configuration at this "
                           "precision")
    assert "the TPOT SLO alone allows 189 users [178, 201]" in note
    capacity = pd.DataFrame({"config": ["a"], "load_kind": ["concurrency"],
                             "max_sustainable_load": [144.0], "note": [""]})
    resolved = study_search.resolve_capacity(capacity, FLAT, SLO, 0.05).iloc[0]
    assert not resolved["resolved"] and math.isnan(resolved["max_sustainable_load"])
    assert resolved["note"].startswith("P95 TTFT stays within")
    # the search asks for no more loads: they could not resolve it
    row = pd.Series({"max_sustainable_load": 144.0, "max_load_lo": 72.0, "max_load_hi": 216.0,
                     "knee_load": math.nan, "resolved": False,
                     "resolution_note": resolved["resolution_note"]})
    load, why = next_refinement(FLAT, row, 0.05, "concurrency", slo=SLO)
    assert load is None and why.startswith("not resolvable: P95 TTFT stays within")


def test_a_flat_figure_far_under_its_slo_leaves_the_binding_one_resolved() -> None:
    calm = _points([72, 108, 144, 216], [0.30, 0.31, 0.33, 0.35],
                   [0.0088, 0.012, 0.020, 0.028], noise=0.36)
    assert study_search.resolution(calm, SLO, 0.05, "users") == (True, "", "TPOT")
    # flat near its SLO, but TPOT surely fails first (at 178..201 users): still resolved
    early = _points([72, 108, 144, 216, 288], [0.607, 0.80, 0.95, 0.97, 1.078],
                    [0.0088, 0.012, 0.020, 0.028, 0.04], noise=0.36)
    ok, _note, binding = study_search.resolution(early, SLO, 0.05, "users")
    assert not ok and binding == "TPOT"  # TTFT's undecided range starts at 108 < 201
    steep_tpot = _points([72, 108, 144, 216, 288], [0.607, 0.80, 0.95, 0.97, 1.078],
                         [0.0088, 0.030, 0.040, 0.05, 0.06], noise=0.36)
    assert study_search.resolution(steep_tpot, SLO, 0.05, "users") == (True, "", "TPOT")


def test_the_search_measures_beside_the_fitted_crossing_not_the_bracket_middle() -> None:
    # P95 TTFT 0.3 s at 20 users, 1.8 s at 30: the fit crosses 1 s at 24.67 users
    steep = _points([10, 20, 30, 40], [0.10, 0.3, 1.8, 3.0], [0.01] * 4, noise=0.05)
    slo = SLO
    fits = {f.figure: f for f in study_search.figure_fits(steep, slo, 0.05)}
    fit = fits["ttft_p95_s"]
    assert fits["tpot_p95_s"].resolved and not fits["tpot_p95_s"].binds
    assert math.isclose(fit.crossing, 20 + 0.7 / 1.5 * 10)
    capacity = pd.Series({"max_sustainable_load": 20.0, "max_load_lo": 20.0,
                          "max_load_hi": 30.0, "knee_load": math.nan})
    load, why = next_refinement(steep, capacity, 0.05, "concurrency", slo=slo)
    # whole users 4% (0.8 x share) over or under 24.67, not the bisection's 25
    assert load in (24.0, 26.0) and "crosses its SLO" in why
    # without the SLO (an old caller), the bracket's middle as before
    assert next_refinement(steep, capacity, 0.05, "concurrency")[0] == 25.0
    # both sides measured close to the crossing: the next one fills the other side
    closer = _points([10, 20, 24, 30, 40], [0.10, 0.3, 0.9, 1.8, 3.0], [0.01] * 5,
                     noise=0.05)
    capacity["max_sustainable_load"], capacity["max_load_lo"] = 24.0, 24.0
    load, _ = next_refinement(closer, capacity, 0.05, "concurrency", slo=slo)
    assert load == 26.0


def test_a_rate_configuration_reads_the_shortfall_of_achieved_as_a_figure() -> None:
    loads = [5.0, 8.0, 12.0]
    rate = pd.DataFrame({"config": "a", "bucket": "all", "load_kind": "rate",
                         "offered_load": loads, "repeats": 1,
                         "achieved_ratio": [1.0, 0.99, 0.80],
                         "achieved_ratio_lo": [0.97, 0.96, 0.78],
                         "achieved_ratio_hi": [1.02, 1.01, 0.82], "error_rate": 0.0})
    fits = {f.figure: f for f in study_search.figure_fits(rate, {"error_rate": 0.01})}
    shortfall = fits["shortfall"]
    assert shortfall.binds and 8.0 < shortfall.crossing < 12.0 and shortfall.resolved


def test_a_saturated_rate_configuration_is_bound_by_its_ceiling_not_a_flat_shortfall() -> None:
    # the simulator near C = 40 req/s, 3 repeats: achieved / offered falls only 1% per 1% of load
    # past C, within its noise of 95% from 39.3 to 40.6 req/s; the throughput ceiling (40.2
    # [40.0, 40.4]) decides sharply, so the capacity is resolved and the ceiling binds
    loads = [32.0, 39.319, 39.617, 40.608, 48.0]
    ratio = [1.0005, 0.9655, 0.9602, 0.9379, 0.7925]
    rate = pd.DataFrame({"config": "a", "bucket": "all", "load_kind": "rate",
                         "offered_load": loads, "repeats": 3, "achieved_ratio": ratio,
                         "achieved_ratio_lo": [r - 0.03 for r in ratio],
                         "achieved_ratio_hi": [r + 0.03 for r in ratio],
                         "ttft_p95_s": [0.23, 0.81, 0.90, 1.08, 2.86], "error_rate": 0.0})
    slo = {"ttft_ms": 2000.0, "error_rate": 0.01}
    assert not study_search.resolution(rate, slo, 0.015, "req/s")[0]  # without the ceiling
    assert study_search.resolution(rate, slo, 0.015, "req/s", (40.19, 39.97, 40.42)) == (
        True, "", "throughput ceiling")


def test_a_task_time_slo_is_fitted_and_can_bind() -> None:
    slo = {**SLO, "task_ms": 20_000.0}
    points = FLAT.assign(task_p95_s=[8.0, 12.0, 24.0, 40.0])  # crosses 20 s at 132 users
    fits = {f.slo: f for f in study_search.figure_fits(points, slo)}
    assert fits["task time"].crossing == 132.0 and fits["task time"].resolved
    ok, _note, binding = study_search.resolution(points, slo, 0.05, "users")
    assert binding == "task time"  # before TPOT's 189 users


def test_a_task_time_interval_drawn_over_tasks_bounds_the_band_and_can_leave_it_flat() -> None:
    slo = {**SLO, "task_ms": 20_000.0}
    task = np.array([8.0, 12.0, 24.0, 40.0])
    points = FLAT.assign(task_p95_s=task, task_p95_s_lo=task * 0.8, task_p95_s_hi=task * 1.2)
    fit = {f.slo: f for f in study_search.figure_fits(points, slo)}["task time"]
    assert fit.crossing == 132.0  # the upper fit crosses 20 s first, the lower one later:
    assert fit.band == pytest.approx((122.0, 148.5))
    assert fit.undecided.tolist() == [144.0]  # 19.2-28.8 s holds 20 s
    wide = FLAT.assign(task_p95_s=[16.0, 18.0, 21.0, 23.0], task_p95_s_lo=10.0,
                       task_p95_s_hi=30.0)  # task time flat within its noise near 20 s
    ok, note, _ = study_search.resolution(wide, {**slo, "tpot_ms": 1000.0}, 0.05, "users")
    assert not ok and "P95 task time stays within" in note
