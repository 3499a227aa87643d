"""A lean streaming target for benchmarking the load generator, and the server-side truth log.

The aiohttp simulator spends most of a core per ~1k requests/s on aiohttp itself; to measure a
*client's* ceiling the target must be cheaper than the client. This server is a bare
``asyncio.Protocol``: HTTP/1.1 keep-alive, ``Content-Length`` bodies, chunked SSE answers shaped
like vLLM's ``/v1/completions`` stream (the simulator's :class:`ChunkEncoder` bytes), usage chunk
and ``[DONE]``.

Two timing modes:

- zero latency (``itl_s == 0`` and ``ttft_s == 0``): the whole answer in one ``write``;
- paced (``--ttft-s`` / ``--itl-s``): one ``write`` per event on the event-loop clock, and the
  **truth log**: for each request, the ``CLOCK_MONOTONIC`` nanoseconds (``time.perf_counter_ns``,
  which is CLOCK_MONOTONIC on Linux and shared by every process of the host) of its arrival and
  just before each content event was handed to the kernel. The arrival is the kernel's receive
  time of the request's bytes (``SO_TIMESTAMPNS``), not the moment this loop got to them: a busy
  target would otherwise start its clock late and count its own delay against the client.
  ``GET /_bench/truth`` returns and clears it as JSON
  ``{"requests": [[key, arrival_ns, [write_ns, ...]], ...]}`` (one process's part), and
  ``--truth-dir`` has every process write its part there on exit; ``key`` is the first word of
  the prompt, so a benchmark that puts a unique id there can join server and client times.

Run: ``python -m infra.tools.bench.target --port 0 [--itl-s 0.002]``; prints ``listening on URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
import time
from typing import Any

from infra.targets.simulator.protocol import ChunkEncoder
from locustfiles.kernel_time import ANCILLARY_SIZE, ask_for_timestamps, stamp_of

READY_PREFIX = "swarmload-bench-target listening on "
_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
         b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
_DONE = b"data: [DONE]\n\n"
_END = b"0\r\n\r\n"
MODEL = "swarmload-bench"


class _TimestampedSocket(socket.socket):
    """A socket whose reads keep the kernel receive time of their bytes (CLOCK_REALTIME ns);
    ``accept`` hands out sockets of this class, so asyncio's transports read through it."""

    rx_wall_ns = 0

    def accept(self) -> tuple[socket.socket, Any]:
        fd, address = self._accept()  # type: ignore[attr-defined]
        # family, type and protocol read from the descriptor: asyncio sets TCP_NODELAY only on a
        # socket whose proto says TCP (without it, Nagle holds each token behind a delayed ACK)
        conn = _TimestampedSocket(fileno=fd)
        if socket.getdefaulttimeout() is None and self.gettimeout():
            conn.setblocking(True)
        ask_for_timestamps(conn)
        return conn, address

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data, ancillary, _flags, _address = self.recvmsg(bufsize, ANCILLARY_SIZE, flags)
        self.rx_wall_ns = stamp_of(ancillary)
        return data


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _json_response(obj: Any, status: str = "200 OK") -> bytes:
    body = json.dumps(obj).encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class _State:
    def __init__(self, ttft_s: float, itl_s: float) -> None:
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.paced = ttft_s > 0 or itl_s > 0
        self.truth: list[list[Any]] = []
        self.encoder = ChunkEncoder(chat=False, model=MODEL)  # one id for all: cheap, valid
        self.whole: dict[tuple[int, int], bytes] = {}  # (tokens, prompt words) -> answer bytes


class _Connection(asyncio.Protocol):
    def __init__(self, state: _State) -> None:
        self.state = state
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.sock: socket.socket | None = None
        self.busy = False  # one request at a time per connection (HTTP/1.1, no pipelining)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        # the raw socket the transport reads through (get_extra_info gives a restricted view)
        self.sock = getattr(transport, "_sock", None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        arrival_ns = time.perf_counter_ns()
        rx_wall_ns = getattr(self.sock, "rx_wall_ns", 0)
        if rx_wall_ns:
            landed_ns = rx_wall_ns - (time.time_ns() - arrival_ns)
            if landed_ns <= arrival_ns:
                arrival_ns = landed_ns
        self.buffer += data
        while not self.busy:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4:end + 4 + length]
            self.buffer = self.buffer[end + 4 + length:]
            method, path = head.split(" ", 2)[:2]
            self._handle(method, path, body, arrival_ns)

    def _handle(self, method: str, path: str, body: bytes, arrival_ns: int) -> None:
        assert self.transport is not None
        if method == "GET":
            if path == "/v1/models":
                payload = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
                self.transport.write(_json_response(payload))
            elif path == "/_bench/truth":
                truth, self.state.truth = self.state.truth, []
                self.transport.write(_json_response({"requests": truth}))
            else:
                self.transport.write(_json_response({}))
            return
        request = json.loads(body)
        tokens = int(request.get("max_tokens") or 16)
        prompt = request.get("prompt") or ""
        encoder = self.state.encoder
        prompt_words = len(prompt.split())
        if not self.state.paced:
            whole = self.state.whole.get((tokens, prompt_words))
            if whole is None:  # built once per shape: the zero-latency target must stay cheap
                events = [encoder.token_chunk(i) for i in range(tokens)]
                usage = encoder.usage_chunk(prompt_words, tokens)
                parts = [_HEAD, *map(_chunk, events), _chunk(usage), _chunk(_DONE), _END]
                whole = self.state.whole.setdefault((tokens, prompt_words), b"".join(parts))
            self.transport.write(whole)
            return
        events = [encoder.token_chunk(i) for i in range(tokens)]
        usage = encoder.usage_chunk(prompt_words, tokens)
        key = prompt.split(" ", 1)[0] if isinstance(prompt, str) else ""
        record: list[Any] = [key, arrival_ns, []]
        self.state.truth.append(record)
        self.busy = True
        self.transport.write(_HEAD)
        loop = asyncio.get_running_loop()
        loop.call_later(self.state.ttft_s, self._paced_write, events, 0, usage, record[2])

    def _paced_write(self, events: list[bytes], index: int, usage: bytes,
                     writes: list[int]) -> None:
        transport = self.transport
        if transport is None:
            return
        writes.append(time.perf_counter_ns())
        transport.write(_chunk(events[index]))
        if index + 1 < len(events):
            asyncio.get_running_loop().call_later(
                self.state.itl_s, self._paced_write, events, index + 1, usage, writes)
            return
        transport.write(_chunk(usage) + _chunk(_DONE) + _END)
        self.busy = False
        if self.buffer:
            self.data_received(b"")


async def serve(port: int, ttft_s: float, itl_s: float, announce: bool = True,
                truth_dir: str | None = None) -> None:
    state = _State(ttft_s, itl_s)
    loop = asyncio.get_running_loop()
    listener = _TimestampedSocket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(4096)
    listener.setblocking(False)
    server = await loop.create_server(lambda: _Connection(state), sock=listener)
    bound = server.sockets[0].getsockname()[1]
    if announce:
        print(f"{READY_PREFIX}http://127.0.0.1:{bound}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    if truth_dir:  # one file per process: with --processes N each holds part of the requests
        import os
        from pathlib import Path

        path = Path(truth_dir) / f"truth-{os.getpid()}.json"
        path.write_text(json.dumps({"requests": state.truth}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.tools.bench.target", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft-s", type=float, default=0.0, help="delay before the first token")
    parser.add_argument("--itl-s", type=float, default=0.0, help="gap between tokens")
    parser.add_argument("--processes", type=int, default=1,
                        help="serve from N processes on one port (SO_REUSEPORT), so the target "
                             "outruns many load-generator processes; needs --port != 0")
    parser.add_argument("--truth-dir", default=None,
                        help="on exit, each process writes its truth log to DIR/truth-PID.json")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.processes > 1:
        if args.port == 0:
            parser.error("--processes > 1 needs a fixed --port")
        import multiprocessing

        children = [multiprocessing.Process(target=_serve_quietly,
                                            args=(args.port, args.ttft_s, args.itl_s,
                                                  args.truth_dir))
                    for _ in range(args.processes - 1)]
        for child in children:
            child.daemon = True
            child.start()
    asyncio.run(serve(args.port, args.ttft_s, args.itl_s, truth_dir=args.truth_dir))
    for child in children if args.processes > 1 else []:
        child.terminate()  # SIGTERM: each child stops its loop and writes its truth file
        child.join(10)
    return 0


def _serve_quietly(port: int, ttft_s: float, itl_s: float, truth_dir: str | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops; daemon children follow
    asyncio.run(serve(port, ttft_s, itl_s, announce=False, truth_dir=truth_dir))


if __name__ == "__main__":
    sys.exit(main())
