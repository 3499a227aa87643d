"""Each engine's /metrics read in one vocabulary (collectors/server_figures.py): the figures a run
shows are the same names whatever engine served it, and what an engine lacks is said absent."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from collectors.server_figures import (
    E2E,
    FIGURES,
    GENERATION_TOKENS,
    ITL,
    KV_USAGE,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    RUNNING,
    SUCCESS,
    TTFT,
    WAITING,
    absent,
    engine_of,
    include_prefixes,
    maps,
    samples_of,
    select,
)
from collectors.server_metrics import BUSY_GAUGES, parse_metrics

# /metrics text in each engine's own exposition (names and types as each engine's source
# declares them; values chosen so every figure is told apart)
EXPOSITION = {
    "vllm": """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 5
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.25
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.99
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{model_name="m"} 2
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 40
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 100
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 4
vllm:time_to_first_token_seconds_sum{model_name="m"} 0.8
vllm:time_to_first_token_seconds_count{model_name="m"} 4
""",
    "sglang": """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 3
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 5
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.25
# TYPE sglang:num_retracted_requests counter
sglang:num_retracted_requests_total{model_name="m"} 2
# TYPE sglang:cached_tokens counter
sglang:cached_tokens_total{model_name="m"} 40
# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens_total{model_name="m"} 100
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 4
sglang:time_to_first_token_seconds_sum{model_name="m"} 0.8
sglang:time_to_first_token_seconds_count{model_name="m"} 4
""",
    "tgi": """# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 3
# TYPE tgi_queue_size gauge
tgi_queue_size 5
# TYPE tgi_request_success counter
tgi_request_success 7
# TYPE tgi_request_generated_tokens histogram
tgi_request_generated_tokens_bucket{le="+Inf"} 7
tgi_request_generated_tokens_sum 70
tgi_request_generated_tokens_count 7
""",
    "llama.cpp": """# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 60
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 40
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 70
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 3
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
""",
}


def _scrape(engine: str, wall_ns: int = 1) -> pd.DataFrame:
    rows = parse_metrics(EXPOSITION[engine])
    return pd.DataFrame([{"run_id": "r", "host": "h", "wall_ns": wall_ns, "target": "t",
                          "error": None, **row} for row in rows])


def _value(frame: pd.DataFrame, figure: str, suffix: str = "") -> float:
    rows = select(frame, figure, suffix)
    return float(rows["value"].sum()) if not rows.empty else float("nan")


@pytest.mark.parametrize("engine", sorted(EXPOSITION))
def test_every_engine_reads_the_same_figures_under_one_name(engine: str) -> None:
    frame = _scrape(engine)
    assert engine_of(frame["sample"]).engine == engine
    assert (_value(frame, RUNNING), _value(frame, WAITING)) == (3.0, 5.0)
    if maps()[engine].exposes(PREFIX_HITS):
        assert (_value(frame, PREFIX_HITS), _value(frame, PREFIX_QUERIES)) == (40.0, 100.0)
    if maps()[engine].exposes(KV_USAGE):
        assert _value(frame, KV_USAGE) == 0.25  # vLLM's older name, also there, is not added in
    if maps()[engine].exposes(TTFT):
        assert (_value(frame, TTFT, "_sum"), _value(frame, TTFT, "_count")) == (0.8, 4.0)
    # the busy gauges that end a run's telemetry tail are every engine's
    assert set(frame["sample"]) & BUSY_GAUGES


def test_a_figure_an_engine_lacks_is_absent_and_says_whose() -> None:
    tgi = engine_of(_scrape("tgi")["sample"])
    missing = absent(tgi, [RUNNING, KV_USAGE, PREFIX_HITS, PREEMPTIONS, TTFT, GENERATION_TOKENS])
    assert missing == {KV_USAGE: "not exposed by TGI", PREFIX_HITS: "not exposed by TGI",
                       PREEMPTIONS: "not exposed by TGI", TTFT: "not exposed by TGI"}
    assert _value(_scrape("tgi"), GENERATION_TOKENS) == 70.0  # its histogram's sum
    assert select(_scrape("tgi"), KV_USAGE).empty
    assert absent(None, [KV_USAGE]) == {}  # no scrape, no engine: nothing claimed


def test_old_run_folders_keep_the_engines_names_and_a_filter_finds_them() -> None:
    keep = samples_of([RUNNING, ITL])
    assert "vllm:num_requests_running" in keep and "sglang:num_running_reqs" in keep
    assert {"vllm:inter_token_latency_seconds_sum",
            "vllm:time_per_output_token_seconds_count"} <= set(keep)
    assert "vllm:num_requests_running" in samples_of(["vllm:num_requests_running"])
    # the scrape filter of a soak keeps every engine's families (counters without _total)
    prefixes = include_prefixes([RUNNING, PREEMPTIONS])
    assert "vllm:num_preemptions" in prefixes and "sglang:num_running_reqs" in prefixes


def test_every_map_names_only_figures_of_the_vocabulary() -> None:
    for metric_map in maps().values():
        assert set(metric_map.names) | set(metric_map.sums) <= set(FIGURES), metric_map.engine


# /metrics text each engine wrote, recorded where it is published (each file's header says where)
RECORDED = Path(__file__).resolve().parent / "fixtures" / "engines"


def _recorded(name: str) -> pd.DataFrame:
    rows = parse_metrics((RECORDED / name).read_text())
    return pd.DataFrame([{"run_id": "r", "host": "h", "wall_ns": 1, "target": "t",
                          "error": None, **row} for row in rows])


def test_sglangs_recorded_metrics_read_in_the_one_vocabulary() -> None:
    """SGLang's documented /metrics output (a Llama-3.1-8B server under load): its engine is
    told from the names, each figure it has is read under the neutral name, and the two it
    did not expose yet are missing, not read from another engine's names."""
    frame = _recorded("sglang-metrics.txt")
    assert engine_of(frame["sample"]).engine == "sglang"
    assert (_value(frame, RUNNING), _value(frame, WAITING)) == (162.0, 2826.0)
    assert _value(frame, KV_USAGE) == 0.28
    assert (_value(frame, PROMPT_TOKENS), _value(frame, GENERATION_TOKENS)) == (8_128_902.0,
                                                                                 7_557_572.0)
    assert _value(frame, TTFT, "_count") == 11008.0
    assert _value(frame, TTFT, "_sum") == pytest.approx(2_351_897.947)
    # the older name of its inter-token latency, the second in the map
    assert _value(frame, ITL, "_count") == 7_400_757.0
    assert _value(frame, E2E, "_count") == 11228.0
    assert select(frame, PREFIX_HITS).empty and select(frame, PREEMPTIONS).empty
    assert set(frame["sample"]) & BUSY_GAUGES


def test_tgis_recorded_metrics_read_in_the_one_vocabulary() -> None:
    """TGI's /metrics as recorded from a server (idle at the scrape): counters without
    ``_total``, generated tokens as a histogram's sum, and the figures TGI lacks said absent."""
    frame = _recorded("tgi-metrics.txt")
    tgi = engine_of(frame["sample"])
    assert tgi.engine == "tgi"
    assert (_value(frame, RUNNING), _value(frame, WAITING)) == (0.0, 0.0)
    assert _value(frame, SUCCESS) == 109.0
    assert _value(frame, GENERATION_TOKENS) == 3423.0  # tgi_request_generated_tokens_sum
    assert (_value(frame, ITL, "_sum"), _value(frame, ITL, "_count")) == (8.643160945, 109.0)
    assert _value(frame, E2E, "_count") == 109.0
    assert absent(tgi, [KV_USAGE, PREFIX_HITS, PREEMPTIONS, TTFT]) == {
        figure: "not exposed by TGI" for figure in (KV_USAGE, PREFIX_HITS, PREEMPTIONS, TTFT)}
    assert set(frame["sample"]) & BUSY_GAUGES


def test_llama_cpps_recorded_metrics_read_in_the_one_vocabulary() -> None:
    """llama-server's /metrics as recorded from the build the suite makes: its prompt counter
    leaves out the cached tokens, so the prefix cache's queries are the sum of the two."""
    frame = _recorded("llama-cpp-metrics.txt")
    llama = engine_of(frame["sample"])
    assert llama.engine == "llama.cpp"
    assert (_value(frame, RUNNING), _value(frame, WAITING)) == (0.0, 0.0)
    assert (_value(frame, PROMPT_TOKENS), _value(frame, PREFIX_HITS)) == (9.0, 5.0)
    assert _value(frame, PREFIX_QUERIES) == 14.0
    assert _value(frame, GENERATION_TOKENS) == 18.0
    assert absent(llama, [KV_USAGE, TTFT, PREEMPTIONS]) == {
        figure: "not exposed by llama.cpp" for figure in (KV_USAGE, TTFT, PREEMPTIONS)}
