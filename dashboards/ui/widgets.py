"""What every page draws with: a Vega-Lite chart drawn on the server as a Markdown image (SVG,
or a palette PNG for charts of many marks), and a small frame as a Markdown table. A Markdown
element needs no renderer fetched by the browser first, which keeps each page's first view near
a one-metric page's."""

from __future__ import annotations

import base64
import io
import json
import re
import string

import pandas as pd
import streamlit as st
from PIL import Image

# what a static image has no use for: Vega's ARIA roles and labels (an <img> offers its alt text
# only; a label per mark, its tooltip fields, was half a chart's SVG), pointer events, and the
# floating-point noise of its coordinates (277.03000000000003); the mark classes stay (they say
# which mark a path draws)
_UNUSED_ATTRIBUTES = re.compile(r' (?:role|aria-[a-z]+|pointer-events)="[^"]*"')
_LONG_DECIMALS = re.compile(r"(\.\d{3})\d+")
_NOTHING_DRAWN = ('<path class="foreground" d="" display="none"/>',
                  '<path class="background" d="M0,0h0v0h0Z"/>')


def static_spec(spec_json: str) -> dict:
    """The spec to draw as an image: with ``config.aria`` off, Vega-Lite adds no description
    per mark (nor a role per group) to the SVG."""
    spec = json.loads(spec_json)
    spec["config"] = {**spec.get("config", {}), "aria": False}
    return spec


def lean_svg(svg: str) -> str:
    """``svg`` without what :data:`_UNUSED_ATTRIBUTES` names and the empty paths Vega leaves
    for a guide's background and foreground: the same picture in about half the bytes,
    which the browser's Markdown parser reads character by character on a first view. Only
    inside tags: text (a label, a title) is left as it is."""
    def tag(match: re.Match[str]) -> str:
        return _LONG_DECIMALS.sub(r"\1", _UNUSED_ATTRIBUTES.sub("", match.group(0)))

    lean = re.sub(r"<[^<>]*>", tag, svg)
    for empty in _NOTHING_DRAWN:
        lean = lean.replace(empty, "")
    return lean


@st.cache_data(show_spinner=False, max_entries=128)
def chart_svg(spec_json: str) -> str:
    """A Vega-Lite spec drawn as SVG on the server (vl-convert, the Vega the export inlines),
    made lean (:func:`lean_svg`): about 0.15 s a chart here, once per spec; the browser then
    only inserts it."""
    import vl_convert

    svg = lean_svg(vl_convert.vegalite_to_svg(static_spec(spec_json)))
    # the opening tag alone on its line makes the whole SVG one raw HTML block for Markdown,
    # so no text inside it (a "*" or "_" in a label) is read as Markdown
    opening = svg.index(">") + 1
    return svg[:opening] + "\n" + svg[opening:]


def chart_png(spec_json: str, colours: int = 64) -> bytes:
    """A Vega-Lite spec drawn as PNG on the server (vl-convert), reduced to a palette of
    ``colours``: a chart has a few colours and their blends, and the palette makes the image
    about a fifth of the RGBA one (a 20,000-point scatter: 80 kB against 455 kB), which is what
    the browser pays to read and decode on a first view."""
    import vl_convert

    drawn = Image.open(io.BytesIO(vl_convert.vegalite_to_png(static_spec(spec_json))))
    out = io.BytesIO()
    drawn.convert("RGB").quantize(colours).save(out, "PNG", optimize=True)
    return out.getvalue()


def chart_title(spec: dict) -> str:
    """A chart's title as plain text (a Vega-Lite title is a string, a list or ``{"text": ..}``)."""
    title = spec.get("title") or ""
    if isinstance(title, dict):
        title = title.get("text") or ""
    if isinstance(title, list):
        title = " ".join(str(part) for part in title)
    return str(title)


@st.cache_data(show_spinner=False, max_entries=128)
def chart_image(spec_json: str, raster: bool = False) -> str:
    """A Vega-Lite spec drawn as SVG on the server (:func:`chart_svg`), as a Markdown image (a
    ``data:`` URI) whose alt text is the chart's title. A Markdown image needs no raw-HTML
    renderer, which Streamlit's frontend would fetch first (rehype-raw, about 190 kB of script),
    and the browser decodes one image instead of laying out every mark as DOM; cached per spec.
    ``raster``: a PNG instead, for a chart of many thousand marks (an SVG of megabytes)."""
    alt = chart_title(json.loads(spec_json)).replace("[", "(").replace("]", ")")
    if raster:
        encoded = base64.b64encode(chart_png(spec_json)).decode("ascii")
        return f"![{alt}](data:image/png;base64,{encoded})"
    svg = chart_svg(spec_json).replace("\n", "", 1)  # the raw-HTML line break is not needed
    encoded = base64.b64encode(svg.encode()).decode("ascii")
    return f"![{alt}](data:image/svg+xml;base64,{encoded})"


def show_chart(spec: dict | str, interactive: bool, raster: bool = False) -> None:
    """With Vega in the browser when ``interactive``, else as :func:`chart_image`; ``spec`` a
    dict or its JSON with sorted keys (what a page caches: the image's cache key as it is)."""
    if interactive:
        st.vega_lite_chart(spec=json.loads(spec) if isinstance(spec, str) else spec,
                           width="stretch")
    else:
        spec_json = spec if isinstance(spec, str) else json.dumps(spec, sort_keys=True)
        st.markdown(chart_image(spec_json, raster))


def markdown_table(frame: pd.DataFrame, index_name: str | None = None) -> str:
    """A small frame (index included) as a GitHub Markdown table, cells as plain text;
    ``index_name`` heads an unnamed index's column (else "index")."""
    frame = frame.reset_index()
    if index_name is not None:
        frame = frame.rename(columns={"index": index_name})

    def cell(value: object) -> str:
        return str(value).replace("|", "/").replace("\n", " ")

    lines = [
        "| " + " | ".join(cell(c) for c in frame.columns) + " |",
        "|" + "---|" * len(frame.columns),
    ]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(False)]
    return "\n".join(lines)


def as_written(text: str) -> str:
    """Markdown that shows ``text`` exactly as written: every ASCII punctuation mark escaped,
    and ``:`` as an entity, so a time (``15:06:40``) does not read as an emoji code, which
    would make the browser fetch Streamlit's emoji table (about 250 kB) on the first view."""
    return "".join("&#58;" if c == ":" else "\\" + c if c in string.punctuation else c
                   for c in text)
