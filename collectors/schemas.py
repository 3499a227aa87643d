"""Parquet table schemas: one schema per table, the single source of truth.

A run folder (``results/<run_id>/``) holds one sub-folder per table; each table is a set of
closed Parquet part files written by :class:`collectors.parquet_sink.RollingParquetWriter`, so
``pyarrow.dataset.dataset(run_dir / "requests")`` reads it while the run is still going.

Units: ``*_ns`` are integer nanoseconds, ``*_s`` float seconds. ``*_wall_ns`` is wall-clock
(``time.time_ns``) and exists to join with other hosts and telemetry; every duration is measured
on the monotonic clock (``time.perf_counter_ns``), as ``shared/docs/METRICS.md`` asks.
"""

from __future__ import annotations

import pyarrow as pa

REQUESTS_TABLE = "requests"
GPU_TABLE = "gpu"

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
)

REQUEST_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("worker_id", pa.string(), nullable=False),  # "<host>:<pid>:<worker_index>"
        pa.field("request_id", pa.string(), nullable=False),  # unique within the run
        pa.field("bucket", pa.string()),  # short / medium / long
        pa.field("endpoint", pa.string()),  # completions / chat
        pa.field("outcome", pa.string(), nullable=False),  # one of OUTCOMES
        pa.field("http_status", pa.int32()),  # null when no response arrived
        pa.field("error", pa.string()),  # short error text, null when ok
        pa.field("scheduled_wall_ns", pa.int64()),  # open-loop plans only
        pa.field("sent_wall_ns", pa.int64(), nullable=False),
        pa.field("schedule_lag_s", pa.float64()),  # sent - scheduled
        pa.field("ttft_s", pa.float64()),  # first content-bearing event - sent
        pa.field("queued_ttft_s", pa.float64()),  # first content-bearing event - scheduled
        pa.field("e2e_s", pa.float64()),  # last byte - sent
        pa.field("tpot_s", pa.float64()),  # (e2e - ttft) / (output_tokens - 1)
        pa.field("itl_count", pa.int32()),  # number of inter-token gaps
        pa.field("itl_sum_s", pa.float64()),
        pa.field("itl_p50_s", pa.float64()),
        pa.field("itl_p99_s", pa.float64()),
        pa.field("itl_max_s", pa.float64()),
        pa.field("itl_s", pa.list_(pa.float32())),  # every gap, for exact run-level ITL pct
        pa.field("prompt_tokens", pa.int32()),
        pa.field("output_tokens", pa.int32()),
        pa.field("tokens_estimated", pa.bool_()),  # true when usage was absent
        pa.field("target_prompt_tokens", pa.int32()),  # what the workload asked for
        pa.field("max_tokens", pa.int32()),
        pa.field("content_events", pa.int32()),
    ]
)

GPU_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("wall_ns", pa.int64(), nullable=False),
        pa.field("gpu_index", pa.int32(), nullable=False),
        pa.field("gpu_uuid", pa.string()),
        pa.field("gpu_name", pa.string()),
        pa.field("util_gpu_pct", pa.float64()),
        pa.field("util_mem_pct", pa.float64()),
        pa.field("mem_used_bytes", pa.int64()),
        pa.field("mem_total_bytes", pa.int64()),
        pa.field("power_w", pa.float64()),
        pa.field("energy_mj", pa.int64()),  # cumulative energy counter, millijoules
        pa.field("temperature_c", pa.float64()),
        pa.field("sm_clock_mhz", pa.int32()),
        pa.field("mem_clock_mhz", pa.int32()),
        pa.field("error", pa.string()),  # set when this GPU could not be read this sample
    ]
)
