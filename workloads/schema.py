"""The stored workload format: ``DIR/workload.parquet``, one row per request, in send order.

Workloads owns this format; the load generator reads it. Columns (``WORKLOAD_SCHEMA``):

- ``request_id`` (string): unique within the workload ("r000000", ...)
- ``bucket`` (string): "short" | "medium" | "long" by ``prompt_tokens`` (see BucketSpec)
- ``prompt_tokens`` (int32): prompt length in tokens: the logged count or, for prompts built or
  counted here, the count the target's tokenizer gives (chat template included for "chat")
- ``output_tokens`` (int32): logged output tokens; send as ``max_tokens`` (with ``ignore_eos``
  where the server accepts it)
- ``prompt`` (string, nullable): scrubbed prompt text for /v1/completions; null for chat
  workloads and when no prompt text exists (then the sender must build one)
- ``messages`` (string, nullable): JSON array of {"role", "content"} for /v1/chat/completions,
  scrubbed; null for completions workloads
- ``trace_offset_s`` (float64, nullable): arrival offset in seconds from the log's first request;
  null when the log has no timing (ShareGPT, generic without timestamps)
- ``session_id`` (string, nullable): anonymized session id (keyed hash of the logged one)
- ``prefix_block_ids`` (list<int64>): shared prefix block ids (Mooncake ``hash_ids``, one id
  per 512-token block); empty when the log has none
- ``source_line`` (int64): line in the log (1-based; record number for JSON arrays and Parquet)
  of the row this request was drawn from
- ``prompt_source`` (string, nullable): "log" (text from the log), "synthesized" (built here to
  the exact length) or null (no text)

Session workloads (``workloads.sessions``) add, per row, one turn of a session (null elsewhere);
the rows of a session are consecutive and in turn order, its turn 0 first:

- ``turn`` (int32, nullable): the turn's index in its session (0-based); null: a lone request
- ``think_time_s`` (float64, nullable): seconds between the previous turn's answer and this turn
- ``user_tokens`` (int32, nullable): tokens of the turn's new user message (its text alone, in
  the target's tokenizer: exact when built with one)
- ``answer`` (string, nullable): the logged (or synthesized) answer of the turn, scrubbed: what
  the history holds under ``history: logged``
- ``tools`` (string, nullable): JSON ``{"tools": [OpenAI tools offered with the turn], "result":
  "the text the tool returns"}``
- ``tool_time_s`` (float64, nullable): seconds the tool "runs" before its result is sent back
- ``shared_tokens`` (int32, nullable): tokens of the turn's prompt that other sessions send on
  purpose too (its group's system prompt, Mooncake blocks shared across conversations)

Task workloads (agents: ``docs/guides/agents.md``) are sessions whose turns form a graph: a task
is a session (``session_id``), its calls its turns (``turn``: the call's index, every dependency
before it). Three more columns, null for every row of other workloads:

- ``depends_on`` (list<int32>, nullable): the calls of the same task that must have finished
  (last byte, tool loop included) before this one is sent; an empty list: sent at the task's
  start. Null: a plain session turn (it follows the previous turn). ``think_time_s`` is the delay
  after the last of them finished (tool time, the agent's own work), ``tool_time_s`` and
  ``tools`` as for sessions
- ``context_turn`` (int32, nullable): the call whose conversation (its prompt as sent and its
  answer) opens this call's prompt; null: the prompt is the call's own ``messages`` (a sub-agent
  starting on the shared system prompt). The answers of the other calls in ``depends_on`` go into
  the call's first user message, the real ones (or ``answer`` under ``history: logged``), as
  :func:`workloads.builtin_mix.with_answers` writes them
- ``agent`` (string, nullable): the agent that makes the call ("planner", "worker-2", "joiner")

For a session turn, ``messages`` holds the turn's NEW messages only (turn 0: the system prompt,
if any, and the user message; later turns: the user message), and ``prompt_tokens`` the whole
prompt's tokens with the logged history before it.

Schema metadata key ``swarmload.workload`` holds the build parameters as JSON (source, endpoint,
tokenizer, buckets, seed). ``DIR/report.json`` holds the build report and ``DIR/arrivals.yaml``
(optional) the arrival plan.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from workloads.scrub import assert_clean

WORKLOAD_FILE = "workload.parquet"
REPORT_FILE = "report.json"
PLAN_FILE = "arrivals.yaml"
METADATA_KEY = b"swarmload.workload"

WORKLOAD_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("bucket", pa.string(), nullable=False),
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("output_tokens", pa.int32(), nullable=False),
        pa.field("prompt", pa.string()),
        pa.field("messages", pa.string()),
        pa.field("trace_offset_s", pa.float64()),
        pa.field("session_id", pa.string()),
        pa.field("prefix_block_ids", pa.list_(pa.int64())),
        pa.field("source_line", pa.int64(), nullable=False),
        pa.field("prompt_source", pa.string()),
        pa.field("turn", pa.int32()),
        pa.field("think_time_s", pa.float64()),
        pa.field("user_tokens", pa.int32()),
        pa.field("answer", pa.string()),
        pa.field("tools", pa.string()),
        pa.field("tool_time_s", pa.float64()),
        pa.field("shared_tokens", pa.int32()),
        pa.field("depends_on", pa.list_(pa.int32())),
        pa.field("context_turn", pa.int32()),
        pa.field("agent", pa.string()),
    ]
)
SESSION_COLUMNS = ("turn", "think_time_s", "user_tokens", "answer", "tools", "tool_time_s",
                   "shared_tokens", "depends_on", "context_turn", "agent")


def workload_table(
    bucket: Sequence[str],
    prompt_tokens: Sequence[int],
    output_tokens: Sequence[int],
    *,
    request_id: Sequence[str] | None = None,
    prompt: Sequence[str | None] | None = None,
    messages: Sequence[str | None] | None = None,
    trace_offset_s: Sequence[float] | np.ndarray | None = None,
    session_id: Sequence[str | None] | None = None,
    prefix_block_ids: Sequence[list[int]] | None = None,
    source_line: Sequence[int] | None = None,
    prompt_source: str | Sequence[str | None] | None = None,
    **session: Sequence[Any] | None,
) -> pd.DataFrame:
    """A workload frame in ``WORKLOAD_SCHEMA``'s column order, one row per request.

    Columns left out take their "nothing known" value: ids ``r000000``, ``r000001``, ...; no
    prompt, messages, timing or session; no prefix blocks; source lines 1..n. ``prompt_source``
    may be one value for every row; ``session`` takes the ``SESSION_COLUMNS`` (null when left
    out). The builders (log builds, studies' built-in mix, the bench's
    keyed trace) all come through here, so a new column is added in one place.
    """
    n = len(bucket)
    unknown = sorted(set(session) - set(SESSION_COLUMNS))
    if unknown:
        raise TypeError(f"workload_table: unknown column(s) {unknown}")

    def text(values: Sequence[str | None] | None) -> Any:
        return pd.Series([None] * n, dtype=object) if values is None else list(values)

    return pd.DataFrame({
        "request_id": [f"r{i:06d}" for i in range(n)] if request_id is None else list(request_id),
        "bucket": list(bucket),
        "prompt_tokens": np.asarray(prompt_tokens, dtype=np.int64),
        "output_tokens": np.asarray(output_tokens, dtype=np.int64),
        "prompt": text(prompt),
        "messages": text(messages),
        "trace_offset_s": (np.full(n, np.nan) if trace_offset_s is None
                           else np.asarray(trace_offset_s, dtype=np.float64)),
        "session_id": text(session_id),
        "prefix_block_ids": ([[] for _ in range(n)] if prefix_block_ids is None
                             else [list(ids) for ids in prefix_block_ids]),
        "source_line": (np.arange(1, n + 1, dtype=np.int64) if source_line is None
                        else np.asarray(source_line, dtype=np.int64)),
        "prompt_source": ([prompt_source] * n if prompt_source is None or isinstance(
            prompt_source, str) else list(prompt_source)),
        **{name: (pd.Series([None] * n, dtype=object) if session.get(name) is None
                  else list(session[name]))  # type: ignore[arg-type]
           for name in SESSION_COLUMNS},
    })


def user_messages(prompt: str) -> str:
    """The ``messages`` cell of a chat workload whose request is one user turn of ``prompt``."""
    return json.dumps([{"role": "user", "content": prompt}], ensure_ascii=False)


def write_workload(frame: pd.DataFrame, out_dir: str | Path, metadata: dict[str, Any]) -> Path:
    """Write ``frame`` (columns of WORKLOAD_SCHEMA) to ``out_dir/workload.parquet``.

    Refuses text that still matches an identifier pattern (see ``workloads.scrub``), so a caller
    that forgot to scrub cannot store raw text.
    """
    for column in ("prompt", "messages"):
        assert_clean(frame[column].dropna(), what=f"workload column {column!r}")
    missing = [name for name in SESSION_COLUMNS if name not in frame.columns]
    if missing:  # a frame of lone requests, built without the session columns: all null
        frame = frame.assign(**{name: pd.Series([None] * len(frame), dtype=object,
                                                index=frame.index) for name in missing})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(frame[WORKLOAD_SCHEMA.names], schema=WORKLOAD_SCHEMA,
                                 preserve_index=False)
    table = table.replace_schema_metadata({METADATA_KEY: json.dumps(metadata).encode()})
    path = out / WORKLOAD_FILE
    pq.write_table(table, path)
    return path


def arrival_unit(folder: str | Path) -> str:
    """What an arrival plan's arrivals are for a workload folder: "tasks" (rows with
    ``depends_on``), "sessions" (rows with ``turn``) or "" (lone requests; also when the folder
    holds no workload). Reads only those columns."""
    path = Path(folder) / WORKLOAD_FILE
    if not path.is_file():
        return ""
    names = pq.read_schema(path).names
    for column, unit in (("depends_on", "tasks"), ("turn", "sessions")):
        if column in names and pq.read_table(path, columns=[column]).column(0).null_count < (
                pq.read_metadata(path).num_rows):
            return unit
    return ""


def read_workload(path: str | Path) -> pd.DataFrame:
    """Read a workload (the folder or the Parquet file); build parameters in ``.attrs["build"]``."""
    path = Path(path)
    if path.is_dir():
        path = path / WORKLOAD_FILE
    table = pq.read_table(path)
    frame = table.to_pandas()
    for name in SESSION_COLUMNS:  # a workload built before sessions existed
        if name not in frame:
            frame[name] = None
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    frame.attrs["build"] = json.loads(raw) if raw else {}
    return frame
