"""Chart specs of a study: pure functions from roll-up frames to Vega-Lite specs (plain dicts).

No Streamlit and no I/O: the study page passes these to ``st.vega_lite_chart`` and the static
export (:mod:`dashboards.study_export`) embeds them with vega-embed, so both show the same
figures. Plain dicts rather than Altair objects because building and validating an Altair layer
chart took about 0.3 s each here, which alone would break the page's 2 s first view; a dict
costs microseconds and the data are a few dozen rows.

Every chart colours configurations the same way (the ``configs`` order), puts offered load or
achieved throughput on x, and marks each configuration's knee and max sustainable load (from
``capacity.parquet``) where the study found them.

Usage::

    view = study_data.select_steps(study.steps, bucket="all")
    spec = latency_vs_throughput(view, study.capacity, "ttft", "p95", configs=study.configs)
    st.vega_lite_chart(spec)          # or json.dumps(spec) into vega-embed

Latency axes are in milliseconds; throughput in ok requests/s unless ``y`` says otherwise.
A chart whose columns the roll-up lacks comes back as a text mark saying so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from dashboards.analysis.study_data import (
    METRIC_LABELS,
    PERCENTILE_TAGS,
    TELEMETRY_COLUMNS,
    THROUGHPUT_COLUMNS,
    capacity_rows,
    load_unit,
    metric_column,
)

Spec = dict[str, Any]
WIDTH = 420
HEIGHT = 280
MARKER_SHAPES = {"knee": "diamond", "max load": "triangle-up"}
MARKER_DASHES = {"knee": [6, 3], "max load": [2, 2]}
SLO_COLOR = "firebrick"
# Vega's "tableau10" scheme, spelled out so every renderer and theme uses the same colours
CONFIG_COLORS = (
    "#4c78a8",
    "#f58518",
    "#54a24b",
    "#b279a2",
    "#e45756",
    "#72b7b2",
    "#eeca3b",
    "#ff9da6",
    "#9d755d",
    "#bab0ac",
)
_TOOLTIP_BASE = ("config", "step", "offered_load")



def records(frame: pd.DataFrame, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts (NaN -> null, numpy scalars -> Python), only ``columns``."""
    if columns is not None:
        frame = frame[[c for c in columns if c in frame]]
    return json.loads(frame.to_json(orient="records", double_precision=10))


def _color(configs: Sequence[str]) -> Spec:
    # an explicit range: Streamlit's theme would otherwise draw two configurations in two
    # shades of one blue
    return {
        "field": "config",
        "type": "nominal",
        "title": "configuration",
        "scale": {"domain": list(configs), "range": list(CONFIG_COLORS)},
    }


def _load_title(steps: pd.DataFrame) -> str:
    unit = load_unit(steps)
    return f"offered load ({unit})" if unit else "offered load"


def _configs(steps: pd.DataFrame, configs: Sequence[str] | None) -> list[str]:
    if configs is not None:
        return list(configs)
    return [str(c) for c in steps["config"].unique()] if "config" in steps else []


def _chart(title: str, layers: list[Spec]) -> Spec:
    # refined steps (a shape by phase) and the markers (a shape by marker) keep their own legends
    return {"title": title, "width": WIDTH, "height": HEIGHT, "layer": layers,
            "resolve": {"scale": {"shape": "independent", "strokeDash": "independent"}}}


def _empty(title: str, reason: str) -> Spec:
    """A chart that says why there is nothing to draw (a column the roll-up lacks)."""
    return {
        "title": title,
        "width": WIDTH,
        "height": 80,
        "data": {"values": [{"text": reason}]},
        "mark": {"type": "text", "fontSize": 13, "color": "gray"},
        "encoding": {"text": {"field": "text", "type": "nominal"}},
    }


def _curve(
    steps: pd.DataFrame, x: str, y: str, configs: Sequence[str], x_title: str, y_title: str
) -> list[Spec]:
    """A line with a point at each step, per configuration, drawn in load order; a 95% error bar
    on each point where the roll-up has ``<y>_lo`` / ``<y>_hi`` (points.parquet), and steps the
    search added (phase ``refine``) drawn as squares."""
    bars = [c for c in (f"{y}_lo", f"{y}_hi") if c in steps]
    extra = [c for c in ("repeats", "requests") if c in steps]
    tooltip = [c for c in dict.fromkeys((*_TOOLTIP_BASE, x, y, *bars, *extra)) if c in steps]
    encoding: Spec = {
        "x": {"field": x, "type": "quantitative", "title": x_title},
        "y": {"field": y, "type": "quantitative", "title": y_title},
        "color": _color(configs),
        "tooltip": [
            {"field": c, "type": "nominal" if c == "config" else "quantitative"} for c in tooltip
        ],
    }
    if "offered_load" in steps:
        # each configuration's line follows its steps, not x (throughput may fold back)
        encoding["order"] = {"field": "offered_load", "type": "quantitative"}
    fields = [*tooltip, *(["phase"] if "phase" in steps else [])]
    data = {"values": records(steps, fields)}
    point: Spec = {**encoding}
    if "phase" in steps:
        point["shape"] = {"field": "phase", "type": "nominal", "title": "step",
                          "scale": {"domain": ["sweep", "probe", "refine"],
                                    "range": ["circle", "circle", "square"]}}
    layers: list[Spec] = [
        {"data": data, "mark": {"type": "line"}, "encoding": encoding},
        {"data": data, "mark": {"type": "point", "filled": True, "size": 60}, "encoding": point},
    ]
    if len(bars) == 2 and steps[bars].notna().any().all():
        layers.append({
            "data": data,
            "mark": {"type": "rule", "strokeWidth": 1.5},
            "encoding": {
                "x": {"field": x, "type": "quantitative"},
                "y": {"field": bars[0], "type": "quantitative"},
                "y2": {"field": bars[1]},
                "color": _color(configs),
            },
        })
    return layers


def _latency_ms(steps: pd.DataFrame, metric: str, percentile: str) -> tuple[pd.DataFrame, str]:
    column = metric_column(metric, percentile)
    frame = steps.copy()
    for suffix in ("", "_lo", "_hi"):
        if f"{column}{suffix}" in frame:
            frame[f"latency_ms{suffix}"] = frame[f"{column}{suffix}"] * 1e3
    return frame, column


def _latency_title(metric: str, percentile: str) -> str:
    return f"{PERCENTILE_TAGS[percentile]} {METRIC_LABELS[metric]} (ms)"


def marker_points(
    steps: pd.DataFrame, capacity: pd.DataFrame, x: str, y: str | None = None
) -> pd.DataFrame:
    """Where each configuration's knee and max sustainable load fall on a curve of ``x``
    (and ``y``) against offered load, interpolated linearly between the steps around them.

    Rows: config, marker ("knee" / "max load"), load, reached, label, x (and y). A load the
    study did not find (NaN) gives no row; one not reached is kept with ``reached=False`` and a
    "+" in its label (the true figure is at least that).
    """
    rows = []
    for row in capacity_rows(capacity):
        curve = steps[steps["config"] == row["config"]] if "config" in steps else steps.iloc[:0]
        curve = curve.dropna(subset=[c for c in ("offered_load", x, y) if c is not None])
        curve = curve.sort_values("offered_load")
        loads = curve["offered_load"].to_numpy(dtype=float)
        for marker, load_key, reached_key, band in (
            ("knee", "knee_load", "knee_reached", "knee"),
            ("max load", "max_sustainable_load", "max_load_reached", "max_load"),
        ):
            load = row[load_key]
            if math.isnan(load) or (x != "offered_load" and not loads.size):
                continue
            if y is not None and not loads.size:
                continue
            reached = row[reached_key] is not False
            point: dict[str, Any] = {
                "config": row["config"],
                "marker": marker,
                "load": load,
                "reached": reached,
                "label": f"{marker} {load:g}" + ("" if reached else "+"),
            }
            lo, hi = row.get(f"{band}_lo", math.nan), row.get(f"{band}_hi", math.nan)
            if math.isfinite(lo) and math.isfinite(hi):  # its 95% interval, as a band
                point["lo"], point["hi"] = lo, hi
            if x == "offered_load":
                point["x"] = load
            else:
                point["x"] = float(np.interp(load, loads, curve[x].to_numpy(dtype=float)))
            if y is not None:
                point["y"] = float(np.interp(load, loads, curve[y].to_numpy(dtype=float)))
            rows.append(point)
    columns = ["config", "marker", "load", "reached", "label", "x", "lo", "hi",
               *(["y"] if y else [])]
    return pd.DataFrame(rows, columns=columns)


def _marker_tooltip() -> list[Spec]:
    return [
        {"field": "config", "type": "nominal"},
        {"field": "marker", "type": "nominal"},
        {"field": "load", "type": "quantitative", "title": "offered load"},
        {"field": "reached", "type": "nominal"},
    ]


def _point_markers(points: pd.DataFrame, configs: Sequence[str], x_title: str) -> list[Spec]:
    data = {"values": records(points)}
    position: dict[str, Any] = {
        "x": {"field": "x", "type": "quantitative", "title": x_title},
        "y": {"field": "y", "type": "quantitative"},
        "color": _color(configs),
    }
    shape = {
        "field": "marker",
        "type": "nominal",
        "title": "marked",
        "scale": {"domain": list(MARKER_SHAPES), "range": list(MARKER_SHAPES.values())},
    }
    return [
        {
            "data": data,
            "mark": {
                "type": "point",
                "filled": True,
                "size": 260,
                "stroke": "black",
                "strokeWidth": 1,
                "opacity": 1,
            },
            "encoding": {**position, "shape": shape, "tooltip": _marker_tooltip()},
        },
        # labels above a knee and below a max load, so the two stay readable when they meet
        *(
            {
                "data": data,
                "transform": [{"filter": {"field": "marker", "equal": marker}}],
                "mark": {"type": "text", "align": "left", "dx": 9, "dy": dy, "fontSize": 11},
                "encoding": dict(position, text={"field": "label", "type": "nominal"}),
            }
            for marker, dy in (("knee", -10), ("max load", 14))
        ),
    ]


def _rule_markers(points: pd.DataFrame, configs: Sequence[str]) -> list[Spec]:
    dash = {
        "field": "marker",
        "type": "nominal",
        "title": "marked",
        "scale": {"domain": list(MARKER_DASHES), "range": list(MARKER_DASHES.values())},
    }
    bands = points.dropna(subset=["lo", "hi"]) if "lo" in points else points.iloc[:0]
    layers = [] if bands.empty else [{
        "data": {"values": records(bands)},
        "mark": {"type": "rect", "opacity": 0.12},
        "encoding": {
            "x": {"field": "lo", "type": "quantitative"},
            "x2": {"field": "hi"},
            "color": _color(configs),
        },
    }]
    return layers + [
        {
            "data": {"values": records(points)},
            "mark": {"type": "rule", "strokeWidth": 2},
            "encoding": {
                "x": {"field": "x", "type": "quantitative"},
                "color": _color(configs),
                "strokeDash": dash,
                "tooltip": _marker_tooltip(),
            },
        }
    ]


def _slo_rule(threshold_s: float | None) -> list[Spec]:
    if threshold_s is None:
        return []
    data = {"values": [{"y": threshold_s * 1e3, "label": f"SLO {threshold_s * 1e3:g} ms"}]}
    y = {"field": "y", "type": "quantitative"}
    return [
        {
            "data": data,
            "mark": {"type": "rule", "color": SLO_COLOR, "strokeDash": [4, 4]},
            "encoding": {"y": y},
        },
        {
            "data": data,
            "mark": {"type": "text", "align": "left", "dx": 4, "dy": -7, "color": SLO_COLOR},
            "encoding": {"y": y, "x": {"value": 0}, "text": {"field": "label", "type": "nominal"}},
        },
    ]


def throughput_vs_load(
    steps: pd.DataFrame,
    capacity: pd.DataFrame,
    y: str = "achieved_req_per_s",
    configs: Sequence[str] | None = None,
) -> Spec:
    """Achieved throughput (or ``y``: output tok/s, goodput) against offered load, one line per
    configuration, with dashed rules at each knee and max sustainable load; for rate plans the
    grey diagonal is "achieved = offered"."""
    title = "Throughput vs offered load"
    configs = _configs(steps, configs)
    if y not in steps or "offered_load" not in steps or steps[y].isna().all():
        return _empty(title, f"the roll-up has no {y}")
    layers: list[Spec] = []
    if load_unit(steps) == "req/s" and y in ("achieved_req_per_s", "goodput_req_per_s"):
        top = float(steps["offered_load"].max())
        layers.append(
            {
                "data": {"values": [{"x": 0.0, "y": 0.0}, {"x": top, "y": top}]},
                "mark": {"type": "line", "color": "lightgray", "strokeDash": [2, 2]},
                "encoding": {
                    "x": {"field": "x", "type": "quantitative"},
                    "y": {"field": "y", "type": "quantitative"},
                },
            }
        )
    layers += _curve(
        steps, "offered_load", y, configs, _load_title(steps), THROUGHPUT_COLUMNS.get(y, y)
    )
    layers += _load_rules(steps, capacity, configs)
    return _chart(title, layers)


def latency_vs_throughput(
    steps: pd.DataFrame,
    capacity: pd.DataFrame,
    metric: str = "ttft",
    percentile: str = "p95",
    configs: Sequence[str] | None = None,
    slo_threshold_s: float | None = None,
) -> Spec:
    """Latency (ms) against achieved throughput, a curve per configuration in load order; the
    knee (diamond) and max sustainable load (triangle) sit on the curve at their offered load."""
    return _latency_chart(
        steps, capacity, metric, percentile, configs, slo_threshold_s, "achieved_req_per_s"
    )


def latency_vs_load(
    steps: pd.DataFrame,
    capacity: pd.DataFrame,
    metric: str = "ttft",
    percentile: str = "p95",
    configs: Sequence[str] | None = None,
    slo_threshold_s: float | None = None,
) -> Spec:
    """Latency (ms) against offered load: the curve the knee was found on, with the knee and
    max sustainable load as dashed rules and the SLO (when it bounds this figure) in red."""
    return _latency_chart(
        steps, capacity, metric, percentile, configs, slo_threshold_s, "offered_load"
    )


def _latency_chart(
    steps: pd.DataFrame,
    capacity: pd.DataFrame,
    metric: str,
    percentile: str,
    configs: Sequence[str] | None,
    slo_threshold_s: float | None,
    x: str,
) -> Spec:
    """Latency (ms) against ``x`` ("achieved_req_per_s" or "offered_load") with the SLO rule;
    the knee and max load are points on a throughput curve (their x is interpolated), rules on a
    load curve (their x is the load itself)."""
    by_throughput = x == "achieved_req_per_s"
    y_title = _latency_title(metric, percentile)
    title = f"{y_title} vs {'throughput' if by_throughput else 'offered load'}"
    configs = _configs(steps, configs)
    frame, column = _latency_ms(steps, metric, percentile)
    if column not in frame or x not in frame or frame[column].isna().all():
        return _empty(title, f"the roll-up has no {column}"
                             + (" or achieved_req_per_s" if by_throughput else ""))
    x_title = THROUGHPUT_COLUMNS[x] if by_throughput else _load_title(frame)
    layers = _curve(frame, x, "latency_ms", configs, x_title, y_title)
    layers += _slo_rule(slo_threshold_s)
    if by_throughput:
        points = marker_points(frame, capacity, x, "latency_ms")
        if not points.empty:
            layers += _point_markers(points, configs, x_title)
    else:
        layers += _load_rules(frame, capacity, configs)
    return _chart(title, layers)


def _load_rules(steps: pd.DataFrame, capacity: pd.DataFrame, configs: Sequence[str]) -> list[Spec]:
    """Dashed rules at each configuration's knee and max load, on a chart of offered load."""
    points = marker_points(steps, capacity, "offered_load")
    return _rule_markers(points, configs) if not points.empty else []


def error_rate_vs_load(steps: pd.DataFrame, configs: Sequence[str] | None = None) -> Spec:
    """Error rate (% of attempts) against offered load, a line per configuration."""
    title = "Error rate vs offered load"
    configs = _configs(steps, configs)
    if "error_rate" not in steps or "offered_load" not in steps:
        return _empty(title, "the roll-up has no error_rate")
    frame = steps.assign(error_pct=steps["error_rate"] * 100)
    for suffix in ("_lo", "_hi"):
        if f"error_rate{suffix}" in frame:
            frame[f"error_pct{suffix}"] = frame[f"error_rate{suffix}"] * 100
    layers = _curve(frame, "offered_load", "error_pct", configs, _load_title(frame), "errors (%)")
    for layer in layers:
        layer["encoding"]["y"]["axis"] = {"format": "~g"}  # "0", not "0.000000", with no errors
    return _chart(title, layers)


def telemetry_vs_load(
    steps: pd.DataFrame, column: str, configs: Sequence[str] | None = None
) -> Spec:
    """One telemetry mean per step (GPU utilisation, power, running requests, KV cache) against
    offered load, a line per configuration."""
    label = TELEMETRY_COLUMNS.get(column, column)
    title = f"{label} vs offered load"
    configs = _configs(steps, configs)
    if column not in steps or "offered_load" not in steps or steps[column].isna().all():
        return _empty(title, f"no {column} in the roll-up")
    return _chart(title, _curve(steps, "offered_load", column, configs, _load_title(steps), label))


def frontier(frontier_points: pd.DataFrame, configs: Sequence[str] | None = None) -> Spec:
    """The throughput-interactivity curve (rollup/frontier.parquet): output tok/s per GPU (per
    server where a configuration has no GPU count) against per-user speed (1 / P50 TPOT), a
    curve per configuration in load order with 95% bars both ways; loads past the SLO hollow."""
    per = str(frontier_points["per"].iloc[0]) if len(frontier_points) else "GPU"
    y_title = f"output tok/s per {per}"
    title = f"Frontier: {y_title} vs tok/s per user"
    if frontier_points.empty or frontier_points["per_user_tok_s"].isna().all():
        return _empty(title, "no frontier in the roll-up (rollup/frontier.parquet)")
    configs = _configs(frontier_points, configs)
    frame = frontier_points.assign(within_slo=frontier_points["sustainable"].map(
        {True: "within SLO", False: "past SLO"}))
    columns = ["config", "offered_load", "per_user_tok_s", "per_user_tok_s_lo",
               "per_user_tok_s_hi", "tok_s", "tok_s_lo", "tok_s_hi", "within_slo"]
    data = {"values": records(frame, columns)}
    x = {"field": "per_user_tok_s", "type": "quantitative", "title": "output tok/s per user "
         "(1 / P50 TPOT)", "scale": {"zero": False}}
    y = {"field": "tok_s", "type": "quantitative", "title": y_title}
    tooltip = [{"field": c, "type": "nominal" if c in ("config", "within_slo")
                else "quantitative"} for c in columns]
    encoding = {"x": x, "y": y, "color": _color(configs), "tooltip": tooltip,
                "order": {"field": "offered_load", "type": "quantitative"}}
    layers: list[Spec] = [
        {"data": data, "mark": {"type": "line"}, "encoding": encoding},
        {"data": data, "mark": {"type": "point", "size": 60},
         "encoding": {**encoding, "fill": {
             "field": "within_slo", "type": "nominal", "title": "load",
             "scale": {"domain": ["within SLO", "past SLO"], "range": ["#444", "white"]},
             # the hollow symbol drawn as the points are: a white one alone is invisible
             "legend": {"symbolStrokeColor": "#444"}}}},
        {"data": data, "mark": {"type": "rule", "strokeWidth": 1.5},
         "encoding": {"x": x, "y": {"field": "tok_s_lo", "type": "quantitative"},
                      "y2": {"field": "tok_s_hi"}, "color": _color(configs)}},
        {"data": data, "mark": {"type": "rule", "strokeWidth": 1.5},
         "encoding": {"y": y, "x": {"field": "per_user_tok_s_lo", "type": "quantitative"},
                      "x2": {"field": "per_user_tok_s_hi"}, "color": _color(configs)}},
    ]
    spec = _chart(title, layers)
    spec["resolve"]["scale"]["fill"] = "independent"
    # below the plot: beside it, long configuration names were cut off at half a page's width;
    # stacked, not side by side: the page's SVG is laid out with vl-convert's font and drawn with
    # the browser's, wider, so "configuration" ran into "load" beside it
    spec["config"] = {"legend": {"orient": "bottom", "direction": "vertical", "labelLimit": 400,
                                 "layout": {"bottom": {"anchor": "start",
                                                       "direction": "vertical"}}}}
    return spec
