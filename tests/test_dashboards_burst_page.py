"""The Burst page under AppTest on a burst study's roll-up, the chart specs, and the export.

The roll-up is built by the analysis itself from two made-up runs of known answer (the fluid
queue of test_dashboards_burst.py): the same spike on a server of 10 req/s recovers in 20 s, on
one of 20 req/s in (30 - 20) x 5 / (20 - 5) = 3.3 s -> 4 s (whole windows).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest
from test_dashboards_burst import NS, T0, fluid_run

from collectors.run_folder import ROLLUP_DIR, STUDY_FILE
from dashboards import burst_charts, study_export
from dashboards.analysis import burst

APP = Path(study_export.__file__).with_name("app.py")
CONFIGS = {"seqs-4": 10.0, "seqs-8": 20.0}


@pytest.fixture
def burst_study(tmp_path: Path) -> Path:
    study = tmp_path / "results" / "studies" / "spike"
    (study / ROLLUP_DIR).mkdir(parents=True)
    (study / STUDY_FILE).write_text(json.dumps({
        "name": "spike", "status": "finished", "started_at": "2026-11-30T22:00:00Z",
        "configurations": [{"name": n, "target": "sim", "args": []} for n in CONFIGS],
        "load": {"kind": "rate", "arrival": "bursts",
                 "burst": {"peak_rps": 30, "spike_s": 5, "count": 1, "first_spike_s": 10}},
        "steps": []}))
    spikes, timelines = [], []
    for name, capacity in CONFIGS.items():
        requests, server = fluid_run(capacity=capacity)
        report = burst.analyze(requests, [burst.Spike(T0 + 10 * NS, T0 + 15 * NS, 30.0)], T0,
                               server)
        spikes.append(report.spikes.assign(config=name, step=1, offered_load=5.0, run_dir="x"))
        timelines.append(report.timelines[1].assign(config=name, step=1, spike=1))
    pd.concat(spikes).to_parquet(study / ROLLUP_DIR / burst.BURSTS_FILE)
    pd.concat(timelines).to_parquet(study / ROLLUP_DIR / burst.BURST_TIMELINES_FILE)
    return study


def test_configurations_are_compared_on_recovery(burst_study: Path) -> None:
    spikes, _ = burst.load_study_bursts(burst_study)
    comparison = burst.recovery_comparison(spikes, list(CONFIGS))
    assert comparison.set_index("config")["recovery_s"].to_dict() == {"seqs-4": 20.0,
                                                                       "seqs-8": 4.0}
    lines = burst.comparison_lines(comparison)
    assert lines[0].startswith("seqs-4: 1/1 spikes recovered, recovery 20 s")


def test_the_burst_page_shows_the_comparison_and_timelines(
        burst_study: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARMLOAD_RESULTS", str(burst_study.parent.parent))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page("ui/study_page.py").run()  # the study page points to the Bursts page
    assert [link.proto.page for link in at.get("page_link")] == ["bursts"]
    at.switch_page("ui/burst_page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Bursts · study spike"
    table = next(m.value for m in at.markdown if m.value.startswith("| config |"))
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in table.splitlines()[2:]}
    assert rows["seqs-4"][:3] == ["1", "1", "20"] and rows["seqs-8"][:3] == ["1", "1", "4"]
    at = at.toggle(key="burst_interactive").set_value(True).run()
    titles = [json.loads(e.proto.spec)["title"] for e in at.get("vega_lite_chart")]
    assert sorted(titles) == ["Offered and achieved load (req/s)",
                              "P95 TTFT per window (ms), baseline band",
                              "Recovery time from the same spike (s)",
                              "Server queue: waiting and running requests"]


def test_timeline_specs_mark_the_spike_band_and_recovery(burst_study: Path) -> None:
    spikes, timelines = burst.load_study_bursts(burst_study)
    spec = burst_charts.ttft_timeline(timelines, spikes, list(CONFIGS))
    shade, band, line, rules = spec["layer"]
    assert shade["data"]["values"] == [{"start": 0.0, "end": 5.0}]
    assert [round(v["ttft_hi_ms"]) for v in band["data"]["values"]] == [33, 33]
    assert [v["recovered_at_s"] for v in rules["data"]["values"]] == [25.0, 9.0]
    assert line["encoding"]["y"]["scale"] == {"type": "log"}


def test_the_export_holds_the_burst_section(burst_study: Path, tmp_path: Path) -> None:
    out = study_export.export(burst_study, tmp_path / "report.html", cdn=True)
    text = out.read_text()
    assert "<h2>Bursts: recovery from the same spike</h2>" in text
    assert 'id="chart-burst-ttft"' in text and "#chart-burst-recovery" in text


@pytest.mark.slow
def test_the_burst_page_in_a_real_browser(burst_study: Path, tmp_path: Path) -> None:
    """Headless Chromium draws every chart of the page with no Streamlit exception (the docs'
    screenshot helper, which waits for each chart's SVG marks)."""
    pytest.importorskip("playwright.sync_api")
    from infra.tools.browser import CHROMIUM
    from infra.tools.screenshots import take_burst_screenshot

    if not CHROMIUM.exists():
        pytest.skip("needs Debian chromium at /usr/bin/chromium")
    shot = take_burst_screenshot(burst_study.parent.parent, "spike", tmp_path / "shots")
    assert shot.stat().st_size > 10_000
