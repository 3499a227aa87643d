"""Efficiency, the throughput-interactivity frontier and the verdict on figures of known shape."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from dashboards.analysis import frontier
from dashboards.analysis.study_stats import Draws
from dashboards.analysis.study_verdict import format_verdict, verdict_table

_NS = 1_000_000_000
SLO = {"ttft_ms": 1000, "tpot_ms": 50, "error_rate": 0.01, "percentile": "p95"}


def _gpu_rows(gpu_index: int, times_s: list[float], power_w: float, util: float,
              energy_mj: list[float | None] | None = None) -> list[dict]:
    return [{"host": "h", "gpu_index": gpu_index, "wall_ns": int(t * _NS), "power_w": power_w,
             "util_gpu_pct": util, "error": None,
             "energy_mj": None if energy_mj is None else energy_mj[i]}
            for i, t in enumerate(times_s)]


def test_energy_comes_from_the_counter_over_the_window_and_idle_gpus_are_not_counted() -> None:
    times = [float(t) for t in range(0, 21)]
    # GPU 0 serves at 300 W; its counter (every 5 s) says 250 W: the counter wins
    counter = [t * 250_000.0 if t % 5 == 0 else None for t in times]
    gpu = pd.DataFrame(_gpu_rows(0, times, 300.0, 80.0, counter)
                       + _gpu_rows(1, times, 60.0, 0.0))  # GPU 1 idles on the same host
    out = frontier.window_energy(gpu, (int(2.5 * _NS), int(17.5 * _NS)))
    assert out["gpu_count"] == 1.0 and out["gpu_energy_source"] == "counter"
    assert out["gpu_energy_j"] == pytest.approx(250.0 * 15.0)
    # no counter: the mean power over the window times its length
    no_counter = gpu.assign(energy_mj=None)
    out = frontier.window_energy(no_counter, (int(2.5 * _NS), int(17.5 * _NS)))
    assert out["gpu_energy_source"] == "power"
    assert out["gpu_energy_j"] == pytest.approx(300.0 * 15.0)
    assert math.isnan(frontier.window_energy(pd.DataFrame(), (0, _NS))["gpu_count"])
    # only idle GPUs: they watched another server's step, so no GPU count nor energy
    idle = frontier.window_energy(gpu[gpu["gpu_index"] == 1], (int(2.5 * _NS), int(17.5 * _NS)))
    assert math.isnan(idle["gpu_count"]) and math.isnan(idle["gpu_energy_j"])


def _points(config: str, loads: list[float], tok_s: list[float], tpot_p50_s: list[float],
            gpus: float = 1.0, share: float = 0.05) -> pd.DataFrame:
    tok, tpot = np.asarray(tok_s), np.asarray(tpot_p50_s)
    return pd.DataFrame({
        "config": config, "bucket": "all", "load_kind": "concurrency", "offered_load": loads,
        "output_tok_per_s": tok, "output_tok_per_s_lo": tok * (1 - share),
        "output_tok_per_s_hi": tok * (1 + share), "tpot_p50_s": tpot,
        "tpot_p50_s_lo": tpot * (1 - share), "tpot_p50_s_hi": tpot * (1 + share),
        "achieved_req_per_s": tok / 100, "goodput_req_per_s": tok / 100,
        "ttft_p95_s": 0.2, "tpot_p95_s": tpot * 1.2, "error_rate": 0.0, "sustainable": True,
        "slo_met": True, "gpu_count": gpus, "gpu_power_w": 500.0})


def test_efficiency_columns_turn_throughput_into_per_gpu_per_joule_and_dollars() -> None:
    points = frontier.efficiency_columns(_points("a", [8], [2000.0], [0.02], gpus=2.0),
                                         gpu_hour_usd=3.6)
    row = points.iloc[0]
    assert row["per_user_tok_s"] == pytest.approx(50.0)
    # a slower TPOT is a slower user: the speed's low end comes from TPOT's high end
    assert row["per_user_tok_s_lo"] == pytest.approx(1 / 0.021)
    assert row["output_tok_per_gpu_s"] == pytest.approx(1000.0)
    assert row["output_tok_per_j"] == pytest.approx(4.0)  # 2,000 tok/s over 500 W
    # $3.60 a GPU-hour is $0.001 a GPU-second; 1,000 tok per GPU-second: $1 per million
    assert row["usd_per_m_output_tok"] == pytest.approx(1.0)
    assert row["usd_per_m_output_tok_lo"] < 1.0 < row["usd_per_m_output_tok_hi"]
    assert math.isnan(frontier.efficiency_columns(_points("a", [8], [2000.0], [0.02]))
                      ["usd_per_m_output_tok"].iloc[0])  # no price, no cost


def test_the_envelope_is_the_most_throughput_at_that_speed_or_faster() -> None:
    x = np.array([10.0, 20.0, 40.0])
    y = np.array([900.0, 1000.0, 400.0])  # the slowest point gave less than the middle one
    grid = np.array([5.0, 10.0, 20.0, 30.0, 40.0, 50.0])
    assert frontier.envelope(x, y, grid).tolist()[:5] == [1000.0, 1000.0, 1000.0, 700.0, 400.0]
    assert math.isnan(frontier.envelope(x, y, grid)[5])  # past the fastest point: not reached


def _draws(points: pd.DataFrame, seed: int, share: float = 0.02) -> dict:
    """Draws of each point: its figures times independent noise of ``share``."""
    rng = np.random.default_rng(seed)
    out = {}
    for row in points.itertuples(index=False):
        noise = rng.normal(1.0, share, (2, 400))
        out[(row.config, float(row.offered_load), "all")] = Draws({
            "output_tok_per_s": row.output_tok_per_s * noise[0],
            "achieved_req_per_s": row.achieved_req_per_s * noise[0],
            "goodput_req_per_s": row.goodput_req_per_s * noise[0],
            "tpot_p50_s": row.tpot_p50_s * noise[1], "tpot_p95_s": row.tpot_p95_s * noise[1],
            "ttft_p95_s": np.full(400, 0.2), "error_rate": np.zeros(400)})
    return out


def _two_configs() -> tuple[pd.DataFrame, dict]:
    """A: 30-60 tok/s per user; B 1.5x A's throughput at 30 tok/s per user, 2.4x at 60 (A's
    1,000 against B's 2,400) and reaches 80."""
    loads = [4.0, 8.0, 16.0]
    a = _points("a", loads, [1000.0, 1600.0, 2000.0], [1 / 60, 1 / 45, 1 / 30])
    b = _points("b", loads, [1500.0, 2400.0, 3000.0], [1 / 80, 1 / 60, 1 / 30])
    points = frontier.efficiency_columns(pd.concat([a, b], ignore_index=True))
    return points, _draws(points, 7)


def test_frontier_segments_say_where_each_configuration_dominates() -> None:
    points, draws = _two_configs()
    segments = frontier.frontier_segments(points, draws, "a", "b")
    outcomes = [(s["outcome"], round(s["speed_lo"]), round(s["speed_hi"])) for s in segments]
    assert outcomes == [("b", 30, 60), ("only b", 60, 80)], outcomes
    dominated = segments[0]
    assert dominated["lo"] > 1 and 1.4 <= dominated["ratio_lo"] <= dominated["ratio_hi"] <= 2.5
    assert dominated["text"].startswith("at 30-60 tok/s per user, b gives 1.")
    assert dominated["text"].endswith("x the output tok/s per GPU of a")
    assert segments[1]["text"] == "above 60 tok/s per user only b reaches (up to 80)"
    table = frontier.frontier_table(points)
    assert (table["per"] == "GPU").all() and len(table) == 6
    assert (table["tok_s_lo"] < table["tok_s"]).all() and (table["tok_s"] < table["tok_s_hi"]).all()


def test_frontier_within_noise_is_called_level() -> None:
    loads = [4.0, 8.0]
    a = _points("a", loads, [1000.0, 1500.0], [1 / 50, 1 / 40])
    b = _points("b", loads, [1010.0, 1490.0], [1 / 50, 1 / 40])
    points = frontier.efficiency_columns(pd.concat([a, b], ignore_index=True))
    (segment,) = frontier.frontier_segments(points, _draws(points, 3), "a", "b")
    assert segment["outcome"] == "tie" and segment["lo"] < 1 < segment["hi"]
    assert "level within noise" in segment["text"]


def test_a_verdict_where_both_hold_names_the_throughput_difference_not_a_ratio_of_one() -> None:
    points, draws = _two_configs()
    capacity = pd.DataFrame({"config": ["a", "b"], "max_sustainable_load": [16.0, 16.0],
                             "max_load_lo": [16.0, 16.0], "max_load_hi": [math.inf, math.inf],
                             "max_load_reached": [False, False]})
    capacity = frontier.capacity_efficiency(capacity, points)
    verdict = verdict_table(points, draws, capacity, SLO, ["a", "b"])
    headline = verdict[verdict["kind"] == "max load"]["text"].iloc[0]
    assert headline.startswith("both hold the SLO at every load measured (4, 8, 16 users); "
                               "b completes 50% more req/s than a [+"), headline
    text = format_verdict(verdict)
    assert "sustains" not in text and "1.00x" not in text
    at16 = verdict[(verdict["figure"] == "achieved_req_per_s")
                   & (verdict["offered_load"] == 16)].iloc[0]
    assert at16["rel_lo"] < 0.5 < at16["rel_hi"] and at16["rel_lo"] > 0.35
    assert "a at 16 users (its max sustainable load): 2,000 output tok/s per GPU" in text
    # one failed load: the ratio of max loads is the headline again, the throughput beside it;
    # a failed 16 users, which b held (b's limit above its sweep): decided, b sustains more
    failed = capacity.assign(max_sustainable_load=[8.0, 16.0], max_load_lo=[8.0, 16.0],
                             max_load_hi=[16.0, math.inf], max_load_reached=[True, False])
    points.loc[(points["config"] == "a") & (points["offered_load"] == 16), "sustainable"] = False
    verdict = verdict_table(points, draws, failed, SLO, ["a", "b"])
    assert verdict[verdict["kind"] == "max load"]["text"].iloc[0].startswith(
        "b sustains more load than a: a failed a load b held")
    summary = verdict[verdict["kind"] == "summary"]["text"].iloc[0]
    assert summary.startswith("at 16 users, the highest load both measured: b completes 50% more")


def test_a_verdict_where_one_held_no_load_says_the_other_sustains_more() -> None:
    """A prefix cache off held none of its loads, on held all: not "no max sustainable load to
    compare" but which sustains more, with the bound on the ratio."""
    points, draws = _two_configs()
    points.loc[points["config"] == "a", "sustainable"] = False
    capacity = pd.DataFrame({"config": ["a", "b"], "max_sustainable_load": [math.nan, 16.0],
                             "max_load_lo": [math.nan, 16.0], "max_load_hi": [math.nan, math.inf],
                             "max_load_reached": [False, False]})
    capacity = frontier.capacity_efficiency(capacity, points)
    verdict = verdict_table(points, draws, capacity, SLO, ["a", "b"])
    assert verdict[verdict["kind"] == "max load"]["text"].iloc[0] == (
        "b sustains more load than a: a held none of its loads (the lowest 4 users), b held 16 "
        "users, its limit above its sweep (a / b < 0.25x)")
    # a failing only loads above all the other held says nothing of their order
    from dashboards.analysis.study_verdict import none_held_text
    low = capacity.set_index("config").assign(max_sustainable_load=[math.nan, 2.0])
    assert none_held_text(points, "a", "b", low.loc["a"], low.loc["b"], "users") is None


def test_the_frontier_legends_stack_so_a_wider_browser_font_cannot_run_them_together() -> None:
    """The page's SVG is laid out with vl-convert's font and drawn with the browser's (wider):
    side by side, the configuration legend's title ran into the load legend's (an H100 study's
    screenshot read "configurationload"). Stacked, each legend has the chart's width."""
    import re

    import vl_convert

    from dashboards import study_charts
    from dashboards.ui.widgets import static_spec

    points = pd.DataFrame({
        "config": ["seqs-64", "seqs-64", "seqs-256", "seqs-256"],
        "offered_load": [24.0, 55.0, 24.0, 216.0], "per_user_tok_s": [139.0, 89.0, 144.0, 39.0],
        "per_user_tok_s_lo": [137.0, 85.0, 142.0, 38.0],
        "per_user_tok_s_hi": [141.0, 93.0, 146.0, 40.0], "tok_s": [2900.0, 5000.0, 2950.0, 7600.0],
        "tok_s_lo": [2800.0, 4200.0, 2850.0, 6100.0], "tok_s_hi": [3000.0, 5800.0, 3050.0, 9000.0],
        "sustainable": [True, False, True, True], "per": ["GPU"] * 4})
    svg = vl_convert.vegalite_to_svg(static_spec(json.dumps(study_charts.frontier(points))))
    legends = re.findall(r'class="mark-group role-legend"[^>]*><g transform="translate\('
                         r'(\d+),(\d+)\)"><path class="background"[^>]*d="M0,0h(\d+)v(\d+)',
                         svg)
    assert len(legends) == 2, legends
    (x1, y1, _, h1), (x2, y2, _, _) = [tuple(map(int, legend)) for legend in legends]
    assert x1 == x2 and y2 >= y1 + h1  # one above the other, at the same left edge
    # the hollow "past SLO" symbol has an outline: white on white was no symbol at all
    load_legend = svg[svg.rindex('class="mark-group role-legend"'):]
    assert 'stroke="#444"' in load_legend
