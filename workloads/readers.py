"""Readers for request logs: each turns one log format into the normalized log frame.

Usage::

    log = read_log("azure", "AzureLLMInferenceTrace_conv.csv")          # -> LogRead
    log = read_log("generic", "requests.jsonl", mapping="timestamp=ts,prompt=text,output_tokens=n")
    log.frame            # the normalized DataFrame (LOG_COLUMNS below)
    log.bad_rows         # [BadRow(line, reason), ...]: rows skipped, never silently

Formats: ``azure`` (Azure LLM inference trace CSV: TIMESTAMP, ContextTokens, GeneratedTokens),
``mooncake`` (JSONL: timestamp in ms from start, input_length, output_length, hash_ids),
``burstgpt`` (CSV: Timestamp in s, Model, Request tokens, Response tokens, Total tokens, Log Type),
``sharegpt`` (JSON array or JSONL of {"id", "conversations": [{"from", "value"}, ...]}: the first
human turn is the prompt, the next reply its output; no timing), and ``generic`` (JSONL, CSV or
Parquet with columns mapped by a ``LogMapping``).

The normalized frame (``LOG_COLUMNS``), one row per valid request, in file order:

- ``source_line`` (int64): 1-based line in the file (CSV data rows count from line 2, after the
  header; for JSON arrays and Parquet, the 1-based record number)
- ``timestamp_s`` (float64): seconds since the first valid request; NaN when the log has no timing
- ``prompt_tokens`` (Int64, nullable): logged prompt length; null when only text was logged
- ``output_tokens`` (Int64, nullable): logged output length; null when only the reply text is known
- ``prompt`` (object: str | None): raw prompt text, NOT scrubbed (scrub before storing)
- ``messages`` (object: list of {"role", "content"} | None): raw chat messages, NOT scrubbed
- ``output_text`` (object: str | None): raw reply text, only to count output tokens; never stored
- ``session_id`` (object: str | None): raw session or conversation id
- ``prefix_block_ids`` (object: list[int] | None): prefix block ids (Mooncake ``hash_ids``)
- ``turn`` (float64, NaN when unknown): the turn's place in its session (generic ``turn=``; every
  user turn of a ShareGPT conversation with ``all_turns``), for session workloads

Validation: rows with a missing or unparsable timestamp (in timed logs), missing, non-integer,
zero or negative lengths, invalid JSON, or no prompt text are *bad rows*: counted with their line
numbers and skipped, or, with ``strict=True``, fatal (BadRowsError). Timestamps that go backwards
raise TimestampError unless ``sort_timestamps=True``. Missing required columns or a mapping that
names an absent column raise LogFormatError listing what the file has.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import yaml

from workloads.errors import (
    BadRow,
    BadRowsError,
    EmptyLogError,
    LogFormatError,
    TimestampError,
)

LOG_COLUMNS = (
    "source_line",
    "timestamp_s",
    "prompt_tokens",
    "output_tokens",
    "prompt",
    "messages",
    "output_text",
    "session_id",
    "prefix_block_ids",
    "turn",
)

LOG_KINDS = ("azure", "mooncake", "burstgpt", "sharegpt", "generic")

_LINES_SHOWN = 20  # line numbers listed per reason in a report


@dataclass
class LogRead:
    """A read log: the normalized frame plus what was rejected and why."""

    kind: str
    path: str
    frame: pd.DataFrame
    bad_rows: list[BadRow]
    rows_read: int
    has_timing: bool

    def bad_rows_summary(self) -> dict[str, Any]:
        by_reason: dict[str, list[int]] = {}
        for row in self.bad_rows:
            by_reason.setdefault(row.reason, []).append(row.line)
        return {
            "count": len(self.bad_rows),
            "by_reason": {
                reason: {"count": len(lines), "lines": lines[:_LINES_SHOWN]}
                for reason, lines in sorted(by_reason.items())
            },
        }


# ---------------------------------------------------------------------------------------------
# generic column mapping


@dataclass(frozen=True)
class LogMapping:
    """Which source column holds what, for the ``generic`` reader.

    ``timestamp_unit``: "s", "ms", "us", "ns" (numbers: epoch or offsets in that unit), "iso"
    (date-time strings), or "auto" (numbers as seconds, anything else as date-times).
    One of ``prompt``, ``messages`` or ``prompt_tokens`` is required; ``output_tokens`` too.
    ``format``: "jsonl", "csv" or "parquet"; by default taken from the file extension.
    """

    timestamp: str | None = None
    timestamp_unit: str = "auto"
    prompt: str | None = None
    messages: str | None = None
    prompt_tokens: str | None = None
    output_tokens: str | None = None
    session_id: str | None = None
    prefix_ids: str | None = None
    turn: str | None = None
    format: str | None = None

    def __post_init__(self) -> None:
        if not (self.prompt or self.messages or self.prompt_tokens):
            raise LogFormatError(
                "generic mapping needs one of prompt=, messages= or prompt_tokens= "
                f"(got {self.to_dict()})"
            )
        if not self.output_tokens:
            raise LogFormatError(f"generic mapping needs output_tokens= (got {self.to_dict()})")
        units = ("auto", "s", "ms", "us", "ns", "iso")
        if self.timestamp_unit not in units:
            raise LogFormatError(f"timestamp_unit {self.timestamp_unit!r} not one of {units}")
        if self.format is not None and self.format not in _GENERIC_FORMATS:
            raise LogFormatError(f"format {self.format!r} not one of {_GENERIC_FORMATS}")

    def to_dict(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    def column_keys(self) -> list[str]:
        return ["timestamp", "prompt", "messages", "prompt_tokens", "output_tokens",
                "session_id", "prefix_ids", "turn"]


_GENERIC_FORMATS = ("jsonl", "csv", "parquet")


def parse_mapping(spec: str | dict[str, Any] | LogMapping | None) -> LogMapping:
    """A mapping from "key=column,key=column", a YAML/JSON file path, or a dict."""
    if isinstance(spec, LogMapping):
        return spec
    if spec is None:
        raise LogFormatError("the generic reader needs a column mapping (--map key=column,...)")
    if isinstance(spec, str):
        path = Path(spec)
        if "=" not in spec and path.exists():
            loaded = yaml.safe_load(path.read_text())
            if not isinstance(loaded, dict):
                raise LogFormatError(f"{spec}: mapping file must hold a key: column table")
            spec = loaded
        else:
            pairs = [p.split("=", 1) for p in spec.split(",") if p.strip()]
            if any(len(p) != 2 for p in pairs):
                raise LogFormatError(f"mapping {spec!r}: expected key=column pairs, ','-separated")
            spec = {k.strip(): v.strip() for k, v in pairs}
    valid = [f.name for f in fields(LogMapping)]
    unknown = sorted(set(spec) - set(valid))
    if unknown:
        raise LogFormatError(f"unknown mapping key(s) {unknown}; valid keys: {valid}")
    # a key given as null keeps its default (every default is "not mapped" or "auto")
    return LogMapping(**{k: str(v) for k, v in spec.items() if v is not None})


# ---------------------------------------------------------------------------------------------
# shared validation


def _as_number(values: Any) -> pd.Series:
    return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").astype("float64")


def _check_lengths(
    reasons: np.ndarray, values: pd.Series, name: str, required: np.ndarray
) -> None:
    """Write the first failing reason per row into ``reasons`` (None = row fine so far)."""
    v = values.to_numpy(dtype="float64", na_value=np.nan)
    free = pd.isna(reasons)
    missing = np.isnan(v) & required
    reasons[free & missing] = f"missing or unparsable {name}"
    present = ~np.isnan(v)
    with np.errstate(invalid="ignore"):
        not_int = present & (np.floor(v) != v)
        non_positive = present & (v <= 0)
    free = pd.isna(reasons)
    reasons[free & not_int] = f"{name} not an integer"
    free = pd.isna(reasons)
    reasons[free & non_positive] = f"{name} <= 0"


def _finish(
    kind: str,
    path: Path,
    raw: pd.DataFrame,
    pre_bad: list[BadRow],
    *,
    has_timing: bool,
    strict: bool,
    sort_timestamps: bool,
) -> LogRead:
    """Validate the raw columns, drop (or raise on) bad rows, make timestamps relative."""
    n = len(raw)
    reasons = np.full(n, None, dtype=object)
    if has_timing:
        reasons[np.isnan(raw["timestamp_s"].to_numpy(dtype="float64"))] = (
            "missing or unparsable timestamp"
        )
    has_prompt_text = raw["prompt"].map(lambda t: isinstance(t, str) and t.strip() != "").to_numpy(
        dtype=bool
    ) | raw["messages"].map(lambda m: isinstance(m, list) and len(m) > 0).to_numpy(dtype=bool)
    has_output_text = raw["output_text"].map(lambda t: isinstance(t, str) and t != "").to_numpy(
        dtype=bool
    )
    _check_lengths(reasons, raw["prompt_tokens"], "prompt tokens", ~has_prompt_text)
    _check_lengths(reasons, raw["output_tokens"], "output tokens", ~has_output_text)

    bad = list(pre_bad)
    lines = raw["source_line"].to_numpy()
    bad_mask = ~pd.isna(reasons)
    bad.extend(BadRow(int(line), str(r)) for line, r in zip(lines[bad_mask], reasons[bad_mask],
                                                            strict=True))
    bad.sort(key=lambda b: b.line)
    rows_read = n + len(pre_bad)
    if bad and strict:
        counts = Counter(b.reason for b in bad)
        shown = ", ".join(f"line {b.line}: {b.reason}" for b in bad[:10])
        raise BadRowsError(
            f"{path}: {len(bad)} bad row(s) of {rows_read} ({dict(counts)}); {shown}"
            + (" ..." if len(bad) > 10 else ""),
            bad,
        )
    frame = raw.loc[~bad_mask].reset_index(drop=True)
    if frame.empty:
        raise EmptyLogError(f"{path}: no valid rows among {rows_read} read as {kind!r}")

    if has_timing:
        ts = frame["timestamp_s"].to_numpy(dtype="float64")
        backwards = np.flatnonzero(np.diff(ts) < 0)
        if backwards.size and not sort_timestamps:
            i = int(backwards[0])
            raise TimestampError(
                f"{path}: timestamps go backwards at line {frame['source_line'].iat[i + 1]} "
                f"({ts[i + 1]:.6f}) after line {frame['source_line'].iat[i]} ({ts[i]:.6f}); "
                f"{backwards.size} such place(s). Sort the log, or pass sort_timestamps=True "
                "(--sort-timestamps) to sort it by time"
            )
        if backwards.size:
            frame = frame.sort_values("timestamp_s", kind="stable").reset_index(drop=True)
        frame["timestamp_s"] = frame["timestamp_s"] - frame["timestamp_s"].min()
    for name in ("prompt_tokens", "output_tokens"):
        frame[name] = frame[name].round().astype("Int64")
    frame["source_line"] = frame["source_line"].astype("int64")
    return LogRead(kind, str(path), frame[list(LOG_COLUMNS)], bad, rows_read, has_timing)


def _empty_raw(n: int) -> dict[str, Any]:
    return {
        "timestamp_s": np.full(n, np.nan),
        "prompt_tokens": np.full(n, np.nan),
        "output_tokens": np.full(n, np.nan),
        "prompt": [None] * n,
        "messages": [None] * n,
        "output_text": [None] * n,
        "session_id": [None] * n,
        "prefix_block_ids": [None] * n,
        "turn": np.full(n, np.nan),
    }


def _read_csv(path: Path, required: tuple[str, ...], kind: str) -> pd.DataFrame:
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise LogFormatError(f"{path}: cannot read as {kind} CSV: {exc}") from exc
    table.columns = [c.strip() for c in table.columns]
    missing = [c for c in required if c not in table.columns]
    if missing:
        raise LogFormatError(
            f"{path}: not a {kind} log: missing column(s) {missing}; "
            f"found {list(table.columns)}; expected {list(required)}"
        )
    return table


def _iter_jsonl(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], list[BadRow]]:
    records: list[tuple[int, dict[str, Any]]] = []
    bad: list[BadRow] = []
    try:
        with path.open(encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    bad.append(BadRow(line_no, "invalid JSON"))
                    continue
                if not isinstance(obj, dict):
                    bad.append(BadRow(line_no, "not a JSON object"))
                    continue
                records.append((line_no, obj))
    except (OSError, UnicodeDecodeError) as exc:
        raise LogFormatError(f"{path}: cannot read as JSONL: {exc}") from exc
    return records, bad


def _datetime_seconds(values: pd.Series) -> np.ndarray:
    """Parse date-time strings to float seconds (NaN where unparsable), nanosecond exact."""
    parsed = pd.to_datetime(values, errors="coerce", format="ISO8601", utc=True)
    if parsed.isna().all() and values.notna().any():
        parsed = pd.to_datetime(values, errors="coerce", format="mixed", utc=True)
    ns = parsed.to_numpy(dtype="datetime64[ns]").astype("int64").astype("float64")
    ns[parsed.isna().to_numpy()] = np.nan
    first = np.nanmin(ns) if np.isfinite(ns).any() else 0.0
    return (ns - first) / 1e9


# ---------------------------------------------------------------------------------------------
# readers


def _read_token_csv(
    path: str | Path, kind: str, required: tuple[str, ...],
    timestamp_s: Callable[[pd.DataFrame], np.ndarray], prompt_column: str, output_column: str,
    *, strict: bool, sort_timestamps: bool,
) -> LogRead:
    """A CSV log of one request a row: arrival time, prompt and output token counts."""
    path = Path(path)
    table = _read_csv(path, required, kind)
    raw = _empty_raw(len(table))
    raw["timestamp_s"] = timestamp_s(table)
    raw["prompt_tokens"] = _as_number(table[prompt_column])
    raw["output_tokens"] = _as_number(table[output_column])
    raw["source_line"] = np.arange(2, len(table) + 2)
    return _finish(kind, path, pd.DataFrame(raw), [], has_timing=True, strict=strict,
                   sort_timestamps=sort_timestamps)


def read_azure(path: str | Path, *, strict: bool = False, sort_timestamps: bool = False) -> LogRead:
    """Azure LLM inference trace (2023/2024) CSV: TIMESTAMP, ContextTokens, GeneratedTokens."""
    return _read_token_csv(
        path, "azure", ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
        lambda table: _datetime_seconds(table["TIMESTAMP"]), "ContextTokens", "GeneratedTokens",
        strict=strict, sort_timestamps=sort_timestamps)


def read_burstgpt(
    path: str | Path, *, strict: bool = False, sort_timestamps: bool = False
) -> LogRead:
    """BurstGPT CSV: Timestamp (s from start), Model, Request tokens, Response tokens, Total
    tokens, Log Type. Failed requests are logged with 0 response tokens: they count as bad rows."""
    return _read_token_csv(
        path, "burstgpt", ("Timestamp", "Model", "Request tokens", "Response tokens"),
        lambda table: _as_number(table["Timestamp"]).to_numpy(), "Request tokens",
        "Response tokens", strict=strict, sort_timestamps=sort_timestamps)


def read_mooncake(
    path: str | Path, *, strict: bool = False, sort_timestamps: bool = False
) -> LogRead:
    """Mooncake JSONL: timestamp (ms from start), input_length, output_length, hash_ids."""
    path = Path(path)
    records, pre_bad = _iter_jsonl(path)
    required = ("timestamp", "input_length", "output_length")
    seen = set().union(*(r.keys() for _, r in records)) if records else set()
    missing = [k for k in required if k not in seen]
    if missing:
        raise LogFormatError(
            f"{path}: not a mooncake log: no record has {missing}; found keys {sorted(seen)}; "
            f"expected {list(required) + ['hash_ids']}"
        )
    raw = _empty_raw(len(records))
    raw["source_line"] = [line for line, _ in records]
    raw["timestamp_s"] = (_as_number([r.get("timestamp") for _, r in records]) / 1000.0).to_numpy()
    raw["prompt_tokens"] = _as_number([r.get("input_length") for _, r in records])
    raw["output_tokens"] = _as_number([r.get("output_length") for _, r in records])
    ids: list[list[int] | None] = []
    for line, rec in records:
        hash_ids = rec.get("hash_ids")
        if isinstance(hash_ids, list) and all(isinstance(h, int) for h in hash_ids):
            ids.append(hash_ids)
        elif hash_ids is None:
            ids.append(None)
        else:
            ids.append(None)
            pre_bad.append(BadRow(line, "hash_ids not a list of integers"))
    raw["prefix_block_ids"] = ids
    frame = pd.DataFrame(raw)
    bad_lines = {b.line for b in pre_bad}
    frame = frame[~frame["source_line"].isin(bad_lines)].reset_index(drop=True)
    return _finish("mooncake", path, frame, pre_bad, has_timing=True, strict=strict,
                   sort_timestamps=sort_timestamps)


_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
          "bard": "assistant", "bing": "assistant", "assistant": "assistant", "model": "assistant",
          "system": "system"}


def _sharegpt_records(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], list[BadRow]]:
    """(record number or line, record) of a ShareGPT JSONL or JSON array, and the bad rows."""
    if path.suffix == ".jsonl":
        return _iter_jsonl(path)
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LogFormatError(f"{path}: cannot read as ShareGPT JSON: {exc}") from exc
    if not isinstance(loaded, list):
        raise LogFormatError(f"{path}: ShareGPT JSON must be an array of conversations")
    records, pre_bad = [], []
    for i, obj in enumerate(loaded, start=1):
        if isinstance(obj, dict):
            records.append((i, obj))
        else:
            pre_bad.append(BadRow(i, "not a JSON object"))
    return records, pre_bad


def _conversation(rec: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any], int] | str:
    """A record's turns, their roles and where the first user turn is; or why it is no
    conversation swarmload can replay."""
    turns = rec.get("conversations")
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        return "conversations not a list of turns"
    roles = [_ROLES.get(str(t.get("from", "")).lower()) for t in turns]
    if None in roles:
        return "unknown speaker in 'from'"
    user_at = next((i for i, r in enumerate(roles) if r == "user"), None)
    if user_at is None or user_at + 1 >= len(turns) or roles[user_at + 1] != "assistant":
        return "no user turn followed by a reply"
    return turns, roles, user_at


def read_sharegpt(path: str | Path, *, strict: bool = False, all_turns: bool = False) -> LogRead:
    """ShareGPT-style JSON (array) or JSONL: {"id", "conversations": [{"from", "value"}, ...]}.

    One request per conversation: the first user turn (after any system turn) is the prompt and
    the turn after it the reply, whose text gives the output length. No timing. With
    ``all_turns`` (session workloads), one row per user turn that a reply follows, in order:
    ``messages`` holds what the turn adds (the system turn, if any, on the first), ``turn`` its
    index and ``session_id`` the conversation's id (its record number where it has none).
    """
    path = Path(path)
    records, pre_bad = _sharegpt_records(path)
    if records and not any("conversations" in r for _, r in records):
        keys = sorted(set().union(*(r.keys() for _, r in records)))
        raise LogFormatError(
            f"{path}: not a sharegpt log: no record has 'conversations'; found keys {keys}"
        )
    kept: list[tuple[int, dict[str, Any]]] = []
    prompts: list[Any] = []
    messages_col: list[Any] = []
    replies: list[Any] = []
    sessions: list[Any] = []
    turn_col: list[int] = []
    for line, rec in records:
        checked = _conversation(rec)
        if isinstance(checked, str):
            pre_bad.append(BadRow(line, checked))
            continue
        turns, roles, user_at = checked
        if all_turns:
            _all_turns(line, rec, roles, turns, kept, prompts, messages_col, replies, sessions,
                       turn_col)
            continue
        msgs = [{"role": roles[i], "content": str(turns[i].get("value", ""))}
                for i in range(user_at + 1)]
        kept.append((line, rec))
        prompts.append(msgs[-1]["content"])
        messages_col.append(msgs)
        replies.append(str(turns[user_at + 1].get("value", "")))
        sessions.append(str(rec["id"]) if rec.get("id") is not None else None)
    raw = _empty_raw(len(kept))
    raw["source_line"] = [line for line, _ in kept]
    raw["prompt"], raw["messages"], raw["output_text"] = prompts, messages_col, replies
    raw["session_id"] = sessions
    if all_turns:
        raw["turn"] = np.asarray(turn_col, dtype="float64")
    return _finish("sharegpt", path, pd.DataFrame(raw), pre_bad, has_timing=False, strict=strict,
                   sort_timestamps=False)


def _all_turns(line: int, rec: dict[str, Any], roles: list[str | None], turns: list[Any],
               kept: list[tuple[int, dict[str, Any]]], prompts: list[Any],
               messages_col: list[Any], replies: list[Any], sessions: list[Any],
               turn_col: list[int]) -> None:
    """Every user turn of one ShareGPT conversation that a reply follows, as rows."""
    sid = str(rec["id"]) if rec.get("id") is not None else f"record{line}"
    system = [{"role": "system", "content": str(t.get("value", ""))}
              for r, t in zip(roles, turns, strict=True) if r == "system"][:1]
    k = 0
    for i, role in enumerate(roles[:-1]):
        if role != "user" or roles[i + 1] != "assistant":
            continue
        user = {"role": "user", "content": str(turns[i].get("value", ""))}
        kept.append((line, rec))
        prompts.append(user["content"])
        messages_col.append([*system, user] if k == 0 else [user])
        replies.append(str(turns[i + 1].get("value", "")))
        sessions.append(sid)
        turn_col.append(k)
        k += 1


def _load_generic_table(path: Path, fmt: str) -> tuple[pd.DataFrame, list[BadRow]]:
    if fmt == "jsonl":
        records, bad = _iter_jsonl(path)
        table = pd.DataFrame([r for _, r in records])
        table["__line"] = [line for line, _ in records]
        return table, bad
    if fmt == "csv":
        table = _read_csv(path, (), "generic")
        table["__line"] = np.arange(2, len(table) + 2)
        return table, []
    try:
        table = pq.read_table(path).to_pandas()
    except (OSError, ValueError) as exc:
        raise LogFormatError(f"{path}: cannot read as Parquet: {exc}") from exc
    table["__line"] = np.arange(1, len(table) + 1)
    return table, []


def _json_value(value: Any) -> Any:
    """Values of list-like columns may arrive as JSON strings (CSV) or arrays (Parquet)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def _stable_int64(value: Any) -> int:
    if isinstance(value, (int, np.integer)):
        return int(value)
    digest = hashlib.blake2b(str(value).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def read_generic(
    path: str | Path,
    mapping: str | dict[str, Any] | LogMapping | None,
    *,
    strict: bool = False,
    sort_timestamps: bool = False,
) -> LogRead:
    """A request log in JSONL, CSV or Parquet whose columns are named by ``mapping``."""
    path = Path(path)
    mapping = parse_mapping(mapping)
    fmt = mapping.format or {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv",
                             ".parquet": "parquet", ".pq": "parquet"}.get(path.suffix.lower())
    if fmt is None:
        raise LogFormatError(
            f"{path}: cannot tell the format from the extension; set format= to one of "
            f"{_GENERIC_FORMATS}"
        )
    table, pre_bad = _load_generic_table(path, fmt)
    available = [c for c in table.columns if c != "__line"]
    absent = {key: getattr(mapping, key) for key in mapping.column_keys()
              if getattr(mapping, key) and getattr(mapping, key) not in table.columns}
    if absent:
        raise LogFormatError(
            f"{path}: mapped column(s) not in the file: {absent}; the file has {available}"
        )
    n = len(table)
    raw = _empty_raw(n)
    raw["source_line"] = table["__line"].to_numpy()

    def column(key: str) -> pd.Series | None:
        name = getattr(mapping, key)
        return table[name] if name else None

    if (ts := column("timestamp")) is not None:
        raw["timestamp_s"] = _timestamp_seconds(ts, mapping.timestamp_unit)
    if (col := column("prompt_tokens")) is not None:
        raw["prompt_tokens"] = _as_number(col)
    raw["output_tokens"] = _as_number(column("output_tokens"))
    if (col := column("prompt")) is not None:
        raw["prompt"] = [v if isinstance(v, str) else None for v in col]
    extra_bad: dict[int, str] = {}  # source line -> why the row is left out
    lines = raw["source_line"]
    if (col := column("messages")) is not None:
        raw["messages"] = _messages_column(lines, col, extra_bad)
    if (col := column("session_id")) is not None:
        raw["session_id"] = [None if _is_missing(v) else str(v) for v in col]
    if (col := column("turn")) is not None:
        raw["turn"] = _turn_column(lines, col, extra_bad)
    if (col := column("prefix_ids")) is not None:
        raw["prefix_block_ids"] = _prefix_ids_column(lines, col, extra_bad)
    frame = pd.DataFrame(raw)
    if extra_bad:
        pre_bad.extend(BadRow(line, reason) for line, reason in extra_bad.items())
        frame = frame[~frame["source_line"].isin(extra_bad)].reset_index(drop=True)
    return _finish("generic", path, frame, pre_bad, has_timing=mapping.timestamp is not None,
                   strict=strict, sort_timestamps=sort_timestamps)


def _timestamp_seconds(ts: pd.Series, unit: str) -> np.ndarray:
    """A timestamp column as seconds: ISO times, or numbers in ``unit`` (auto: seconds, or ISO
    when no value is a number)."""
    numeric = _as_number(ts)
    if unit == "iso" or (unit == "auto" and numeric.isna().all() and ts.notna().any()):
        return _datetime_seconds(ts.astype(object))
    scale = {"auto": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[unit]
    return (numeric * scale).to_numpy()


def _messages_column(lines: Any, col: pd.Series,
                     bad: dict[int, str]) -> list[list[dict[str, str]] | None]:
    parsed: list[list[dict[str, str]] | None] = []
    for line, value in zip(lines, col, strict=True):
        msgs = _normalize_messages(_json_value(value))
        if msgs is None and value is not None and not _is_missing(value):
            bad[int(line)] = "messages not a list of {role, content}"
        parsed.append(msgs)
    return parsed


def _turn_column(lines: Any, col: pd.Series, bad: dict[int, str]) -> np.ndarray:
    turn = _as_number(col)
    for line, value, given in zip(lines, turn, col, strict=True):
        if np.isnan(value) and not _is_missing(given):
            bad[int(line)] = "turn not a number"
    return turn.to_numpy()


def _prefix_ids_column(lines: Any, col: pd.Series, bad: dict[int, str]) -> list[list[int] | None]:
    ids: list[list[int] | None] = []
    for line, value in zip(lines, col, strict=True):
        value = _json_value(value)
        if isinstance(value, list):
            ids.append([_stable_int64(v) for v in value])
        else:
            ids.append(None)
            if not _is_missing(value):
                bad[int(line)] = "prefix ids not a list"
    return ids


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def _normalize_messages(value: Any) -> list[dict[str, str]] | None:
    if not isinstance(value, list) or not value:
        return None
    out = []
    for m in value:
        if not isinstance(m, dict):
            return None
        role = m.get("role", m.get("from"))
        content = m.get("content", m.get("value"))
        role = _ROLES.get(str(role).lower(), str(role)) if role is not None else None
        if role is None or not isinstance(content, str):
            return None
        out.append({"role": role, "content": content})
    return out


_READERS: dict[str, Callable[..., LogRead]] = {
    "azure": read_azure,
    "mooncake": read_mooncake,
    "burstgpt": read_burstgpt,
    "sharegpt": read_sharegpt,
}


def read_log(
    kind: str,
    path: str | Path,
    *,
    mapping: str | dict[str, Any] | LogMapping | None = None,
    strict: bool = False,
    sort_timestamps: bool = False,
    sessions: bool = False,
) -> LogRead:
    """Read ``path`` as log format ``kind`` (one of LOG_KINDS); ``sessions``: every turn of a
    multi-turn log (ShareGPT) is a row."""
    if not Path(path).is_file():
        raise LogFormatError(f"{path}: no such file")
    if kind == "generic":
        return read_generic(path, mapping, strict=strict, sort_timestamps=sort_timestamps)
    if kind not in _READERS:
        raise LogFormatError(f"unknown log kind {kind!r}; valid kinds: {list(LOG_KINDS)}")
    if mapping is not None:
        raise LogFormatError(f"--map applies to the generic reader only, not {kind!r}")
    if kind == "sharegpt":
        return read_sharegpt(path, strict=strict, all_turns=sessions)
    return _READERS[kind](path, strict=strict, sort_timestamps=sort_timestamps)


def parse_source(spec: str) -> tuple[str, str]:
    """Split "kind:PATH" (as given to ``--source``) into (kind, path)."""
    kind, sep, path = spec.partition(":")
    if not sep or kind not in LOG_KINDS or not path:
        raise LogFormatError(f"--source {spec!r}: expected KIND:PATH with KIND one of {LOG_KINDS}")
    return kind, path


__all__ = [
    "LOG_COLUMNS",
    "LOG_KINDS",
    "LogMapping",
    "LogRead",
    "parse_mapping",
    "parse_source",
    "read_azure",
    "read_burstgpt",
    "read_generic",
    "read_log",
    "read_mooncake",
    "read_sharegpt",
]
