"""Early warning (dashboards/analysis/early_warning.py): a creep too small to count as drift so
far is flagged by its projection to the planned end and to its limit, with the time to it."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from dashboards.analysis.drift import VERDICT_NONE, drift_report
from dashboards.analysis.early_warning import (
    Limit,
    early_warnings,
    format_warnings,
    soak_limits,
)

H = 3.6e12  # ns per hour


def _series(hours: float, window_s: float, **slopes_per_h: tuple[float, float]) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    n = int(hours * 3600 / window_s)
    t = np.arange(n) * window_s / 3600
    data = {name: start * (1 + share * t) + rng.normal(0, start * 0.002, n)
            for name, (start, share) in slopes_per_h.items()}
    return pd.DataFrame(data, index=(t * H).astype(np.int64) + 10**18)


def test_an_8_percent_per_hour_creep_is_flagged_in_the_first_hour_with_its_time_to_limit():
    # 8 GB growing 8%/h, one hour of one-minute windows, a 72 h soak, a 24 GB host
    series = _series(1.0, 60, server_rss_mb=(8192.0, 0.08), req_per_s=(20.0, 0.0))
    report = drift_report(series)
    rss = report.set_index("series").loc["server_rss_mb"]
    assert rss["verdict"] == VERDICT_NONE and rss["change_share"] < 0.10  # not drift yet
    last = int(series.index.max())
    warnings = early_warnings(report, last_window_ns=last, planned_end_ns=last + int(71 * H),
                              limits={"server_rss_mb": Limit(24 * 1024.0, "host memory")})
    row = warnings.set_index("series").loc["server_rss_mb"]
    assert row["flagged"]
    true_hours = (24 * 1024 - 8192 * (1 + 0.08 * rss["hours"])) / (8192 * 0.08)
    assert row["hours_to_limit"] == pytest.approx(true_hours, rel=0.05)
    assert re.fullmatch(r"server RSS \+0\.6\d+ GB/h \(\+8\.\d%/h\): reaches 24 GB "
                        r"\(host memory\) in 2\d\.\d h", row["text"]), row["text"]
    assert "req_per_s" not in set(warnings["series"])  # flat: no significant trend
    assert format_warnings(warnings).startswith("early warning: server RSS +0.6")


def test_a_trend_that_stays_small_to_the_end_is_not_flagged():
    series = _series(1.0, 60, server_rss_mb=(8192.0, 0.01))
    report = drift_report(series)
    last = int(series.index.max())
    warnings = early_warnings(report, last_window_ns=last, planned_end_ns=last + int(2 * H),
                              limits={"server_rss_mb": Limit(24 * 1024.0, "host memory")})
    row = warnings.set_index("series").loc["server_rss_mb"]
    assert not row["flagged"] and row["hours_to_limit"] > 2  # reached only after the end
    assert row["projected_change_share"] == pytest.approx(0.03, abs=0.005)


def test_latency_to_its_slo_and_kv_cache_to_full():
    series = _series(0.5, 30, ttft_p95_s=(0.2, 0.5), kv_cache_usage=(0.5, 0.4))
    limits = soak_limits(series, memory_limit_mb=None, host_memory_mb=None, gpu_memory_gb=None,
                         slos={"ttft_p95_s": 0.3})
    assert limits["kv_cache_usage"] == Limit(1.0, "KV cache full")
    report = drift_report(series)
    last = int(series.index.max())
    warnings = early_warnings(report, last_window_ns=last, planned_end_ns=last + int(10 * H),
                              limits=limits).set_index("series")
    assert warnings.loc["ttft_p95_s", "flagged"]
    assert warnings.loc["ttft_p95_s", "hours_to_limit"] == pytest.approx(
        (0.3 - 0.2 * 1.25) / 0.1, rel=0.1)
    assert "reaches 300 ms (SLO)" in warnings.loc["ttft_p95_s", "text"]
    assert warnings.loc["kv_cache_usage", "hours_to_limit"] == pytest.approx(
        (1.0 - 0.5 * 1.2) / 0.2, rel=0.1)


def test_a_trend_away_from_its_limit_has_no_time_to_it():
    series = _series(1.0, 60, server_rss_mb=(8192.0, -0.08))
    report = drift_report(series)
    last = int(series.index.max())
    row = early_warnings(report, last_window_ns=last, planned_end_ns=last + int(10 * H),
                         limits={"server_rss_mb": Limit(24 * 1024.0, "host memory")}).iloc[0]
    assert math.isnan(row["hours_to_limit"]) and row["flagged"]  # -80% by the end
    assert "by the planned end" in row["text"]
