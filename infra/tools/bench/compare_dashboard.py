"""Time the Compare page's first view on two 10-million-request studies, beside Streamlit's floor.

    python -m infra.tools.bench.compare_dashboard --out /tmp/compare-10m --measure --repeat 5

Writes two synthetic studies (:func:`infra.tools.bench.study_dashboard.write_synthetic_study`, 10M
requests each in roll-ups, labelled ``engine=vllm-0.25`` and ``engine=vllm-0.26``) under
``--out/studies`` and opens ``/compare?items=study:studies/monday,study:studies/tuesday`` in
headless Chromium until the curves chart is drawn, cold cache and warm cache, as the Study page
bench does; then, in the same run, the floor: a page with one metric served the way the dashboard
is (same server flags, wide layout, the same five-page navigation, at ``/compare``), cold and
warm, and the issue's bare floor (a one-page Streamlit script with one metric).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from infra.tools.bench.study_dashboard import (
    figures,
    measure_baseline,
    measure_browser,
    write_synthetic_study,
)

READY_SELECTOR = ".st-key-chart-curves img"  # the curves chart: an SVG image, decoded
STUDIES = {"monday": "vllm-0.25", "tuesday": "vllm-0.26"}
FLOOR_SELECTOR = '[data-testid="stMetric"]'
# The floor inside the dashboard's frame: dashboards/app.py's page setup and navigation, with
# the Compare page replaced by one metric (the other pages are never opened).
FLOOR_APP = """import streamlit as st


def compare_floor():
    st.title("Compare")
    st.metric("requests", "10,000,000")


def other():
    st.title("other")


st.set_page_config(page_title="swarmload", layout="wide")
st.navigation([
    st.Page(other, title="Run", default=True),
    st.Page(other, title="Study", url_path="study"),
    st.Page(compare_floor, title="Compare", url_path="compare"),
    st.Page(other, title="Bursts", url_path="bursts"),
    st.Page(other, title="Soak", url_path="soak"),
]).run()
"""


def write_studies(out: Path, requests: int) -> Path:
    """Two labelled synthetic studies under ``out/studies``; returns the results folder."""
    for name, engine in STUDIES.items():
        study = write_synthetic_study(out / "studies" / name, requests, name=name)
        meta = json.loads((study / "study.json").read_text())
        meta["labels"] = {"engine": engine}
        (study / "study.json").write_text(json.dumps(meta, indent=1))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.tools.bench.compare_dashboard",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="results folder to (re)write")
    parser.add_argument("--requests", type=int, default=10_000_000, help="requests per study")
    parser.add_argument("--measure", action="store_true", help="time the page on it")
    parser.add_argument("--no-generate", action="store_true", help="reuse an existing --out")
    parser.add_argument("--repeat", type=int, default=3, help="timed views per method")
    args = parser.parse_args(argv)
    if not args.no_generate:
        write_studies(args.out, args.requests)
        print(f"wrote {len(STUDIES)} studies of {args.requests:,} requests under {args.out}")
    if not args.measure:
        return 0
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    url_path = "/compare?items=" + ",".join(f"study:studies/{name}" for name in STUDIES)
    cold, warm = measure_browser(args.out.resolve(), "", args.repeat, url_path=url_path,
                                 ready_selector=READY_SELECTOR)
    print(f"Compare page first view, Chromium, cold cache: {figures(cold)}")
    print(f"Compare page first view, Chromium, warm cache: {figures(warm)}")
    with tempfile.TemporaryDirectory() as tmp:
        floor_app = Path(tmp) / "floor_app.py"
        floor_app.write_text(FLOOR_APP)
        cold, warm = measure_browser(args.out.resolve(), "", args.repeat, url_path="/compare",
                                     ready_selector=FLOOR_SELECTOR, app=floor_app)
    print(f"floor in the dashboard's frame (one metric at /compare), cold: {figures(cold)}")
    print(f"floor in the dashboard's frame (one metric at /compare), warm: {figures(warm)}")
    floor = measure_baseline(args.repeat)
    print(f"bare floor, Chromium (a one-page Streamlit script with one metric), cold: "
          f"{figures(floor)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
