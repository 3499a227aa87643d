"""Text Generation Inference's ``/metrics`` names for the server figures
(:mod:`collectors.server_figures`).

From TGI's ``docs/source/reference/metrics.md``, checked against /metrics text recorded from a
TGI server (``tests/fixtures/engines/tgi-metrics.txt``). Its router writes counters without the
``_total`` suffix (``tgi_request_success 109``); the exposition parser every scrape goes through
(prometheus_client's) names such a counter's sample with it, so the run folder holds
``tgi_request_success_total``, the name mapped here. TGI has no KV-cache, prefix-cache,
preemption or time-to-first-token metric; its generated tokens are the sum of the per-request
histogram ``tgi_request_generated_tokens``.
"""

from __future__ import annotations

from collectors import server_figures as fig

MAP = fig.MetricMap(
    engine="tgi", title="TGI", prefix="tgi_",
    names={
        fig.RUNNING: ("tgi_batch_current_size",),
        fig.WAITING: ("tgi_queue_size",),
        fig.SUCCESS: ("tgi_request_success_total",),  # written without _total: see above
        fig.GENERATION_TOKENS: ("tgi_request_generated_tokens_sum",),
        fig.ITL: ("tgi_request_mean_time_per_token_duration",),
        fig.E2E: ("tgi_request_duration",),
    })
