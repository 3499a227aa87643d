"""The master's live figures for Prometheus (collectors/live_metrics.py): what a scrape shows,
and that days of records never grow the series or the memory."""

from __future__ import annotations

import tracemalloc

import gevent
import gevent.socket
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.live_metrics import BUCKETS, LiveMetrics, label_name, serve
from collectors.schemas import OUTCOMES
from infra.ports import free_port


def _batch(n: int, start_s: float, *, outcome: str = "ok", bucket: str = "short",
           ttft: float = 0.05, lag: float | None = 0.001) -> dict[str, list]:
    sent = [int((start_s + i * 0.01) * 1e9) for i in range(n)]
    return {
        "outcome": [outcome] * n, "bucket": [bucket] * n, "sent_wall_ns": sent,
        "scheduled_wall_ns": [s - 1_000_000 for s in sent], "output_tokens": [64] * n,
        "ttft_s": [ttft] * n, "tpot_s": [0.01] * n, "e2e_s": [0.7] * n,
        "itl_s": [[0.01] * 63] * n, "schedule_lag_s": [lag] * n, "read_delay_s": [0.002] * n,
    }


def _scrape(metrics: LiveMetrics) -> dict[tuple[str, tuple], float]:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_counts_histograms_and_rates_as_a_user_scrapes_them() -> None:
    now = [1000.0]
    metrics = LiveMetrics({"run_id": "r1", "engine.version": "0.26"}, clock=lambda: now[0])
    metrics.on_records(_batch(200, 990.0))  # 200 ok over 2 s, finishing at ~990.7-992.7
    metrics.on_records(_batch(5, 991.0, outcome="http_5xx", bucket="long"))
    metrics.on_records(_batch(3, 991.0, bucket="mystery"))
    now[0] = 996.0
    metrics.on_worker_live("w1", {"sent": 100})
    now[0] = 1000.0
    metrics.on_worker_live("w1", {"sent": 260})
    got = _scrape(metrics)
    base = (("engine_version", "0.26"), ("run_id", "r1"))

    def value(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted((*base, *labels.items()))))]

    assert value("swarmload_requests_total", bucket="short", outcome="ok") == 200
    assert value("swarmload_requests_total", bucket="long", outcome="http_5xx") == 5
    assert value("swarmload_requests_total", bucket="other", outcome="ok") == 3
    assert value("swarmload_ttft_seconds_bucket", bucket="short", le="0.04") == 0
    assert value("swarmload_ttft_seconds_bucket", bucket="short", le="0.06") == 200
    assert value("swarmload_itl_seconds_count", bucket="short") == 200 * 63
    assert value("swarmload_output_tokens_total", bucket="short") == 200 * 64
    # failed requests enter no latency histogram
    assert value("swarmload_e2e_seconds_count", bucket="long") == 0
    assert value("swarmload_schedule_lag_seconds_bucket", le="0.001") == 208
    # 160 sent in 4 s; 203 ok finished in the 10 s window ending 4 s ago
    assert value("swarmload_offered_rate") == pytest.approx(40.0)
    assert value("swarmload_achieved_rate") == pytest.approx(20.3)
    assert value("swarmload_in_flight") == 260 - 208
    assert value("swarmload_generator_healthy") == 1.0
    assert value("swarmload_info") == 1.0


def test_a_lagging_generator_reads_unhealthy() -> None:
    metrics = LiveMetrics({"run_id": "r"}, clock=lambda: 1000.0)
    metrics.on_records(_batch(100, 990.0, lag=0.05))
    got = {name: v for (name, _), v in _scrape(metrics).items()}
    assert got["swarmload_schedule_lag_p99_seconds"] == pytest.approx(0.05)
    assert got["swarmload_generator_healthy"] == 0.0


def test_days_of_records_keep_the_series_and_the_memory_fixed() -> None:
    now = [0.0]
    metrics = LiveMetrics({"run_id": "soak"}, clock=lambda: now[0])
    outcomes = [o for o in OUTCOMES]

    def one_hour(hour: int) -> None:
        for minute in range(60):
            t = hour * 3600.0 + minute * 60.0
            now[0] = t + 60
            for i, outcome in enumerate(outcomes[:4]):
                metrics.on_records(_batch(50, t + i, outcome=outcome,
                                          bucket=BUCKETS[(minute + i) % 3]))
            metrics.on_worker_live(f"w{minute % 2}", {"sent": hour * 12_000 + minute * 200})

    one_hour(0)
    series = len(_scrape(metrics))
    tracemalloc.start()
    one_hour(1)
    first, _ = tracemalloc.get_traced_memory()
    for hour in range(2, 8):
        one_hour(hour)
    later, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(_scrape(metrics)) == series  # no series per request, minute or worker report
    assert later - first < 64 * 1024, (first, later)
    assert len(metrics.bins) <= 70 and len(metrics.sent_history) <= 40


def test_label_names_become_prometheus_names() -> None:
    assert label_name("engine.version") == "engine_version"
    assert label_name("2nd") == "_2nd"
    assert label_name("__x") == "___x"


def test_served_over_http_in_the_event_loop() -> None:
    metrics = LiveMetrics({"run_id": "r"})
    port = free_port()
    server = serve(metrics, "127.0.0.1", port)
    try:
        def fetch() -> str:  # gevent's socket: the server runs in this loop
            with gevent.socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
                chunks = iter(lambda: sock.recv(65536), b"")
                return b"".join(chunks).decode()

        text = gevent.spawn(fetch).get(timeout=10)
        assert 'swarmload_info{run_id="r"} 1.0' in text
    finally:
        server.stop(timeout=1)


def test_late_reads_alone_stay_healthy_and_events_read_together_do_not() -> None:
    metrics = LiveMetrics({"run_id": "r"}, clock=lambda: 1000.0)
    late = _batch(100, 990.0)
    late["read_delay_s"] = [0.040] * 100  # 40 ms late, each event alone: the figures held
    metrics.on_records(late)
    got = {name: v for (name, _), v in _scrape(metrics).items()}
    assert got["swarmload_read_delay_p99_seconds"] == pytest.approx(0.040)
    assert got["swarmload_merged_gap_share"] == 0.0
    assert got["swarmload_generator_healthy"] == 1.0
    merged = _batch(100, 990.0)
    merged["itl_s"] = [[0.0] * 3 + [0.01] * 60] * 100  # first token read with the next three
    metrics = LiveMetrics({"run_id": "r"}, clock=lambda: 1000.0)
    metrics.on_records(merged)
    got = {name: v for (name, _), v in _scrape(metrics).items()}
    assert got["swarmload_merged_gap_share"] == pytest.approx(3 / 63)
    assert got["swarmload_generator_healthy"] == 0.0
