"""The ``--swarmload-*`` command-line options of the locustfiles (also read from env vars)."""

from __future__ import annotations

from typing import Any


def add_swarmload_arguments(parser: Any) -> None:
    group = parser.add_argument_group("swarmload", "swarmload load generation and recording")
    add = group.add_argument
    add("--swarmload-run-id", env_var="SWARMLOAD_RUN_ID", default="",
        help="Run id written into every record (default: run-<timestamp>)")
    add("--swarmload-run-dir", env_var="SWARMLOAD_RUN_DIR", default="",
        help="Run folder for Parquet records (default: results/<run id>)")
    add("--swarmload-endpoint", env_var="SWARMLOAD_ENDPOINT", default="completions",
        choices=["completions", "chat"], help="OpenAI endpoint to stream from")
    add("--swarmload-model", env_var="SWARMLOAD_MODEL", default="",
        help="Model name (default: first of /v1/models)")
    add("--swarmload-max-tokens", env_var="SWARMLOAD_MAX_TOKENS", type=int, default=64,
        help="max_tokens of every request")
    add("--swarmload-ignore-eos", env_var="SWARMLOAD_IGNORE_EOS", default="true",
        help="Send ignore_eos=true so outputs are exactly max_tokens (true/false)")
    add("--swarmload-seed", env_var="SWARMLOAD_SEED", type=int, default=0, help="Prompt seed")
    add("--swarmload-mix", env_var="SWARMLOAD_MIX", default="45/40/15",
        help="short/medium/long shares, e.g. 45/40/15")
    add("--swarmload-thresholds", env_var="SWARMLOAD_THRESHOLDS", default="64,512",
        help="Bucket thresholds in prompt tokens: SHORT_MAX,LONG_MIN")
    add("--swarmload-long-max-tokens", env_var="SWARMLOAD_LONG_MAX_TOKENS", type=int,
        default=1500, help="Longest prompt of the long bucket, in tokens")
    add("--swarmload-workload", env_var="SWARMLOAD_WORKLOAD", default="",
        help="Workload folder (swarmload workload build); with --swarmload-plan: open-loop replay")
    add("--swarmload-plan", env_var="SWARMLOAD_PLAN", default="",
        help="Arrival plan file (trace/poisson/gamma/bursts); default: <workload>/arrivals.yaml")
    add("--swarmload-schedule-duration", env_var="SWARMLOAD_SCHEDULE_DURATION", type=float,
        default=0.0, help="Seconds of schedule to replay (default: --run-time minus drain)")
    add("--swarmload-inflight-cap", env_var="SWARMLOAD_INFLIGHT_CAP", type=int, default=2000,
        help="Most requests in flight per worker; arrivals over it are recorded as dropped")
    add("--swarmload-read-timeout", env_var="SWARMLOAD_READ_TIMEOUT", type=float, default=300.0,
        help="Longest silence within a stream before it counts as a timeout, seconds")
