"""A line thinned to its envelope per pixel column keeps every spike and dip."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dashboards import soak_charts
from dashboards.analysis.envelope import envelope_positions


def test_every_buckets_extremes_survive_and_at_most_four_points_a_bucket() -> None:
    rng = np.random.default_rng(5)
    x = np.arange(4320) / 60.0  # 72 h of one-minute windows
    y = rng.normal(100.0, 2.0, x.size)
    y[1234] = 180.0  # one spike of a single window
    y[3000] = 20.0  # and a dip
    keep = envelope_positions(x, y, 440)
    assert keep.size <= 4 * 440
    assert 1234 in keep and 3000 in keep
    assert keep[0] == 0 and keep[-1] == x.size - 1
    assert np.all(np.diff(keep) > 0)  # sorted, each once: a line drawn in x order
    bucket = np.minimum((x / x[-1] * 440).astype(int), 439)
    frame = pd.DataFrame({"bucket": bucket, "y": y})
    kept = frame.iloc[keep].groupby("bucket")["y"]
    every = frame.groupby("bucket")["y"]
    assert (kept.min() == every.min()).all() and (kept.max() == every.max()).all()


def test_a_short_line_comes_back_whole_without_its_gaps() -> None:
    y = np.array([1.0, np.nan, 3.0, 2.0])
    assert envelope_positions(np.arange(4.0), y, 440).tolist() == [0, 2, 3]
    with pytest.raises(ValueError, match="buckets"):
        envelope_positions(np.arange(4.0), y, 0)


def test_a_thinned_soak_chart_has_the_same_extremes_per_series() -> None:
    hours = np.arange(4320)
    index = pd.Index(1_760_000_000 * 10**9 + hours * 60 * 10**9, name="window_start_ns")
    series = pd.DataFrame({"ttft_p95_s": 0.05 + 0.001 * np.sin(hours),
                           "server_rss_mb": 900.0 + hours / 60 * 4}, index=index)
    series.iloc[777, 0] = 0.4
    full = soak_charts.timeline(series, ["ttft_p95_s"], title="t", y_title="ms", scale=1e3)
    thin = soak_charts.timeline(series, ["ttft_p95_s"], title="t", y_title="ms", scale=1e3,
                                max_points=4 * soak_charts.WIDTH)
    rows = [pd.DataFrame(spec["layer"][-1]["data"]["values"]) for spec in (full, thin)]
    assert len(rows[0]) == 4320 and len(rows[1]) <= 4 * soak_charts.WIDTH
    assert rows[1]["value"].max() == pytest.approx(400.0) == rows[0]["value"].max()
    assert rows[1]["value"].min() == rows[0]["value"].min()
    assert rows[1]["h"].min() == 0.0 and rows[1]["h"].max() == rows[0]["h"].max()
