"""Screenshots of every dashboard page on a study folder, for the docs.

Usage::

    python -m infra.tools.screenshots --results results/studies --study sim-two-configs \\
        --out docs/screenshots

Serves the dashboard on ``--results`` (127.0.0.1 only), opens each page in headless Chromium,
waits until its key elements are there and the whole page is drawn (Streamlit's script run over,
every chart decoded: :func:`infra.tools.browser.wait_until_drawn`), fails on any Streamlit
exception, and writes:

- ``study.png``: the study page's first view (the verdict, the frontier chart beside it, the
  capacity, the four comparison charts);
- ``study-frontier.png``: the verdict beside the throughput-interactivity frontier, cropped to
  them (studies with ``rollup/frontier.parquet``);
- ``study-telemetry.png``: its GPU and server telemetry section, scrolled to the top of the view;
- ``run.png``: the run page on the study's first step run;
- ``report.png``: the static HTML export (``swarmload study export``) opened from disk;
- with ``--bursts``, only ``bursts.png``: the Burst page of a burst study (1400 x 1500 px);
- with ``--sessions-run RUN``, only ``sessions.png``: the Run page's Sessions section of a run
  with sessions; with ``--tasks-run RUN``, only ``tasks.png``: its Tasks section of a run with
  agent tasks;
- with ``--server-run RUN`` (repeatable), only ``run-server-<kind>.png`` for each: the Run page's
  server section of that run (the figures from its engine's own ``/metrics``, a figure the
  engine does not expose marked absent), named after the run's target kind;
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
    wait_until_drawn,
)

# tall enough for a whole page: Streamlit scrolls inside its own container, so a "full page"
# screenshot would stop at the viewport
VIEWPORT = {"width": 1400, "height": 2300}
STUDY_READY = ".st-key-chart-latency-throughput img"  # the server-drawn SVG, as an image
CHART_KEYS = ("chart-throughput-load", "chart-latency-throughput", "chart-latency-load")
FRONTIER_KEY = "chart-frontier"  # dashboards/ui/study_page.py's container of the frontier
SECTION_KEY = "study_section"  # its "Details" radio, above the chosen section
SERVER_SECTION_KEY = "run-server"  # dashboards/ui/run_page.py's container of the server figures


def first_step_run(results_dir: Path, study_dir: Path) -> str | None:
    """The run page's id (``?run=``) of the study's first step run, if it has one."""
    steps = study_data.step_runs(run_folder.load_study_meta(study_dir), study_dir)
    if steps.empty or "run_dir" not in steps:
        return None
    path = Path(str(steps["run_dir"].iloc[0])).resolve()
    root = results_dir.resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else None


def _wait_for_charts(page, keys: tuple[str, ...]) -> None:
    """Until each chart of ``keys`` is on the page and the whole page is drawn."""
    for key in keys:
        # a static chart is an image of server-drawn SVG; an interactive one, Vega's own SVG
        page.locator(f".st-key-{key} img, .st-key-{key} svg.marks").first.wait_for(
            state="attached", timeout=60_000)
    wait_until_drawn(page)


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
        frontier = (study_dir / run_folder.ROLLUP_DIR / run_folder.FRONTIER_FILE).is_file()
        _wait_for_charts(page, (*CHART_KEYS, *((FRONTIER_KEY,) if frontier else ())))
        raise_on_exception(page)
        written.append(out_dir / "study.png")
        page.screenshot(path=str(written[-1]), full_page=False)
        if frontier:  # the verdict's row: its sentences and the chart beside them
            written.append(out_dir / "study-frontier.png")
            page.locator(f'[data-testid="stHorizontalBlock"]:has(.st-key-{FRONTIER_KEY})'
                         ).first.screenshot(path=str(written[-1]))

        open_page(page, f"{study_url}&section=telemetry", ".st-key-chart-latency-throughput")
        page.locator('[class*="st-key-chart-telemetry-"] img').first.wait_for(
            state="attached", timeout=60_000)
        wait_until_drawn(page)
        raise_on_exception(page)
        # the section lies below the verdict, capacity and comparison charts: scroll it (its
        # "Details" choice first) to the top of the view, or the shot is study.png again
        page.locator(f".st-key-{SECTION_KEY}").evaluate(
            "element => element.scrollIntoView({block: 'start'})")
        written.append(out_dir / "study-telemetry.png")
        page.screenshot(path=str(written[-1]), full_page=False)

        run_id = first_step_run(results_dir, study_dir)
        run_url = f"{url}/" + (f"?run={quote(run_id)}" if run_id else "")
        open_page(page, run_url, '[data-testid="stMain"] h1')
        # a step run kept without its raw requests (as in docs/) has no figures to wait for
        page.get_by_text("No request records yet.").or_(
            page.locator(".st-key-chart-run-ttft img")
        ).first.wait_for(state="attached", timeout=60_000)
        wait_until_drawn(page)
        raise_on_exception(page)
        written.append(out_dir / "run.png")
        page.screenshot(path=str(written[-1]), full_page=False)

        with tempfile.TemporaryDirectory() as tmp:
            report = study_export.export(study_dir, Path(tmp) / "report.html")
            page.goto(report.resolve().as_uri())
            page.locator("#chart-latency-throughput svg.marks").wait_for(timeout=60_000)
            if frontier:
                page.locator("#chart-frontier svg.marks").wait_for(timeout=60_000)
            wait_until_drawn(page)
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


# the Run page sections a screenshot can show alone: section (its container key and the PNG's
# name) -> how many charts it draws
RUN_SECTIONS = {"sessions": 4, "tasks": 2}


def take_section_screenshot(results_dir: Path, run_id: str, out_dir: Path,
                            section: str = "sessions") -> Path:
    """``<section>.png``: one section of the Run page (:data:`RUN_SECTIONS`: its container, its
    charts drawn)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{section}.png"
    with dashboard_server(results_dir) as url, chromium_browser() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 3000})
        open_page(page, f"{url}/?run={quote(run_id)}", f".st-key-{section}")
        box = page.locator(f".st-key-{section}")
        box.locator("img").nth(RUN_SECTIONS[section] - 1).wait_for(state="attached",
                                                                  timeout=60_000)
        wait_until_drawn(page)
        raise_on_exception(page)
        box.screenshot(path=str(path))
    _shrink(path)
    return path


def take_server_screenshots(results_dir: Path, run_ids: list[str], out_dir: Path) -> list[Path]:
    """``run-server-<kind>.png`` for each run: the Run page's server section (its container,
    charts drawn), named after the target kind in the run's manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with dashboard_server(results_dir) as url, chromium_browser() as browser:
        page = browser.new_page(viewport=VIEWPORT)
        for run_id in run_ids:
            kind = run_folder.load_manifest(results_dir / run_id).get("target", {}).get("kind")
            section = page.locator(f".st-key-{SERVER_SECTION_KEY}")
            open_page(page, f"{url}/?run={quote(run_id)}", f".st-key-{SERVER_SECTION_KEY}")
            section.locator("img").first.wait_for(state="attached", timeout=60_000)
            wait_until_drawn(page)
            raise_on_exception(page)
            written.append(out_dir / f"run-server-{kind or 'url'}.png")
            section.screenshot(path=str(written[-1]))
    for path in written:
        _shrink(path)
    return written


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
            wait_until_drawn(page)
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
    for section in RUN_SECTIONS:
        parser.add_argument(f"--{section}-run", default=None, metavar="RUN",
                            help=f"only {section}.png: the Run page's {section.title()} section "
                            "of this run")
    parser.add_argument("--server-run", action="append", default=[], metavar="RUN",
                        help="only run-server-<kind>.png: the Run page's server section of this "
                        "run (a folder under --results; repeatable)")
    args = parser.parse_args(argv)
    if args.server_run:
        for path in take_server_screenshots(args.results, args.server_run, args.out):
            print(f"{path} ({path.stat().st_size / 1024:.0f} KiB)")
        return 0
    for section in RUN_SECTIONS:
        run_id = getattr(args, f"{section}_run")
        if run_id:
            path = take_section_screenshot(args.results, run_id, args.out, section)
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
