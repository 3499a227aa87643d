"""The collectors' effect table: a setting that costs the server more than the run-to-run noise
is called out, one inside the noise is not, and a drift between runs counts as noise."""

from __future__ import annotations

import pandas as pd

from infra.tools.device.collector_effect import effect_table


def _runs(costly_ms: float) -> pd.DataFrame:
    rows = []
    for i, arm in enumerate(["off", "nvml", "scrape", "scrape", "nvml", "off"]):
        drift = 0.5 * i  # the server slows a little run after run
        ttft = 100.0 + drift + (costly_ms if arm == "scrape" else 0.0) + (0.3 if i % 2 else -0.3)
        rows.append({"arm": arm, "server_ttft_mean_ms": ttft, "req_per_s": 150.0})
    return pd.DataFrame(rows)


def test_a_cost_well_above_the_noise_is_flagged_and_a_small_one_is_within_noise():
    table = effect_table(_runs(costly_ms=10.0), figures=("server_ttft_mean_ms",))
    verdicts = dict(zip(table["setting"], table["verdict"], strict=True))
    assert verdicts == {"nvml": "within noise", "scrape": "costs the server"}
    scrape = table[table["setting"] == "scrape"].iloc[0]
    assert 9.0 < scrape["change"] < 11.0 and scrape["runs"] == 2 and scrape["baseline_runs"] == 2

    quiet = effect_table(_runs(costly_ms=0.5), figures=("server_ttft_mean_ms",))
    assert set(quiet["verdict"]) == {"within noise"}
