"""Arrival plans: loading, errors, Poisson mean rate, burst per-second counts, trace scaling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from trace_data import AZURE_CONV

from workloads.arrivals import (
    BurstsPlan,
    load_plan,
    parse_plan_spec,
    plan_from_dict,
    save_plan,
    schedule,
)
from workloads.build import BuildConfig, build_workload
from workloads.errors import PlanError


def workload(n: int = 100, offsets: np.ndarray | None = None) -> pd.DataFrame:
    return pd.DataFrame({"trace_offset_s": offsets if offsets is not None else np.full(n, np.nan)})


def test_poisson_mean_rate_and_determinism() -> None:
    plan = plan_from_dict({"kind": "poisson", "rate_rps": 20})
    s = schedule(plan, workload(), duration_s=300, seed=1)
    assert len(s) / 300 == pytest.approx(20, rel=0.03)           # 6000 expected, sd ~77
    gaps = np.diff(s.offset_s)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)
    assert s.offset_s.is_monotonic_increasing and s.offset_s.max() < 300
    assert s.request_index.tolist()[:150] == [i % 100 for i in range(150)]
    pd.testing.assert_frame_equal(s, schedule(plan, workload(), 300, seed=1))
    assert not s.equals(schedule(plan, workload(), 300, seed=2))


def test_gamma_burstiness() -> None:
    s = schedule(parse_plan_spec("gamma:rate_rps=50,cv=3"), workload(), 200, seed=0)
    gaps = np.diff(s.offset_s)
    assert len(s) / 200 == pytest.approx(50, rel=0.15)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.15)


@pytest.mark.parametrize("spacing", ["even", "poisson"])
def test_bursts_per_second_counts_match_the_plan(spacing: str) -> None:
    """2 req/s with a 10x spike for 10 s every 60 s (first at 30 s), for 10 minutes."""
    plan = parse_plan_spec(f"bursts:base_rps=2,multiplier=10,spike_s=10,period_s=60,"
                           f"first_spike_s=30,spacing={spacing}")
    s = schedule(plan, workload(), duration_s=600, seed=0)
    per_second = np.bincount(s.offset_s.astype(int), minlength=600)
    planned = np.array([plan.rate_at(t) for t in range(600)])
    assert set(planned) == {2.0, 20.0} and (planned == 20).sum() == 100
    if spacing == "even":
        assert (per_second == planned).all()
    else:
        assert per_second[planned == 20].mean() == pytest.approx(20, rel=0.1)
        assert per_second[planned == 2].mean() == pytest.approx(2, rel=0.1)
        spikes = per_second.reshape(10, 60)[:, 30:40].sum(axis=1)
        assert (spikes > 120).all()   # every spike visible: 200 expected, base would give 20


def test_trace_fitted_into_two_minutes() -> None:
    wl = build_workload(BuildConfig("azure", str(AZURE_CONV), n=2000, seed=0)).frame
    s = schedule(parse_plan_spec("trace:fit_window_s=120"), wl, duration_s=None)
    assert len(s) == 2000 and sorted(s.request_index) == list(range(2000))
    assert s.offset_s.min() == 0.0 and s.offset_s.max() < 120
    assert s.offset_s.max() > 119          # fills the window
    # scaling keeps the shape: the same relative gaps as the trace
    original = np.sort(wl.trace_offset_s.to_numpy())
    np.testing.assert_allclose(s.offset_s.to_numpy() / s.offset_s.max(),
                               original / original.max(), atol=1e-9)


def test_trace_window_scale_and_loop() -> None:
    wl = workload(offsets=np.arange(10) * 10.0)       # 0, 10, ..., 90 s
    s = schedule(plan_from_dict({"kind": "trace", "window_start_s": 20, "window_end_s": 60,
                                 "time_scale": 0.5}), wl, None)
    assert s.request_index.tolist() == [2, 3, 4, 5]
    assert s.offset_s.tolist() == [0.0, 5.0, 10.0, 15.0]
    looped = schedule(plan_from_dict({"kind": "trace", "window_start_s": 20, "window_end_s": 60,
                                      "time_scale": 0.5, "loop": True}), wl, duration_s=45)
    assert looped.offset_s.tolist() == [0, 5, 10, 15, 20, 25, 30, 35, 40]
    assert looped.request_index.tolist() == [2, 3, 4, 5] * 2 + [2]


def test_plan_files_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "arrivals.yaml"
    path.write_text("kind: bursts\nbase_rps: 2\nmultiplier: 10\nspike_s: 10\nperiod_s: 60\n")
    plan = load_plan(path)
    assert isinstance(plan, BurstsPlan) and plan.first_spike == 30
    save_plan(plan, tmp_path / "copy.yaml")
    assert load_plan(tmp_path / "copy.yaml") == plan
    (tmp_path / "p.json").write_text('{"kind": "closed", "concurrency": 8}')
    closed = load_plan(tmp_path / "p.json")
    with pytest.raises(PlanError, match="closed plans have no schedule"):
        schedule(closed, workload(), 10)
    with pytest.raises(PlanError, match=r"valid kinds: \['trace', 'poisson', 'gamma', 'bursts', "
                                        r"'closed'\]"):
        plan_from_dict({"kind": "sine", "rate_rps": 1})
    with pytest.raises(PlanError, match=r"unknown key\(s\) \['rps'\]"):
        plan_from_dict({"kind": "poisson", "rps": 1})
    with pytest.raises(PlanError, match="rate_rps must be a number > 0"):
        plan_from_dict({"kind": "poisson", "rate_rps": -1})
    with pytest.raises(PlanError, match="missing"):
        plan_from_dict({"kind": "gamma"})
    with pytest.raises(PlanError, match="no trace times"):
        schedule(parse_plan_spec("trace:time_scale=1"), workload(), 10)
    with pytest.raises(PlanError, match="requests"):
        schedule(parse_plan_spec("poisson:rate_rps=1e9"), workload(), 1000)
