"""SGLang's ``/metrics`` names (``--enable-metrics``) for the server figures
(:mod:`collectors.server_figures`).

From SGLang's ``python/sglang/srt/metrics/collector.py`` (SchedulerMetricsCollector,
TokenizerMetricsCollector). The prefix cache is counted in prompt tokens: hits are
``cached_tokens_total``, queries every prompt token (``prompt_tokens_total``). Preemptions are
SGLang's retractions. Speculative decoding is exposed as a rate only (``spec_accept_rate``), not
as the accepted and drafted token counters.
"""

from __future__ import annotations

from collectors import server_figures as fig

MAP = fig.MetricMap(
    engine="sglang", title="SGLang", prefix="sglang:",
    names={
        fig.RUNNING: ("sglang:num_running_reqs",),
        fig.WAITING: ("sglang:num_queue_reqs",),
        fig.KV_USAGE: ("sglang:token_usage",),  # tokens used of the KV pool, 0-1
        fig.PREEMPTIONS: ("sglang:num_retracted_requests_total",),
        fig.PREFIX_HITS: ("sglang:cached_tokens_total",),
        fig.PREFIX_QUERIES: ("sglang:prompt_tokens_total",),
        fig.SUCCESS: ("sglang:num_requests_total",),
        fig.GENERATION_TOKENS: ("sglang:generation_tokens_total",),
        fig.PROMPT_TOKENS: ("sglang:prompt_tokens_total",),
        fig.TTFT: ("sglang:time_to_first_token_seconds",),
        fig.ITL: ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        fig.E2E: ("sglang:e2e_request_latency_seconds",),
        fig.SPEC_ACCEPT_RATE: ("sglang:spec_accept_rate",),
    })
