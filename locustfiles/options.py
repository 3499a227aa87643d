"""The ``--swarmload-*`` command-line options of the locustfiles (also read from env vars)."""

from __future__ import annotations

from typing import Any

# name (after "--swarmload-"; the env var is SWARMLOAD_<NAME>), type, default, help, extra keywords
SWARMLOAD_OPTIONS: tuple[tuple[str, type, Any, str, dict[str, Any]], ...] = (
    ("run-id", str, "", "Run id written into every record (default: run-<timestamp>)", {}),
    ("run-dir", str, "", "Run folder for Parquet records (default: results/<run id>)", {}),
    ("endpoint", str, "completions", "OpenAI endpoint to stream from",
     {"choices": ["completions", "chat"]}),
    ("model", str, "", "Model name (default: first of /v1/models)", {}),
    ("max-tokens", int, 64, "max_tokens of every request", {}),
    ("ignore-eos", str, "true",
     "Send ignore_eos=true so outputs are exactly max_tokens (true/false)", {}),
    ("seed", int, 0, "Prompt seed", {}),
    ("prompt-salt", str, "",
     "Opens every prompt, so no run meets another's prompts in a prefix cache (default: fresh "
     "per run; give a run's salt from its manifest to repeat it exactly; 'none': no salt)", {}),
    ("mix", str, "45/40/15", "short/medium/long shares, e.g. 45/40/15", {}),
    ("thresholds", str, "64,512", "Bucket thresholds in prompt tokens: SHORT_MAX,LONG_MIN", {}),
    ("long-max-tokens", int, 1500, "Longest prompt of the long bucket, in tokens", {}),
    ("workload", str, "",
     "Workload folder (swarmload workload build); with --swarmload-plan: open-loop replay", {}),
    ("plan", str, "",
     "Arrival plan file (trace/poisson/gamma/bursts); default: <workload>/arrivals.yaml", {}),
    ("schedule-duration", float, 0.0,
     "Seconds of schedule to replay (default: --run-time minus drain)", {}),
    ("inflight-cap", int, 2000,
     "Most requests in flight per worker; arrivals over it are recorded as dropped", {}),
    ("no-stream", str, "false",
     "Non-streaming requests (true/false): E2E and usage only, no TTFT", {}),
    ("ca-bundle", str, "", "https targets: PEM file of the CA(s) to trust instead of the "
     "system store", {}),
    ("insecure", str, "false", "https targets: skip certificate verification (true/false)", {}),
    ("api-key-env", str, "",
     "Name of the environment variable holding the API key (default: OPENAI_API_KEY when set); "
     "sent as 'Authorization: Bearer'. The key itself is never an option", {}),
    ("api-key-file", str, "", "File holding the API key (instead of an environment variable)",
     {}),
    ("headers", str, "",
     "Extra request headers, one 'Name: value' per line (env SWARMLOAD_HEADERS keeps values "
     "off command lines)", {}),
    ("connect-timeout", float, 10.0, "Seconds to wait for a TCP connect (connect_error)", {}),
    ("first-token-timeout", float, 120.0,
     "Seconds from sent to the first content event before a request counts as "
     "timeout_before_first_token (covers queueing and prefill of long prompts)", {}),
    ("stall-timeout", float, 30.0,
     "Longest silence after the first token before a request counts as timeout_mid_stream, "
     "seconds", {}),
    ("soak", str, "false",
     "Soak mode (swarmload soak): lazy schedule, per-window records, compaction, trimmed "
     "Locust stats", {}),
    ("window", float, 60.0, "Soak: seconds per window of the windows table", {}),
    ("compact-every", float, 3600.0, "Soak: seconds between compactions of part files", {}),
    ("stats-keep", float, 600.0, "Soak: seconds of Locust per-second stats kept", {}),
    ("segment", int, 0, "Soak: segment number of a resumed run (0: first)", {}),
    ("start-seq", int, 0, "Soak: open-loop schedule resumes at this sequence number", {}),
    ("targets", str, "",
     "Several target base URLs, comma-separated (replicas): each request goes to one of them, "
     "chosen by --swarmload-balance; default: Locust's --host alone", {}),
    ("balance", str, "round-robin", "How --swarmload-targets share the requests",
     {"choices": ["round-robin", "least-busy"]}),
    ("replica-header", str, "X-Served-By",
     "Response header naming the replica that answered (a load balancer's server name); "
     "empty: none", {}),
    ("read-timeout", float, 300.0,
     "Longest silence within a stream before it counts as a timeout, seconds", {}),
)


def add_swarmload_arguments(parser: Any) -> None:
    group = parser.add_argument_group("swarmload", "swarmload load generation and recording")
    for name, kind, default, help_text, extra in SWARMLOAD_OPTIONS:
        typed = {} if kind is str else {"type": kind}  # as declared before: strings untyped
        group.add_argument(f"--swarmload-{name}",
                           env_var="SWARMLOAD_" + name.upper().replace("-", "_"),
                           default=default, help=help_text, **typed, **extra)
