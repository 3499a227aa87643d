"""Pure parsing of OpenAI-style SSE streams: no I/O, no clocks, tested without sockets.

The loop that owns the socket takes the timestamps (``locustfiles.streaming``); this module only
says what a line is. A *content event* carries generated content (METRICS.md's TTFT row):
``choices[0].text``, ``delta.content``, ``delta.reasoning`` (current vLLM),
``delta.reasoning_content`` (older vLLM, DeepSeek, SGLang) or ``delta.tool_calls``, non-empty; a
role-only chunk or an empty delta is not a token. An *answer event* is a content event that is
not reasoning (text, content or tool calls); its first one gives the time to the first answer
token beside TTFT.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any


class EventKind(Enum):
    IGNORED = 0  # blank line, comment, non-data field
    CONTENT = 1  # carries generated content
    EMPTY = 2  # a valid chunk without content (role-only, empty delta, finish_reason)
    USAGE = 3  # the final usage chunk (may also be CONTENT if a server merges them)
    DONE = 4  # data: [DONE]
    ERROR = 5  # an error object sent inside the stream
    MALFORMED = 6  # data that is not JSON


@dataclass(slots=True)
class ParsedEvent:
    kind: EventKind
    usage: dict[str, Any] | None = None
    error: str | None = None
    has_content: bool = False
    has_answer: bool = False  # content that is not reasoning (text, content, tool calls)
    finish_reason: str | None = None  # choices[0].finish_reason when the event names one


_IGNORED = ParsedEvent(EventKind.IGNORED)
_DONE = ParsedEvent(EventKind.DONE)
_EMPTY = ParsedEvent(EventKind.EMPTY)
_ANSWER = ParsedEvent(EventKind.CONTENT, has_content=True, has_answer=True)
_REASONING = ParsedEvent(EventKind.CONTENT, has_content=True)
REASONING_FIELDS = ("reasoning", "reasoning_content")


def answer_of(choice: dict[str, Any]) -> Any:
    """The answer a choice carries (text, content or tool calls), or None."""
    text = choice.get("text")
    if text:
        return text
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return delta.get("content") or delta.get("tool_calls") or None
    return None


def reasoning_of(choice: dict[str, Any]) -> str | None:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return delta.get("reasoning") or delta.get("reasoning_content") or None
    return None


def parse_line(line: str) -> ParsedEvent:
    """Classify one line of an SSE body (without its line ending)."""
    if not line.startswith("data:"):
        return _IGNORED
    data = line[5:].strip()
    if not data:
        return _IGNORED
    if data == "[DONE]":
        return _DONE
    try:
        event = json.loads(data)
    except ValueError:
        return ParsedEvent(EventKind.MALFORMED, error=f"not JSON: {data[:80]!r}")
    if not isinstance(event, dict):
        return ParsedEvent(EventKind.MALFORMED, error=f"not an object: {data[:80]!r}")
    if event.get("error"):
        err = event["error"]
        message = err.get("message") if isinstance(err, dict) else str(err)
        return ParsedEvent(EventKind.ERROR, error=str(message)[:200])
    choices = event.get("choices")
    choice = choices[0] if choices and isinstance(choices[0], dict) else None
    has_answer = choice is not None and bool(answer_of(choice))
    has_content = has_answer or (choice is not None and bool(reasoning_of(choice)))
    usage = event.get("usage")
    reason = choice.get("finish_reason") if choice is not None else None
    if usage:
        # llama.cpp's text completions end with one chunk holding the finish reason and usage
        return ParsedEvent(EventKind.USAGE, usage=usage, has_content=has_content,
                           has_answer=has_answer,
                           finish_reason=reason if isinstance(reason, str) else None)
    if isinstance(reason, str):
        return ParsedEvent(EventKind.CONTENT if has_content else EventKind.EMPTY,
                           has_content=has_content, has_answer=has_answer, finish_reason=reason)
    return _ANSWER if has_answer else _REASONING if has_content else _EMPTY


def assemble_answer(lines: list[bytes]) -> tuple[str, list[dict[str, Any]]]:
    """The answer text and tool calls of a finished response, from its kept ``data:`` lines
    (stream chunks, or one whole non-streamed body): what a session's history takes.

    Tool-call deltas are merged by their ``index`` as the OpenAI stream sends them (the id, type
    and name once, the arguments in pieces).
    """
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for raw in lines:
        data = raw[5:].strip() if raw.startswith(b"data:") else raw.strip()
        if not data or data == b"[DONE]":
            continue
        try:
            event = json.loads(data)
        except ValueError:
            continue
        for choice in event.get("choices") or () if isinstance(event, dict) else ():
            if not isinstance(choice, dict):
                continue
            part = choice.get("delta") or choice.get("message") or {}
            piece = choice.get("text") or (part.get("content") if isinstance(part, dict) else None)
            if isinstance(piece, str):
                text.append(piece)
            for i, call in enumerate((part.get("tool_calls") or []) if isinstance(part, dict)
                                     else []):
                if not isinstance(call, dict):
                    continue
                slot = calls.setdefault(int(call.get("index", i)), {
                    "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
    return "".join(text), [calls[i] for i in sorted(calls)]
