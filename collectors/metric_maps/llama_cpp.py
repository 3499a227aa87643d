"""llama.cpp's ``llama-server`` ``/metrics`` names (``--metrics``) for the server figures
(:mod:`collectors.server_figures`).

From ``tools/server/server-task.cpp`` (``server_task_result_metrics::to_metrics``), checked
against the ``/metrics`` text of the llama-server the suite builds (llama-cpp-python 0.3.36's
llama.cpp; tests/test_e2e_llama_cpp.py). Its prompt counter excludes the tokens reused from the
cache, so the prefix cache's queries are the sum of ``prompt_tokens_total`` and
``prompt_tokens_cached_total``. No KV-cache usage (older builds had ``kv_cache_usage_ratio``;
current ones do not, so the figure is marked absent), no latency histogram, no success counter,
no preemptions.
"""

from __future__ import annotations

from collectors import server_figures as fig

MAP = fig.MetricMap(
    engine="llama.cpp", title="llama.cpp", prefix="llamacpp:",
    names={
        fig.RUNNING: ("llamacpp:requests_processing",),
        fig.WAITING: ("llamacpp:requests_deferred",),
        fig.PREFIX_HITS: ("llamacpp:prompt_tokens_cached_total",),
        fig.GENERATION_TOKENS: ("llamacpp:tokens_predicted_total",),
        fig.PROMPT_TOKENS: ("llamacpp:prompt_tokens_total",),
        fig.SPEC_ACCEPTED: ("llamacpp:spec_decode_num_accepted_tokens_total",),
        fig.SPEC_DRAFTED: ("llamacpp:spec_decode_num_draft_tokens_total",),
    },
    sums={fig.PREFIX_QUERIES: ("llamacpp:prompt_tokens_total",
                               "llamacpp:prompt_tokens_cached_total")})
