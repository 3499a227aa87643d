"""``/metrics`` under vLLM's metric names, produced by prometheus_client in its own registry.

Names, types and histogram buckets follow vLLM's v1 engine (``vllm/v1/metrics/loggers.py``); every
series carries ``model_name`` and ``engine="0"`` labels as vLLM's do. Gauges are refreshed at
scrape time from the engine's state rather than on every step, which keeps the token path free of
metric calls.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# vLLM's buckets, so that quantiles estimated from our histograms compare with a real server's.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort")

PROMETHEUS_CONTENT_TYPE = CONTENT_TYPE_LATEST


class SimulatorMetrics:
    """The metric children for one served model; call :meth:`render` to scrape."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("model_name", "engine")
        values = {"model_name": model_name, "engine": "0"}
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=reg)

        self.num_requests_running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        ).labels(**values)
        self.num_requests_waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        ).labels(**values)
        self.kv_cache_usage_perc = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        ).labels(**values)
        self.num_preemptions = Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.",
            labels, registry=reg,
        ).labels(**values)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=reg
        ).labels(**values)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels,
            registry=reg,
        ).labels(**values)
        success = Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            (*labels, "finished_reason"), registry=reg,
        )
        self.request_success = {
            reason: success.labels(**values, finished_reason=reason) for reason in FINISH_REASONS
        }
        self.time_to_first_token = Histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            labels, registry=reg, buckets=TTFT_BUCKETS,
        ).labels(**values)
        self.e2e_request_latency = Histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
            labels, registry=reg, buckets=REQUEST_LATENCY_BUCKETS,
        ).labels(**values)
        self.request_queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            labels, registry=reg, buckets=REQUEST_LATENCY_BUCKETS,
        ).labels(**values)

        # Producers add generated tokens here (a plain int: no lock on the token path);
        # render() moves them into the counter.
        self.pending_generation_tokens = 0

    def set_state(self, *, running: int, waiting: int, kv_usage: float) -> None:
        self.num_requests_running.set(running)
        self.num_requests_waiting.set(waiting)
        self.kv_cache_usage_perc.set(kv_usage)

    def render(self) -> bytes:
        pending, self.pending_generation_tokens = self.pending_generation_tokens, 0
        if pending:
            self.generation_tokens.inc(pending)
        return generate_latest(self.registry)
