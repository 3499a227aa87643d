"""Chart specs of one run: pure functions from the run page's frames to Vega-Lite (plain dicts).

The Run page draws them on the server as images on its first view (PNG for the TTFT scatter,
whose 20,000 points would make an SVG of megabytes; SVG for the lines) and with Vega in the
browser under "Interactive charts": the same figures either way. ``max_points`` thins a line to
its envelope per pixel column (:mod:`dashboards.analysis.envelope`), for an image that looks the
same from fewer points.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from dashboards.analysis.envelope import envelope_positions
from dashboards.study_charts import records

Spec = dict[str, Any]
WIDTH = 440  # two charts a row in the page's wide layout
WIDE = 920  # the TTFT scatter, alone on its row
HEIGHT = 220
SCHEMA = "https://vega.github.io/schema/vega-lite/v5.json"
LAG_SHOWN_S = 0.005  # a task timeline draws a call's schedule lag past this


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


def bars(histogram: pd.DataFrame, x: str, y: str, *, title: str, x_title: str) -> Spec:
    """Counts ``y`` per bin centre ``x`` (a histogram frame) as bars."""
    return {
        "$schema": SCHEMA, "title": title, "width": WIDTH, "height": HEIGHT,
        "data": {"values": records(histogram, [x, y])},
        "mark": {"type": "bar"},
        "encoding": {
            "x": {"field": x, "type": "ordinal", "title": x_title},
            "y": {"field": y, "type": "quantitative", "title": y},
            "tooltip": [{"field": x}, {"field": y}],
        },
    }


def duration_bars(histogram: pd.DataFrame) -> Spec:
    """Sessions per duration bin (:func:`dashboards.analysis.sessions.duration_histogram`)."""
    return bars(histogram, "duration_s", "sessions", title="Session durations",
                x_title="duration (s)")


def task_bars(histogram: pd.DataFrame) -> Spec:
    """Ok tasks per task-time bin (:func:`dashboards.analysis.tasks.task_histogram`)."""
    return bars(histogram, "task_s", "tasks", title="Task times (ok tasks)",
                x_title="task time (s)")


def task_timeline(timeline: pd.DataFrame, title: str) -> Spec:
    """One task's calls (:func:`dashboards.analysis.tasks.timeline`) as bars from first send to
    last byte on a lane per agent (lanes in the graph's order), the critical path's calls in
    their own colour (a call not ok in grey), and each dependency a dashed line from the end of
    the call waited on to the dependent call's scheduled send (the gap between: its delay); an
    orange line from a call's scheduled send to its send where the generator sent it more than
    :data:`LAG_SHOWN_S` late (its schedule lag: the task's generator delay)."""
    lanes = list(dict.fromkeys(timeline.sort_values(["depth", "call"])["agent"]))
    calls = timeline.drop_duplicates("call")
    calls = calls.assign(path=np.where(calls["outcome"].ne("ok"), "not ok", np.where(
        calls["on_critical_path"], "critical path", "other")))
    edges = timeline[timeline["from_end_s"].notna()]
    late = calls[(calls["start_s"] - calls["scheduled_s"]) > LAG_SHOWN_S]
    lane = {"field": "agent", "type": "nominal", "scale": {"domain": lanes}, "title": "agent"}
    return {
        "$schema": SCHEMA, "title": title, "width": WIDE,
        "height": max(HEIGHT // 2, 28 * len(lanes)),
        "layer": [
            {"data": {"values": records(calls, ["call", "agent", "start_s", "end_s", "path",
                                                "outcome"])},
             "mark": {"type": "bar", "height": {"band": 0.6}},
             "encoding": {
                 "x": {"field": "start_s", "type": "quantitative",
                       "title": "s since the task's start"},
                 "x2": {"field": "end_s"}, "y": lane,
                 "color": {"field": "path", "type": "nominal", "title": None,
                           "scale": {"domain": ["critical path", "other", "not ok"],
                                     "range": ["#d62728", "#9ecae1", "#7f7f7f"]},
                           "legend": {"orient": "bottom"}},
                 "tooltip": [{"field": "call"}, {"field": "agent"}, {"field": "outcome"},
                             {"field": "start_s", "format": ".3f"},
                             {"field": "end_s", "format": ".3f"}]}},
            {"data": {"values": records(edges, ["from_agent", "from_end_s", "agent",
                                                "scheduled_s"])},
             "mark": {"type": "rule", "strokeDash": [3, 2], "color": "#555"},
             "encoding": {
                 "x": {"field": "from_end_s", "type": "quantitative"},
                 "x2": {"field": "scheduled_s"},
                 "y": {**lane, "field": "from_agent"}, "y2": {"field": "agent"}}},
            {"data": {"values": records(late, ["call", "agent", "scheduled_s", "start_s"])},
             "mark": {"type": "rule", "strokeWidth": 3, "color": "#ff7f0e"},
             "encoding": {
                 "x": {"field": "scheduled_s", "type": "quantitative"},
                 "x2": {"field": "start_s"}, "y": lane,
                 "tooltip": [{"field": "call"}, {"field": "scheduled_s", "format": ".3f"},
                             {"field": "start_s", "format": ".3f"}]}},
        ],
    }
