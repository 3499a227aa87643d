"""Time the Soak page's first view on a real soak run folder, as the study page bench does.

    python -m infra.tools.bench.soak_dashboard --results RESULTS_DIR --run RUN_ID [--repeat 3]

Headless Chromium against the dashboard server: seconds from navigation to ``/soak?run=RUN_ID``
until the latency chart's marks are drawn, with a cold and a warm browser cache
(:func:`infra.tools.bench.study_dashboard.measure_browser`), and the floor (a Streamlit page with
one metric) on the same machine at the same time.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from infra.tools.bench.study_dashboard import figures, measure_baseline, measure_browser

# the latency chart drawn: the server's SVG shown as an image (the page's first view)
READY_SELECTOR = '.st-key-chart-soak-latency img[src^="data:image/svg"]'


def screenshot(results_dir: Path, run_id: str, path: Path) -> None:
    from infra.tools.browser import (
        chromium_browser,
        dashboard_server,
        open_page,
        raise_on_exception,
        wait_until_drawn,
    )
    from infra.tools.screenshots import _shrink

    path.parent.mkdir(parents=True, exist_ok=True)
    with dashboard_server(results_dir) as url, chromium_browser() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1700})
        open_page(page, f"{url}/soak?run={run_id}", READY_SELECTOR, timeout_ms=120_000)
        for key in ("chart-soak-rss", "chart-soak-throughput", "chart-soak-errors"):
            page.locator(f".st-key-{key} img").first.wait_for(state="attached", timeout=60_000)
        wait_until_drawn(page)
        raise_on_exception(page)
        page.screenshot(path=str(path), full_page=False)
    _shrink(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.tools.bench.soak_dashboard",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, required=True, help="results folder")
    parser.add_argument("--run", required=True, help="soak run id (a folder under --results)")
    parser.add_argument("--repeat", type=int, default=3, help="timed views per method")
    parser.add_argument("--screenshot", type=Path, default=None, metavar="PNG",
                        help="also save the page's first view there (1400 x 1700 px)")
    args = parser.parse_args(argv)
    if args.screenshot is not None:
        screenshot(args.results.resolve(), args.run, args.screenshot)
        print(f"{args.screenshot} ({args.screenshot.stat().st_size / 1024:.0f} KiB)")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    cold, warm = measure_browser(args.results.resolve(), "", args.repeat,
                                 url_path=f"/soak?run={args.run}", ready_selector=READY_SELECTOR)
    print(f"Soak page first view, Chromium, cold cache: {figures(cold)}")
    print(f"Soak page first view, Chromium, warm cache: {figures(warm)}")
    floor = measure_baseline(args.repeat)
    print(f"floor, Chromium (a Streamlit page with one metric): {figures(floor)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
