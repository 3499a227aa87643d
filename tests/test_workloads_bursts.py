"""Burst plans: spike shapes (step, ramp, single spike), the spike's own mix, gamma spacing, and
errors that name the bad field."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workloads.arrivals import BurstsPlan, parse_plan_spec, plan_from_dict, schedule
from workloads.errors import PlanError


def mixed_workload(n: int = 90) -> pd.DataFrame:
    buckets = np.array(["short", "medium", "long"])[np.arange(n) % 3]
    return pd.DataFrame({"bucket": buckets, "trace_offset_s": np.full(n, np.nan)})


def test_a_ramp_spike_follows_its_ramp_up_and_down() -> None:
    """Base 2 req/s; one spike at 10 s rising to 20 req/s over 5 s and falling over 5 s."""
    plan = plan_from_dict({"kind": "bursts", "base_rps": 2, "peak_rps": 20, "spike_s": 10,
                           "count": 1, "first_spike_s": 10, "shape": "ramp",
                           "spacing": "even"})
    assert plan.spikes(60) == [(10.0, 20.0)]
    assert [plan.rate_at(t) for t in (5, 10, 12.5, 15, 17.5, 20, 40)] == [
        2, 2, 11, 20, 11, 2, 2]
    s = schedule(plan, mixed_workload(), duration_s=30, seed=0)
    per_second = np.bincount(s.offset_s.astype(int), minlength=30)
    # the planned count per second is the rate's integral over it (triangle: 2 + 18 * ...)
    planned = np.array([np.trapezoid([plan.rate_at(t + f) for f in np.linspace(0, 1, 101)],
                                     dx=0.01) for t in range(30)])
    assert int(per_second[10:20].sum()) == pytest.approx(planned[10:20].sum(), abs=1)  # 110
    assert np.abs(per_second - planned).max() <= 1.0, per_second
    assert per_second[14] > per_second[11] > per_second[5]  # rising, above the base


def test_a_single_step_spike_needs_no_period() -> None:
    plan = parse_plan_spec("bursts:base_rps=5,peak_rps=30,spike_s=5,count=1,first_spike_s=10,"
                           "spacing=even")
    s = schedule(plan, mixed_workload(), duration_s=40, seed=0)
    per_second = np.bincount(s.offset_s.astype(int), minlength=40)
    assert per_second[10:15].tolist() == [30] * 5
    assert set(per_second[:10]) | set(per_second[15:]) == {5}


def test_repeated_spikes_stop_after_count() -> None:
    plan = parse_plan_spec("bursts:base_rps=1,multiplier=4,spike_s=2,period_s=10,count=2")
    assert plan.spikes(100) == [(5.0, 7.0), (15.0, 17.0)]
    assert plan.rate_at(25.5) == 1.0 and plan.rate_at(15.5) == 4.0


def test_the_spike_has_its_own_mix() -> None:
    """Short prompts only during the spike; the base load keeps the workload's mix and order."""
    plan = parse_plan_spec("bursts:base_rps=3,peak_rps=30,spike_s=4,count=1,first_spike_s=10,"
                           "spacing=even,spike_mix=100/0/0")
    wl = mixed_workload()
    s = schedule(plan, wl, duration_s=30, seed=0)
    buckets = wl["bucket"].to_numpy()[s.request_index.to_numpy()]
    inside = (s.offset_s >= 10) & (s.offset_s < 14)
    assert inside.sum() == 120 and set(buckets[inside]) == {"short"}
    outside = buckets[~inside.to_numpy()]
    assert {b: (outside == b).mean() for b in ("short", "medium", "long")} == pytest.approx(
        {"short": 1 / 3, "medium": 1 / 3, "long": 1 / 3}, abs=0.02)
    assert s.request_index[~inside].tolist()[:6] == [0, 1, 2, 3, 4, 5]
    # every short row is used before one repeats
    assert s.request_index[inside].tolist()[:30] == list(range(0, 90, 3))


def test_gamma_spacing_keeps_its_cv_in_base_and_spike() -> None:
    plan = parse_plan_spec("bursts:base_rps=40,multiplier=5,spike_s=100,period_s=300,"
                           "first_spike_s=200,spacing=gamma,cv=2.5")
    s = schedule(plan, mixed_workload(), duration_s=300, seed=3)
    t = s.offset_s.to_numpy()
    base, spike = np.diff(t[t < 190]), np.diff(t[(t > 210) & (t < 290)])
    assert base.std() / base.mean() == pytest.approx(2.5, rel=0.15)
    assert spike.std() / spike.mean() == pytest.approx(2.5, rel=0.15)
    assert len(t[t < 200]) / 200 == pytest.approx(40, rel=0.15)
    assert len(t[t >= 200]) / 100 == pytest.approx(200, rel=0.15)


@pytest.mark.parametrize(("plan", "message"), [
    ({"base_rps": -2, "multiplier": 3, "spike_s": 5, "period_s": 60},
     r"bursts plan: base_rps must be a number > 0, got -2"),
    ({"base_rps": 2, "peak_rps": -30, "spike_s": 5, "period_s": 60},
     r"bursts plan: peak_rps must be a number > 0, got -30"),
    ({"base_rps": 2, "multiplier": 3, "spike_s": 90, "period_s": 60},
     r"bursts plan: spike_s \(90\) is longer than period_s \(60\)"),
    ({"base_rps": 2, "multiplier": 3, "spike_s": 5, "period_s": 60, "shape": "sawtooth"},
     r"bursts plan: shape 'sawtooth' is not one of \['step', 'ramp'\]"),
    ({"base_rps": 2, "multiplier": 3, "spike_s": 5, "period_s": 60, "spacing": "fractal"},
     r"bursts plan: spacing 'fractal' is not one of \['poisson', 'even', 'gamma'\]"),
    ({"base_rps": 2, "multiplier": 3, "peak_rps": 6, "spike_s": 5, "period_s": 60},
     r"multiplier or peak_rps \(one of them\)"),
    ({"base_rps": 2, "multiplier": 3, "spike_s": 5},
     r"period_s is required"),
    ({"base_rps": 2, "multiplier": 3, "spike_s": 5, "count": 1},
     r"first_spike_s is required for a single spike"),
    ({"base_rps": 2, "multiplier": 3, "spike_s": 5, "period_s": 60, "count": 0},
     r"count must be an integer >= 1, got 0"),
    ({"base_rps": 2, "multiplier": 3, "spike_s": 5, "period_s": 60, "shape": "ramp",
      "ramp_up_s": 4, "ramp_down_s": 3},
     r"ramp_up_s \+ ramp_down_s \(4 \+ 3\) is longer than spike_s \(5\)"),
    ({"base_rps": 2, "multiplier": 3, "spike_s": 5, "period_s": 60, "ramp_up_s": 1},
     r"ramp_up_s needs shape: ramp"),
    ({"base_rps": 2, "multiplier": 3, "spike_s": 5, "period_s": 60, "spike_mix": "short"},
     r"spike_mix 'short'"),
    ({"base_rps": 2, "multiplier": 3, "spike_s": 5, "period_s": 60, "spacing": "gamma",
      "cv": 0}, r"bursts plan: cv must be a number > 0, got 0"),
    ({"base_rps": 2, "multiplier": 3, "spike_s": 5, "period_s": 60, "height": 4},
     r"unknown key\(s\) \['height'\]; valid keys: \['base_rps'"),
])
def test_bad_burst_plans_name_the_field(plan: dict, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_from_dict({"kind": "bursts", **plan})


def test_a_spike_mix_the_workload_cannot_serve_is_refused() -> None:
    plan = parse_plan_spec("bursts:base_rps=2,multiplier=3,spike_s=5,period_s=20,"
                           "spike_mix=0/0/100")
    wl = pd.DataFrame({"bucket": ["short"] * 10, "trace_offset_s": np.full(10, np.nan)})
    with pytest.raises(PlanError, match=r"spike_mix '0/0/100' asks for \['long'\]"):
        schedule(plan, wl, 30)


def test_bad_plan_stops_a_run_before_anything_starts(tmp_path, run_swarmload) -> None:
    """The CLI says which field is wrong and starts no target or Locust process."""
    from workloads.schema import write_workload

    frame = pd.DataFrame({
        "request_id": ["r0"], "bucket": ["short"], "prompt_tokens": [4], "output_tokens": [4],
        "prompt": ["one two three four"], "messages": [None], "trace_offset_s": [None],
        "session_id": [None], "prefix_block_ids": [[]], "source_line": [1],
        "prompt_source": ["synthesized"]})
    write_workload(frame, tmp_path / "wl", {})
    plan = tmp_path / "bad.yaml"
    plan.write_text("kind: bursts\nbase_rps: 2\nmultiplier: 3\nspike_s: 30\nperiod_s: 10\n")
    done = run_swarmload("run", "--target", "sim", "--workload", str(tmp_path / "wl"),
                         "--plan", str(plan), "--results", str(tmp_path / "results"),
                         timeout=60)
    assert done.returncode == 2
    assert "spike_s (30) is longer than period_s (10)" in done.stderr
    assert not (tmp_path / "results").exists()
    assert isinstance(BurstsPlan(base_rps=1, spike_s=1, multiplier=2, period_s=5), BurstsPlan)
