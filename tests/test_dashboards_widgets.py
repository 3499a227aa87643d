"""The charts every page draws on the server: lean SVG that is the same picture."""

from __future__ import annotations

import io
import json

import numpy as np
import vl_convert
from PIL import Image

from dashboards.ui import widgets

# points with a tooltip (Vega writes a description per mark from it), an error bar, thirds
SPEC = {
    "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
    "title": "P95 TTFT (ms) vs offered load",
    "width": 400, "height": 250,
    "data": {"values": [{"load": i / 3, "ttft": 50 + 7 * i / 3, "lo": 45 + 7 * i / 3,
                         "hi": 55 + 7 * i / 3, "config": f"c{i % 2}"} for i in range(30)]},
    "layer": [
        {"mark": {"type": "point", "filled": True},
         "encoding": {"x": {"field": "load", "type": "quantitative"},
                      "y": {"field": "ttft", "type": "quantitative"},
                      "color": {"field": "config", "type": "nominal"},
                      "tooltip": [{"field": "load"}, {"field": "ttft"}, {"field": "config"}]}},
        {"mark": "rule",
         "encoding": {"x": {"field": "load", "type": "quantitative"},
                      "y": {"field": "lo", "type": "quantitative"}, "y2": {"field": "hi"}}},
    ],
}


def _pixels(svg: str) -> np.ndarray:
    png = vl_convert.svg_to_png(svg)
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)


def test_a_static_chart_is_the_same_picture_in_half_the_bytes() -> None:
    spec_json = json.dumps(SPEC, sort_keys=True)
    full = vl_convert.vegalite_to_svg(SPEC)
    lean = widgets.chart_svg(spec_json)
    assert "aria-label" in full and "aria-" not in lean and "role=" not in lean
    assert len(lean) < 0.6 * len(full)
    assert 'class="marks"' in lean and ">P95 TTFT (ms) vs offered load<" in lean
    before, after = _pixels(full), _pixels(lean)
    assert before.shape == after.shape
    # coordinates kept to a thousandth of a pixel: a few antialiased edge pixels move, slightly
    differing = np.abs(before - after).sum(axis=-1) > 0
    assert differing.mean() < 0.001 and np.abs(before - after).max() < 64


def test_lean_svg_leaves_text_as_written() -> None:
    svg = ('<svg class="marks" role="graphics-document"><text aria-label="a" x="1.23456789">'
           'role="x" 0.123456789</text><path class="foreground" aria-hidden="true" d="" '
           'pointer-events="none" display="none"/></svg>')
    assert widgets.lean_svg(svg) == ('<svg class="marks"><text x="1.234">role="x" 0.123456789'
                                     '</text></svg>')
