"""Bootstrap intervals and verdicts of dashboards.analysis.compare_stats, on known answers."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dashboards.analysis import compare_stats as cs


def test_quantile_replicates_draw_what_scipy_bootstrap_draws() -> None:
    """The order-statistic shortcut gives scipy.stats.bootstrap's percentile interval."""
    rng = np.random.default_rng(7)
    values = rng.lognormal(np.log(0.1), 0.4, 300)
    ours = cs.quantile_replicates(values, 0.95, 40_000, np.random.default_rng(1))
    scipy_ci = stats.bootstrap(
        (values,), lambda x, axis: np.quantile(x, 0.95, axis=axis, method="inverted_cdf"),
        n_resamples=40_000, method="percentile", confidence_level=0.95, rng=2,
    ).confidence_interval
    low, high = np.quantile(ours, [0.025, 0.975])
    ordered = np.sort(values)
    # both sit on order statistics of the sample: at most one rank apart (Monte Carlo noise)
    rank = {v: i for i, v in enumerate(ordered)}
    assert abs(rank[low] - rank[scipy_ci.low]) <= 1
    assert abs(rank[high] - rank[scipy_ci.high]) <= 1


def test_an_eight_percent_slower_candidate_is_worse_and_its_interval_covers_eight() -> None:
    rng = np.random.default_rng(3)
    a = rng.lognormal(np.log(0.1), 0.3, 4000)
    b = rng.lognormal(np.log(0.1), 0.3, 4000) * 1.08
    for q in (0.5, 0.95):
        change = cs.compare_quantile("ttft", a, b, q, level=cs.simultaneous_level(0.95, 12),
                                     rng=np.random.default_rng(0))
        assert change.verdict == "worse", change
        assert change.low <= 0.08 <= change.high, change
        assert change.n_a == change.n_b == 4000


def test_same_distribution_is_within_noise_on_every_figure_in_19_of_20() -> None:
    """Simultaneous intervals: all twelve figures stay within noise in >= 95% of pairs."""
    rng = np.random.default_rng(11)
    clean = 0
    for repeat in range(40):
        level = cs.simultaneous_level(0.95, 12)
        a = [rng.lognormal(np.log(0.1), 0.4, 800) for _ in range(9)]
        b = [rng.lognormal(np.log(0.1), 0.4, 800) for _ in range(9)]
        verdicts = [cs.compare_quantile("x", x, y, q, level=level, min_effect=0.0,
                                        rng=np.random.default_rng(repeat)).verdict
                    for x, y, q in zip(a, b, [0.5, 0.95, 0.99] * 3, strict=True)]
        verdicts.append(cs.compare_proportion("err", rng.binomial(800, 0.02), 800,
                                              rng.binomial(800, 0.02), 800, level=level,
                                              min_effect=0.0, rng=rng).verdict)
        clean += all(v == "within noise" for v in verdicts)
    assert clean >= 38, clean


def test_error_rate_and_throughput_directions() -> None:
    rng = np.random.default_rng(0)
    more_errors = cs.compare_proportion("error_rate", 20, 2000, 100, 2000, level=0.99, rng=rng)
    assert more_errors.verdict == "worse" and not more_errors.relative
    assert more_errors.change == pytest.approx(0.04)
    faster = cs.compare_rate("req_per_s", 1000, 10.0, 1300, 10.0, level=0.99, n_a=1000,
                             n_b=1300, rng=rng)
    assert faster.verdict == "better" and faster.change == pytest.approx(0.3)
    slower = cs.compare_rate("req_per_s", 1300, 10.0, 1000, 10.0, level=0.99, n_a=1300,
                             n_b=1000, rng=rng)
    assert slower.verdict == "worse"


def test_a_sure_but_tiny_change_is_within_noise_and_empty_sides_have_no_data() -> None:
    rng = np.random.default_rng(0)
    a = np.full(50_000, 0.100) + rng.normal(0, 1e-4, 50_000)
    b = a * 1.005  # +0.5%: certain with 50k values, and too small to matter
    tiny = cs.compare_quantile("ttft", a, b, 0.5, level=0.99, rng=rng)
    assert tiny.low > 0 and tiny.verdict == "within noise"
    assert cs.compare_quantile("ttft", a, np.array([]), 0.5, level=0.99,
                               rng=rng).verdict == "no data"
    with pytest.raises(ValueError, match="level"):
        cs.simultaneous_level(1.5, 3)
