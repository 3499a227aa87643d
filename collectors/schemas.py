"""Parquet table schemas: one schema per table, the single source of truth.

A run folder (``results/<run_id>/``) holds one sub-folder per table; each table is a set of
closed Parquet part files written by :class:`collectors.parquet_sink.RollingParquetWriter`, so
``pyarrow.dataset.dataset(run_dir / "requests")`` reads it while the run is still going.

Units: ``*_ns`` are integer nanoseconds, ``*_s`` float seconds. ``*_wall_ns`` is wall-clock
(``time.time_ns``) and exists to join with other hosts and telemetry; every duration is measured
on the monotonic clock (``time.perf_counter_ns``), as ``docs/METRICS.md`` asks.
"""

from __future__ import annotations

import pyarrow as pa

from collectors.request_columns import REQUEST_COLUMNS

REQUESTS_TABLE = "requests"
GPU_TABLE = "gpu"
GPU_PROCESSES_TABLE = "gpu_processes"
SERVER_METRICS_TABLE = "server_metrics"
HOST_TABLE = "host"
WINDOWS_TABLE = "windows"
SERVER_REQUESTS_TABLE = "server_requests"

# Outcome classes of METRICS.md; failed requests never enter latency percentiles.
OUTCOME_OK = "ok"
OUTCOME_CONNECT_ERROR = "connect_error"
OUTCOME_TIMEOUT_BEFORE_FIRST_TOKEN = "timeout_before_first_token"
OUTCOME_TIMEOUT_MID_STREAM = "timeout_mid_stream"
OUTCOME_HTTP_4XX = "http_4xx"
OUTCOME_HTTP_429 = "http_429"
OUTCOME_HTTP_5XX = "http_5xx"
OUTCOME_STREAM_CUT = "stream_cut"
OUTCOME_MALFORMED_EVENT = "malformed_event"
OUTCOME_EMPTY_OUTPUT = "empty_output"
OUTCOME_ERROR_EVENT = "error_event"  # an error object inside an otherwise good stream
OUTCOME_NOT_EVENT_STREAM = "not_event_stream"  # 2xx whose Content-Type is not text/event-stream
# ok stream, but fewer tokens than max_tokens under ignore_eos (vLLM does this when the prompt
# leaves less room than max_tokens under --max-model-len: finish_reason "length", fewer tokens)
OUTCOME_SHORT_OUTPUT = "short_output"
# Generator-side outcomes of open-loop replay: the request never reached the server (or its
# answer was never read). They are counted on their own, not as server errors.
OUTCOME_DROPPED = "dropped"  # over the in-flight cap at its scheduled time
OUTCOME_WORKER_LOST = "worker_lost"  # its worker left (or died) before its record was stored
OUTCOME_CANCELLED = "cancelled"  # still in flight when the run ended (or at Ctrl-C)
# sent, but its record died with the master (or never reached it): written afterwards from the
# workers' send journals (collectors/journal.py), with how long it had waited
OUTCOME_RECORD_LOST = "record_lost"
# a session's turn never sent because an earlier turn of the session failed (sessions end at
# their first failed turn; the failure itself is that turn's outcome)
OUTCOME_SESSION_ENDED = "session_ended"
GENERATOR_OUTCOMES = (OUTCOME_DROPPED, OUTCOME_WORKER_LOST, OUTCOME_CANCELLED,
                      OUTCOME_RECORD_LOST, OUTCOME_SESSION_ENDED)
OUTCOMES = (
    OUTCOME_OK,
    OUTCOME_CONNECT_ERROR,
    OUTCOME_TIMEOUT_BEFORE_FIRST_TOKEN,
    OUTCOME_TIMEOUT_MID_STREAM,
    OUTCOME_HTTP_4XX,
    OUTCOME_HTTP_429,
    OUTCOME_HTTP_5XX,
    OUTCOME_STREAM_CUT,
    OUTCOME_MALFORMED_EVENT,
    OUTCOME_EMPTY_OUTPUT,
    OUTCOME_ERROR_EVENT,
    OUTCOME_NOT_EVENT_STREAM,
    OUTCOME_SHORT_OUTPUT,
    *GENERATOR_OUTCOMES,
)

# one field per declared column (collectors/request_columns.py: name, type, meaning, how shown)
REQUEST_SCHEMA = pa.schema([column.field for column in REQUEST_COLUMNS])

# One row per GPU per sample; every GPU read in one tick shares that tick's wall_ns. A GPU that
# could not be read gets a row with only its index, uuid and ``error`` set, and the others go on.
# Fields NVML does not offer on a device (NotSupported) stay null. The "slow" fields (energy,
# PCIe, ECC) are read at most once per ``slow_interval_s`` and are null on the rows in between:
# on the H200 NVML's energy read cost 3.9 ms CPU and each PCIe read blocked 21 ms.
GPU_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("wall_ns", pa.int64(), nullable=False),
        pa.field("gpu_index", pa.int32(), nullable=False),
        pa.field("gpu_uuid", pa.string()),
        pa.field("gpu_name", pa.string()),
        pa.field("util_gpu_pct", pa.float64()),  # % of the last NVML period a kernel ran
        pa.field("util_mem_pct", pa.float64()),  # % of the period device memory was read/written
        pa.field("mem_used_bytes", pa.int64()),
        pa.field("mem_total_bytes", pa.int64()),
        pa.field("power_w", pa.float64()),
        pa.field("energy_mj", pa.int64()),  # cumulative energy counter, millijoules
        pa.field("temperature_c", pa.float64()),
        pa.field("sm_clock_mhz", pa.int32()),
        pa.field("mem_clock_mhz", pa.int32()),
        # nvmlDeviceGetCurrentClocksEventReasons bitmask (0x1 idle, 0x4 sw power cap,
        # 0x8 hw slowdown, 0x20 sw thermal, 0x40 hw thermal, 0x80 hw power brake, ...)
        pa.field("throttle_reasons", pa.int64()),
        pa.field("pcie_tx_kb_s", pa.int64()),  # NVML PCIe throughput, KB/s over ~20 ms
        pa.field("pcie_rx_kb_s", pa.int64()),
        pa.field("ecc_corrected_volatile", pa.int64()),  # since the last driver load
        pa.field("ecc_uncorrected_volatile", pa.int64()),
        pa.field("xid_events", pa.list_(pa.int64())),  # XIDs reported since the previous row
        pa.field("read_s", pa.float64()),  # time spent reading this GPU (sampler's own cost)
        pa.field("error", pa.string()),  # set when this GPU could not be read this sample
    ]
)

# One row per process holding memory on a GPU, per slow sample (at most once per
# ``slow_interval_s``). ``used_mem_bytes`` is null where the driver does not say (some
# containers); ``pid`` is as the driver sees it, which inside a container may be a host pid.
GPU_PROCESS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("wall_ns", pa.int64(), nullable=False),
        pa.field("gpu_index", pa.int32(), nullable=False),
        pa.field("gpu_uuid", pa.string()),
        pa.field("pid", pa.int64(), nullable=False),
        pa.field("process_name", pa.string()),
        pa.field("kind", pa.string()),  # "compute" or "graphics"
        pa.field("used_mem_bytes", pa.int64()),
    ]
)

# Long format: one row per Prometheus sample per scrape, so any metric a server exposes lands
# without a schema change. ``metric`` is the family name as prometheus_client's parser gives it
# (counters without ``_total``), ``sample`` the exposed sample name (``vllm:num_requests_running``,
# ``vllm:prompt_tokens_total``, ``vllm:time_to_first_token_seconds_bucket``), ``labels`` a JSON
# object with sorted keys (``{"engine":"0","le":"0.5","model_name":"m"}``). A failed scrape is
# one row with ``error`` set and metric/sample/value null; the scraper keeps trying. Names stay
# each engine's own; collectors/server_figures.py reads them in one vocabulary.
SERVER_METRICS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("host", pa.string(), nullable=False),  # host that scraped (its clock)
        pa.field("wall_ns", pa.int64(), nullable=False),  # when the scrape was sent
        pa.field("target", pa.string(), nullable=False),  # the /metrics URL
        pa.field("metric", pa.string()),
        pa.field("metric_type", pa.string()),  # gauge, counter, histogram, summary, ...
        pa.field("sample", pa.string()),
        pa.field("labels", pa.string()),
        pa.field("value", pa.float64()),
        pa.field("scrape_s", pa.float64()),  # request duration of this scrape
        pa.field("error", pa.string()),
    ]
)

HOST_KIND_SYSTEM = "system"
HOST_KIND_PROCESS = "process"

# One "system" row per sample (sys_* set) and one "process" row per watched process (process
# fields set). ``selector`` says why a process is watched: "self" (the collector), "pid",
# "name:<regex>" or "child_of:<pid>". ``cpu_pct`` is psutil's: 100 = one core busy; null on
# the first sight of a process (psutil needs two readings). A watched pid that went away gets
# one row with ``error`` set.
HOST_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("wall_ns", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # HOST_KIND_SYSTEM / HOST_KIND_PROCESS
        pa.field("selector", pa.string()),
        pa.field("pid", pa.int64()),
        pa.field("ppid", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("cpu_pct", pa.float64()),
        pa.field("wait_pct", pa.float64()),  # runnable, waiting for a core (Linux schedstat)
        pa.field("rss_bytes", pa.int64()),
        pa.field("num_threads", pa.int32()),
        pa.field("sys_cpu_pct", pa.float64()),  # all cores together, 0-100
        pa.field("sys_cpu_count", pa.int32()),
        pa.field("sys_mem_total_bytes", pa.int64()),
        pa.field("sys_mem_used_bytes", pa.int64()),
        pa.field("sys_mem_available_bytes", pa.int64()),
        pa.field("load1", pa.float64()),
        pa.field("error", pa.string()),
    ]
)

# One row per fixed wall-clock window of request records (collectors.windows.window_stats),
# written during a soak so that reports never re-read the raw requests. ``late`` rows hold records
# that reached the master after their window was written (counts exact, percentiles of those
# only). ``segment`` is the run segment (0, then 1, 2, ... after each ``--resume``).
# Latency percentiles are exact, over the window's ok requests.
WINDOW_SCHEMA = pa.schema(
    [
        pa.field("window_start_ns", pa.int64(), nullable=False),  # wall clock
        pa.field("window_s", pa.float64(), nullable=False),
        pa.field("segment", pa.int32(), nullable=False),
        pa.field("late", pa.bool_(), nullable=False),
        pa.field("requests", pa.int64(), nullable=False),
        pa.field("ok", pa.int64(), nullable=False),
        pa.field("errors", pa.int64(), nullable=False),  # server-side failures
        pa.field("not_sent", pa.int64(), nullable=False),  # dropped / worker_lost / cancelled
        pa.field("error_rate", pa.float64()),  # errors / (ok + errors)
        pa.field("errors_by_class", pa.string()),  # JSON {outcome: count}, ok excluded
        pa.field("prompt_tokens", pa.int64()),
        pa.field("output_tokens", pa.int64()),
        pa.field("req_per_s", pa.float64()),  # ok requests / window_s
        pa.field("output_tok_per_s", pa.float64()),
        *[pa.field(f"{tag}_{pct}_s", pa.float64())
          for tag in ("ttft", "tpot", "e2e") for pct in ("p50", "p95", "p99")],
        # the generator's self-checks over the window: a lag above 10 ms, or events read
        # together (collectors.itl_gaps) past the run summary's limits, and the window's
        # latencies are its own as much as the server's (the drift report skips them)
        pa.field("schedule_lag_p99_s", pa.float64()),
        pa.field("read_delay_p99_s", pa.float64()),
        pa.field("merged_gap_share", pa.float64()),
        pa.field("ttft_bound_p99_s", pa.float64()),
    ]
)

# One row per request as the server itself timed it: vLLM's OpenTelemetry span ``llm_request``
# (one per finished request, sent with ``--otlp-traces-endpoint``), received over OTLP/HTTP by
# ``collectors.otlp_traces``. The span starts at vLLM's ``arrival_time`` (the API server's wall
# clock when it began to render and tokenize the prompt) and ends when its output processor
# finished the request. Durations are vLLM's own attributes: ``ttft_s`` runs from arrival to the
# first token reaching the API server's output processor; ``queue_s`` (waiting in the engine's
# scheduler) and ``prefill_s`` (scheduled -> first token) are engine-core times within it.
# ``server_request_id`` is vLLM's external id (``gen_ai.request.id``), derived from the client's
# X-Request-Id: ``cmpl-<id>-0`` (completions), ``chatcmpl-<id>`` (chat); the join is
# ``dashboards/analysis/server_traces.py``. Spans without ``gen_ai.request.id`` are not rows.
SERVER_REQUESTS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("host", pa.string(), nullable=False),  # host that received the span
        pa.field("received_wall_ns", pa.int64(), nullable=False),  # when its export arrived
        pa.field("server_request_id", pa.string(), nullable=False),  # gen_ai.request.id
        pa.field("span_name", pa.string()),  # "llm_request"
        pa.field("trace_id", pa.string()),  # hex
        pa.field("span_id", pa.string()),  # hex
        pa.field("service", pa.string()),  # resource service.name
        pa.field("server_pid", pa.int64()),  # resource vllm.process_id (which API server)
        pa.field("start_wall_ns", pa.int64(), nullable=False),  # server clock: vLLM arrival
        pa.field("end_wall_ns", pa.int64()),  # server clock: request finished
        pa.field("queue_s", pa.float64()),  # gen_ai.latency.time_in_queue
        pa.field("ttft_s", pa.float64()),  # gen_ai.latency.time_to_first_token
        pa.field("prefill_s", pa.float64()),  # gen_ai.latency.time_in_model_prefill
        pa.field("decode_s", pa.float64()),  # gen_ai.latency.time_in_model_decode
        pa.field("inference_s", pa.float64()),  # gen_ai.latency.time_in_model_inference
        pa.field("e2e_s", pa.float64()),  # gen_ai.latency.e2e
        pa.field("prompt_tokens", pa.int32()),  # gen_ai.usage.prompt_tokens
        pa.field("output_tokens", pa.int32()),  # gen_ai.usage.completion_tokens
        pa.field("max_tokens", pa.int32()),  # gen_ai.request.max_tokens
        pa.field("attributes", pa.string()),  # every span attribute, JSON (sorted keys)
    ]
)
