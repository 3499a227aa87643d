"""vLLM's ``/metrics`` names for the server figures (:mod:`collectors.server_figures`).

From vLLM's own metric definitions (``vllm/v1/metrics/loggers.py``). Where vLLM renamed a metric,
the names are listed newest first (the first present in a run wins). The built-in simulator
exposes the same names.
"""

from __future__ import annotations

from collectors import server_figures as fig

MAP = fig.MetricMap(
    engine="vllm", title="vLLM", prefix="vllm:",
    names={
        fig.RUNNING: ("vllm:num_requests_running",),
        fig.WAITING: ("vllm:num_requests_waiting",),
        # renamed from gpu_cache_usage_perc in v0.10; a fraction 0-1 despite its name
        fig.KV_USAGE: ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        fig.PREEMPTIONS: ("vllm:num_preemptions_total",),
        fig.PREFIX_HITS: ("vllm:prefix_cache_hits_total",),
        fig.PREFIX_QUERIES: ("vllm:prefix_cache_queries_total",),
        fig.SUCCESS: ("vllm:request_success_total",),
        fig.GENERATION_TOKENS: ("vllm:generation_tokens_total",),
        fig.PROMPT_TOKENS: ("vllm:prompt_tokens_total",),
        fig.TTFT: ("vllm:time_to_first_token_seconds",),
        # V1's inter-token latency; before it, time_per_output_token held the same figure
        fig.ITL: ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        fig.E2E: ("vllm:e2e_request_latency_seconds",),
        fig.SPEC_ACCEPTED: ("vllm:spec_decode_num_accepted_tokens_total",),
        fig.SPEC_DRAFTED: ("vllm:spec_decode_num_draft_tokens_total",),
    })
