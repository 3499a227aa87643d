"""Chart specs of bursts: pure functions from burst frames to Vega-Lite specs (plain dicts).

Inputs are :mod:`dashboards.analysis.burst` frames: ``timelines`` (TIMELINE_COLUMNS of one spike,
one or more configurations told apart by a ``config`` column) and ``spikes`` (SPIKE_COLUMNS with
``config``). Time runs from the spike's start (``t_s`` = 0); the spike is shaded, each
configuration's baseline band is drawn in its colour and a dashed rule marks where it recovered.
The Burst page passes these to ``st.vega_lite_chart``; the study export embeds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from dashboards.study_charts import CONFIG_COLORS, records

Spec = dict[str, Any]
WIDTH = 360
HEIGHT = 240
SPIKE_SHADE = "#bbbbbb"


def _color(configs: Sequence[str]) -> Spec:
    return {"field": "config", "type": "nominal", "title": "configuration",
            "scale": {"domain": list(configs),
                      "range": [CONFIG_COLORS[i % len(CONFIG_COLORS)]
                                for i in range(len(configs))]}}


def _configs(frame: pd.DataFrame, configs: Sequence[str] | None) -> list[str]:
    return list(configs) if configs else list(dict.fromkeys(frame["config"]))


def _x() -> Spec:
    return {"field": "t_s", "type": "quantitative",
            "title": "s from the spike's start (a fault's action)"}


def _spike_shade(spikes: pd.DataFrame) -> list[Spec]:
    duration = float(spikes["duration_s"].max()) if len(spikes) else 0.0
    return [{"data": {"values": [{"start": 0.0, "end": duration}]},
             "mark": {"type": "rect", "color": SPIKE_SHADE, "opacity": 0.25},
             "encoding": {"x": {"field": "start", "type": "quantitative"},
                          "x2": {"field": "end"}}}]


def markers(spikes: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: the recovery point (s from the spike's start; NaN if never) and its
    baseline bands (TTFT P50..limit in ms, queue 0..limit)."""
    frame = pd.DataFrame({
        "config": spikes["config"].astype(str),
        "recovered_at_s": spikes["duration_s"] + spikes["recovery_s"],
        "recovery_s": spikes["recovery_s"],
        "ttft_lo_ms": spikes["baseline_ttft_p50_s"] * 1e3,
        "ttft_hi_ms": spikes["ttft_limit_s"] * 1e3,
        "queue_hi": spikes["queue_limit"].replace(np.inf, np.nan),
    })
    frame["label"] = [f"recovered {r:.0f} s" if np.isfinite(r) else "not recovered"
                      for r in frame["recovery_s"]]
    return frame


def _recovery_rules(marks: pd.DataFrame, configs: Sequence[str]) -> list[Spec]:
    recovered = marks[np.isfinite(marks["recovered_at_s"])]
    if recovered.empty:
        return []
    return [{"data": {"values": records(recovered, ["config", "recovered_at_s", "label"])},
             "mark": {"type": "rule", "strokeDash": [6, 3], "strokeWidth": 2},
             "encoding": {"x": {"field": "recovered_at_s", "type": "quantitative"},
                          "color": _color(configs),
                          "tooltip": [{"field": "config"}, {"field": "label"}]}}]


def _chart(title: str, layers: list[Spec]) -> Spec:
    return {"$schema": "https://vega.github.io/schema/vega-lite/v6.json", "title": title,
            "width": WIDTH, "height": HEIGHT, "layer": layers}


def load_timeline(timelines: pd.DataFrame, spikes: pd.DataFrame,
                  configs: Sequence[str] | None = None) -> Spec:
    """Offered (dashed) and achieved (solid) load per 1 s window."""
    configs = _configs(timelines, configs)
    long = timelines[["config", "t_s", "offered_rps", "achieved_rps"]].melt(
        id_vars=["config", "t_s"], var_name="series", value_name="rps")
    long["series"] = long["series"].map({"offered_rps": "offered", "achieved_rps": "achieved"})
    return _chart("Offered and achieved load (req/s)", [
        *_spike_shade(spikes),
        {"data": {"values": records(long)},
         "mark": {"type": "line", "interpolate": "step-after"},
         "encoding": {"x": _x(), "y": {"field": "rps", "type": "quantitative", "title": "req/s"},
                      "color": _color(configs),
                      "strokeDash": {"field": "series", "type": "nominal", "title": "load",
                                     "scale": {"domain": ["offered", "achieved"],
                                               "range": [[4, 3], [1, 0]]}},
                      "tooltip": [{"field": "config"}, {"field": "series"},
                                  {"field": "t_s"}, {"field": "rps", "format": ".1f"}]}},
        *_recovery_rules(markers(spikes), configs),
    ])


def ttft_timeline(timelines: pd.DataFrame, spikes: pd.DataFrame,
                  configs: Sequence[str] | None = None) -> Spec:
    """P95 TTFT per window (log scale) over each configuration's baseline band."""
    configs = _configs(timelines, configs)
    data = timelines.assign(ttft_p95_ms=timelines["ttft_p95_s"] * 1e3)
    data = data[np.isfinite(data["ttft_p95_ms"])]
    marks = markers(spikes)
    return _chart("P95 TTFT per window (ms), baseline band", [
        *_spike_shade(spikes),
        {"data": {"values": records(marks, ["config", "ttft_lo_ms", "ttft_hi_ms"])},
         "mark": {"type": "rect", "opacity": 0.15},
         "encoding": {"y": {"field": "ttft_lo_ms", "type": "quantitative"},
                      "y2": {"field": "ttft_hi_ms"}, "color": _color(configs)}},
        {"data": {"values": records(data, ["config", "t_s", "ttft_p95_ms"])},
         "mark": {"type": "line", "point": True},
         "encoding": {"x": _x(),
                      "y": {"field": "ttft_p95_ms", "type": "quantitative", "title": "ms",
                            "scale": {"type": "log"}},
                      "color": _color(configs),
                      "tooltip": [{"field": "config"}, {"field": "t_s"},
                                  {"field": "ttft_p95_ms", "format": ".0f"}]}},
        *_recovery_rules(marks, configs),
    ])


def error_timeline(timelines: pd.DataFrame, spikes: pd.DataFrame,
                   configs: Sequence[str] | None = None) -> Spec:
    """The share of each window's requests that failed (a fault drill's third criterion)."""
    configs = _configs(timelines, configs)
    data = timelines.assign(error_pct=timelines["error_rate"] * 100.0)
    data = data[np.isfinite(data["error_pct"])]
    return _chart("Error rate per window (%)", [
        *_spike_shade(spikes),
        {"data": {"values": records(data, ["config", "t_s", "error_pct", "failed"])},
         "mark": {"type": "line", "point": True, "interpolate": "step-after"},
         "encoding": {"x": _x(),
                      "y": {"field": "error_pct", "type": "quantitative", "title": "%"},
                      "color": _color(configs),
                      "tooltip": [{"field": "config"}, {"field": "t_s"},
                                  {"field": "error_pct", "format": ".1f"}, {"field": "failed"}]}},
        *_recovery_rules(markers(spikes), configs),
    ])


def queue_timeline(timelines: pd.DataFrame, spikes: pd.DataFrame,
                   configs: Sequence[str] | None = None) -> Spec:
    """The server's waiting queue (solid) and running requests (dotted) per window."""
    configs = _configs(timelines, configs)
    if timelines[["waiting", "running"]].isna().all().all():
        return _chart("Server queue", [{"mark": {"type": "text"},
                                        "encoding": {"text": {"value": "no server metrics"}}}])
    long = timelines[["config", "t_s", "waiting", "running"]].melt(
        id_vars=["config", "t_s"], var_name="series", value_name="count").dropna()
    marks = markers(spikes).dropna(subset=["queue_hi"]).assign(zero=0.0)
    return _chart("Server queue: waiting and running requests", [
        *_spike_shade(spikes),
        {"data": {"values": records(marks, ["config", "zero", "queue_hi"])},
         "mark": {"type": "rect", "opacity": 0.15},
         "encoding": {"y": {"field": "zero", "type": "quantitative"},
                      "y2": {"field": "queue_hi"}, "color": _color(configs)}},
        {"data": {"values": records(long)},
         "mark": {"type": "line"},
         "encoding": {"x": _x(),
                      "y": {"field": "count", "type": "quantitative", "title": "requests"},
                      "color": _color(configs),
                      "strokeDash": {"field": "series", "type": "nominal", "title": "queue",
                                     "scale": {"domain": ["waiting", "running"],
                                               "range": [[1, 0], [2, 2]]}},
                      "tooltip": [{"field": "config"}, {"field": "series"}, {"field": "t_s"},
                                  {"field": "count", "format": ".1f"}]}},
        *_recovery_rules(marks, configs),
    ])


def recovery_bars(comparison: pd.DataFrame, configs: Sequence[str] | None = None) -> Spec:
    """Median recovery time per configuration (a configuration that never recovered shows a
    label instead of a bar)."""
    configs = _configs(comparison, configs)
    data = comparison.assign(label=[
        f"{r:.0f} s" if np.isfinite(r) else "never" for r in comparison["recovery_s"]],
        bar=comparison["recovery_s"].fillna(0.0))
    return {"$schema": "https://vega.github.io/schema/vega-lite/v6.json",
            "title": "Recovery time from the same spike (s)", "width": 300, "height": 140,
            "data": {"values": records(data, ["config", "bar", "label", "recovered", "spikes"])},
            "encoding": {"y": {"field": "config", "type": "nominal", "sort": list(configs),
                               "title": None},
                         "x": {"field": "bar", "type": "quantitative",
                               "title": "s from the spike's end"}},
            "layer": [{"mark": {"type": "bar"}, "encoding": {"color": _color(configs)}},
                      {"mark": {"type": "text", "align": "left", "dx": 4},
                       "encoding": {"text": {"field": "label"}}}]}
