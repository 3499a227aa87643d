"""Screenshots of every dashboard page on a study folder, for the docs.

Usage::

    python -m infra.tools.screenshots --results results/studies --study sim-two-configs \\
        --out docs/screenshots

Serves the dashboard on ``--results`` (127.0.0.1 only), opens each page in headless Chromium,
waits until its key element is drawn, fails on any Streamlit exception, and writes:

- ``study.png``: the study page's first view (capacity, the four comparison charts);
- ``study-telemetry.png``: its GPU and server telemetry section;
- ``run.png``: the run page on the study's first step run;
- ``report.png``: the static HTML export (``swarmload study export``) opened from disk;
- with ``--bursts``, only ``bursts.png``: the Burst page of a burst study (1400 x 1500 px);
- with ``--sessions-run RUN``, only ``sessions.png``: the Run page's Sessions section of a run
  with sessions;
- :func:`take_compare_screenshots`: the Compare page on given ``?items=`` views.

256-colour PNG files of a 1400 x 2300 px viewport, about 100 KiB each.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

from collectors import run_folder
from dashboards import study_export
from dashboards.analysis import study_data
from infra.tools.browser import (
    DashboardError,
    chromium_browser,
    dashboard_server,
    open_page,
    raise_on_exception,
)

# tall enough for a whole page: Streamlit scrolls inside its own container, so a "full page"
# screenshot would stop at the viewport
VIEWPORT = {"width": 1400, "height": 2300}
STUDY_READY = ".st-key-chart-latency-throughput img"  # the server-drawn SVG, as an image
CHART_KEYS = ("chart-throughput-load", "chart-latency-throughput", "chart-latency-load")


def first_step_run(results_dir: Path, study_dir: Path) -> str | None:
    """The run page's id (``?run=``) of the study's first step run, if it has one."""
    steps = study_data.step_runs(run_folder.load_study_meta(study_dir), study_dir)
    if steps.empty or "run_dir" not in steps:
        return None
    path = Path(str(steps["run_dir"].iloc[0])).resolve()
    root = results_dir.resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else None


def _wait_for_charts(page, keys: tuple[str, ...]) -> None:
    for key in keys:
        # a static chart is an image of server-drawn SVG; an interactive one, Vega's own SVG
        page.locator(f".st-key-{key} img, .st-key-{key} svg.marks").first.wait_for(
            timeout=60_000)
    page.wait_for_timeout(500)  # let the last transitions of Vega's drawing settle


def take_screenshots(results_dir: Path, study_name: str, out_dir: Path) -> list[Path]:
    """Write the four screenshots (see the module docstring); returns their paths."""
    studies = study_data.list_studies(results_dir)
    match = study_data.find_study(studies, study_name)
    if match is None:
        raise DashboardError(f"no study {study_name!r} in {results_dir}: {list(studies['name'])}")
    study_dir = Path(match["path"])
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with dashboard_server(results_dir) as url, chromium_browser() as browser:
        page = browser.new_page(viewport=VIEWPORT)
        study_url = f"{url}/study?study={quote(str(match['study_id']))}"
        open_page(page, study_url, STUDY_READY)
        _wait_for_charts(page, CHART_KEYS)
        raise_on_exception(page)
        written.append(out_dir / "study.png")
        page.screenshot(path=str(written[-1]), full_page=False)

        open_page(page, f"{study_url}&section=telemetry", ".st-key-chart-latency-throughput")
        telemetry = page.locator('[class*="st-key-chart-telemetry-"] img')
        telemetry.first.wait_for(timeout=60_000)
        page.wait_for_timeout(500)
        raise_on_exception(page)
        written.append(out_dir / "study-telemetry.png")
        page.screenshot(path=str(written[-1]), full_page=False)

        run_id = first_step_run(results_dir, study_dir)
        run_url = f"{url}/" + (f"?run={quote(run_id)}" if run_id else "")
        open_page(page, run_url, '[data-testid="stMain"] h1')
        # a step run kept without its raw requests (as in docs/) has no figures to wait for
        page.get_by_text("No request records yet.").or_(
            page.locator(".st-key-chart-run-ttft img")
        ).first.wait_for(timeout=60_000)
        page.wait_for_timeout(1000)
        raise_on_exception(page)
        written.append(out_dir / "run.png")
        page.screenshot(path=str(written[-1]), full_page=False)

        with tempfile.TemporaryDirectory() as tmp:
            report = study_export.export(study_dir, Path(tmp) / "report.html")
            page.goto(report.resolve().as_uri())
            page.locator("#chart-latency-throughput svg.marks").wait_for(timeout=60_000)
            page.wait_for_timeout(500)
            written.append(out_dir / "report.png")
            page.screenshot(path=str(written[-1]), full_page=False)
    for path in written:
        _shrink(path)
    return written


BURST_CHART_KEYS = ("chart-burst-recovery", "chart-burst-load", "chart-burst-ttft",
                    "chart-burst-queue")


def take_burst_screenshot(results_dir: Path, study_name: str, out_dir: Path) -> Path:
    """``bursts.png``: the Burst page comparing a burst study's configurations on recovery."""
    studies = study_data.list_studies(results_dir)
    match = study_data.find_study(studies, study_name)
    if match is None:
        raise DashboardError(f"no study {study_name!r} in {results_dir}: {list(studies['name'])}")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bursts.png"
    with dashboard_server(results_dir) as url, chromium_browser() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1500})
        burst_url = f"{url}/bursts?view=study&study={quote(str(match['study_id']))}"
        open_page(page, burst_url, ".st-key-chart-burst-recovery img")
        _wait_for_charts(page, BURST_CHART_KEYS)
        raise_on_exception(page)
        page.screenshot(path=str(path), full_page=False)
    _shrink(path)
    return path


def take_sessions_screenshot(results_dir: Path, run_id: str, out_dir: Path) -> Path:
    """``sessions.png``: the Sessions section of the Run page (its container, charts drawn)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "sessions.png"
    with dashboard_server(results_dir) as url, chromium_browser() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 3000})
        open_page(page, f"{url}/?run={quote(run_id)}", ".st-key-sessions")
        section = page.locator(".st-key-sessions")
        section.locator("img").nth(3).wait_for(timeout=60_000)  # its four charts
        page.wait_for_timeout(1000)
        raise_on_exception(page)
        section.screenshot(path=str(path))
    _shrink(path)
    return path


def take_compare_screenshots(results_dir: Path, views: dict[str, str], out_dir: Path,
                             height: int = 1700) -> list[Path]:
    """``<name>.png`` of the Compare page for each ``name -> ?items=...`` query in ``views``;
    a view of studies waits for the curves chart, one of runs for the verdict table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with dashboard_server(results_dir) as url, chromium_browser() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": height})
        for name, query in views.items():
            ready = (".st-key-chart-curves img" if "study:" in query
                     else '[class*="st-key-table-verdicts-"]')
            open_page(page, f"{url}/compare?{query}", ready)
            page.wait_for_timeout(1000)
            raise_on_exception(page)
            written.append(out_dir / f"{name}.png")
            page.screenshot(path=str(written[-1]), full_page=False)
    for path in written:
        _shrink(path)
    return written


def _shrink(path: Path) -> None:
    """Re-save as a 256-colour PNG: a third of the size, no visible loss on flat UI colours."""
    from PIL import Image  # Pillow comes with Streamlit

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.tools.screenshots",
        description="Screenshots of the dashboard's pages on a study, for the docs.",
    )
    parser.add_argument("--results", type=Path, required=True, help="folder holding the study")
    parser.add_argument("--study", default=None, help="study folder or name (default: the newest)")
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"))
    parser.add_argument("--bursts", action="store_true",
                        help="only bursts.png: the Burst page of a burst study")
    parser.add_argument("--sessions-run", default=None, metavar="RUN",
                        help="only sessions.png: the Run page's Sessions section of this run")
    args = parser.parse_args(argv)
    if args.sessions_run:
        path = take_sessions_screenshot(args.results, args.sessions_run, args.out)
        print(f"{path} ({path.stat().st_size / 1024:.0f} KiB)")
        return 0
    name = args.study
    if name is None:
        studies = study_data.list_studies(args.results)
        if studies.empty:
            print(f"no study in {args.results}", file=sys.stderr)
            return 2
        name = str(studies.iloc[0]["study_id"])
    if args.bursts:
        path = take_burst_screenshot(args.results, name, args.out)
        print(f"{path} ({path.stat().st_size / 1024:.0f} KiB)")
        return 0
    for path in take_screenshots(args.results, name, args.out):
        print(f"{path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
