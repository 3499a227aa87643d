"""Every dashboard page in headless Chromium on a real study folder (slow).

The study is real: ``swarmload study run`` sweeps two simulator configurations (4 and 8 slots,
each request holding a slot for about 0.4 s, so capacities of about 10 and 20 req/s) over four
open-loop steps each, with Locust master, worker and collectors; it is the capacity test's study
(``conftest.sim_capacity_study``), made once per session. The test then serves
``swarmload dashboard`` on it and, as a user would, opens the Study page, switches the metric
and the detail section, follows a step's link to the Run page, opens the Run page's default
view, and opens the static HTML export from disk; on each it waits for the key elements, fails
on any Streamlit exception, and saves a screenshot under the test's tmp folder.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote
from xml.etree import ElementTree

import pytest

from dashboards.analysis import study_data
from infra.tools import screenshots
from infra.tools.browser import (
    CHROMIUM,
    chromium_browser,
    dashboard_server,
    open_page,
    raise_on_exception,
    wait_until_drawn,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium at /usr/bin/chromium"),
]
REPO_ROOT = Path(__file__).resolve().parents[1]
CHART_KEYS = ("chart-throughput-load", "chart-latency-throughput", "chart-latency-load",
              "chart-errors-load")
VIEWPORT = {"width": 1400, "height": 2000}


@pytest.fixture(scope="module")
def study_results(request: pytest.FixtureRequest) -> Path:
    """A results folder holding one finished two-configuration study of the simulator."""
    pytest.importorskip("playwright.sync_api")
    reuse = os.environ.get("SWARMLOAD_BROWSER_STUDY_RESULTS")
    if reuse:  # a results folder this fixture made before: iterate on the pages in seconds
        return Path(reuse)
    return request.getfixturevalue("sim_capacity_study").results


def _svg_of(src: str) -> str:
    """The SVG text of an image's ``data:image/svg+xml;base64,`` source."""
    prefix = "data:image/svg+xml;base64,"
    assert src.startswith(prefix), src[:60]
    return base64.b64decode(src.removeprefix(prefix)).decode()


def _line_paths(svg: str) -> int:
    """Paths drawn by Vega's line marks (one per configuration's curve) in an SVG."""
    ns = "{http://www.w3.org/2000/svg}"
    return sum(len(list(group.iter(f"{ns}path"))) for group in ElementTree.fromstring(svg).iter(
        f"{ns}g") if "mark-line" in (group.get("class") or "").split())


def _the_study(results: Path) -> dict:
    studies = study_data.list_studies(results)
    assert len(studies) == 1, studies
    return studies.iloc[0].to_dict()


def test_every_page_in_a_real_browser(study_results: Path, tmp_path: Path) -> None:
    study = _the_study(study_results)
    study_dir = Path(study["path"])
    assert (study_dir / "rollup" / "steps.parquet").is_file(), "the runner wrote no roll-up"
    record = json.loads((study_dir / "study.json").read_text())
    configs = [c["name"] for c in record["configurations"]]
    assert configs == ["seqs-4", "seqs-8"]
    shots = []
    with (
        dashboard_server(study_results, tmp_path / "dashboard.log") as url,
        chromium_browser() as browser,
    ):
        page = browser.new_page(viewport=VIEWPORT)
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))

        # the study page: capacity per configuration, four charts (on first view, images of
        # SVG drawn on the server)
        study_url = f"{url}/study?study={quote(study['study_id'])}"
        open_page(page, study_url, ".st-key-chart-latency-throughput img")
        for key in CHART_KEYS:
            page.locator(f".st-key-{key} img").wait_for(timeout=60_000)
        table = page.locator(".st-key-table-capacity table")
        capacity = study_data.load_study(study_dir).capacity
        for row in study_data.capacity_rows(capacity):  # as the runner found them
            expected = study_data.format_load(
                row["max_sustainable_load"], row["max_load_reached"], "req/s"
            )
            cells = table.locator("tr").filter(has_text=row["config"]).locator("td")
            shown = cells.nth(1).inner_text(timeout=30_000)
            # the figure, then its 95% interval where the roll-up has one ("9.2 req/s [9.2, 10.8]")
            assert shown == expected or shown.startswith(f"{expected} ["), shown
        # each configuration's curve: a coloured line per config in the latency chart, whose
        # image the browser decoded (drawn at its size, alt text its title)
        latency = page.locator(".st-key-chart-latency-throughput")
        image = latency.locator("img")
        assert image.evaluate("img => img.complete && img.naturalWidth > 100")
        assert image.get_attribute("alt") == "P95 TTFT (ms) vs throughput"
        svg = _svg_of(image.get_attribute("src") or "")
        assert _line_paths(svg) >= len(configs)
        assert svg.count(">P95 TTFT (ms) vs throughput<") == 1
        # the frontier beside the verdict: output tok/s (per server: the simulator has no GPU)
        # against per-user speed, a curve per configuration
        frontier = page.locator(".st-key-chart-frontier img")
        frontier.wait_for(timeout=60_000)
        assert frontier.evaluate("img => img.complete && img.naturalWidth > 100")
        assert frontier.get_attribute("alt") == (
            "Frontier: output tok/s per server vs tok/s per user")
        assert _line_paths(_svg_of(frontier.get_attribute("src") or "")) >= len(configs)
        raise_on_exception(page)
        shots.append(tmp_path / "study.png")
        page.screenshot(path=str(shots[-1]))

        # "Interactive charts" draws the same four charts with Vega in the browser
        page.locator('[data-testid="stSidebar"]').get_by_text("Interactive charts").click()
        for key in CHART_KEYS:
            page.locator(f'.st-key-{key} [data-testid="stVegaLiteChart"] svg.marks').wait_for(
                timeout=60_000
            )
        assert latency.locator("g.mark-line path").count() >= len(configs)

        # the metric selector redraws the charts for TPOT
        page.locator('[data-testid="stRadio"]').filter(has_text="Metric").get_by_text(
            "TPOT", exact=True
        ).click()
        latency.get_by_text("P95 TPOT (ms) vs throughput").wait_for(timeout=60_000)
        raise_on_exception(page)

        # the telemetry section: the simulator's /metrics, averaged per step
        page.locator('[data-testid="stRadio"]').filter(has_text="Details").get_by_text(
            "GPU and server telemetry", exact=True
        ).click()
        running = page.locator(".st-key-chart-telemetry-num_requests_running_mean svg.marks")
        running.wait_for(timeout=60_000)
        raise_on_exception(page)
        shots.append(tmp_path / "study-telemetry.png")
        page.screenshot(path=str(shots[-1]))

        # the step runs section links each step to the run page, which reads its raw requests
        page.locator('[data-testid="stRadio"]').filter(has_text="Details").get_by_text(
            "Step runs", exact=True
        ).click()
        link = page.locator(".st-key-table-step-runs a").first
        link.wait_for(timeout=60_000)
        href = link.get_attribute("href")
        assert href and href.startswith("/?run="), href
        open_page(page, url + href, '[data-testid="stMetric"]')
        ttft = page.locator('[data-testid="stMetric"]').filter(has_text="P95 TTFT (ms)")
        assert float(ttft.locator('[data-testid="stMetricValue"]').inner_text()) > 0
        page.locator(".st-key-chart-run-ttft img").wait_for(timeout=60_000)
        raise_on_exception(page)
        shots.append(tmp_path / "run-step.png")
        page.screenshot(path=str(shots[-1]))

        # the run page's default view (no link): the step runs are listed as runs
        open_page(page, f"{url}/", '[data-testid="stMetric"]')
        assert page.locator('[data-testid="stMain"] h1').first.inner_text().startswith("Run ")
        page.wait_for_url("**/?run=studies*", timeout=30_000)  # it opened on a step run
        raise_on_exception(page)
        shots.append(tmp_path / "run.png")
        page.screenshot(path=str(shots[-1]))

        # the static export, from disk: every chart drawn with the inlined libraries
        report = tmp_path / "report.html"
        subprocess.run(
            [sys.executable, "-m", "infra.cli", "study", "export", str(study_dir), "--out",
             str(report)],
            cwd=REPO_ROOT, check=True, timeout=120,
        )
        page.goto(report.as_uri())
        charts = page.locator(".chart")
        charts.first.locator("svg.marks").wait_for(timeout=60_000)
        drawn = page.locator(".chart svg.marks")
        assert charts.count() >= 4
        page.wait_for_function(
            f"document.querySelectorAll('.chart svg.marks').length === {charts.count()}",
            timeout=60_000,
        )
        assert drawn.count() == charts.count()
        assert page.locator("#study-title").inner_text() == f"Study {record['name']}"
        shots.append(tmp_path / "report.png")
        page.screenshot(path=str(shots[-1]))
        assert not errors, errors
    for shot in shots:
        assert shot.stat().st_size > 20_000, shot
    print("screenshots:", *shots, sep="\n  ")


def test_docs_screenshot_command_on_the_same_study(study_results: Path, tmp_path: Path) -> None:
    study = _the_study(study_results)
    written = screenshots.take_screenshots(study_results, study["study_id"], tmp_path / "shots")
    assert [p.name for p in written] == ["study.png", "study-frontier.png",
                                         "study-telemetry.png", "run.png", "report.png"]
    shots = {p.name: p for p in written}
    crop = shots.pop("study-frontier.png")
    sizes = {name: p.stat().st_size for name, p in shots.items()}
    assert all(size > 20_000 for size in sizes.values()), sizes  # which page came out blank
    # the telemetry section is below the first view: its shot is not the first view again
    assert shots["study-telemetry.png"].read_bytes() != shots["study.png"].read_bytes()
    # the verdict's row is a fifth of a page (a drawn one is about 20 kB): its sentences on the
    # left, the frontier chart on the right, each drawn
    left, right = _ink(crop, 0.0, 0.5), _ink(crop, 0.5, 1.0)
    assert left > 0.01 and right > 0.01, (crop.stat().st_size, left, right)


def _ink(png: Path, start: float, stop: float) -> float:
    """The share of dark pixels (text, axes, marks) between ``start`` and ``stop`` of a PNG's
    width: about 0.04 where text or a chart is drawn, 0 on the page's white."""
    from PIL import Image

    with Image.open(png) as image:
        grey = image.convert("L")
    width, height = grey.size
    band = grey.crop((int(start * width), 0, int(stop * width), height))
    dark = sum(count for value, count in enumerate(band.histogram()) if value < 200)
    return dark / (band.width * band.height)


_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" width="400" height="300">'
        '<rect width="400" height="300" fill="#4c78a8"/></svg>')
# a Streamlit page as the wait sees it: the script run ends 0.6 s in, a chart image comes at 0.3 s
_SLOW_PAGE = """<!doctype html><body><div data-testid="stApp" data-test-script-state="running">
</div><script>
setTimeout(() => { const image = document.createElement("img"); image.src = "SRC";
                   document.querySelector("[data-testid=stApp]").append(image); }, 300);
setTimeout(() => document.querySelector("[data-testid=stApp]")
                    .setAttribute("data-test-script-state", "notRunning"), 600);
</script></body>"""


def test_a_screenshot_waits_for_the_script_run_and_every_image_decoded(tmp_path: Path) -> None:
    """What the docs' screenshots wait for (infra.tools.browser.wait_until_drawn): not the
    first moment an element is there, but the script run over and each image decoded; a page
    whose image never decodes is never called drawn."""
    pytest.importorskip("playwright.sync_api")
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    src = "data:image/svg+xml;base64," + base64.b64encode(_SVG.encode()).decode()
    slow, broken = tmp_path / "slow.html", tmp_path / "broken.html"
    slow.write_text(_SLOW_PAGE.replace("SRC", src))
    broken.write_text(_SLOW_PAGE.replace("SRC", "data:image/png;base64,AAAA"))
    with chromium_browser() as browser:
        page = browser.new_page()
        page.goto(slow.as_uri())
        wait_until_drawn(page, timeout_ms=30_000)
        assert page.evaluate("""() => [
            document.querySelector("[data-testid=stApp]").dataset.testScriptState,
            [...document.images].map((image) => image.complete && image.naturalWidth)]""") == [
            "notRunning", [400]]
        page.goto(broken.as_uri())
        with pytest.raises(PlaywrightTimeout):
            wait_until_drawn(page, timeout_ms=2_000)
