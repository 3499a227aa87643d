"""Chart specs of a soak: pure functions from its series (dashboards.analysis.soak) to Vega-Lite.

``series`` is :func:`dashboards.analysis.soak.soak_series` (index: window start, wall-clock ns);
time runs in hours from the run's first window. Gaps between segments (a crash, then
``--resume``) are shaded; each series' verdict is in its legend label, and a drifting series'
Theil-Sen line is drawn dashed over it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from dashboards.analysis.envelope import envelope_positions

Spec = dict[str, Any]
WIDTH = 440
HEIGHT = 220
GAP_SHADE = "#d9d9d9"


def _hours(series: pd.DataFrame, origin_ns: int) -> np.ndarray:
    return (np.asarray(series.index, dtype=np.int64) - origin_ns) / 3.6e12


def _label(name: str, verdicts: dict[str, str]) -> str:
    verdict = verdicts.get(name)
    return f"{name} ({verdict})" if verdict else name


def timeline(series: pd.DataFrame, columns: Sequence[str], *, title: str, y_title: str,
             scale: float = 1.0, origin_ns: int | None = None,
             verdicts: dict[str, str] | None = None,
             trends: dict[str, tuple[float, float, float]] | None = None,
             gaps: Sequence[tuple[float, float]] = (), max_points: int | None = None) -> Spec:
    """Lines of ``columns`` over the hours; ``trends`` maps a column to (hours, level, slope per
    hour) of its Theil-Sen line, from the drift report (drawn from that hour on); ``gaps`` are
    (start h, end h) spans to shade. ``origin_ns`` (default: the first window) is hour 0.
    ``max_points`` thins each line to its envelope (:func:`envelope_positions`, at most that many
    points): for a static image, ``4 * WIDTH`` draws the same picture as every window."""
    verdicts = verdicts or {}
    present = [c for c in columns if c in series.columns and series[c].notna().any()]
    origin = int(series.index.min()) if origin_ns is None else origin_ns
    hours = _hours(series, origin)
    # one line per segment: a crash's gap is not bridged
    ends = np.array([b for _, b in gaps], dtype=float)
    segment = np.searchsorted(np.sort(ends), hours, side="right") if ends.size else (
        np.zeros(hours.size, dtype=int))
    rows: list[dict[str, Any]] = []
    for c in present:
        values = series[c].to_numpy(dtype=float)
        keep = (envelope_positions(hours, values, max(1, max_points // 4)) if max_points
                else np.flatnonzero(np.isfinite(values)))
        label = _label(c, verdicts)
        rows += [{"h": h, "value": v, "series": label, "segment": g}
                 for h, v, g in zip(hours[keep].tolist(), (values[keep] * scale).tolist(),
                                    segment[keep].tolist(), strict=True)]
    layers: list[Spec] = []
    if gaps:
        layers.append({
            "data": {"values": [{"h0": a, "h1": b} for a, b in gaps]},
            "mark": {"type": "rect", "color": GAP_SHADE, "opacity": 0.6},
            "encoding": {"x": {"field": "h0", "type": "quantitative"}, "x2": {"field": "h1"}},
        })
    layers.append({
        "data": {"values": rows},
        "mark": {"type": "line", "strokeWidth": 1.5},
        "encoding": {
            "x": {"field": "h", "type": "quantitative", "title": "hours from the start"},
            "y": {"field": "value", "type": "quantitative", "title": y_title,
                  "scale": {"zero": False}},
            "color": {"field": "series", "type": "nominal", "title": None,
                      "legend": {"orient": "bottom", "columns": 2, "labelLimit": 260}},
            "detail": {"field": "segment", "type": "nominal"},
        },
    })
    trend_rows = []
    for column, (h0, start, slope) in (trends or {}).items():
        if column not in present or not np.isfinite(h0):
            continue
        for h in (h0, float(hours.max())):
            trend_rows.append({"h": h, "value": (start + slope * (h - h0)) * scale,
                               "series": _label(column, verdicts)})
    if trend_rows:
        layers.append({
            "data": {"values": trend_rows},
            "mark": {"type": "line", "strokeDash": [6, 4], "strokeWidth": 2},
            "encoding": {"x": {"field": "h", "type": "quantitative"},
                         "y": {"field": "value", "type": "quantitative"},
                         "color": {"field": "series", "type": "nominal"}},
        })
    return {"$schema": "https://vega.github.io/schema/vega-lite/v5.json", "title": title,
            "width": WIDTH, "height": HEIGHT, "layer": layers}
