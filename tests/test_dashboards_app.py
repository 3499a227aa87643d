"""The Streamlit dashboard: AppTest on a synthetic results folder; the real server in Chromium."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from collectors.parquet_sink import RollingParquetWriter
from collectors.schemas import (
    GPU_SCHEMA,
    REQUEST_SCHEMA,
    SERVER_METRICS_SCHEMA,
    SERVER_METRICS_TABLE,
    SERVER_REQUESTS_SCHEMA,
)
from dashboards import launch
from infra.tools.browser import chromium_browser, dashboard_server

APP = Path(launch.__file__).with_name("app.py")
CHROMIUM = Path("/usr/bin/chromium")
T0_NS = 1_700_000_000 * 1_000_000_000


def _write_run(results: Path, run_id: str, seed: int, *, with_gpu: bool) -> list[float]:
    """A finished run: 120 ok requests over 3 buckets + 6 failed ones with 60 s latencies.

    Returns the ok requests' TTFTs, from which the test computes the expected P95 by hand.
    """
    rng = np.random.default_rng(seed)
    rows, ok_ttfts = [], []
    for i in range(126):
        bucket = ("short", "medium", "long")[i % 3]
        failed = i % 21 == 20
        ttft = 60.0 if failed else float(rng.gamma(2.0, 0.04))
        if not failed:
            ok_ttfts.append(ttft)
        rows.append(
            {
                "run_id": run_id,
                "worker_id": "h:1:0",
                "request_id": f"r{i}",
                "http_request_id": f"{run_id}-r{i}",
                "endpoint": "completions",
                "bucket": bucket,
                "outcome": "http_5xx" if failed else "ok",
                "http_status": 503 if failed else 200,
                "sent_wall_ns": T0_NS + i * 50_000_000,
                "ttft_s": ttft,
                "e2e_s": ttft + 0.5,
                "tpot_s": 0.5 / 15,
                "itl_s": [0.5 / 15] * 15,
                "prompt_tokens": 100,
                "output_tokens": 16,
            }
        )
    writer = RollingParquetWriter(results / run_id / "requests", REQUEST_SCHEMA, prefix="m")
    for start in range(0, len(rows), 50):  # several part files, as a real run writes them
        writer.append_rows(rows[start : start + 50])
        writer.flush()
    gpu = {"available": False, "reason": "nvidia-smi not found", "gpus": []}
    if with_gpu:
        gpu = {"available": True, "reason": None, "gpus": [{"index": 0, "name": "H200"}]}
        sink = RollingParquetWriter(results / run_id / "gpu", GPU_SCHEMA)
        sink.append_rows(
            {
                "run_id": run_id,
                "host": "h",
                "wall_ns": T0_NS + k * 100_000_000,
                "gpu_index": 0,
                "util_gpu_pct": float(k % 100),
                "mem_used_bytes": 2**30 * k,
                "power_w": 120.0 + k,
                "temperature_c": 40.0,
                "sm_clock_mhz": 1980,
            }
            for k in range(60)
        )
        sink.close()
    manifest = {
        "run_id": run_id,
        "started_at": "2023-11-14T22:13:20Z",
        "ended_at": "2023-11-14T22:13:30Z",
        "target": {"kind": "sim", "base_url": "http://127.0.0.1:8000", "model": "tiny"},
        "workload": {"kind": "synthetic"},
        "load": {"workers": 1, "users": 8, "spawn_rate": 8, "duration_s": 10},
        "gpu": gpu,
        "warnings": [GENERATOR_WARNING] if with_gpu else [],
    }
    (results / run_id / "manifest.json").write_text(json.dumps(manifest))
    return ok_ttfts


GENERATOR_WARNING = "GENERATOR FELL BEHIND: P99 schedule lag 42.0 ms > 10 ms"


def _expected_p95_ms(ttfts: list[float]) -> str:
    return f"{float(np.percentile(ttfts, 95)) * 1e3:.2f}"


@pytest.fixture
def results(tmp_path: Path) -> tuple[Path, dict[str, list[float]]]:
    results = tmp_path / "results"
    ttfts = {
        "cpu-run": _write_run(results, "cpu-run", seed=1, with_gpu=False),
        "gpu-run": _write_run(results, "gpu-run", seed=2, with_gpu=True),
    }
    (results / "not-a-run").mkdir()  # no manifest: must not be listed
    return results, ttfts


def _metric(at: AppTest, label: str) -> str:
    values = [m.value for m in at.metric if m.label == label]
    assert len(values) == 1, f"expected one metric {label!r}, found {len(values)}"
    return values[0]


def test_app_lists_runs_and_shows_exact_p95_ttft(
    results: tuple[Path, dict[str, list[float]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    results_dir, ttfts = results
    monkeypatch.setenv("SWARMLOAD_RESULTS", str(results_dir))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    run_picker = at.sidebar.selectbox[0]
    assert len(run_picker.options) == 2
    assert all("not-a-run" not in option for option in run_picker.options)

    at = run_picker.select("cpu-run").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Run cpu-run"
    assert _metric(at, "P95 TTFT (ms)") == _expected_p95_ms(ttfts["cpu-run"])
    assert _metric(at, "Requests") == "126"
    assert _metric(at, "Error rate") == f"{6 / 126 * 100:.2f}%"
    assert any("no GPU telemetry (nvidia-smi not found)" in i.value for i in at.info)

    assert not at.warning  # the generator kept up: nothing to warn about

    at = at.sidebar.selectbox[0].select("gpu-run").run()
    assert not at.exception, [e.value for e in at.exception]
    assert _metric(at, "P95 TTFT (ms)") == _expected_p95_ms(ttfts["gpu-run"])
    assert not any("no GPU telemetry" in i.value for i in at.info)
    # the run's own verdict on its load generator, from the manifest
    assert [w.value for w in at.warning] == [f"Load generator: {GENERATOR_WARNING}"]


def test_a_figure_the_engine_does_not_expose_is_said_absent_not_drawn_empty(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run against TGI (its own /metrics names): its queue and batch are charted under the
    one vocabulary, and the KV-cache panel says TGI does not expose it."""
    results = tmp_path / "results"
    _write_run(results, "tgi-run", seed=3, with_gpu=False)
    sink = RollingParquetWriter(results / "tgi-run" / SERVER_METRICS_TABLE, SERVER_METRICS_SCHEMA)
    sink.append_rows(
        {"run_id": "tgi-run", "host": "h", "wall_ns": T0_NS + k * 500_000_000,
         "target": "http://127.0.0.1:8080/metrics", "metric": sample, "metric_type": "gauge",
         "sample": sample, "labels": "{}", "value": float(value + k % 3), "scrape_s": 0.01,
         "error": None}
        for k in range(14)
        for sample, value in (("tgi_queue_size", 2), ("tgi_batch_current_size", 4)))
    sink.close()
    monkeypatch.setenv("SWARMLOAD_RESULTS", str(results))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    captions = [c.value for c in at.caption]
    assert "**KV-cache usage**: not exposed by TGI" in captions
    assert not any("running requests" in c or "waiting requests" in c for c in captions)


def test_app_shows_where_ttft_goes_when_the_run_has_server_spans(
    results: tuple[Path, dict[str, list[float]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    results_dir, _ttfts = results
    # vLLM's span for every 2nd request of cpu-run: stamped 1 ms after the send, TTFT 5 ms
    sink = RollingParquetWriter(results_dir / "cpu-run" / "server_requests",
                                SERVER_REQUESTS_SCHEMA)
    sink.append_rows({"run_id": "cpu-run", "host": "h", "received_wall_ns": T0_NS,
                      "server_request_id": f"cmpl-cpu-run-r{i}-0",
                      "start_wall_ns": T0_NS + i * 50_000_000 + 1_000_000, "ttft_s": 0.005,
                      "queue_s": 0.001, "prefill_s": 0.002} for i in range(0, 126, 2))
    sink.close()
    monkeypatch.setenv("SWARMLOAD_RESULTS", str(results_dir))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at = at.sidebar.selectbox[0].select("cpu-run").run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Where TTFT goes (ms, ok requests with a server span)" in [h.value for h in
                                                                        at.subheader]
    assert any(c.value.startswith("60 of 120 ok requests") for c in at.caption)
    table = next(d.value for d in at.dataframe if "before vLLM: network, HTTP" in d.value.index)
    assert table.loc["before vLLM: network, HTTP", "all P50"] == pytest.approx(1.0)
    assert table.loc["engine queue", "all P95"] == pytest.approx(1.0)


def test_app_trims_warm_up(
    results: tuple[Path, dict[str, list[float]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    results_dir, _ = results
    monkeypatch.setenv("SWARMLOAD_RESULTS", str(results_dir))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at = at.sidebar.selectbox[0].select("cpu-run").run()
    at = at.sidebar.number_input[0].set_value(3.0).run()  # sends are 50 ms apart: skip 60
    assert not at.exception, [e.value for e in at.exception]
    assert _metric(at, "Requests") == "66"
    at = at.sidebar.number_input[0].set_value(1000.0).run()
    assert any("leave nothing" in w.value for w in at.warning)


def test_app_follows_a_run_still_being_written(
    results: tuple[Path, dict[str, list[float]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    results_dir, ttfts = results
    manifest_path = results_dir / "cpu-run" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["ended_at"] = None
    manifest_path.write_text(json.dumps(manifest))
    monkeypatch.setenv("SWARMLOAD_RESULTS", str(results_dir))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["run"] = "cpu-run"  # a link to one run opens on it
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.sidebar.toggle[0].value is True  # live run: auto-refresh on by default
    assert _metric(at, "P95 TTFT (ms)") == _expected_p95_ms(ttfts["cpu-run"])


def test_app_with_no_runs_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARMLOAD_RESULTS", str(tmp_path / "empty"))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception
    assert any("No runs in" in i.value for i in at.info)


def test_results_folder_comes_from_argument_then_environment() -> None:
    from dashboards.app import results_dir_from

    env = {"SWARMLOAD_RESULTS": "/data/env"}
    assert results_dir_from(["--results", "/data/arg"], env) == Path("/data/arg")
    assert results_dir_from(["-q", "tests"], env) == Path("/data/env")
    assert results_dir_from([], {}) == Path("results")


def test_launch_command_listens_on_localhost_headless(tmp_path: Path) -> None:
    command = launch.build_command(tmp_path, 8600, "127.0.0.1")
    assert command[:4] == [sys.executable, "-m", "streamlit", "run"]
    joined = " ".join(command)
    assert "--server.address 127.0.0.1" in joined and "--server.port 8600" in joined
    assert "--server.headless true" in joined and "--browser.gatherUsageStats false" in joined
    assert command[-2:] == ["--results", str(tmp_path.resolve())]


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium at /usr/bin/chromium")
def test_dashboard_in_a_real_browser(
    results: tuple[Path, dict[str, list[float]]], tmp_path: Path
) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    results_dir, ttfts = results
    for run_id in ttfts:  # one run only, so the page opens on it
        if run_id != "gpu-run":
            shutil.rmtree(results_dir / run_id)
    screenshot = tmp_path / "dashboard.png"
    with dashboard_server(results_dir, tmp_path / "dashboard.log") as base_url, \
            chromium_browser() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 3600})
        page.goto(f"{base_url}/", timeout=60_000)
        exception = page.locator('[data-testid="stException"]')
        # whichever comes first, so a broken page fails at once and says why
        page.get_by_text("P95 TTFT (ms)").or_(exception).first.wait_for(timeout=90_000)
        assert exception.count() == 0, exception.first.inner_text()
        metric = page.locator('[data-testid="stMetric"]').filter(has_text="P95 TTFT (ms)")
        value = metric.locator('[data-testid="stMetricValue"]').inner_text(timeout=30_000)
        assert value.strip() == _expected_p95_ms(ttfts["gpu-run"])
        page.get_by_text("GPU telemetry").wait_for(timeout=30_000)
        expect = sync_api.expect
        # first drawn on the server as images: 1 TTFT scatter (PNG), 2 per-window charts (P95
        # TTFT and GPU utilisation on the run's time axis) and 5 GPU line charts (SVG)
        images = page.locator('[data-testid="stMain"] img')
        expect(images).to_have_count(8, timeout=60_000)
        scatter = page.locator(".st-key-chart-run-ttft img")
        assert (scatter.get_attribute("src") or "").startswith("data:image/png;base64,")
        assert scatter.get_attribute("alt") == "TTFT by sent time"
        assert scatter.evaluate("img => img.complete && img.naturalWidth > 500")
        # "Interactive charts": Vega draws the same charts into SVG in the browser; one point
        # per ok request (plus the bucket legend's 3) and one line per chart
        page.locator('[data-testid="stSidebar"]').get_by_text("Interactive charts").click()
        charts = page.locator('[data-testid="stVegaLiteChart"]')
        expect(charts.locator("svg.marks")).to_have_count(8, timeout=60_000)
        ok_requests = len(ttfts["gpu-run"])
        points = charts.first.locator("g.mark-symbol path")
        expect(points).to_have_count(ok_requests + 3, timeout=30_000)
        expect(charts.locator("g.mark-line path")).to_have_count(7, timeout=30_000)
        page.screenshot(path=str(screenshot), full_page=True)
        assert exception.count() == 0
        assert "Traceback" not in page.content()
    assert screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")
