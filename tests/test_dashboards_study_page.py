"""The study view: roll-up readers, chart specs, the Streamlit page under AppTest, HTML export.

The study folders are written by :func:`infra.tools.bench.study_dashboard.write_synthetic_study`
(the study runner's contract, with known capacities) and trimmed by hand to test what a partial
study shows. The browser test of every page on a real study lives in test_dashboards_browser.py.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from collectors import run_folder
from collectors.run_folder import CAPACITY_FILE, ROLLUP_DIR, STEPS_FILE, STUDY_FILE
from dashboards import study_charts, study_export
from dashboards.analysis import study_data
from infra.tools.bench import study_dashboard as bench_study

APP = Path(study_export.__file__).with_name("app.py")
# what Streamlit's frontend takes for an emoji code, which makes it fetch its emoji table first
EMOJI_CODE = re.compile(r":(?!material/|streamlit:)[\w+-][\w_+-]*:")


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """results/studies/small: 2 configs x 10 steps, 200k requests; raw requests for one step."""
    results = tmp_path / "results"
    bench_study.write_synthetic_study(
        results / "studies" / "small", total_requests=200_000, raw_steps=1, name="small"
    )
    return results


def svg_of_image(markdown: str) -> str:
    """The SVG text inside a Markdown image of a ``data:image/svg+xml;base64,`` URI."""
    prefix = "](data:image/svg+xml;base64,"
    assert prefix in markdown and markdown.endswith(")"), markdown[:80]
    return base64.b64decode(markdown.split(prefix, 1)[1][:-1]).decode()


def _charts(at: AppTest) -> dict[str, dict]:
    specs = [json.loads(e.proto.spec) for e in at.get("vega_lite_chart")]
    return {spec["title"]: spec for spec in specs}


def _capacity_cells(at: AppTest) -> dict[str, list[str]]:
    """The capacity table's rows as a reader sees them: config -> its cells."""
    tables = [m.value for m in at.markdown if m.value.startswith("| config |")]
    assert len(tables) == 1, [m.value[:40] for m in at.markdown]
    lines = tables[0].splitlines()[2:]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return {row[0]: row[1:] for row in cells}


def _interactive(at: AppTest) -> AppTest:
    """The same page with "Interactive charts" on: Vega-Lite specs the test can read."""
    at = at.toggle(key="study_interactive").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _study_page(
    results: Path, monkeypatch: pytest.MonkeyPatch, corrupt_raw: bool = False
) -> AppTest:
    """The study page, as a link to /study opens it (the app's first run is the run page)."""
    monkeypatch.setenv("SWARMLOAD_RESULTS", str(results))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    if corrupt_raw:
        # a page that read raw requests would fail on these: the study view must not touch them
        for part in results.glob("**/step-*/requests/*.parquet"):
            part.write_bytes(b"not parquet")
    at.switch_page("ui/study_page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


# ------------------------------------------------------------------------------------ roll-ups


def test_studies_are_found_at_three_depths_and_nowhere_deeper(tmp_path: Path) -> None:
    for folder in (tmp_path, tmp_path / "a", tmp_path / "studies" / "b"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / STUDY_FILE).write_text(json.dumps({"name": folder.name, "status": "running"}))
    deep = tmp_path / "studies" / "b" / "cfg" / "step-0"
    deep.mkdir(parents=True)
    (deep / STUDY_FILE).write_text("{}")  # a step run is never a study
    found = run_folder.study_dirs(tmp_path)
    assert found == [tmp_path, tmp_path / "a", tmp_path / "studies" / "b"]
    assert set(study_data.list_studies(tmp_path)["name"]) == {tmp_path.name, "a", "b"}
    assert study_data.list_studies(tmp_path / "missing").empty


def test_a_study_without_roll_ups_loads_empty_and_the_tables_degrade(tmp_path: Path) -> None:
    (tmp_path / STUDY_FILE).write_text(json.dumps({"name": "early", "configurations": []}))
    study = study_data.load_study(tmp_path)
    assert study.name == "early" and study.steps.empty and study.capacity.empty
    # a roll-up lacking most columns: only what exists is shown
    steps = pd.DataFrame(
        {"config": ["a", "a"], "offered_load": [1.0, 2.0], "ttft_p95_s": [0.1, 0.2]}
    )
    table = study_data.latency_table_ms(steps, "ttft")
    assert list(table.columns) == ["all P95"] and table["all P95"].tolist() == [100.0, 200.0]
    assert study_data.error_table_pct(steps).columns.empty
    assert study_charts.error_rate_vs_load(steps)["mark"]["type"] == "text"  # says what lacks
    assert study_charts.telemetry_vs_load(steps, "gpu_util_mean")["mark"]["type"] == "text"


def test_latency_table_has_a_column_per_bucket_and_percentile(results: Path) -> None:
    study = study_data.load_study(results / "studies" / "small")
    table = study_data.latency_table_ms(study.steps, "tpot", ("p95", "p99"))
    assert list(table.columns) == [
        f"{b} {p}" for b in ("all", "short", "medium", "long") for p in ("P95", "P99")
    ]
    assert len(table) == 20  # 2 configs x 10 steps
    row = study.steps[
        (study.steps["bucket"] == "long") & (study.steps["config"] == "max-num-seqs-8")
    ]
    expected = row.sort_values("offered_load")["tpot_p99_s"].to_numpy() * 1e3
    assert table.loc["max-num-seqs-8"]["long P99"].to_numpy() == pytest.approx(expected)


def test_slo_bounds_read_both_forms_of_the_study_file() -> None:
    runner_form = {
        "ttft_ms": 1500,
        "tpot_ms": 50,
        "itl_ms": None,
        "error_rate": 0.01,
        "percentile": "p95",
    }
    assert (
        study_data.slo_text(runner_form) == "P95 TTFT <= 1500 ms, P95 TPOT <= 50 ms, errors <= 1%"
    )
    assert study_data.slo_threshold_s(runner_form, "ttft", "p95") == 1.5
    assert study_data.slo_threshold_s(runner_form, "ttft", "p99") is None  # another percentile
    assert study_data.slo_threshold_s(runner_form, "itl", "p95") is None  # unset bound
    assert study_data.slo_threshold_s({"e2e_p99_ms": 2000}, "e2e", "p99") == 2.0
    assert study_data.slo_threshold_s({"ttft_ms": 100, "percentile": 99}, "ttft", "p99") == 0.1


def test_capacity_table_says_when_a_figure_was_not_reached() -> None:
    capacity = pd.DataFrame(
        {
            "config": ["a", "b"],
            "max_sustainable_load": [8.0, math.nan],
            "max_load_reached": [False, False],
            "knee_load": [6.0, math.nan],
            "knee_reached": [True, False],
            "knee_latency_s": [0.25, math.nan],
            "metric": ["ttft_p95_s", "ttft_p95_s"],
        }
    )
    table = study_data.capacity_table(capacity, "req/s")
    assert table.loc["a", "max sustainable load"] == "≥ 8 req/s"
    assert table.loc["a", "knee"] == "6 req/s" and table.loc["a", "latency at knee (ms)"] == "250.0"
    assert table.loc["b", "max sustainable load"] == "none found"
    # a figure flat within its noise near the SLO: said in words, never a number
    capacity["resolved"] = [True, False]
    capacity["max_load_lo"], capacity["max_load_hi"] = [8.0, 72.0], [math.inf, 216.0]
    capacity["note"] = ["", "P95 TTFT stays within 600-1,100 ms (SLO 1,000 ms) from 72 to 216 "
                            "users: the TTFT SLO does not bound this configuration at this "
                            "precision"]
    table = study_data.capacity_table(capacity, "users")
    assert table.loc["b", "max sustainable load"].startswith("not resolved")
    assert table.loc["b", "note"].startswith("P95 TTFT stays within 600-1,100 ms")


# -------------------------------------------------------------------------------------- charts


def _steps_and_capacity() -> tuple[pd.DataFrame, pd.DataFrame]:
    steps = pd.DataFrame(
        {
            "config": ["a"] * 3 + ["b"] * 3,
            "step": [0, 1, 2] * 2,
            "offered_load": [10.0, 20.0, 30.0] * 2,
            "load_kind": ["rate"] * 6,
            "achieved_req_per_s": [10.0, 19.0, 21.0, 10.0, 20.0, 29.0],
            "ttft_p95_s": [0.1, 0.3, 2.0, 0.1, 0.11, 0.2],
        }
    )
    capacity = pd.DataFrame(
        {
            "config": ["a", "b"],
            "max_sustainable_load": [20.0, 30.0],
            "max_load_reached": [True, False],
            "knee_load": [15.0, math.nan],
            "knee_reached": [True, False],
        }
    )
    return steps, capacity


def test_markers_sit_on_the_curve_at_their_offered_load() -> None:
    steps, capacity = _steps_and_capacity()
    points = study_charts.marker_points(steps, capacity, "achieved_req_per_s", "ttft_p95_s")
    by_key = points.set_index(["config", "marker"])
    # knee at 15 req/s offered: halfway between the steps at 10 and 20
    assert by_key.loc[("a", "knee"), "x"] == pytest.approx(14.5)
    assert by_key.loc[("a", "knee"), "y"] == pytest.approx(0.2)
    assert by_key.loc[("a", "max load"), "x"] == pytest.approx(19.0)
    # b: no knee found (NaN): no marker; max load never exceeded: kept, flagged, "+" label
    assert ("b", "knee") not in by_key.index
    assert not by_key.loc[("b", "max load"), "reached"]
    assert by_key.loc[("b", "max load"), "label"] == "max load 30+"


def test_latency_chart_spec_marks_knee_max_load_and_slo() -> None:
    steps, capacity = _steps_and_capacity()
    spec = study_charts.latency_vs_throughput(
        steps, capacity, "ttft", "p95", ["a", "b"], slo_threshold_s=0.5
    )
    json.dumps(spec)  # plain JSON, ready for vega-embed
    assert spec["title"] == "P95 TTFT (ms) vs throughput"
    layers = spec["layer"]
    curve = layers[0]["data"]["values"]
    assert [row["latency_ms"] for row in curve if row["config"] == "a"] == pytest.approx(
        [100.0, 300.0, 2000.0]
    )
    assert layers[0]["encoding"]["color"]["scale"]["domain"] == ["a", "b"]
    slo = [layer for layer in layers if layer["mark"].get("color") == study_charts.SLO_COLOR]
    assert slo and slo[0]["data"]["values"][0]["y"] == 500.0
    symbols = [layer for layer in layers if "shape" in layer["encoding"]]
    assert {row["marker"] for row in symbols[0]["data"]["values"]} == {"knee", "max load"}
    # without an SLO for this figure, no red rule
    plain = study_charts.latency_vs_throughput(steps, capacity, "ttft", "p95", ["a", "b"])
    assert not [layer for layer in plain["layer"] if layer["mark"].get("color") == "firebrick"]


def test_throughput_chart_draws_the_ideal_line_only_for_rate_plans() -> None:
    steps, capacity = _steps_and_capacity()
    rate = study_charts.throughput_vs_load(steps, capacity)
    assert rate["layer"][0]["mark"]["color"] == "lightgray"
    assert rate["layer"][1]["encoding"]["x"]["title"] == "offered load (req/s)"
    rules = [layer for layer in rate["layer"] if layer["mark"]["type"] == "rule"]
    assert sorted(row["x"] for row in rules[0]["data"]["values"]) == [15.0, 20.0, 30.0]
    closed = study_charts.throughput_vs_load(steps.assign(load_kind="concurrency"), capacity)
    assert (
        closed["layer"][0]["mark"]["type"] == "line" and "color" not in closed["layer"][0]["mark"]
    )
    assert closed["layer"][0]["encoding"]["x"]["title"] == "offered load (concurrent streams)"


# -------------------------------------------------------------------------------------- the page


def test_study_page_shows_capacity_and_charts_from_roll_ups_only(
    results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study_dir = results / "studies" / "small"
    assert list(study_dir.glob("*/step-*/requests/*.parquet"))
    at = _study_page(results, monkeypatch, corrupt_raw=True)
    assert at.title[0].value == "Study small"
    capacity = pd.read_parquet(study_dir / ROLLUP_DIR / CAPACITY_FILE).set_index("config")
    cells = _capacity_cells(at)
    for config in ("max-num-seqs-8", "max-num-seqs-32"):
        max_load, knee = cells[config][:2]
        # the figure, then its 95% interval: "35 req/s [32.9, 37.1]"
        lo, hi = capacity.loc[config, ["max_load_lo", "max_load_hi"]]
        assert max_load == (f"{capacity.loc[config, 'max_sustainable_load']:g} req/s "
                            f"[{lo:.3g}, {hi:.3g}]")
        assert knee.startswith(f"{capacity.loc[config, 'knee_load']:g} req/s [")
    # the study's times as written, not as emoji codes ("14:13:20" holds ":13:")
    texts = [m.value for m in [*at.markdown, *at.caption]]
    assert not [t for t in texts if EMOJI_CODE.search(t)]
    started = json.loads((study_dir / STUDY_FILE).read_text())["started_at"]
    assert any(started in html.unescape(t.replace("\\", "")) for t in texts)
    # the first view's charts are static SVG drawn on the server, one Markdown image per chart
    # container (a data: URI, alt text the title); no raw HTML
    images = [m.value for m in at.markdown if m.value.startswith("![")]
    svgs = [svg_of_image(image) for image in images]
    assert len(svgs) == 5 and all('class="marks"' in svg for svg in svgs)
    frontier_title = ("Frontier: output tok/s per GPU vs tok/s per user")
    assert any(image.startswith(f"![{frontier_title}](") for image in images)
    assert any("P95 TTFT (ms) vs throughput" in svg for svg in svgs)
    assert any(image.startswith("![P95 TTFT (ms) vs throughput](") for image in images)
    assert not [m for m in at.markdown if m.value.lstrip().startswith("<svg")]
    assert not at.get("vega_lite_chart")
    at = _interactive(at)  # the same charts as Vega-Lite specs, drawn by the browser
    charts = _charts(at)
    assert set(charts) == {
        "Throughput vs offered load",
        "P95 TTFT (ms) vs throughput",
        "P95 TTFT (ms) vs offered load",
        "Error rate vs offered load",
        frontier_title,
    }
    # the frontier: a curve per configuration with bars both ways, from rollup/frontier.parquet
    layers = charts[frontier_title]["layer"]
    assert {len(layer["data"]["values"]) for layer in layers} == {20}  # 2 configs x 10 loads
    assert [layer["encoding"].get("x2", layer["encoding"].get("y2")) for layer in layers[2:]] == [
        {"field": "tok_s_hi"}, {"field": "per_user_tok_s_hi"}]
    slo_rules = [
        layer
        for layer in charts["P95 TTFT (ms) vs throughput"]["layer"]
        if layer["mark"].get("color") == study_charts.SLO_COLOR
    ]
    assert slo_rules[0]["data"]["values"][0]["y"] == 500.0  # the study's P95 TTFT SLO
    assert any("P95 TTFT <= 500 ms" in c.value for c in at.caption)


def test_study_page_selectors_change_metric_percentile_and_bucket(
    results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _interactive(_study_page(results, monkeypatch))
    at.radio(key="study_metric").set_value("e2e")
    at.radio(key="study_percentile").set_value("p99")
    at.radio(key="study_section").set_value("latency")
    at.radio(key="study_bucket").set_value("long").run()
    assert not at.exception, [e.value for e in at.exception]
    charts = _charts(at)
    assert "P99 E2E (ms) vs throughput" in charts
    steps = pd.read_parquet(results / "studies" / "small" / ROLLUP_DIR / STEPS_FILE)
    long_rows = steps[(steps["bucket"] == "long") & (steps["config"] == "max-num-seqs-8")]
    curve = charts["P99 E2E (ms) vs offered load"]["layer"][0]["data"]["values"]
    drawn = sorted(r["latency_ms"] for r in curve if r["config"] == "max-num-seqs-8")
    assert drawn == pytest.approx(sorted(long_rows["e2e_p99_s"] * 1e3))
    assert at.query_params["metric"] == "e2e" and at.query_params["bucket"] == "long"
    assert any(s.value == "E2E per bucket (ms, ok requests)" for s in at.subheader)


def test_study_page_detail_sections_and_configuration_filter(
    results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _study_page(results, monkeypatch)
    assert at.radio(key="study_section").value == "runs"  # the light section by default
    at = _interactive(at).radio(key="study_section").set_value("telemetry").run()
    assert not at.exception
    titles = set(_charts(at))
    assert "GPU utilisation (%) vs offered load" in titles
    assert "KV cache usage (fraction) vs offered load" in titles
    at = at.radio(key="study_section").set_value("errors").run()
    assert any(s.value.startswith("Errors") for s in at.subheader)
    at = at.radio(key="study_section").set_value("runs").run()
    links = " ".join(m.value for m in at.markdown)
    assert "(/?run=studies/small/max-num-seqs-8/step-0)" in links
    at = at.sidebar.multiselect[0].set_value(["max-num-seqs-32"]).run()
    curve = _charts(at)["Throughput vs offered load"]["layer"][1]["data"]["values"]
    assert {row["config"] for row in curve} == {"max-num-seqs-32"}


def test_study_page_on_a_study_that_has_not_rolled_up_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study_dir = tmp_path / "studies" / "fresh"
    study_dir.mkdir(parents=True)
    meta = {
        "name": "fresh",
        "status": "running",
        "configurations": [{"name": "a"}],
        "steps": [{"config": "a", "step": 0, "offered_load": 1, "run_dir": "a/step-0"}],
    }
    (study_dir / STUDY_FILE).write_text(json.dumps(meta))
    at = _study_page(tmp_path, monkeypatch)
    assert any("No roll-up yet" in i.value for i in at.info)
    assert at.sidebar.toggle[0].value is True  # a running study refreshes by itself


def test_no_studies_says_where_they_come_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _study_page(tmp_path, monkeypatch)
    assert any("No studies in" in i.value for i in at.info)


def test_run_page_lists_the_step_runs_of_studies(
    results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWARMLOAD_RESULTS", str(results))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["run"] = "studies/small/max-num-seqs-8/step-0"  # the study page's link
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.sidebar.selectbox[0].options) == 20
    assert at.title[0].value == "Run small-max-num-seqs-8-step-0"
    requests = [m.value for m in at.metric if m.label == "Requests"]
    assert requests and int(requests[0]) > 0  # the raw step's requests, read on this page


# ------------------------------------------------------------------------------------- export


def test_export_writes_one_file_with_specs_and_tables(results: Path, tmp_path: Path) -> None:
    study_dir = results / "studies" / "small"
    out = study_export.export(study_dir, tmp_path / "report.html", cdn=True)
    text = out.read_text()
    assert '<h1 id="study-title">Study small</h1>' in text
    assert text.count('class="chart"') == 9  # the frontier, 4 study charts, 4 telemetry means
    assert text.count('id="chart-frontier"') == 1 and '"#chart-frontier"' in text
    assert "Frontier: output tok/s per GPU vs tok/s per user" in text
    assert "P95 TTFT (ms) vs throughput" in text and "TPOT per bucket (ms, ok requests)" in text
    assert "cdn.jsdelivr.net" in text  # --cdn: the note says it needs the internet
    assert "needs the internet" in text


def test_export_inlines_the_chart_libraries(results: Path, tmp_path: Path) -> None:
    pytest.importorskip("vl_convert")
    out = tmp_path / "report.html"
    code = study_export.main([str(results / "studies" / "small"), "--out", str(out)])
    assert code == 0
    text = out.read_text()
    assert "<script src=" not in text  # nothing fetched at view time
    assert "vegaEmbed" in text and len(text) > 500_000
    assert study_export.main([str(tmp_path / "nothing"), "--out", str(out)]) == 2


def test_verdict_and_error_bars_on_the_page_and_in_the_export(
    results: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    at = _study_page(results, monkeypatch)
    verdicts = [m.value for m in at.markdown if "sustains" in m.value]
    assert verdicts and "max-num-seqs-32 sustains" in verdicts[0]
    # the verdict table: each common load's P95 TTFT change with its interval and a word
    table = [m.value for m in at.markdown if m.value.startswith("| pair |")]
    assert table and ("within noise" in table[0] or "better" in table[0])
    study = study_data.load_study(results / "studies" / "small")
    view = study_data.select_steps(study.curves, "all")
    spec = study_charts.latency_vs_load(view, study.capacity, "ttft", "p95", study.configs)
    bars = [layer for layer in spec["layer"] if "y2" in layer["encoding"]]
    assert bars and bars[0]["encoding"]["y"]["field"] == "latency_ms_lo"
    bands = [layer for layer in spec["layer"] if layer["mark"].get("type") == "rect"]
    assert bands and {"lo", "hi"} <= set(bands[0]["data"]["values"][0])
    text = study_export.export(results / "studies" / "small", tmp_path / "r.html",
                               cdn=True).read_text()
    assert '<h2 id="verdict">Verdict</h2>' in text and "sustains" in text


def test_the_verdict_by_load_holds_every_figure_of_the_long_table(results: Path) -> None:
    study = study_data.load_study(results / "studies" / "small")
    _, long = study_data.verdict_tables(study.verdict, "req/s")
    wide = study_data.verdict_by_load(long)
    loads = list(dict.fromkeys(long["load (req/s)"]))
    assert list(wide["load (req/s)"]) == loads and len(wide) * 3 == len(long)
    assert list(wide.columns[2:]) == [f"{f}: A → B, B - A [95%]"
                                      for f in ("TTFT P95", "TPOT P95", "errors")]
    by_load = wide.set_index("load (req/s)")
    for row in long.to_dict("records"):
        cell = by_load.loc[row["load (req/s)"], f"{row['figure']}: A → B, B - A [95%]"]
        a, unit = row["A"].rsplit(" ", 1)
        word = row["verdict"].removeprefix("max-num-seqs-32 ")
        assert cell == f"{a} → {row['B']}, {row['B - A [95%]']} {word}", (cell, row)
        assert unit in {"ms", "%"}
    assert study_data.verdict_by_load(pd.DataFrame()).empty


def test_a_throughput_change_from_zero_is_shown_in_its_unit_not_as_nan() -> None:
    """On the H100, seqs-64's goodput at 216 users was 0 (P95 TTFT 5 s against a 1 s SLO) and
    seqs-256's 58.7 req/s: the Study page read "+nan% [+nan, +nan]", the verdict "- [-, -]"."""
    from dashboards.analysis import study_verdict

    row = {"config_a": "seqs-64", "config_b": "seqs-256", "kind": "at load",
           "offered_load": 216.0, "figure": "goodput_req_per_s", "value_a": 0.0,
           "value_b": 58.73, "change": 58.73, "lo": 47.32, "hi": 69.08, "relative": math.nan,
           "rel_lo": math.nan, "rel_hi": math.nan, "within_noise": False, "text": ""}
    _, table = study_data.verdict_tables(pd.DataFrame([row]), "streams")
    (cell,) = table.to_dict("records")
    assert cell["B - A [95%]"] == "+58.7 req/s [+47.3, +69.1]", cell
    assert cell["verdict"] == "seqs-256 better"
    from types import SimpleNamespace

    import numpy as np

    rng = np.random.default_rng(7)
    none, held = (SimpleNamespace(values={"goodput_req_per_s": v}) for v in (
        np.zeros(200), rng.normal(58.73, 5.0, 200)))
    text = study_verdict._at_load("seqs-64", "seqs-256", 216.0, "goodput_req_per_s", 0.0, 58.73,
                                  none, held)["text"]
    assert "nan" not in text and "+58.7 req/s" in text and "(seqs-64: 0)" in text, text
