"""The Responses API (``POST /v1/responses``, ``--endpoint responses``): its typed events timed
as METRICS.md defines, on the same client, timestamps and timeouts as :mod:`locustfiles.streaming`.

A Responses stream is SSE with an ``event:`` line and a ``data:`` JSON object whose ``type``
names the event (vLLM, as OpenAI). The ``event:`` line names it first, so that is what is read
(the JSON's own ``type`` comes last in vLLM's objects, after nested ``type`` keys of items and
parts); a server that sends no ``event:`` lines has each event decoded in full::

    response.created, response.in_progress, response.output_item.added, ...
    response.reasoning_text.delta     {"delta": "..."}   reasoning: a content event (TTFT)
    response.output_text.delta        {"delta": "..."}   the answer: a content event (TTFT)
    response.function_call_arguments.delta               a tool call: an answer event
    response.output_text.done, response.content_part.done, response.output_item.done
    response.completed / response.incomplete   {"response": {"status", "usage": {...}}}
    response.failed {"response": {"error"}}, error {"message"}    -> error_event

The body ends after ``response.completed`` (no ``[DONE]``): a stream that ends before it is
``stream_cut``. Usage (``input_tokens``, ``output_tokens``, ``output_tokens_details.
reasoning_tokens``) is mapped onto the completions names the records use; ``status:
incomplete`` because ``max_output_tokens`` was reached is finish reason ``length``.

:func:`stream_responses` sends the request on :mod:`locustfiles.streaming`'s client and takes
its times as that module does (sent when the last byte left, each event at the kernel's receive
time of its read); the outcome classes are the same, decided the same way. It is a loop of its
own, not a branch of the completions hot path, so each can change without the other.
"""

from __future__ import annotations

import json
import time
from typing import Any

import gevent

from collectors.schemas import (
    OUTCOME_ERROR_EVENT,
    OUTCOME_MALFORMED_EVENT,
    OUTCOME_STREAM_CUT,
)
from locustfiles.config import ENDPOINT_PATHS
from locustfiles.streaming import (
    CONNECT_FAILURES,
    STREAM_FAILURES,
    StreamClient,
    StreamTiming,
    mark_cancelled,
    mark_sent,
    refused_stream,
    start_timing,
    stream_ended,
    stream_failed,
)

RESPONSES_PATH = ENDPOINT_PATHS["responses"]
ANSWER_DELTAS = (b"response.output_text.delta", b"response.function_call_arguments.delta",
                 b"response.refusal.delta")
REASONING_DELTAS = (b"response.reasoning_text.delta", b"response.reasoning_summary_text.delta")
FINAL_EVENTS = ("response.completed", "response.incomplete")
FAILED_EVENTS = ("response.failed", "error")
_EMPTY_DELTA = b'"delta":""'


def event_type(line: bytes) -> bytes:
    """The top-level ``type`` of one ``data:`` line, decoded in full (b"" when none)."""
    try:
        event = json.loads(line[5:])
    except ValueError:
        return b""
    kind = event.get("type") if isinstance(event, dict) else None
    return kind.encode() if isinstance(kind, str) else b""


def responses_payload(body: dict[str, Any], prompt: Any) -> dict[str, Any]:
    """A completions body (``max_tokens``, ``stream``, sampling fields) as a Responses one:
    ``input`` (text, or chat messages) and ``max_output_tokens``; usage needs no asking."""
    out = {k: v for k, v in body.items()
           if k not in ("max_tokens", "stream_options", "prompt", "messages")}
    out["input"] = prompt
    out["max_output_tokens"] = body["max_tokens"]
    return out


def responses_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """A Responses ``usage`` under the completions names the records read."""
    if not isinstance(usage, dict):
        return None
    out: dict[str, Any] = {"prompt_tokens": usage.get("input_tokens"),
                           "completion_tokens": usage.get("output_tokens"),
                           "total_tokens": usage.get("total_tokens")}
    details = usage.get("output_tokens_details") or {}
    if details.get("reasoning_tokens"):
        out["completion_tokens_details"] = {"reasoning_tokens": details["reasoning_tokens"]}
    return out


class ResponsesLines:
    """What :func:`stream_responses` does with each ``data:`` line of a Responses stream, given
    the line's arrival time; it fills ``timing``. Pure: tested without sockets."""

    __slots__ = ("timing", "answered", "done", "named")

    def __init__(self, timing: Any) -> None:
        self.timing = timing
        self.answered = False
        self.done = False
        self.named = b""  # the type the last ``event:`` line gave (the next data line's)

    def event_line(self, line: bytes) -> None:
        self.named = line[6:].strip()

    def __call__(self, line: bytes, now: int) -> str | None:
        """None to go on; "done" at the end; an outcome class to stop with (``timing.error``
        set)."""
        timing = self.timing
        kind, self.named = self.named or event_type(line), b""
        if kind in ANSWER_DELTAS or kind in REASONING_DELTAS:
            if _EMPTY_DELTA not in line:
                timing.content_ns.append(now)
                if not self.answered and kind in ANSWER_DELTAS:
                    timing.first_answer_index = len(timing.content_ns) - 1
                    self.answered = True
            return None
        if not kind.startswith((b"response.completed", b"response.incomplete",
                                b"response.failed", b"error")):
            if kind:
                return None  # created, in_progress, *.added, *.done: no content
        try:
            event = json.loads(line[5:])
        except ValueError:
            event = None
        if not isinstance(event, dict):
            timing.error = f"not a JSON object: {line[5:85]!r}"
            return OUTCOME_MALFORMED_EVENT
        kind_text = str(event.get("type") or "")
        raw = event.get("response")
        response: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if kind_text in FINAL_EVENTS:
            timing.usage = responses_usage(response.get("usage"))
            status = response.get("status")
            reason = (response.get("incomplete_details") or {}).get("reason")
            timing.finish_reason = ("length" if status == "incomplete" and reason in (
                "max_output_tokens", None) else str(reason or "stop"))
            timing.last_byte_ns = now
            self.done = True
            return "done"
        if kind_text in FAILED_EVENTS or not kind_text:
            error = response.get("error") if kind_text == "response.failed" else event
            message = error.get("message") if isinstance(error, dict) else error
            timing.error = f"error event: {str(message or event)[:180]}"
            timing.last_byte_ns = now
            return OUTCOME_ERROR_EVENT
        return None

    def at_end(self) -> str | None:
        """The body ended: an outcome if that was too soon."""
        if not self.done:
            self.timing.error = "stream ended before response.completed"
            return OUTCOME_STREAM_CUT
        return None


def _fail(timing: StreamTiming, outcome: str, error: str | None = None) -> StreamTiming:
    timing.outcome = outcome
    timing.error = (error if error is not None else timing.error or outcome)[:200]
    return timing


def _short(timing: StreamTiming, payload: dict[str, Any]) -> str | None:
    wanted = payload.get("max_output_tokens")
    got = (timing.usage or {}).get("completion_tokens")
    if payload.get("ignore_eos") and wanted and got is not None and got < wanted:
        return f"{got} of max_output_tokens {wanted} tokens under ignore_eos"
    return None


# a stream loop like streaming.read_stream, inline for the same reason: over the caps
def stream_responses(client: StreamClient, path: str, payload: dict[str, Any],  # noqa: C901, PLR0915
                     request_id: str | None = None) -> StreamTiming:
    """POST a Responses ``payload`` (``stream: true``) and time every event of the answer;
    never raises for the server's behaviour (as :func:`locustfiles.streaming.stream_request`).
    """
    perf, wall = time.perf_counter_ns, time.time_ns
    body = json.dumps(payload, separators=(",", ":")).encode()
    timing, wall_offset_ns = start_timing()
    settings = client.settings
    deadline_ns = timing.sent_ns + int(settings.first_token_timeout_s * 1e9)
    lines = ResponsesLines(timing)
    response = None
    sse_events = 0
    floor_ns = timing.sent_ns  # no event stamped before the one read before it
    try:
        response = client.request("POST", path, body,
                                  {"X-Request-Id": request_id} if request_id else None, timing)
        sock = response._sock
        mark_sent(timing, getattr(sock, "sent_ns", 0), wall_offset_ns)
        refused = refused_stream(timing, response, settings)
        if refused is not None:
            return refused
        if sock is not None:
            sock.settimeout(max(1e-3, (deadline_ns - perf()) * 1e-9))
        read_delay = -1
        while True:
            line = response.readline(b"\n")
            if not line:
                break
            if not line.startswith(b"data:"):
                if line.startswith(b"event:"):
                    lines.event_line(line)
                if not timing.content_ns and perf() > deadline_ns:
                    raise TimeoutError
                continue  # blank separators, comments
            sse_events += 1
            now = perf()
            stamp = getattr(sock, "rx_wall_ns", 0)
            if stamp:  # the kernel's receive time of the read that brought the line
                delay = wall() - stamp
                if 0 <= delay <= now - timing.sent_ns:
                    read_delay = max(read_delay, delay)
                    now -= delay
            if now < floor_ns:  # lines of one read through two clocks (streaming.read_stream)
                now = floor_ns
            floor_ns = now
            had_content = bool(timing.content_ns)
            verdict = lines(line, now)
            if not had_content and timing.content_ns and sock is not None:
                sock.settimeout(settings.stall_timeout_s)  # from now on, each silence
            elif not timing.content_ns and now > deadline_ns:
                raise TimeoutError
            if verdict == "done":
                response.read()
                break
            if verdict is not None:
                return _fail(timing, verdict)
        if read_delay >= 0:
            timing.read_delay_max_ns = read_delay
        cut = lines.at_end()
        if cut is not None:
            timing.last_byte_ns = perf()
            return _fail(timing, cut)
    except (*CONNECT_FAILURES, TimeoutError, *STREAM_FAILURES) as exc:
        return stream_failed(timing, exc, settings, done=lines.done,
                             headers=response is not None)
    except gevent.GreenletExit as exc:  # the run ended: the record is still written
        mark_cancelled(timing, exc, perf())
        raise
    finally:
        timing.sse_events = sse_events
        if response is not None:
            response.release()
    return stream_ended(timing, _short(timing, payload), "no output text or reasoning event")
