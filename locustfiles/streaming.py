"""The one module that speaks HTTP: send a streaming request and take its timestamps.

Every time is ``time.perf_counter_ns()`` (CLOCK_MONOTONIC on Linux) taken in the loop that reads
the socket, the moment ``recv`` returns: every SSE line of that read arrived then. Figures are
derived later by :mod:`locustfiles.timing`.

Why a small HTTP/1.1 client of our own on (gevent-patched) sockets: measured with
``swarmload bench hotpath`` (docs/BENCHMARKS.md), httpx's ``iter_lines`` cost about 4x the CPU per
streamed event of this loop, and geventhttpclient's ``readline`` about 2x; a saturated generator
reports its own queueing as the server's latency (FINDINGS.md). This client does per event only
what METRICS.md needs: take the time, tell a content event from the others with a byte search,
and decode JSON fully only until the first content event, plus the usage and error events.
It speaks what OpenAI-compatible servers send: ``Transfer-Encoding: chunked``, ``Content-Length``
or close-delimited bodies, keep-alive. Plain ``http://`` only (the load goes to loopback or a
private network); errors subclass ``httpx.HTTPError`` so callers written for httpx keep working.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

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

_RECV_SIZE = 65536
IDLE_LIMIT_S = 3.0  # reuse a kept-alive connection only this long after its last answer


class StreamHTTPError(httpx.HTTPError):
    """An HTTP-level failure of :class:`StreamClient` (bad status line, closed connection)."""


@dataclass(frozen=True)
class ClientSettings:
    """Sized for long streams."""

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 300.0  # longest silence allowed between two bytes of a stream
    write_timeout_s: float = 30.0
    max_connections: int = 10_000  # idle keep-alive connections kept for reuse


class _Response:
    """Status, headers and an iterator over body blocks of one HTTP/1.1 response."""

    __slots__ = ("status", "chunked", "length", "keep_alive", "sock", "buf", "complete")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.complete = False
        head = self._read_head()
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise StreamHTTPError(f"bad status line {lines[0][:80]!r}")
        self.status = int(parts[1])
        self.chunked = False
        self.length: int | None = None
        self.keep_alive = parts[0] == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
            elif name == b"content-length":
                self.length = int(value)
            elif name == b"connection":
                self.keep_alive = value.strip().lower() == b"keep-alive"
        if self.chunked:
            self.length = None
        elif self.length is None:
            self.keep_alive = False  # body ends when the server closes

    def _recv(self) -> bytes:
        return self.sock.recv(_RECV_SIZE)

    def _read_head(self) -> bytes:
        buf = b""
        while True:
            data = self._recv()
            if not data:
                raise StreamHTTPError("connection closed before the response headers")
            buf += data
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                head, self.buf = buf[:end], buf[end + 4:]
                if head.startswith(b"HTTP/1.1 100"):  # 100 Continue: the real head follows
                    buf, self.buf = self.buf, b""
                    if b"\r\n\r\n" not in buf:
                        continue
                    end = buf.find(b"\r\n\r\n")
                    head, self.buf = buf[:end], buf[end + 4:]
                return head

    def blocks(self) -> Iterator[bytes]:
        """Body bytes as they arrive, de-chunked; one block per ``recv`` at most."""
        if self.chunked:
            yield from self._chunked_blocks()
            return
        remaining = self.length
        data, self.buf = self.buf, b""
        while True:
            if data:
                if remaining is not None:
                    data = data[:remaining]
                    remaining -= len(data)
                yield data
            if remaining == 0:
                self.complete = True
                return
            data = self._recv()
            if not data:
                if remaining is None:
                    self.complete = True
                    return
                raise httpx.RemoteProtocolError("connection closed before the end of the body")

    def _chunked_blocks(self) -> Iterator[bytes]:
        # Positions into one buffer per recv, no re-slicing of the rest after every chunk:
        # a zero-latency answer is ~70 chunks in one recv, and copying the tail each time was
        # the hot path's biggest cost (cProfile).
        buf, self.buf = self.buf, b""
        need = 0  # data bytes of the current chunk not yet taken
        crlf = False  # the CRLF that closes a chunk's data is next
        while True:
            out = []
            pos, size_buf = 0, len(buf)
            while True:
                if need:
                    end = pos + need
                    if end > size_buf:
                        if pos < size_buf:
                            out.append(buf[pos:])
                            need -= size_buf - pos
                            pos = size_buf
                        break
                    out.append(buf[pos:end])
                    pos, need, crlf = end, 0, True
                if crlf:
                    if size_buf - pos < 2:
                        break
                    pos += 2
                    crlf = False
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                size = int(buf[pos:eol].split(b";", 1)[0], 16)
                pos = eol + 2
                if size == 0:
                    if out:
                        yield b"".join(out)
                    self._finish_chunked(buf[pos:])
                    return
                need = size
            if out:
                yield out[0] if len(out) == 1 else b"".join(out)
            data = self._recv()
            if not data:
                raise httpx.RemoteProtocolError("connection closed in the middle of the body")
            buf = buf[pos:] + data if pos < size_buf else data

    def _finish_chunked(self, buf: bytes) -> None:
        """Consume the (empty) trailer section after the last chunk, so the connection is clean
        for the next request."""
        while b"\r\n" not in buf[:2] and b"\r\n\r\n" not in buf:
            data = self._recv()
            if not data:
                self.keep_alive = False
                break
            buf += data
        end = 2 if buf[:2] == b"\r\n" else buf.find(b"\r\n\r\n") + 4
        if buf[end:]:
            self.keep_alive = False  # bytes after the response: never reuse this connection
        self.complete = True

    def read(self) -> bytes:
        return b"".join(self.blocks())


class StreamClient:
    """A keep-alive HTTP/1.1 client on (gevent-patched) sockets; one request per connection at
    a time, idle connections pooled for reuse."""

    def __init__(self, base_url: str, settings: ClientSettings) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"base URL {base_url!r}: only http://HOST[:PORT] is supported")
        self.base_url = base_url.rstrip("/")
        self.address = (parts.hostname, parts.port or 80)
        self.prefix = parts.path.rstrip("/")
        self.settings = settings
        self._host_header = parts.netloc
        self._idle: list[tuple[socket.socket, float]] = []  # (socket, idle since, monotonic)

    def _connect(self, fresh: bool = False) -> tuple[socket.socket, bool]:
        """An idle kept-alive socket (not idle longer than IDLE_LIMIT_S) or a new one; and
        whether it was reused."""
        idle = self._idle
        limit = time.monotonic() - IDLE_LIMIT_S
        while idle and not fresh:
            sock, since = idle.pop()
            if since >= limit:
                return sock, True
            sock.close()  # servers drop idle connections (uvicorn after 5 s): do not race them
        try:
            sock = socket.create_connection(self.address,
                                            timeout=self.settings.connect_timeout_s)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"{self.base_url}: {exc}") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"{self.base_url}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, False

    def _release(self, sock: socket.socket, response: _Response) -> None:
        if response.complete and response.keep_alive and (
                len(self._idle) < self.settings.max_connections):
            self._idle.append((sock, time.monotonic()))
        else:
            sock.close()

    def _send(self, method: str, path: str, body: bytes) -> tuple[socket.socket, _Response]:
        head = (f"{method} {self.prefix}{path} HTTP/1.1\r\nHost: {self._host_header}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Accept: */*\r\n\r\n").encode()
        for attempt in (0, 1):
            sock, reused = self._connect(fresh=attempt > 0)
            try:
                sock.settimeout(self.settings.write_timeout_s)
                sock.sendall(head + body)
                sock.settimeout(self.settings.read_timeout_s)
                return sock, _Response(sock)
            except (StreamHTTPError, ConnectionResetError, BrokenPipeError):
                sock.close()
                if not reused or attempt:
                    raise
                # The server closed this kept-alive socket before answering (no byte of a
                # response came back): send once more on a new connection, as httpx does.
            except BaseException:
                sock.close()
                raise
        raise AssertionError("unreachable")

    def get(self, path: str) -> tuple[int, bytes]:
        sock, response = self._send("GET", path, b"")
        try:
            body = response.read()
        except BaseException:
            sock.close()
            raise
        self._release(sock, response)
        return response.status, body

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for sock, _since in idle:
            sock.close()


def make_client(base_url: str, settings: ClientSettings | None = None) -> StreamClient:
    return StreamClient(base_url, settings or ClientSettings())


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


_CONTENT_KEYS = (b'"text":', b'"content":', b'"reasoning_content":')


def has_content_bytes(data: bytes) -> bool:
    """Cheap test of one ``data:`` payload: does a text/content field hold a non-empty string?

    Valid for compact and spaced JSON; a quote inside a string is escaped (``\\"``), so a key
    pattern cannot match inside generated text. The first content event of every stream is
    decoded in full as well (see :func:`stream_request`), which catches a server whose chunks
    this test would misread.
    """
    for key in _CONTENT_KEYS:
        i = data.find(key)
        while i >= 0:
            j = i + len(key)
            while data[j:j + 1] == b" ":
                j += 1
            if data[j:j + 1] == b'"' and data[j + 1:j + 2] != b'"':
                return True
            i = data.find(key, j)
    return False


def stream_request(client: StreamClient, path: str, payload: dict[str, Any]) -> StreamTiming:
    """POST ``payload`` to ``path`` with streaming on, and time every event of the answer."""
    perf = time.perf_counter_ns
    body = json.dumps(payload, separators=(",", ":")).encode()
    timing = StreamTiming(sent_ns=perf(), sent_wall_ns=time.time_ns())
    content_ns = timing.content_ns
    append = content_ns.append
    done = False
    sock = None
    try:
        sock, response = client._send("POST", path, body)
        timing.http_status = code = response.status
        if code >= 400:
            text = response.read().decode("utf-8", "replace")
            timing.last_byte_ns = perf()
            client._release(sock, response)
            sock = None
            outcome = (OUTCOME_HTTP_429 if code == 429
                       else OUTCOME_HTTP_4XX if code < 500 else OUTCOME_HTTP_5XX)
            return _fail(timing, outcome, f"HTTP {code}: {text[:150]}")
        pending = b""
        for block in response.blocks():
            now = perf()
            if done:
                continue  # read on to the end of the body so the connection is reused
            if pending:
                block = pending + block
            lines = block.split(b"\n")
            pending = lines.pop()  # an incomplete last line waits for the next block
            for line in lines:
                if not line.startswith(b"data:"):
                    continue  # blank separator, comment, other SSE field
                if content_ns and b'"usage"' not in line and b'"error"' not in line:
                    # Fast path, inlined (a call per event costs as much as the test itself):
                    # compact JSON of vLLM and most servers first, the general test after.
                    i = line.find(b'"text":"')
                    if i < 0:
                        i = line.find(b'"content":"') + 3
                        if i < 3:
                            if has_content_bytes(line):
                                append(now)
                            elif line[5:].strip() == b"[DONE]":
                                done = True
                                timing.last_byte_ns = now
                            continue
                    if line[i + 8:i + 9] != b'"' or has_content_bytes(line):
                        append(now)
                    continue
                event = parse_line(line.decode("utf-8", "replace").rstrip("\r"))
                kind = event.kind
                if event.has_content:
                    append(now)
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
        if done:
            client._release(sock, response)
            sock = None
        else:
            timing.last_byte_ns = perf()
            return _fail(timing, OUTCOME_STREAM_CUT, "stream ended before [DONE]")
    except httpx.ConnectTimeout as exc:
        timing.last_byte_ns = perf()
        return _fail(timing, OUTCOME_CONNECT_ERROR, f"connect timeout: {exc}")
    except httpx.ConnectError as exc:
        timing.last_byte_ns = perf()
        return _fail(timing, OUTCOME_CONNECT_ERROR, f"connect error: {exc}")
    except TimeoutError:
        timing.last_byte_ns = perf()
        outcome = OUTCOME_TIMEOUT_MID_STREAM if content_ns else OUTCOME_TIMEOUT_BEFORE_FIRST_TOKEN
        return _fail(timing, outcome, "ReadTimeout")
    except (httpx.HTTPError, OSError, ValueError) as exc:
        timing.last_byte_ns = perf()
        if done:  # the server closed oddly after [DONE]: the answer itself was complete
            return timing
        return _fail(timing, OUTCOME_STREAM_CUT, f"{type(exc).__name__}: {exc}")
    finally:
        if sock is not None:
            sock.close()
    if not content_ns:
        return _fail(timing, OUTCOME_EMPTY_OUTPUT, "no content-bearing event")
    return timing


def get_json(client: StreamClient, path: str) -> Any:
    status, body = client.get(path)
    if status >= 400:
        raise StreamHTTPError(f"GET {path}: HTTP {status}")
    return json.loads(body)
