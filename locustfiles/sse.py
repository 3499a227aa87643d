"""Pure parsing of OpenAI-style SSE streams: no I/O, no clocks, tested without sockets.

The loop that owns the socket takes the timestamps (``locustfiles.streaming``); this module only
says what a line is. A *content event* carries generated text (``choices[0].text``,
``delta.content`` or ``delta.reasoning_content``, non-empty): a role-only chunk or an empty delta
is not a token (METRICS.md).
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


_IGNORED = ParsedEvent(EventKind.IGNORED)
_DONE = ParsedEvent(EventKind.DONE)
_EMPTY = ParsedEvent(EventKind.EMPTY)
_CONTENT = ParsedEvent(EventKind.CONTENT, has_content=True)


def content_of(choice: dict[str, Any]) -> str | None:
    text = choice.get("text")
    if text:
        return text
    delta = choice.get("delta")
    if delta:
        return delta.get("content") or delta.get("reasoning_content") or None
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
    has_content = bool(choices) and isinstance(choices[0], dict) and bool(content_of(choices[0]))
    usage = event.get("usage")
    if usage:
        return ParsedEvent(EventKind.USAGE, usage=usage, has_content=has_content)
    return _CONTENT if has_content else _EMPTY
