"""The one module that speaks HTTP: send a streaming request and take its timestamps.

Every time is on ``time.perf_counter_ns()``'s clock (CLOCK_MONOTONIC on Linux). "Sent" is taken
just before the system call that hands the request's last bytes to the kernel (a stamp taken
when that call returns can be late by however long the kernel then keeps the worker off the
CPU). An event's arrival is the kernel's receive timestamp of the read that brought its bytes
(``SO_TIMESTAMPNS``, CLOCK_REALTIME: how long ago it was is read on that clock and taken off the
monotonic read time), so a worker busy with other streams when a token lands does not add its
own delay to TTFT and ITL; that delay (read time minus kernel time) is kept per request as
``read_delay_max_ns``, the generator's self-check. Where the kernel gives no timestamp (not
Linux), the read time stands in. Figures are derived later by :mod:`locustfiles.timing`.

HTTP/1.1 is geventhttpclient's (Locust's own dependency, built for gevent, llhttp parser in C):
its low-level response ``readline`` hands over each SSE line as soon as its bytes arrived
(FastHttpUser's iterators hold about 1 KiB back). ``swarmload bench hotpath``
(docs/BENCHMARKS.md) measured it within about a quarter of a hand-written HTTP parser and about
15x cheaper than httpx's ``iter_lines``; a saturated generator reports its own queueing as the
server's latency. Per event this loop does only what METRICS.md needs: take the
time, tell a content event from the others with a byte search, and decode JSON fully only until
the first content event, plus the usage and error events.

Two things geventhttpclient's pool does not do are added to it (:class:`_IdleLimitedPool`):
reuse a kept-alive connection only within ``IDLE_LIMIT_S`` of its last answer (uvicorn drops
idle ones after 5 s; a request written onto a connection as the server closes it is lost), and
tell a failed connect apart from a failed read (METRICS.md ``connect_error``). A request whose
connection closes before one byte of the answer is sent once more, on another connection.

Errors: ``httpx.ConnectError``/``httpx.ConnectTimeout`` for a failed connect and
:class:`StreamHTTPError` for anything else from :func:`get_json`; all subclass
``httpx.HTTPError``, so callers written for httpx keep working. :func:`stream_request` never
raises for the server's behaviour: it returns a :class:`StreamTiming` with its outcome (one of
``collectors.schemas.OUTCOMES``). Killed mid-request (the run ended, Ctrl-C), it re-raises
``GreenletExit`` carrying the request's timing as ``exc.timing`` (outcome ``cancelled``), so the
caller can still write its record.

Three timeouts, apart (:class:`ClientSettings`): connect, first token (from sent to the first
content event: queueing and prefill of a long prompt on a loaded server take tens of seconds,
so 120 s by default), and stall (the longest silence after the first token: a healthy server
emits a token every few to a few hundred milliseconds, so 30 s by default).
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import time
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import gevent
import gevent.socket
import gevent.ssl
import httpx
from geventhttpclient import HTTPClient
from geventhttpclient.connectionpool import ConnectionPool, SSLConnectionPool
from geventhttpclient.response import (
    HTTPConnectionClosed,
    HTTPParseError,
    HTTPSocketPoolResponse,
)

from collectors.schemas import (
    OUTCOME_CANCELLED,
    OUTCOME_CONNECT_ERROR,
    OUTCOME_EMPTY_OUTPUT,
    OUTCOME_ERROR_EVENT,
    OUTCOME_HTTP_4XX,
    OUTCOME_HTTP_5XX,
    OUTCOME_HTTP_429,
    OUTCOME_MALFORMED_EVENT,
    OUTCOME_NOT_EVENT_STREAM,
    OUTCOME_OK,
    OUTCOME_SHORT_OUTPUT,
    OUTCOME_STREAM_CUT,
    OUTCOME_TIMEOUT_BEFORE_FIRST_TOKEN,
    OUTCOME_TIMEOUT_MID_STREAM,
)
from locustfiles.clock_sync import SKEW_NS
from locustfiles.kernel_time import ANCILLARY_SIZE, SO_TIMESTAMPNS, ask_for_timestamps, stamp_of
from locustfiles.pacer import BEHIND_NS, CHECK_AHEAD_NS, TURN, make_way
from locustfiles.sse import EventKind, parse_line

_RECV_SIZE = 65536  # one recv takes all a burst of events holds (geventhttpclient's default: 4 KiB)
# The HTTP parser calls back into Python for every chunk (one per event) of what it is fed: a
# read of a whole answer is fed in pieces of this size when a send falls due before the parser
# would be done with it (the send made way for between them), and the head is read in one
_FEED_PIECE = 2048
# What feeding a read to the parser costs, at most, per byte (its callbacks included: 1.6 ns
# on the 2-core machines): a read is fed whole unless a send falls due within that long
FEED_NS_PER_BYTE = 4
IDLE_LIMIT_S = 3.0  # reuse a kept-alive connection only this long after its last answer
# A connection back in the pool for less than this is handed out again without the check that
# it is still open (a system call: 12-15 us of each send at 2,000 req/s on the 2-core machines,
# the sends' lag P50 halved without it). A server closes a kept-alive connection when it has idled
# seconds, or says so in the answer (``Connection: close``, which the pool honours); one that
# closed it silently within this long is met by the send, and the request goes once more
# (``resent``) on a new connection, as in the race the check cannot close either. A server seen
# doing so gets the check on every reuse from then on (llama.cpp's llama-server closes the
# connection after every streamed answer while announcing keep-alive: without the check, the
# resends met other such connections, and a fifth of the requests failed as stream_cut).
FRESH_IDLE_S = 0.02
RESOLVE_TTL_S = 30.0  # a target's address is looked up again after this long
_TOKEN_PUNCT = "!#$%&'*+-.^_`|~"  # what a header name may hold besides letters and digits
# SWARMLOAD_KERNEL_RX_TIMES=0 falls back to read times (`swarmload bench accuracy
# --compare-read-times` measures both; a user has no reason to turn it off)
_KERNEL_RX_TIMES = os.environ.get("SWARMLOAD_KERNEL_RX_TIMES", "1") != "0"


class StreamHTTPError(httpx.HTTPError):
    """An HTTP-level failure seen by :func:`get_json` (bad status, parse error, closed
    connection)."""


DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_FIRST_TOKEN_TIMEOUT_S = 120.0
DEFAULT_STALL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ClientSettings:
    """Sized for long streams (the module docstring says why these defaults)."""

    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    # sent -> first content event; also bounds sending the request and reading the headers
    first_token_timeout_s: float = DEFAULT_FIRST_TOKEN_TIMEOUT_S
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S  # longest silence after the first token
    max_connections: int = 10_000  # connections open at once; a request beyond waits for one
    # TLS (https:// targets): verification on unless insecure; ca_bundle replaces the system
    # store (a PEM file with the CA that signed the server's certificate)
    ca_bundle: str | None = None
    insecure: bool = False
    # sent with every request (Authorization, tenant headers, ...); never logged or stored
    headers: tuple[tuple[str, str], ...] = ()
    # response header naming the replica that answered (a load balancer's server name: the
    # HAProxy config of infra.targets.haproxy sets it); kept per request as ``replica``
    replica_header: str | None = "X-Served-By"


class _TimestampedSocket(gevent.socket.socket):
    """A gevent socket that keeps the kernel's receive time of its latest read and the monotonic
    time its latest ``sendall`` handed its last bytes to the kernel.

    geventhttpclient reads only through ``recv`` and reads lazily (a line is handed over before
    the next read), so when a line is returned, ``rx_wall_ns`` is the kernel time of the read that
    completed it: no later than the line's bytes landed, never earlier than the request was sent.
    """

    __slots__ = ("rx_wall_ns", "sent_ns")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rx_wall_ns = 0  # 0: no kernel timestamp (yet)
        self.sent_ns = 0

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data, ancillary, _flags, _address = self.recvmsg(bufsize, ANCILLARY_SIZE, flags)
        self.rx_wall_ns = stamp_of(ancillary)  # 0, unstamped: the read time stands in
        return data

    def sendall(self, data: Any, flags: int = 0) -> None:
        """gevent's ``sendall``, stamping ``sent_ns`` just before the system call that hands
        the last bytes to the kernel, not after it returns: the write wakes the server, which
        may take the CPU from this process right there, and a stamp taken on return then came
        late by as long as the kernel kept the worker off the CPU (667 ms once, on a loaded
        2-core host, after vLLM had streamed the whole answer). A write that would block waits
        on the loop as gevent's does, and the stamp is that of the call after the wait."""
        raw = self._sock
        view = memoryview(data).cast("B")
        total = len(view)
        done = 0
        perf = time.perf_counter_ns
        while True:
            stamp = perf()
            try:
                done += raw.send(view[done:], flags)
            except (BlockingIOError, InterruptedError):
                if self.timeout == 0.0:
                    raise
                self._wait(self._write_event)
                continue
            if done >= total:
                self.sent_ns = stamp
                return


class _IdleLimitedPool(ConnectionPool):
    """geventhttpclient's pool, plus: an idle connection older than ``IDLE_LIMIT_S`` is not
    reused, a failed connect raises ``httpx.ConnectError``/``ConnectTimeout``, and TCP_NODELAY.

    The pool already drops an idle socket that turned readable (the server's FIN arrived); the
    idle limit also avoids the race in which the FIN is still on its way.
    """

    def __init__(self, *args: Any, base_url: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._base_url = base_url
        self._idle_since: dict[socket.socket, float] = {}
        # the server closed a kept-alive connection unannounced: check even fresh ones
        self.check_fresh = False
        self._resolved: tuple[float, Any] | None = None
        self._looking_up: gevent.Greenlet | None = None  # a lookup on its way (address_now)

    def _create_socket(self) -> socket.socket:
        try:
            return super()._create_socket()
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"{self._base_url}: {exc}") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"{self._base_url}: {exc}") from exc

    def _create_tcp_socket(self, family: int, socktype: int, protocol: int) -> socket.socket:
        return _TimestampedSocket(family, socktype, protocol)

    def after_connect(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if _KERNEL_RX_TIMES:
            ask_for_timestamps(sock)  # where the kernel refuses, read times stand in

    def get_socket(self) -> socket.socket:
        sock = super().get_socket()
        # a stream's read switches its socket to the stall timeout: a reused one starts over
        sock.settimeout(self.network_timeout)
        return sock

    def new_socket(self) -> socket.socket:
        """A new connection, never an idle one: for a request that goes once more because a
        kept-alive connection was found closed (those idle beside it may be closed too). From
        then on every idle connection is checked before it is reused."""
        self.check_fresh = True
        self._semaphore.acquire()
        try:
            if self._closed:
                raise RuntimeError("connection pool closed")
            sock = self._create_socket()
        except BaseException:
            self._semaphore.release()
            raise
        sock.settimeout(self.network_timeout)
        return sock

    def return_socket(self, sock: socket.socket) -> None:
        if not self._closed:
            self._idle_since[sock] = time.monotonic()
        super().return_socket(sock)

    def _is_socket_alive(self, sock: socket.socket | None) -> bool:
        # called for each idle socket the pool is about to hand out again
        since = self._idle_since.pop(sock, None)  # type: ignore[arg-type]
        if since is None:
            return False
        idle_s = time.monotonic() - since
        if idle_s > IDLE_LIMIT_S:
            return False
        if idle_s < FRESH_IDLE_S and not self.check_fresh:
            return True
        raw = getattr(sock, "_sock", None)
        if not isinstance(sock, _TimestampedSocket) or raw is None:
            return super()._is_socket_alive(sock)
        # An idle kept-alive socket must have nothing to read: a peek that would block says
        # so with one system call (geventhttpclient's select() costs a gevent watcher).
        try:
            raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False  # the server's FIN (b"") or stray bytes: not reusable

    def _resolve(self) -> Any:
        # the address once per RESOLVE_TTL_S, not a resolver thread's round trip per connect
        now = time.monotonic()
        if self._resolved is None or now - self._resolved[0] > RESOLVE_TTL_S:
            self._resolved = (now, super()._resolve())
        return self._resolved[1]

    def address_now(self) -> Any:
        """The address to connect to without yielding: the last one looked up (None before the
        first lookup). Once it is older than RESOLVE_TTL_S it still serves, while a greenlet
        looks it up again: a lookup can yield, and a connect that cannot wait must not."""
        resolved = self._resolved
        if resolved is None:
            return None
        if time.monotonic() - resolved[0] > RESOLVE_TTL_S and (
                self._looking_up is None or self._looking_up.dead):
            self._looking_up = gevent.spawn(self._resolve)
        return resolved[1][0]

    def has_idle(self) -> bool:
        """A kept-alive connection waits here."""
        return not self._socket_queue.empty()

    def is_full(self) -> bool:
        """Every connection this pool may hold is open: none may be opened now."""
        return self._semaphore.locked()

    def connect_now(self) -> bool:
        """Open a connection without yielding and leave it idle here, when the handshake is
        over by the time ``connect`` returns; False, with nothing opened, when it is not (or
        the address was never looked up, or the pool is full)."""
        looked_up = self.address_now()
        if looked_up is None or not self._semaphore.acquire(blocking=False):
            return False
        family, socktype, proto, _name, address = looked_up
        sock = None
        try:
            sock = _TimestampedSocket(family, socktype, proto)
            error = sock._sock.connect_ex(address)  # the real socket: it does not wait
            if error not in (0, errno.EINPROGRESS):
                raise OSError(error, os.strerror(error))
            sock._sock.getpeername()  # ENOTCONN: the handshake is still under way
            self.after_connect(sock)
        except OSError:
            if sock is not None:
                sock.close()
            self._semaphore.release()
            return False
        sock.settimeout(self.network_timeout)
        self.return_socket(sock)
        return True

    def close(self) -> None:
        super().close()
        self._idle_since.clear()


class _IdleLimitedTLSPool(_IdleLimitedPool, SSLConnectionPool):
    """The same pool over TLS. Receive timestamps stay off: the TLS layer reads the socket
    itself, so event times are the loop's read times (as without kernel timestamps)."""

    def connect_now(self) -> bool:
        return False  # a TLS handshake needs round trips: never over as connect returns


def tls_context(ca_bundle: str | None, insecure: bool) -> gevent.ssl.SSLContext:
    """A client context: the system's CA store (or ``ca_bundle``) and hostname checks, or no
    verification at all when ``insecure``."""
    context = gevent.ssl.create_default_context(cafile=ca_bundle)
    if insecure:
        context.check_hostname = False
        context.verify_mode = gevent.ssl.CERT_NONE
    return context


class StreamClient:
    """A keep-alive HTTP/1.1 client for one base URL (``http[s]://HOST[:PORT][/PREFIX]``)."""

    def __init__(self, base_url: str, settings: ClientSettings) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base URL {base_url!r}: use http[s]://HOST[:PORT]")
        self.base_url = base_url.rstrip("/")
        self.prefix = parts.path.rstrip("/")
        self._heads: dict[str, bytes] = {}
        self.settings = settings
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        self.http = HTTPClient(
            parts.hostname, port, block_size=_RECV_SIZE, concurrency=settings.max_connections,
            connection_timeout=settings.connect_timeout_s,
            network_timeout=settings.first_token_timeout_s,
            headers={"Content-Type": "application/json", "Accept": "*/*",
                     **dict(settings.headers)})
        # HTTPClient has no pool parameter; its pool is this one attribute (geventhttpclient 2.x,
        # pinned <3; tests/test_locustfiles_streaming.py fails if the hooks stop being called).
        # Linux turns receive timestamping on a moment after the first socket asks for it, so a
        # worker's first answers could go unstamped: a socket that asks from the start keeps it on.
        self._timestamps_on: socket.socket | None = None
        if _KERNEL_RX_TIMES and SO_TIMESTAMPNS is not None:
            self._timestamps_on = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            ask_for_timestamps(self._timestamps_on)
        pool_args: dict[str, Any] = {
            "size": settings.max_connections, "connection_timeout": settings.connect_timeout_s,
            "network_timeout": settings.first_token_timeout_s, "base_url": self.base_url}
        self.pool: _IdleLimitedPool
        if tls:
            context = tls_context(settings.ca_bundle, settings.insecure)
            self.pool = _IdleLimitedTLSPool(
                parts.hostname, port, parts.hostname, port, insecure=settings.insecure,
                ssl_context_factory=lambda **_kwargs: context, **pool_args)
        else:
            self.pool = _IdleLimitedPool(parts.hostname, port, parts.hostname, port, **pool_args)
        self.http._connection_pool = self.pool

    def request_bytes(self, path: str, body: bytes, request_id: str | None = None,
                      headers: dict[str, str] | None = None) -> bytes:
        """A ``POST`` of ``body`` to ``path`` as the bytes that go on the wire: the head is
        built and checked once per path (geventhttpclient builds and checks it per request),
        then only ``X-Request-Id``, ``Content-Length`` and this request's ``headers`` are
        added."""
        head = self._heads.get(path)
        if head is None:
            head = self._heads[path] = self._head(path)
        if headers:
            for name, value in headers.items():
                if not (name and name.isascii() and all(c.isalnum() or c in _TOKEN_PUNCT
                                                        for c in name)
                        and str(value).isprintable()):
                    raise ValueError(f"header {name!r}: a token name and a printable value")
            head += "".join(f"{name}: {value}\r\n"
                            for name, value in headers.items()).encode("latin-1")
        if request_id:
            if not request_id.isprintable() or not request_id.isascii():
                raise ValueError(f"request id {request_id!r}: printable ASCII only")
            return b"%sX-Request-Id: %s\r\nContent-Length: %d\r\n\r\n%s" % (
                head, request_id.encode(), len(body), body)
        return b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)

    def _head(self, path: str) -> bytes:
        # geventhttpclient's own builder, so the head is the one HTTPClient.request sends
        # (Host, User-Agent, the client's headers, checked), less its Content-Length line
        text = self.http._build_request("POST", self.prefix + path, body=b"-")
        lines = [line for line in text.split("\r\n")
                 if line and not line.lower().startswith("content-length:")]
        return ("\r\n".join(lines) + "\r\n").encode("latin-1")

    def connect_ahead(self) -> None:
        """Open a connection and leave it idle in the pool, so that the next send needs no
        connect (the open-loop pacer does this while it waits); nothing when one is idle
        already or the pool is full. A failed connect is left to the send that needs one."""
        pool = self.pool
        if pool.has_idle() or pool.is_full():
            return
        try:
            sock = pool.get_socket()  # none idle: a new connection (the greenlet yields)
        except httpx.HTTPError:
            return
        pool.return_socket(sock)

    def connect_at_once(self) -> bool:
        """Open a connection without yielding and leave it idle in the pool, when the handshake
        is over by the time ``connect`` returns (a target on this host or beside it: about
        25 us on loopback); False, with nothing opened, when it is not (a farther target, TLS,
        the address never looked up yet, the pool full).

        The open-loop pacer calls it for a send that finds no connection waiting: a greenlet
        spawned to connect starts only after every greenlet already ready to run, and on a
        worker near its ceiling those are the reads of hundreds of milliseconds of answers
        (the connecting sends went out 0.3-0.8 s late at 2,800 req/s on a 2-core machine)."""
        return self.pool.connect_now()

    def has_idle_connection(self) -> bool:
        """A kept-alive connection waits in the pool: a send needs no connect (it may still
        find that one dead and connect after all)."""
        return self.pool.has_idle()

    def take_connection(self) -> Any:
        """A pooled (or new) connection for :meth:`send`, taken ahead: the open-loop pacer takes
        it (the pool's checks that it is still open, a system call among them) before waiting
        out the last microseconds to a send's planned time, not after."""
        return self.pool.get_socket()

    def send(self, data: bytes, sock: Any = None) -> Any:
        """Put ``data`` on ``sock`` (:meth:`take_connection`) or a pooled (or new) connection;
        the socket, to read the answer from. A kept-alive connection that broke as the request
        went out is replaced once, by a new one."""
        pool = self.pool
        for attempt in (1, 2):
            if sock is None:
                sock = pool.get_socket() if attempt == 1 else pool.new_socket()
            try:
                sock.sendall(data)
                return sock
            except OSError as exc:
                pool.release_socket(sock)
                sock = None
                if attempt == 2 or exc.errno not in (errno.ECONNRESET, errno.EPIPE):
                    raise
            except BaseException:
                pool.release_socket(sock)
                raise
        raise AssertionError("unreachable")

    def response(self, sock: Any) -> Any:
        """The answer on ``sock`` with its status and headers read (the socket goes back to
        the pool when the body has been read to its end)."""
        return HTTPSocketPoolResponse(sock, self.pool,
                                      block_size=_FEED_PIECE, method="POST",
                                      headers_type=self.http.headers_type)

    def request(self, method: str, path: str, body: bytes = b"",
                headers: dict[str, str] | None = None,
                timing: StreamTiming | None = None) -> Any:
        """Send one request; its response with status and headers read, body still to read.
        A request sent once more is marked on ``timing`` (``resent``)."""
        uri = self.prefix + path
        try:
            return self.http.request(method, uri, body=body, headers=headers)
        except HTTPConnectionClosed:
            # Closed before one byte of an answer: the server dropped the kept-alive connection
            # as the request went out. Send once more, as httpx does (geventhttpclient retries
            # only idempotent methods).
            if timing is not None:
                timing.resent = True
            return self.http.request(method, uri, body=body, headers=headers)

    def close(self) -> None:
        self.http.close()
        if self._timestamps_on is not None:
            self._timestamps_on.close()


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
    # index in content_ns of the first answer event (text, content, tool calls), after any
    # reasoning events; None when no answer came
    first_answer_index: int | None = None
    streamed: bool = True  # False: a non-streaming request (no TTFT, no ITL)
    finish_reason: str | None = None  # the last one the stream named
    retry_after_s: float | None = None  # an HTTP 429/503's Retry-After, in seconds
    # Longest wait between a read's bytes landing (kernel time) and this loop reading them:
    # the generator's own delay, kept out of every latency. None without kernel timestamps.
    read_delay_max_ns: int | None = None
    # which replica answered: the load balancer's header, or the base URL a client-side
    # balancer chose (None: a single target without that header)
    replica: str | None = None
    # every data line of the answer, kept only when asked (a session's history needs the
    # answer's text and tool calls: ``sse.assemble_answer``); None otherwise
    answer_lines: list[bytes] | None = None
    # sent once more because its connection closed before one byte of an answer: the server may
    # have started the first one too (a replica killed as it read it); times are the second's
    resent: bool = False
    sse_events: int | None = None  # data: lines read, content or not (None: not streamed)


def _fail(timing: StreamTiming, outcome: str, error: str) -> StreamTiming:
    timing.outcome = outcome
    timing.error = error[:200]
    return timing


# What a request's client may raise, by outcome (every stream loop classifies them alike):
# a failed connect (the pool raises these two for a refused, unresolvable or slow connect) ...
CONNECT_FAILURES = (httpx.ConnectTimeout, httpx.ConnectError)
# ... and a connection that broke, or an answer that could not be parsed, once connected
STREAM_FAILURES = (HTTPParseError, httpx.HTTPError, OSError, ValueError)


def connect_failed(timing: StreamTiming, exc: BaseException, now_ns: int) -> StreamTiming:
    """``connect_error``, saying whether the connect timed out or failed."""
    timing.last_byte_ns = now_ns
    kind = "connect timeout" if isinstance(exc, httpx.ConnectTimeout) else "connect error"
    return _fail(timing, OUTCOME_CONNECT_ERROR, f"{kind}: {exc}")


def stream_broke(timing: StreamTiming, exc: BaseException, now_ns: int) -> StreamTiming:
    """``stream_cut``, naming the exception."""
    timing.last_byte_ns = now_ns
    return _fail(timing, OUTCOME_STREAM_CUT, f"{type(exc).__name__}: {exc}")


def mark_cancelled(timing: StreamTiming, exc: BaseException, now_ns: int,
                   error: str = "run ended while in flight") -> None:
    """Killed in flight (the run is over, Ctrl-C): ``cancelled``, with the timing handed on as
    ``exc.timing`` so that a record is still written; the caller re-raises ``exc``."""
    timing.last_byte_ns = now_ns
    _fail(timing, OUTCOME_CANCELLED, error)
    exc.timing = timing  # type: ignore[attr-defined]


def start_timing(*, streamed: bool = True) -> tuple[StreamTiming, int]:
    """A request's timing, its send stamped now (:func:`mark_sent` moves it to the send's last
    byte), and the offset CLOCK_REALTIME - CLOCK_MONOTONIC for ``sent_wall_ns`` (plus
    clock_sync's test-only skew). Every request of every loop starts here."""
    start_ns = time.perf_counter_ns()
    wall_offset_ns = time.time_ns() + SKEW_NS[0] - start_ns
    return StreamTiming(sent_ns=start_ns, sent_wall_ns=start_ns + wall_offset_ns,
                        streamed=streamed), wall_offset_ns


def mark_sent(timing: StreamTiming, sent_ns: int, wall_offset_ns: int) -> None:
    """The request's last byte was handed to the kernel at ``sent_ns`` (the socket's stamp; 0
    when it has none): after a pooled or new connect, later than the start."""
    if sent_ns > timing.sent_ns:
        timing.sent_ns = sent_ns
        timing.sent_wall_ns = sent_ns + wall_offset_ns


def stream_failed(timing: StreamTiming, exc: BaseException, settings: ClientSettings, *,
                  done: bool = False, headers: bool = True) -> StreamTiming:
    """What a request's client raised (:data:`CONNECT_FAILURES`, ``TimeoutError``,
    :data:`STREAM_FAILURES`), as its outcome: a failed connect; a silence past the stall timeout
    after the first content event or past the first-token timeout before it (``headers``: the
    answer's headers had come); a broken stream, unless the answer was already complete
    (``done``: the server closed oddly after its end)."""
    now = time.perf_counter_ns()
    if isinstance(exc, CONNECT_FAILURES):
        return connect_failed(timing, exc, now)
    if isinstance(exc, TimeoutError):
        timing.last_byte_ns = now
        events = len(timing.content_ns)
        if events:
            return _fail(timing, OUTCOME_TIMEOUT_MID_STREAM,
                         f"no event for {settings.stall_timeout_s:g} s (stall timeout) after "
                         f"{events} content events")
        return _fail(timing, OUTCOME_TIMEOUT_BEFORE_FIRST_TOKEN,
                     f"no first token within {settings.first_token_timeout_s:g} s "
                     f"(first-token timeout){'' if headers else ', no response headers'}")
    if done:
        timing.last_byte_ns = now
        return timing
    return stream_broke(timing, exc, now)


def stream_ended(timing: StreamTiming, short: str | None, nothing: str) -> StreamTiming:
    """A stream read to its end: ``empty_output`` (``nothing`` says what never came) without a
    content event, ``short_output`` with ``short`` (why it gave fewer tokens than asked), ok
    otherwise."""
    if not timing.content_ns:
        return _fail(timing, OUTCOME_EMPTY_OUTPUT, nothing)
    if short is not None:
        return _fail(timing, OUTCOME_SHORT_OUTPUT, short)
    return timing


def http_outcome(code: int) -> str:
    """The outcome class of an HTTP error status (400 and over)."""
    return (OUTCOME_HTTP_429 if code == 429
            else OUTCOME_HTTP_4XX if code < 500 else OUTCOME_HTTP_5XX)


def refused_stream(timing: StreamTiming, response: Any,
                   settings: ClientSettings) -> StreamTiming | None:
    """A streamed answer's headers, before its body: the status and the replica that answered
    (``replica_header``) into ``timing``; an HTTP error (with its Retry-After and the start of
    its body) or an answer that is not an event stream is the timing's outcome, returned.
    None: read on."""
    timing.http_status = code = response.status_code
    if settings.replica_header:
        timing.replica = response.get(settings.replica_header) or timing.replica
    if code >= 400:
        retry_after = response.get("retry-after")
        timing.retry_after_s = retry_after_seconds(
            retry_after if isinstance(retry_after, str) else None)
        text = response.read().decode("utf-8", "replace")
        timing.last_byte_ns = time.perf_counter_ns()
        hint = f" (Retry-After: {retry_after})" if retry_after else ""
        return _fail(timing, http_outcome(code), f"HTTP {code}{hint}: {text[:150]}")
    content_type = response.get("content-type")
    if isinstance(content_type, str) and "text/event-stream" not in content_type.lower():
        text = response.read(200).decode("utf-8", "replace")
        timing.last_byte_ns = time.perf_counter_ns()
        return _fail(timing, OUTCOME_NOT_EVENT_STREAM,
                     f"HTTP {code} {content_type}, not an event stream: {text[:120]!r}")
    return None


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date (RFC 9110 10.2.3)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


_FINISH_KEY = b'"finish_reason":"'
_OBJECT_ENDS = (b"}", b"}\r")  # how a data line (its newline cut) holding a JSON object ends


def _finish_reason_of(line: bytes) -> str | None:
    i = line.find(_FINISH_KEY)
    if i < 0:
        return None
    j = i + len(_FINISH_KEY)
    return line[j:line.find(b'"', j)].decode("utf-8", "replace")


def _short_output(timing: StreamTiming, payload: dict[str, Any]) -> str | None:
    """Why an ok stream under ``ignore_eos`` gave less than ``max_tokens``, or None.

    With ``usage``, its count decides; without, a finish reason other than ``length`` does
    (content events may merge tokens, so their count alone proves nothing).
    """
    max_tokens = payload.get("max_tokens")
    if not payload.get("ignore_eos") or not max_tokens:
        return None
    got = (timing.usage or {}).get("completion_tokens")
    if got is not None:
        if got < max_tokens:
            return (f"{got} of max_tokens {max_tokens} tokens under ignore_eos "
                    f"(finish_reason {timing.finish_reason})")
        return None
    if timing.finish_reason is not None and timing.finish_reason != "length":
        return f"finish_reason {timing.finish_reason!r} under ignore_eos (no usage)"
    return None


_ANSWER_KEYS = (b'"text":', b'"content":')
# A key's leading quote keeps '"content":' from matching inside '"reasoning_content":'.
_REASONING_KEYS = (b'"reasoning":', b'"reasoning_content":')


def _holds_value(data: bytes, key: bytes, opening: bytes, empty: bytes) -> bool:
    i = data.find(key)
    while i >= 0:
        j = i + len(key)
        while data[j:j + 1] == b" ":
            j += 1
        if data[j:j + 1] == opening:
            k = j + 1
            while data[k:k + 1] == b" ":
                k += 1
            if data[k:k + 1] != empty:
                return True
        i = data.find(key, j)
    return False


def has_answer_bytes(data: bytes) -> bool:
    """Cheap test of one ``data:`` payload: does it carry answer content (a non-empty ``text``
    or ``content`` string, or a non-empty ``tool_calls`` list)?

    Valid for compact and spaced JSON; a quote inside a string is escaped (``\\"``), so a key
    pattern cannot match inside generated text. The first content event of every stream is
    decoded in full as well (see :func:`stream_request`), which catches a server whose chunks
    this test would misread.
    """
    for key in _ANSWER_KEYS:
        if _holds_value(data, key, b'"', b'"'):
            return True
    return _holds_value(data, b'"tool_calls":', b"[", b"]")


# Whole answer events in a row, each ``data: {...}`` with a non-empty ``text`` or ``content``
# string and its line ending in ``}``, blank lines between (vLLM's compact framing, one event a
# token; a read may begin with the blank line of the one before): read_stream takes such a run
# in one match instead of line by line, the largest share of a busy worker's CPU. A key cannot
# match inside generated text: a quote there is escaped.
_ANSWER_RUN = re.compile(rb'\n*(?:data: ?\{[^\n]*"(?:text|content)":"[^"\n][^\n]*\}\n\n)+')
_RUN_MIN_BYTES = 512  # shorter reads (a few events) go line by line: the same cost
_RUN_NS_PER_BYTE = 3  # what matching a run costs at most (about 1.5 ns a byte here)


# The first line of a run, split where its text begins and where it ends: a server writes
# every token's event as the one before but for the text (the id, the model, the nulls), so
# the lines after it are checked against its two ends by counting, not matched one by one
_FIRST_ANSWER = re.compile(
    rb'\n*(data: ?\{[^\n]*"(?:text|content)":")(?:[^"\\\n]|\\[^\n])+("[^\n]*\}\n\n)')


def answer_run(batch: bytes) -> tuple[int, int]:
    """``(events, end)``: the whole lines at the start of ``batch`` that are plain answer events
    (:data:`_ANSWER_RUN`), how many, and where the rest begins; ``(0, 0)`` if it starts
    otherwise. Nothing from the first line holding usage or an error on is in the run: those are
    decoded in full.

    The common case, every line its first line's head (``data: {...,"text":"``) and tail
    (``",...}``) with a text between, is proven by counts over the bytes (:func:`_template_run`,
    2.5x cheaper than the expression); anything else is matched line by line."""
    template = _template_run(batch)
    if template is not None:
        return template
    end = len(batch)
    for marker in (b'"usage"', b'"error"'):
        i = batch.find(marker, 0, end)
        if i >= 0:
            end = i
    match = _ANSWER_RUN.match(batch, 0, end)
    if match is None:
        return 0, 0
    stop = match.end()
    return batch.count(b"}\n\n", 0, stop), stop


def _template_run(batch: bytes) -> tuple[int, int] | None:
    """The run of :func:`answer_run` when its lines are the first one's head and tail around
    a text; None when that cannot be shown (the expression decides then).

    The first line is matched (``_FIRST_ANSWER``); the lines after it, up to the last one that
    ends with its tail, count as N lines of ``head + text + tail`` when the span holds exactly
    2N newlines (each line's own two: no line inside a text), N - 1 places where a tail is
    followed by the head, N times the quotes of head and tail (no quote in any text, so no key
    and no usage or error in one) and no head followed by a quote (no empty text). Every such
    line also passes the expression's test of one line."""
    first = _FIRST_ANSWER.match(batch)
    if first is None:
        return None
    line = first.group(0)
    if b'"usage"' in line or b'"error"' in line:
        return None
    head, tail = first.group(1), first.group(2)
    start = first.end()
    last = batch.rfind(tail, start)
    if last < 0 or not batch.startswith(head, start):
        return 1, start
    stop = last + len(tail)
    newlines = batch.count(b"\n", start, stop)
    lines = newlines // 2
    if (newlines % 2 == 0
            and batch.count(tail + head, start, stop) == lines - 1
            and batch.count(b'"', start, stop) == lines * (head.count(b'"') + tail.count(b'"'))
            and batch.find(head + b'"', start, stop) < 0):
        return 1 + lines, stop
    return None


def has_content_bytes(data: bytes) -> bool:
    """Like :func:`has_answer_bytes`, reasoning (``reasoning``, ``reasoning_content``) included:
    every content event of METRICS.md's TTFT row."""
    if has_answer_bytes(data):
        return True
    for key in _REASONING_KEYS:
        if _holds_value(data, key, b'"', b'"'):
            return True
    return False


class OpenStream:
    """A streaming request sent (or failed to be sent): what :func:`read_stream` needs.

    Split from the reading so that an open-loop pacer can put the request on the wire itself,
    at its planned time, and leave the answer to a greenlet of its own
    (:mod:`locustfiles.replay`)."""

    __slots__ = ("client", "data", "payload", "sock", "timing")

    def __init__(self, client: StreamClient, data: bytes, payload: dict[str, Any],
                 timing: StreamTiming, sock: Any) -> None:
        self.client, self.data, self.payload, self.timing, self.sock = (
            client, data, payload, timing, sock)


def request_body(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def open_stream(client: StreamClient, data: bytes, payload: dict[str, Any],
                connection: Any = None) -> OpenStream:
    """Send the request bytes ``data`` (:meth:`StreamClient.request_bytes`), on ``connection``
    if one was taken ahead (:meth:`StreamClient.take_connection`); ``sent_ns`` is when its last
    byte was handed to the kernel. A failed connect is the timing's outcome (``sock`` None);
    killed meanwhile, it re-raises ``GreenletExit`` with the timing, as :func:`stream_request`
    does."""
    perf = time.perf_counter_ns
    timing, wall_offset_ns = start_timing()
    sock = None
    try:
        sock = client.send(data, connection)
    except CONNECT_FAILURES as exc:
        connect_failed(timing, exc, perf())
    except OSError as exc:  # the connection broke twice while the request went out
        stream_broke(timing, exc, perf())
    except gevent.GreenletExit as exc:
        mark_cancelled(timing, exc, perf(), "run ended while in flight before the answer's "
                       "headers (the request may not have reached the server)")
        raise
    else:
        mark_sent(timing, getattr(sock, "sent_ns", 0) or perf(), wall_offset_ns)
    return OpenStream(client, data, payload, timing, sock)


def stream_request(client: StreamClient, path: str, payload: dict[str, Any],
                   request_id: str | None = None, *, keep_answer: bool = False,
                   headers: dict[str, str] | None = None) -> StreamTiming:
    """POST ``payload`` to ``path`` with streaming on, and time every event of the answer.

    ``request_id`` goes out as ``X-Request-Id`` (vLLM takes it as its own request id and echoes
    it), so a record joins the server's logs. A payload with ``"stream": false`` is answered by
    :func:`complete_request`. ``keep_answer`` keeps every data line in ``answer_lines``;
    ``headers`` go out with this request (a session's header for a sticky balancer).
    """
    if payload.get("stream") is False:
        return complete_request(client, path, payload, request_id, keep_answer=keep_answer,
                                headers=headers)
    data = client.request_bytes(path, request_body(payload), request_id, headers)
    return read_stream(open_stream(client, data, payload), keep_answer=keep_answer)


# the measured hot path, inline on purpose (docs: the hot-path benchmark): over the caps
def read_stream(opened: OpenStream, *, keep_answer: bool = False) -> StreamTiming:  # noqa: C901, PLR0915
    """Read the answer to a request :func:`open_stream` sent, and time every event.

    Lines are taken in batches: every complete line the buffer holds after a read is handled
    before the next read, so each batch came with the latest read and gets its kernel receive
    time (the time of the read that completed it, as before), at a fraction of a call per line.
    """
    client, timing, payload = opened.client, opened.timing, opened.payload
    if timing.outcome != OUTCOME_OK:
        return timing  # not sent: a failed connect
    perf = time.perf_counter_ns
    wall = time.time_ns
    turn = TURN
    behind = BEHIND_NS + CHECK_AHEAD_NS  # this far behind, lines are read first (make_way)
    content_ns = timing.content_ns
    append = content_ns.append
    settings = client.settings
    first_token_deadline_ns = timing.sent_ns + int(settings.first_token_timeout_s * 1e9)
    done = False
    sse_events = 0
    answered = False  # an answer event (not reasoning) has arrived
    last_content_line = b""
    response = None
    sock = opened.sock
    keep = None
    if keep_answer:
        timing.answer_lines = []
        keep = timing.answer_lines.append
    try:
        try:
            response = client.response(sock)
        except HTTPConnectionClosed:
            # Closed before one byte of an answer: the server dropped the kept-alive connection
            # as the request went out. Send once more, as httpx does, on a new connection.
            timing.resent = True
            sock = client.send(opened.data, client.pool.new_socket())
            sent_ns = getattr(sock, "sent_ns", 0) or perf()
            timing.sent_wall_ns += sent_ns - timing.sent_ns
            timing.sent_ns = sent_ns
            response = client.response(sock)
        make_way(CHECK_AHEAD_NS)
        refused = refused_stream(timing, response, settings)
        if refused is not None:
            return refused
        stamped = sock if isinstance(sock, _TimestampedSocket) else None
        earliest_ns = floor_ns = timing.sent_ns
        read_delay_max_ns = -1  # stays -1 if no read carried a kernel timestamp
        buffer = response._body_buffer  # the parser appends each body chunk's bytes here
        # straight into it: the parser calls back once a chunk (an event), and a Python method
        # there cost 9 of the 24 us it took to parse a 64-event answer
        response._on_body = buffer.extend
        block_size = client.http.block_size
        if response._sock is not None:  # None: the whole body came with the headers
            sock.settimeout(max(1e-3, (first_token_deadline_ns - perf()) * 1e-9))
        while not done:
            end = buffer.rfind(b"\n")
            if end < 0:
                reading = response._sock
                if response.message_complete or reading is None:
                    break  # the body's end
                data = reading.recv(block_size)
                size = len(data)
                due = turn.due_ns
                if size > _FEED_PIECE and due and (
                        0 <= perf() + size * FEED_NS_PER_BYTE - due < behind):
                    # a send falls due while the parser takes this read: it goes in pieces
                    for start in range(0, size, _FEED_PIECE):
                        response.feed(data[start:start + _FEED_PIECE])
                        make_way(CHECK_AHEAD_NS)
                else:
                    response.feed(data)  # b"": the peer closed (ends a close-delimited body)
                if not data and not response.message_complete:
                    break
                continue
            batch = bytes(buffer[:end])
            del buffer[:end + 1]
            now = perf()
            if stamped is not None and stamped.rx_wall_ns:
                # How long ago the bytes landed, on the kernel's (wall) clock, read next to the
                # monotonic one: an offset taken at the request's start would carry any step of
                # the wall clock since (a VM's clock resynchronised mid-request, seen in CI).
                delay = wall() - stamped.rx_wall_ns
                if 0 <= delay <= now - earliest_ns:
                    if delay > read_delay_max_ns:
                        read_delay_max_ns = delay
                    now -= delay
            # two batches of one read take its stamp through two clocks read apart: the later
            # one may come out nanoseconds earlier (a TTFT over its E2E, seen on llama-server)
            if now < floor_ns:
                now = floor_ns
            floor_ns = now
            pieces: tuple[bytes, ...] = (batch,)
            if not answered and keep is None and len(batch) >= _RUN_MIN_BYTES:
                # the first data line alone (the first answer may be in it), then maybe a run
                first = batch.find(b"data:")
                cut = batch.find(b"\n", first) if first >= 0 else -1
                if cut > 0:
                    pieces = (batch[:cut], batch[cut + 1:])
            for piece in pieces:
                if done:
                    break
                if answered and keep is None and len(piece) >= _RUN_MIN_BYTES:
                    # once a piece, so make_way's own test: a send due meanwhile goes first
                    make_way(len(piece) * _RUN_NS_PER_BYTE)
                    events, stop = answer_run(piece)
                    if events:
                        content_ns += [now] * events  # one read: one arrival time, as per line
                        sse_events += events
                        last_content_line = piece[piece.rfind(b"data:", 0, stop):stop - 2]
                        piece = piece[stop:]
                for line in piece.split(b"\n"):
                    if not line.startswith(b"data:"):
                        if line and line != b"\r" and not content_ns and (
                                perf() > first_token_deadline_ns):
                            raise TimeoutError  # only comments or keep-alives so far
                        continue  # blank separator, comment, other SSE field
                    sse_events += 1
                    due = turn.due_ns
                    if due and 0 <= perf() + CHECK_AHEAD_NS - due < behind:
                        make_way(CHECK_AHEAD_NS)  # a due open-loop send goes first, between events
                    if keep is not None:
                        keep(line)
                    if answered and b'"usage"' not in line and b'"error"' not in line and (
                            line.endswith(_OBJECT_ENDS)):
                        # Fast path, inlined (a call per event costs as much as the test itself):
                        # compact JSON of vLLM and most servers first, the general test after. A
                        # line that does not end as a JSON object goes the full way (malformed).
                        i = line.find(b'"text":"')
                        if i < 0:
                            i = line.find(b'"content":"') + 3
                            if i < 3:
                                if has_content_bytes(line):
                                    append(now)
                                    last_content_line = line
                                elif _FINISH_KEY in line:
                                    timing.finish_reason = _finish_reason_of(line)
                                continue
                        if line[i + 8:i + 9] != b'"' or has_content_bytes(line):
                            append(now)
                        last_content_line = line  # its finish_reason is read once, at the end
                        continue
                    if content_ns and b'"usage"' not in line and b'"error"' not in line and (
                            line.endswith(_OBJECT_ENDS)) and has_content_bytes(line):
                        # Reasoning so far (the first event was decoded in full): only the first
                        # answer event is looked for, by bytes; empty chunks and [DONE] go the full
                        # way below.
                        append(now)
                        if has_answer_bytes(line):
                            timing.first_answer_index = len(content_ns) - 1
                            answered = True
                        continue
                    event = parse_line(line.decode("utf-8", "replace").rstrip("\r"))
                    kind = event.kind
                    if event.has_content:
                        if not content_ns and response._sock is not None:
                            # from now on the stall timeout bounds each silence
                            response._sock.settimeout(settings.stall_timeout_s)
                        append(now)
                        if event.has_answer and not answered:
                            timing.first_answer_index = len(content_ns) - 1
                            answered = True
                    elif not content_ns and now > first_token_deadline_ns:
                        raise TimeoutError  # events, but none with content, until the deadline
                    if event.finish_reason is not None:
                        timing.finish_reason = event.finish_reason
                    if kind is EventKind.DONE:
                        done = True
                        timing.last_byte_ns = now
                        break
                    if kind is EventKind.USAGE:
                        timing.usage = event.usage
                    elif kind is EventKind.MALFORMED:
                        timing.last_byte_ns = now
                        return _fail(timing, OUTCOME_MALFORMED_EVENT, event.error or "malformed")
                    elif kind is EventKind.ERROR:
                        timing.last_byte_ns = now
                        return _fail(timing, OUTCOME_ERROR_EVENT, f"error event: {event.error}")
        if done:
            response.read()  # the body's end (the last chunk): the connection goes back
        if read_delay_max_ns >= 0:
            timing.read_delay_max_ns = read_delay_max_ns
        if timing.finish_reason is None and _FINISH_KEY in last_content_line:
            # vLLM names it on the last token's chunk (a later chunk of its own would have won)
            timing.finish_reason = _finish_reason_of(last_content_line)
        if not done:
            timing.last_byte_ns = perf()
            return _fail(timing, OUTCOME_STREAM_CUT, "stream ended before [DONE]")
    except (*CONNECT_FAILURES, TimeoutError, *STREAM_FAILURES) as exc:
        return stream_failed(timing, exc, settings, done=done, headers=response is not None)
    except gevent.GreenletExit as exc:
        mark_cancelled(timing, exc, perf(), "run ended while in flight" + (
            f" after {len(content_ns)} content events" if content_ns
            else "" if response is not None
            else " before the answer's headers (the request may not have reached the server)"))
        raise
    finally:
        timing.sse_events = sse_events
        if response is not None:
            # back to the pool if the body was read to its end, closed otherwise
            response.release()
    return stream_ended(timing, _short_output(timing, payload), "no content-bearing event")


def complete_request(client: StreamClient, path: str, payload: dict[str, Any],
                     request_id: str | None = None, *, keep_answer: bool = False,
                     headers: dict[str, str] | None = None) -> StreamTiming:
    """POST a non-streaming ``payload``: E2E (sent to the body's last byte) and usage only.

    Nothing arrives before the whole answer, so there is no TTFT (METRICS.md): ``content_ns``
    stays empty and the record's ``streamed`` is false.
    """
    perf = time.perf_counter_ns
    body = json.dumps(payload, separators=(",", ":")).encode()
    timing, wall_offset_ns = start_timing(streamed=False)
    extra = headers
    headers = {"X-Request-Id": request_id} if request_id else None
    if extra:
        headers = {**(headers or {}), **extra}
    response = None
    try:
        response = client.request("POST", path, body, headers, timing)
        mark_sent(timing, getattr(response._sock, "sent_ns", 0), wall_offset_ns)
        timing.http_status = code = response.status_code
        data = response.read()
        timing.last_byte_ns = perf()
    except CONNECT_FAILURES as exc:
        return connect_failed(timing, exc, perf())
    except TimeoutError:
        timing.last_byte_ns = perf()
        return _fail(timing, OUTCOME_TIMEOUT_BEFORE_FIRST_TOKEN,
                     f"no answer within {client.settings.first_token_timeout_s:g} s "
                     "(first-token timeout)")
    except STREAM_FAILURES as exc:
        return stream_broke(timing, exc, perf())
    except gevent.GreenletExit as exc:  # as in stream_request: the record is still written
        mark_cancelled(timing, exc, perf())
        raise
    finally:
        if response is not None:
            response.release()
    text = data.decode("utf-8", "replace")
    if keep_answer:
        timing.answer_lines = [data]
    if code >= 400:
        return _fail(timing, http_outcome(code), f"HTTP {code}: {text[:150]}")
    try:
        answer = json.loads(text)
        choice = answer["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return _fail(timing, OUTCOME_MALFORMED_EVENT, f"not a completion: {text[:80]!r}")
    timing.usage = answer.get("usage") if isinstance(answer, dict) else None
    message = choice.get("message") or {}
    if not (choice.get("text") or message.get("content") or message.get("tool_calls")
            or message.get("reasoning") or message.get("reasoning_content")):
        return _fail(timing, OUTCOME_EMPTY_OUTPUT, "no content in the answer")
    return timing
def cancelled_timing(exc: BaseException) -> StreamTiming | None:
    """The timing :func:`stream_request` attached to the ``GreenletExit`` that killed it."""
    return getattr(exc, "timing", None)


def get_json(client: StreamClient, path: str) -> Any:
    try:
        response = client.request("GET", path)
        try:
            status, body = response.status_code, response.read()
        finally:
            response.release()
    except (HTTPParseError, OSError) as exc:  # a failed connect is httpx.ConnectError already
        raise StreamHTTPError(f"GET {path}: {type(exc).__name__}: {exc}") from exc
    if status >= 400:
        raise StreamHTTPError(f"GET {path}: HTTP {status}")
    return json.loads(body)
