"""The one module that speaks HTTP: send a streaming request and take its timestamps.

Every time is ``time.perf_counter_ns()`` taken in the loop that reads the socket, the moment a
line arrives; parsing is delegated to :mod:`locustfiles.sse` and the figures are derived later by
:mod:`locustfiles.timing`, so this loop does as little as possible per event. httpx's sync client
is used because its ``iter_lines`` hands each SSE line over as it arrives (FastHttpUser's iterators
buffer about 1 KiB: FINDINGS.md) and it cooperates with gevent's monkey-patching. Keep every
httpx call in this module (httpx is pinned < 1).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from collectors.schemas import (
    OUTCOME_CONNECT_ERROR,
    OUTCOME_EMPTY_OUTPUT,
    OUTCOME_HTTP_4XX,
    OUTCOME_HTTP_5XX,
    OUTCOME_HTTP_429,
    OUTCOME_MALFORMED_EVENT,
    OUTCOME_OK,
    OUTCOME_STREAM_CUT,
    OUTCOME_TIMEOUT_BEFORE_FIRST_TOKEN,
    OUTCOME_TIMEOUT_MID_STREAM,
)
from locustfiles.sse import EventKind, parse_line


@dataclass(frozen=True)
class ClientSettings:
    """Sized for long streams: httpx's defaults (5 s read, 100 connections) are not."""

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 300.0  # longest silence allowed between two bytes of a stream
    write_timeout_s: float = 30.0
    max_connections: int = 10_000


def make_client(base_url: str, settings: ClientSettings | None = None) -> httpx.Client:
    s = settings or ClientSettings()
    return httpx.Client(
        base_url=base_url,
        timeout=httpx.Timeout(
            connect=s.connect_timeout_s,
            read=s.read_timeout_s,
            write=s.write_timeout_s,
            pool=None,  # waiting for a pooled connection is the generator's queue, not a failure
        ),
        limits=httpx.Limits(
            max_connections=s.max_connections, max_keepalive_connections=s.max_connections
        ),
    )


@dataclass(slots=True)
class StreamTiming:
    """Raw monotonic timestamps and what the stream said; figures are derived elsewhere."""

    sent_ns: int
    sent_wall_ns: int
    outcome: str = OUTCOME_OK
    http_status: int | None = None
    error: str | None = None
    content_ns: list[int] = field(default_factory=list)  # arrival of every content event
    last_byte_ns: int | None = None
    usage: dict[str, Any] | None = None


def _fail(timing: StreamTiming, outcome: str, error: str) -> StreamTiming:
    timing.outcome = outcome
    timing.error = error[:200]
    return timing


def stream_request(client: httpx.Client, path: str, payload: dict[str, Any]) -> StreamTiming:
    """POST ``payload`` to ``path`` with streaming on, and time every event of the answer."""
    perf = time.perf_counter_ns
    timing = StreamTiming(sent_ns=perf(), sent_wall_ns=time.time_ns())
    content_ns = timing.content_ns
    done = False
    try:
        with client.stream("POST", path, json=payload) as response:
            timing.http_status = response.status_code
            if response.status_code >= 400:
                body = response.read().decode("utf-8", "replace")
                timing.last_byte_ns = perf()
                code = response.status_code
                outcome = (
                    OUTCOME_HTTP_429 if code == 429
                    else OUTCOME_HTTP_4XX if code < 500
                    else OUTCOME_HTTP_5XX
                )
                return _fail(timing, outcome, f"HTTP {code}: {body[:150]}")
            for line in response.iter_lines():
                now = perf()
                if done or not line:
                    continue  # read on to the end of the body so the connection is reused
                event = parse_line(line)
                kind = event.kind
                if event.has_content:
                    content_ns.append(now)
                if kind is EventKind.DONE:
                    done = True
                    timing.last_byte_ns = now
                elif kind is EventKind.USAGE:
                    timing.usage = event.usage
                elif kind is EventKind.MALFORMED:
                    timing.last_byte_ns = now
                    return _fail(timing, OUTCOME_MALFORMED_EVENT, event.error or "malformed")
                elif kind is EventKind.ERROR:
                    timing.last_byte_ns = now
                    return _fail(timing, OUTCOME_HTTP_5XX, f"error event: {event.error}")
            if not done:
                timing.last_byte_ns = perf()
                return _fail(timing, OUTCOME_STREAM_CUT, "stream ended before [DONE]")
    except httpx.TimeoutException as exc:
        timing.last_byte_ns = perf()
        if isinstance(exc, httpx.ConnectTimeout):
            return _fail(timing, OUTCOME_CONNECT_ERROR, f"connect timeout: {exc}")
        outcome = OUTCOME_TIMEOUT_MID_STREAM if content_ns else OUTCOME_TIMEOUT_BEFORE_FIRST_TOKEN
        return _fail(timing, outcome, f"{type(exc).__name__}")
    except httpx.ConnectError as exc:
        timing.last_byte_ns = perf()
        return _fail(timing, OUTCOME_CONNECT_ERROR, f"connect error: {exc}")
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        timing.last_byte_ns = perf()
        if done:  # the server closed oddly after [DONE]: the answer itself was complete
            return timing
        return _fail(timing, OUTCOME_STREAM_CUT, f"{type(exc).__name__}: {exc}")
    if not content_ns:
        return _fail(timing, OUTCOME_EMPTY_OUTPUT, "no content-bearing event")
    return timing


def get_json(client: httpx.Client, path: str) -> Any:
    response = client.get(path)
    response.raise_for_status()
    return response.json()
