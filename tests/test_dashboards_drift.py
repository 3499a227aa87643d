"""Drift report on synthetic per-minute series with known slopes (METRICS.md, "Over time")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dashboards.analysis.drift import (
    ATTRIBUTED_GENERATOR,
    ATTRIBUTED_SERVER,
    ATTRIBUTED_UNCONFIRMED,
    VERDICT_DOWN,
    VERDICT_GENERATOR_DOWN,
    VERDICT_NONE,
    VERDICT_SHORT,
    VERDICT_UP,
    attribute_client_drift,
    drift_report,
    drifting,
    format_drift,
    generator_drifting,
    series_drift,
)

MINUTE_NS = 60_000_000_000


def _minutes(hours: float) -> pd.Index:
    return pd.Index(np.arange(int(hours * 60), dtype=np.int64) * MINUTE_NS + 1_700_000_000 * 10**9)


def _noisy(level: float, slope_per_h: float, hours: float, noise: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(hours * 60)) / 60.0
    return level + slope_per_h * t + rng.normal(0.0, noise, t.size)


def test_a_known_leak_is_flagged_with_its_slope_inside_the_interval() -> None:
    # RSS 500 MB growing 60 MB/h (+1 MB/min) over 2 h, 3 MB of noise
    values = _noisy(500.0, 60.0, 2.0, 3.0, seed=1)
    result = series_drift("server_rss_mb", np.arange(values.size) / 60.0, values)
    assert result.verdict == VERDICT_UP
    assert result.slope_low_per_h <= 60.0 <= result.slope_high_per_h
    assert result.slope_per_h == pytest.approx(60.0, rel=0.05)
    assert result.start_level == pytest.approx(500.0, rel=0.01)
    assert result.change_share == pytest.approx(120.0 / 500.0, rel=0.05)


def test_flat_noise_and_a_small_trend_are_not_drift() -> None:
    flat = _noisy(0.2, 0.0, 1.0, 0.01, seed=2)
    assert series_drift("p95", np.arange(60) / 60.0, flat).verdict == VERDICT_NONE
    # 3 %/h over one hour: significant to Mann-Kendall, but under 10% of the start
    small = _noisy(100.0, 3.0, 1.0, 0.2, seed=3)
    result = series_drift("p95", np.arange(60) / 60.0, small)
    assert result.mk_p < 0.01 and result.verdict == VERDICT_NONE


def test_a_falling_series_drifts_down_and_a_short_one_says_so() -> None:
    falling = _noisy(100.0, -30.0, 1.0, 1.0, seed=4)
    assert series_drift("tput", np.arange(60) / 60.0, falling).verdict == VERDICT_DOWN
    assert series_drift("tput", np.arange(5) / 60.0, falling[:5]).verdict == VERDICT_SHORT


def test_the_report_skips_warm_up_and_lists_the_worst_first() -> None:
    index = _minutes(2.0)
    warm_then_flat = _noisy(1.0, 0.0, 2.0, 0.01, seed=5)
    warm_then_flat[:10] = np.linspace(3.0, 1.0, 10)  # a warm-up that settles in 10 minutes
    series = pd.DataFrame({
        "warm_then_flat": warm_then_flat,
        "creep": _noisy(0.05, 0.005, 2.0, 0.0005, seed=6),  # +10 %/h
        "leak": _noisy(500.0, 60.0, 2.0, 3.0, seed=7),  # +12 %/h
        "errors": np.zeros(index.size),
    }, index=index)
    report = drift_report(series, warmup_s=600)
    assert report["series"].tolist()[:2] == ["leak", "creep"]
    assert drifting(report) == ["leak", "creep"]
    assert report.set_index("series").loc["warm_then_flat", "verdict"] == VERDICT_NONE
    assert report.set_index("series").loc["errors", "verdict"] == VERDICT_NONE
    creep = report.set_index("series").loc["creep"]
    assert creep["slope_share_per_h"] == pytest.approx(0.10, rel=0.2)
    assert "leak" in format_drift(report).splitlines()[1]
    assert report["windows"].tolist() == [110] * 4  # the first 10 minutes are warm-up


def test_an_error_rate_that_starts_clean_and_grows_drifts() -> None:
    rate = np.concatenate([np.zeros(30), np.linspace(0.0, 0.05, 30)])
    assert series_drift("error_rate", np.arange(60) / 60.0, rate).verdict == VERDICT_UP


def test_a_client_drift_the_server_does_not_share_is_put_down_to_the_generator() -> None:
    # The no-drift soak's case: the server answers in 50 ms all along; the client's P99 falls
    # from 60 to 50 ms over the run as the generator's machine gets quieter.
    index = _minutes(1.0)
    server = _noisy(0.050, 0.0, 1.0, 0.0003, seed=8)
    client_p99 = server + np.linspace(0.010, 0.0, index.size) + _noisy(0, 0, 1.0, 0.0005, 9)
    # The creep soak's case: the server's own TTFT creeps +20 %/h and the client's with it.
    creeping = _noisy(0.20, 0.04, 1.0, 0.002, seed=10)
    series = pd.DataFrame({"ttft_p99_s": client_p99, "server_ttft_mean_s": server,
                           "ttft_p50_s": creeping + 0.001, "server_e2e_mean_s": creeping,
                           "e2e_p99_s": _noisy(1.0, -0.3, 1.0, 0.01, seed=11)}, index=index)
    references = {"ttft_p99_s": "server_ttft_mean_s", "ttft_p50_s": "server_e2e_mean_s",
                  "e2e_p99_s": "server_missing"}
    plain = drift_report(series)
    assert set(drifting(plain)) == {"ttft_p99_s", "ttft_p50_s", "server_e2e_mean_s",
                                    "e2e_p99_s"}
    report = attribute_client_drift(plain, series, references).set_index("series")
    p99 = report.loc["ttft_p99_s"]
    assert p99["verdict"] == VERDICT_GENERATOR_DOWN
    assert p99["attribution"] == ATTRIBUTED_GENERATOR
    assert p99["server_reference"] == "server_ttft_mean_s" and p99["gap_mk_p"] < 0.01
    assert report.loc["ttft_p50_s", "attribution"] == ATTRIBUTED_SERVER
    assert report.loc["e2e_p99_s", "attribution"] == ATTRIBUTED_UNCONFIRMED  # nothing to check
    flagged = drifting(report.reset_index())
    assert "ttft_p99_s" not in flagged and {"ttft_p50_s", "e2e_p99_s"} <= set(flagged)
    assert generator_drifting(report.reset_index()) == ["ttft_p99_s"]
    assert "generator/network (vs server_ttft_mean_s)" in format_drift(report.reset_index())


def test_soak_gpu_series_add_power_and_memory_over_gpus_and_average_utilisation(tmp_path) -> None:
    """A soak on a GPU server charts and judges GPU utilisation and power per window (a seed's
    soak saw utilisation jump between 0 and 85%): two GPUs, one busy and one idle."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from collectors.schemas import GPU_SCHEMA, GPU_TABLE
    from dashboards.analysis.soak import gpu_and_kv

    ns = 1_000_000_000
    rows = [{"run_id": "r", "host": "h", "wall_ns": 600 * ns + tick * ns, "gpu_index": gpu,
             "util_gpu_pct": 80.0 if gpu == 0 else 0.0, "power_w": 450.0 if gpu == 0 else 100.0,
             "mem_used_bytes": 40 * 10**9} for tick in range(120) for gpu in (0, 1)]
    (tmp_path / GPU_TABLE).mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=GPU_SCHEMA),
                   tmp_path / GPU_TABLE / "h-1-000001.parquet")
    series = gpu_and_kv(tmp_path, 60.0)
    assert len(series) == 2
    assert series["gpu_util_pct"].tolist() == [40.0, 40.0]
    assert series["gpu_power_w"].tolist() == [550.0, 550.0]
    assert series["gpu_mem_gb"].tolist() == [80.0, 80.0]
