"""Server-metrics scraper: parsing, a live prometheus_client endpoint, an unreachable target."""

from __future__ import annotations

import json
import socket
import time
from contextlib import contextmanager

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from collectors.schemas import SERVER_METRICS_SCHEMA, SERVER_METRICS_TABLE
from collectors.server_metrics import ServerMetricsScraper, metrics_url, parse_metrics

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 7.0
vllm:num_requests_running{engine="1",model_name="tiny"} 3.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="tiny"} 2.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="tiny"} 4.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="tiny"} 5.0
vllm:time_to_first_token_seconds_count{model_name="tiny"} 5.0
vllm:time_to_first_token_seconds_sum{model_name="tiny"} 0.61
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 123.0
"""


def test_parse_keeps_every_sample_with_its_labels():
    rows = parse_metrics(VLLM_TEXT)
    by = {(r["sample"], r["labels"]): r for r in rows}
    running = by[("vllm:num_requests_running", '{"engine":"1","model_name":"tiny"}')]
    assert running["value"] == 3.0 and running["metric_type"] == "gauge"
    preempt = by[("vllm:num_preemptions_total", '{"engine":"0","model_name":"tiny"}')]
    assert preempt["metric"] == "vllm:num_preemptions" and preempt["metric_type"] == "counter"
    bucket = by[("vllm:time_to_first_token_seconds_bucket", '{"le":"+Inf","model_name":"tiny"}')]
    assert bucket["value"] == 5.0 and bucket["metric_type"] == "histogram"
    assert len(rows) == 8


def test_include_prefixes_drop_other_families():
    rows = parse_metrics(VLLM_TEXT, include=["vllm:"])
    assert {r["sample"] for r in rows if r["sample"].startswith("python_")} == set()
    assert len(rows) == 7


def test_metrics_url_accepts_a_base_url():
    assert metrics_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://127.0.0.1:8000/metrics/") == "http://127.0.0.1:8000/metrics"


@contextmanager
def prometheus_endpoint():
    registry = CollectorRegistry()
    running = Gauge("vllm:num_requests_running", "running", ["model_name"], registry=registry)
    preempt = Counter("vllm:num_preemptions", "preemptions", ["model_name"], registry=registry)
    Histogram("vllm:e2e_request_latency_seconds", "e2e", registry=registry).observe(0.3)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"http://127.0.0.1:{server.server_port}", running.labels("tiny"), preempt.labels(
            "tiny")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_scraper_follows_a_live_endpoint(tmp_path):
    with prometheus_endpoint() as (base_url, running, preempt):
        scraper = ServerMetricsScraper(tmp_path, "run-1", base_url, interval_s=0.1, host="h1",
                                       flush_interval_s=0.3)
        assert scraper.start()
        time.sleep(0.5)
        running.set(12)
        preempt.inc(3)
        time.sleep(0.6)
        running.set(0)
        time.sleep(0.5)
        scraper.stop()
    df = pd.read_parquet(tmp_path / SERVER_METRICS_TABLE)
    assert set(df.columns) == set(SERVER_METRICS_SCHEMA.names)
    assert df["error"].isna().all() and (df["target"] == f"{base_url}/metrics").all()
    series = df[df["sample"] == "vllm:num_requests_running"].sort_values("wall_ns")
    assert json.loads(series["labels"].iloc[0]) == {"model_name": "tiny"}
    values = series["value"].tolist()
    assert values[0] == 0 and 12 in values and values[-1] == 0  # rose, then fell
    assert len(series) >= 10  # ~1.6 s at 10 Hz on a busy 2-core machine
    assert df[df["sample"] == "vllm:num_preemptions_total"]["value"].max() == 3
    assert (df["sample"] == "vllm:e2e_request_latency_seconds_bucket").any()
    stats = scraper.stats()
    assert stats["errors"] == 0 and stats["scrapes_ok"] == len(series)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_target_is_recorded_and_retried(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/metrics"
    scraper = ServerMetricsScraper(tmp_path, "run-1", url, interval_s=0.1)
    assert scraper.start()
    time.sleep(0.6)
    scraper.stop()
    df = pd.read_parquet(tmp_path / SERVER_METRICS_TABLE)
    assert len(df) >= 3 and df["error"].str.contains("ConnectError").all()
    assert df["sample"].isna().all() and df["value"].isna().all()
    assert scraper.stats()["errors"] == len(df) and scraper.stats()["sample_errors"] == 0


def test_target_that_comes_up_late_is_picked_up(tmp_path):
    """Scraping starts before the server (as when the orchestrator starts both at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    scraper = ServerMetricsScraper(tmp_path, "run-1", f"http://127.0.0.1:{port}", interval_s=0.1)
    assert scraper.start()
    time.sleep(0.3)
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_waiting", "waiting", registry=registry).set(4)
    try:
        server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    except OSError:
        scraper.stop()
        pytest.skip("the free port was taken meanwhile")
    try:
        time.sleep(0.5)
    finally:
        scraper.stop()
        server.shutdown()
        server.server_close()
        thread.join(5)
    df = pd.read_parquet(tmp_path / SERVER_METRICS_TABLE).sort_values("wall_ns")
    assert df["error"].iloc[0] is not None
    waiting = df[df["sample"] == "vllm:num_requests_waiting"]
    assert len(waiting) >= 2 and (waiting["value"] == 4).all()


def test_simulator_running_requests_rise_under_load_and_fall_after(tmp_path):
    """End to end against the project's vLLM-shaped simulator: scraped, joined per step."""
    simulator = pytest.importorskip("infra.targets.simulator")
    import threading

    import httpx

    from dashboards.analysis.telemetry import per_step

    statuses: list[int] = []

    def stream(base_url: str, model: str) -> None:
        body = {"model": model, "prompt": "hello", "max_tokens": 120, "stream": True,
                "ignore_eos": True}
        with httpx.Client(timeout=30) as client, client.stream(
                "POST", f"{base_url}/v1/completions", json=body) as response:
            for _ in response.iter_lines():
                pass
            statuses.append(response.status_code)

    with simulator.running_simulator() as base_url:  # continuous batching: vLLM-like gauges
        scraper = ServerMetricsScraper(tmp_path, "run-1", base_url, interval_s=0.1,
                                       include=["vllm:"])
        assert scraper.start()
        model = httpx.get(f"{base_url}/v1/models").json()["data"][0]["id"]
        time.sleep(0.5)
        load_start = time.time_ns()
        threads = [threading.Thread(target=stream, args=(base_url, model)) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        load_end = time.time_ns()
        time.sleep(0.8)
        scraper.stop()
    assert statuses == [200] * 12
    server = pd.read_parquet(tmp_path / SERVER_METRICS_TABLE)
    assert server["error"].isna().all()
    steps = [{"step": "before", "start_wall_ns": load_start - 500_000_000,
              "end_wall_ns": load_start},
             {"step": "load", "start_wall_ns": load_start, "end_wall_ns": load_end},
             {"step": "after", "start_wall_ns": load_end + 200_000_000,
              "end_wall_ns": load_end + 800_000_000}]
    view = per_step(None, steps, server=server)
    assert view.loc["before", "num_requests_running"] == 0
    assert view.loc["load", "num_requests_running_max"] >= 6
    assert view.loc["load", "num_requests_running"] > 2
    assert view.loc["after", "num_requests_running"] == 0
