"""What every table of a run folder and every column in it means, for the docs.

:data:`TABLES` maps each table's folder name to its schema (``collectors/schemas.py``, the one
definition of its columns and types), a paragraph about the table and one line per column (the
``requests`` table's lines are declared with its columns, ``collectors/request_columns.py``). The
run-folder reference page of the docs site is generated from it (``infra/tools/docs_reference.py``),
and ``tests/test_collectors_schema_docs.py`` fails when a column has no line here or a line
names no column, so a new column is documented where it is added.
"""

from __future__ import annotations

import pyarrow as pa

from collectors import schemas as s
from collectors.request_columns import REQUEST_COLUMNS

# declared with each column (collectors/request_columns.py)
_REQUESTS = {column.name: column.meaning for column in REQUEST_COLUMNS}

_GPU = {
    "run_id": "the run",
    "host": "the host sampled",
    "wall_ns": "the sample's tick (every GPU read in one tick shares it)",
    "gpu_index": "NVML index",
    "gpu_uuid": "NVML UUID",
    "gpu_name": "device name",
    "util_gpu_pct": "% of the last NVML period a kernel ran",
    "util_mem_pct": "% of the period device memory was read or written",
    "mem_used_bytes": "device memory used",
    "mem_total_bytes": "device memory",
    "power_w": "power draw",
    "energy_mj": "cumulative energy counter (slow field)",
    "temperature_c": "GPU temperature",
    "sm_clock_mhz": "SM clock",
    "mem_clock_mhz": "memory clock",
    "throttle_reasons": "nvmlDeviceGetCurrentClocksEventReasons bitmask (0x1 idle, 0x4 sw power "
                        "cap, 0x8 hw slowdown, 0x20 sw thermal, 0x40 hw thermal, 0x80 hw power "
                        "brake, ...)",
    "pcie_tx_kb_s": "NVML PCIe transmit throughput over ~20 ms (slow field)",
    "pcie_rx_kb_s": "NVML PCIe receive throughput over ~20 ms (slow field)",
    "ecc_corrected_volatile": "corrected ECC errors since the last driver load (slow field)",
    "ecc_uncorrected_volatile": "uncorrected ECC errors since the last driver load (slow field)",
    "xid_events": "XIDs reported since the previous row",
    "read_s": "time spent reading this GPU (the sampler's own cost)",
    "error": "set when this GPU could not be read this sample (the others go on)",
}

_GPU_PROCESSES = {
    "run_id": "the run",
    "host": "the host sampled",
    "wall_ns": "the slow sample's tick",
    "gpu_index": "NVML index",
    "gpu_uuid": "NVML UUID",
    "pid": "as the driver sees it (inside a container, maybe a host pid)",
    "process_name": "process name",
    "kind": "`compute` or `graphics`",
    "used_mem_bytes": "GPU memory it holds; null where the driver does not say",
}

_SERVER_METRICS = {
    "run_id": "the run",
    "host": "host that scraped (its clock)",
    "wall_ns": "when the scrape was sent",
    "target": "the /metrics URL (one per replica)",
    "metric": "family name as prometheus_client's parser gives it (counters without `_total`)",
    "metric_type": "gauge, counter, histogram, summary, ...",
    "sample": "the exposed sample name, the engine's own (`vllm:num_requests_running`, "
              "`sglang:num_queue_reqs`, `vllm:time_to_first_token_seconds_bucket`); the analysis "
              "reads it in one vocabulary (collectors/server_figures.py)",
    "labels": "JSON object with sorted keys (`{\"engine\":\"0\",\"le\":\"0.5\"}`)",
    "value": "the sample's value",
    "scrape_s": "request duration of this scrape",
    "error": "set on the one row of a failed scrape (metric, sample, value null)",
}

_HOST = {
    "run_id": "the run",
    "host": "the host sampled",
    "wall_ns": "the sample's tick",
    "kind": "`system` (sys_* set) or `process` (process fields set)",
    "selector": "why a process is watched: `self` (the collector), `pid`, `name:<regex>` or "
                "`child_of:<pid>`",
    "pid": "process id",
    "ppid": "parent process id",
    "name": "process name",
    "cpu_pct": "psutil's: 100 = one core busy; null on the first sight of a process",
    "wait_pct": "share of the interval the process was ready to run but waited for a core, in % "
                "(`/proc/<pid>/schedstat`'s run delay, Linux; null elsewhere and on first sight): "
                "a process the host starves",
    "rss_bytes": "resident memory",
    "num_threads": "threads",
    "sys_cpu_pct": "all cores together, 0-100",
    "sys_cpu_count": "logical cores",
    "sys_mem_total_bytes": "system memory",
    "sys_mem_used_bytes": "system memory used",
    "sys_mem_available_bytes": "system memory available",
    "load1": "1-minute load average",
    "error": "set on the one row of a watched pid that went away",
}

_WINDOWS = {
    "window_start_ns": "window start, wall clock",
    "window_s": "window length",
    "segment": "run segment: 0, then 1, 2, ... after each `--resume`",
    "late": "records that reached the master after their window was written (counts exact, "
            "percentiles of those only)",
    "requests": "records in the window",
    "ok": "ok records",
    "errors": "server-side failures",
    "not_sent": "dropped / worker_lost / cancelled",
    "error_rate": "errors / (ok + errors)",
    "errors_by_class": "JSON {outcome: count}, ok excluded",
    "prompt_tokens": "prompt tokens of the window's requests",
    "output_tokens": "output tokens of the window's requests",
    "req_per_s": "ok requests / window_s",
    "output_tok_per_s": "output tokens / window_s",
    **{f"{tag}_{pct}_s": f"exact {pct.upper()} {tag.upper()} over the window's ok requests"
       for tag in ("ttft", "tpot", "e2e") for pct in ("p50", "p95", "p99")},
    "schedule_lag_p99_s": "generator self-check: above 10 ms it did not keep up (the drift "
                          "report skips the window)",
    "read_delay_p99_s": "generator self-check: P99 read delay over the window",
    "merged_gap_share": "generator self-check: share of the ok requests' ITL gaps that were 0 "
                        "(events one read brought, stamped with its last bytes' time)",
    "ttft_bound_p99_s": "generator self-check: P99 of how late the ok requests' TTFT may read "
                        "(leading merged gaps x the request's mean other gap)",
}

_SERVER_REQUESTS = {
    "run_id": "the run",
    "host": "the host that received the span",
    "received_wall_ns": "when its export arrived (the receiver's wall clock)",
    "server_request_id": "vLLM's `gen_ai.request.id`: `cmpl-<X-Request-Id>-0` (completions), "
                         "`chatcmpl-<X-Request-Id>` (chat); the join key to "
                         "`requests.http_request_id`",
    "span_name": "the span's name (`llm_request`)",
    "trace_id": "hex",
    "span_id": "hex",
    "service": "the resource's `service.name`",
    "server_pid": "the resource's `vllm.process_id`: which API-server process finished it",
    "start_wall_ns": "span start, server clock: vLLM's arrival time, stamped when the API "
                     "server began to render the prompt (before tokenization)",
    "end_wall_ns": "span end, server clock: when the API server's output processor finished",
    "queue_s": "`gen_ai.latency.time_in_queue`: time in the engine queue",
    "ttft_s": "`gen_ai.latency.time_to_first_token`: arrival to the first token reaching the "
              "output processor",
    "prefill_s": "`gen_ai.latency.time_in_model_prefill`: scheduled to first token",
    "decode_s": "`gen_ai.latency.time_in_model_decode`: first to last token",
    "inference_s": "`gen_ai.latency.time_in_model_inference`: scheduled to last token",
    "e2e_s": "`gen_ai.latency.e2e`: arrival to finish",
    "prompt_tokens": "`gen_ai.usage.prompt_tokens`",
    "output_tokens": "`gen_ai.usage.completion_tokens`",
    "max_tokens": "`gen_ai.request.max_tokens`",
    "attributes": "every attribute of the span, JSON with sorted keys",
}

# folder name -> (schema, what one row is, meaning per column)
TABLES: dict[str, tuple[pa.Schema, str, dict[str, str]]] = {
    s.REQUESTS_TABLE: (s.REQUEST_SCHEMA, "One row per request sent (and per scheduled request "
                       "that never reached the server). Closed part files every ~2 s, readable "
                       "with `pyarrow.dataset` while the run goes on.", _REQUESTS),
    s.GPU_TABLE: (s.GPU_SCHEMA, "One row per GPU per sample (NVML; `--gpu-interval`, 1 s by "
                  "default, 10 Hz supported). Fields NVML does not offer on a device stay null; "
                  "the slow fields (energy, PCIe, ECC) are read at most once per slow interval "
                  "and are null on the rows in between.", _GPU),
    s.GPU_PROCESSES_TABLE: (s.GPU_PROCESS_SCHEMA, "One row per process holding memory on a GPU, "
                            "per slow sample.", _GPU_PROCESSES),
    s.SERVER_METRICS_TABLE: (s.SERVER_METRICS_SCHEMA, "The target's Prometheus `/metrics`, "
                             "one row per sample per scrape (`--metrics-interval`, 0.5 s by "
                             "default), so any metric a server exposes lands without a schema "
                             "change.", _SERVER_METRICS),
    s.HOST_TABLE: (s.HOST_SCHEMA, "One `system` row per sample and one `process` row per "
                   "watched process (the target's processes, the collectors).", _HOST),
    s.WINDOWS_TABLE: (s.WINDOW_SCHEMA, "Soaks: one row per fixed wall-clock window of request "
                      "records, written during the soak so that reports never re-read the raw "
                      "requests.", _WINDOWS),
    s.SERVER_REQUESTS_TABLE: (s.SERVER_REQUESTS_SCHEMA, "With `--server-traces` (or `swarmload "
                              "collect --otlp-port PORT`): one row per vLLM span `llm_request`, "
                              "i.e. per request the server finished. Times are the server's.",
                              _SERVER_REQUESTS),
}

# outcome class -> what happened (docs/METRICS.md defines them; the run-folder page lists them)
OUTCOME_DOCS: dict[str, str] = {
    s.OUTCOME_OK: "`[DONE]` after at least one content event",
    s.OUTCOME_CONNECT_ERROR: "connect refused or timed out (`error` says which)",
    s.OUTCOME_TIMEOUT_BEFORE_FIRST_TOKEN: "no content event within `--first-token-timeout` "
                                          "(headers or not)",
    s.OUTCOME_TIMEOUT_MID_STREAM: "silence longer than `--stall-timeout` after the first token",
    s.OUTCOME_HTTP_4XX: "status 400-499 other than 429",
    s.OUTCOME_HTTP_429: "status 429 (`retry_after_s` kept)",
    s.OUTCOME_HTTP_5XX: "status >= 500 (`retry_after_s` kept for 503)",
    s.OUTCOME_STREAM_CUT: "the body ended (or the connection closed) before `[DONE]`",
    s.OUTCOME_MALFORMED_EVENT: "a `data:` line that is not a JSON object; `error` quotes it",
    s.OUTCOME_EMPTY_OUTPUT: "`[DONE]` without any content event",
    s.OUTCOME_ERROR_EVENT: "an `{\"error\": ...}` event inside a 200 stream",
    s.OUTCOME_NOT_EVENT_STREAM: "a 2xx whose Content-Type is not `text/event-stream`; `error` "
                                "quotes it",
    s.OUTCOME_SHORT_OUTPUT: "under `ignore_eos`, fewer tokens than `max_tokens` (usage count; "
                            "without usage, a finish reason other than `length`)",
    s.OUTCOME_DROPPED: "open-loop: over the in-flight cap at its scheduled time",
    s.OUTCOME_WORKER_LOST: "its worker left or died before its record reached the master",
    s.OUTCOME_CANCELLED: "still in flight when the run ended or at Ctrl-C; `e2e_s` is how long "
                         "it had waited",
    s.OUTCOME_RECORD_LOST: "sent, but the master died (or stopped) before storing its record",
    s.OUTCOME_SESSION_ENDED: "a session's turn never sent because an earlier turn of the session "
                             "failed (that failure is the earlier turn's outcome)",
}
