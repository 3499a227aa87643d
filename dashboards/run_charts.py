"""Chart specs of one run: pure functions from the run page's frames to Vega-Lite (plain dicts).

The Run page draws them on the server as images on its first view (PNG for the TTFT scatter,
whose 20,000 points would make an SVG of megabytes; SVG for the lines) and with Vega in the
browser under "Interactive charts": the same figures either way. ``max_points`` thins a line to
its envelope per pixel column (:mod:`dashboards.analysis.envelope`), for an image that looks the
same from fewer points.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from dashboards.analysis.envelope import envelope_positions
from dashboards.study_charts import records

Spec = dict[str, Any]
WIDTH = 440  # two charts a row in the page's wide layout
WIDE = 920  # the TTFT scatter, alone on its row
HEIGHT = 220
SCHEMA = "https://vega.github.io/schema/vega-lite/v5.json"


def ttft_scatter(points: pd.DataFrame) -> Spec:
    """One point per ok request (as :func:`dashboards.analysis.runs.latency_over_time` thinned
    them): TTFT in ms against the send time, coloured by bucket."""
    return {
        "$schema": SCHEMA, "title": "TTFT by sent time", "width": WIDE, "height": 300,
        "data": {"values": records(points, ["t_s", "ttft_ms", "bucket"])},
        "mark": {"type": "circle", "size": 10, "opacity": 0.6},
        "encoding": {
            "x": {"field": "t_s", "type": "quantitative", "title": "sent (s since run start)"},
            "y": {"field": "ttft_ms", "type": "quantitative", "title": "TTFT (ms)"},
            "color": {"field": "bucket", "type": "nominal", "title": "bucket"},
            "tooltip": [{"field": "t_s", "title": "sent (s)", "format": ".2f"},
                        {"field": "ttft_ms", "title": "TTFT (ms)", "format": ".1f"},
                        {"field": "bucket"}],
        },
    }


def line(frame: pd.DataFrame, x: str, y: str, *, title: str, x_title: str,
         color: str | None = None, max_points: int | None = None) -> Spec:
    """``y`` against ``x`` (sorted), one line per ``color`` value if given. ``max_points`` thins
    each line to its envelope (at most that many points; ``4 * WIDTH`` looks the same)."""
    frame = frame[frame[y].notna()].sort_values(x)
    if max_points:
        groups = [g for _, g in frame.groupby(color, sort=False)] if color else [frame]
        frame = pd.concat([g.iloc[envelope_positions(g[x].to_numpy(), g[y].to_numpy(),
                                                     max(1, max_points // 4))]
                           for g in groups]) if groups else frame
    encoding: Spec = {
        "x": {"field": x, "type": "quantitative", "title": x_title},
        "y": {"field": y, "type": "quantitative", "title": title},
        "tooltip": [{"field": x, "format": ".1f"}, {"field": y, "format": ".3~g"}],
    }
    if color:
        encoding["color"] = {"field": color, "type": "nominal", "title": color}
    values = records(frame, [x, y, *([color] if color else [])])
    return {"$schema": SCHEMA, "title": title, "width": WIDTH, "height": HEIGHT,
            "data": {"values": values}, "mark": {"type": "line", "strokeWidth": 1.5},
            "encoding": encoding}



def turn_lines(by_turn: pd.DataFrame, columns: list[str], *, title: str,
               y_title: str) -> Spec:
    """One line per column of ``by_turn`` (:func:`dashboards.analysis.sessions.per_turn`, with
    the columns to draw) over the turn index."""
    return {
        "$schema": SCHEMA, "title": title, "width": WIDTH, "height": HEIGHT,
        "data": {"values": records(by_turn, ["turn", *columns])},
        "transform": [{"fold": columns, "as": ["series", "value"]}],
        "mark": {"type": "line", "point": True, "strokeWidth": 1.5},
        "encoding": {
            "x": {"field": "turn", "type": "quantitative", "title": "turn",
                  "axis": {"tickMinStep": 1}},
            "y": {"field": "value", "type": "quantitative", "title": y_title},
            "color": {"field": "series", "type": "nominal", "title": None,
                      "legend": {"orient": "bottom"}},
            "tooltip": [{"field": "turn"}, {"field": "series"},
                        {"field": "value", "format": ".3~g"}],
        },
    }


def history_scatter(points: pd.DataFrame) -> Spec:
    """One point per ok turn (:func:`dashboards.analysis.sessions.turn_points`): TTFT against
    the history it was sent with, coloured by turn."""
    return {
        "$schema": SCHEMA, "title": "TTFT by history length", "width": WIDTH,
        "height": HEIGHT,
        "data": {"values": records(points.assign(turn=points["turn"].astype(int)),
                                   ["history_tokens", "ttft_ms", "turn"])},
        "mark": {"type": "circle", "size": 10, "opacity": 0.6},
        "encoding": {
            "x": {"field": "history_tokens", "type": "quantitative", "title": "history (tokens)"},
            "y": {"field": "ttft_ms", "type": "quantitative", "title": "TTFT (ms)"},
            "color": {"field": "turn", "type": "ordinal", "title": "turn"},
            "tooltip": [{"field": "turn"}, {"field": "history_tokens"},
                        {"field": "ttft_ms", "format": ".1f"}],
        },
    }


def duration_bars(histogram: pd.DataFrame) -> Spec:
    """Sessions per duration bin (:func:`dashboards.analysis.sessions.duration_histogram`)."""
    return {
        "$schema": SCHEMA, "title": "Session durations", "width": WIDTH, "height": HEIGHT,
        "data": {"values": records(histogram, ["duration_s", "sessions"])},
        "mark": {"type": "bar"},
        "encoding": {
            "x": {"field": "duration_s", "type": "ordinal", "title": "duration (s)"},
            "y": {"field": "sessions", "type": "quantitative", "title": "sessions"},
            "tooltip": [{"field": "duration_s"}, {"field": "sessions"}],
        },
    }
