"""vLLM's Prometheus metric names that swarmload reads (``server_metrics`` table, ``sample``).

Defined once here, for the samplers' filters, the telemetry join, soaks, studies, replicas and
bursts. Where vLLM renamed a metric, a tuple lists every name (the first present wins).
"""

from __future__ import annotations

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc (v0.10); either is accepted
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
SUCCESS = "vllm:request_success_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
# the server's own latency histograms (_sum, _count)
SERVER_TTFT = "vllm:time_to_first_token_seconds"
SERVER_E2E = "vllm:e2e_request_latency_seconds"
SERVER_ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
