"""The HTTP/1.1 SSE client of locustfiles.streaming against a raw socket server that splits its
bytes at awkward places: every outcome class and the keep-alive reuse a user would notice."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from locustfiles.streaming import has_content_bytes, make_client, stream_request


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


TOKENS = [_event({"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]})
          for i in range(5)]
USAGE = _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}})
BODY = b"".join(TOKENS) + USAGE + b"data: [DONE]\n\n"


def _chunked(body: bytes, size: int) -> bytes:
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


@pytest.fixture
def server() -> Iterator[tuple[str, list[bytes], list[int]]]:
    """Serves each queued raw answer to one request, writing it in 7-byte pieces; counts
    accepted connections."""
    answers: list[bytes] = []
    accepted = [0]
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def handle(conn: socket.socket) -> None:
        with conn:
            while answers:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(rest) < length:
                    rest += conn.recv(65536)
                answer = answers.pop(0)
                for i in range(0, len(answer), 7):
                    conn.sendall(answer[i:i + 7])
                if b"Connection: close" in answer:
                    return

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted[0] += 1
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{port}", answers, accepted
    listener.close()


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_chunked_stream_split_anywhere_is_timed_and_connection_reused(server) -> None:
    url, answers, accepted = server
    answers += [HEAD + _chunked(BODY, 13), HEAD + _chunked(BODY, 1000)]
    client = make_client(url)
    for _ in range(2):
        timing = stream_request(client, "/v1/completions", {"prompt": "x"})
        assert timing.outcome == "ok", timing.error
        assert len(timing.content_ns) == 5
        assert timing.usage == {"prompt_tokens": 3, "completion_tokens": 5}
        assert timing.sent_ns <= timing.content_ns[0] <= timing.last_byte_ns
    assert accepted[0] == 1  # the second request went over the kept-alive connection


def test_content_length_body_and_http_errors(server) -> None:
    url, answers, _ = server
    answers += [
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY,
        b"HTTP/1.1 429 Too Many\r\nContent-Length: 4\r\n\r\nslow",
        b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy",
    ]
    client = make_client(url)
    assert stream_request(client, "/v1/completions", {}).outcome == "ok"
    assert stream_request(client, "/v1/completions", {}).outcome == "http_429"
    failed = stream_request(client, "/v1/completions", {})
    assert failed.outcome == "http_5xx" and "busy" in failed.error


def test_stream_cut_malformed_and_empty(server) -> None:
    url, answers, _ = server
    only_done = HEAD + _chunked(USAGE + b"data: [DONE]\n\n", 64)
    malformed = HEAD + _chunked(b"data: {not json\n\n" + BODY, 64)
    cut = HEAD + b"%x\r\n%s\r\n" % (len(TOKENS[0]), TOKENS[0])  # then the server closes
    answers += [only_done, malformed, cut]
    client = make_client(url)
    assert stream_request(client, "/v1/completions", {}).outcome == "empty_output"
    assert stream_request(client, "/v1/completions", {}).outcome == "malformed_event"
    timing = stream_request(client, "/v1/completions", {})
    assert timing.outcome == "stream_cut" and len(timing.content_ns) == 1


def test_connect_error_is_classified() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        timing = stream_request(make_client(f"http://127.0.0.1:{port}"), "/v1/completions", {})
    assert timing.outcome == "connect_error"


@pytest.mark.parametrize(("payload", "expected"), [
    (b'{"choices":[{"text":" a"}]}', True),
    (b'{"choices":[{"text":""}]}', False),
    (b'{"choices": [{"text": " spaced"}]}', True),
    (b'{"choices":[{"delta":{"role":"assistant","content":""}}]}', False),
    (b'{"choices":[{"delta":{"content":"x"}}]}', True),
    (b'{"choices":[{"delta":{"reasoning_content":"think","content":null}}]}', True),
    (b'{"choices":[{"text":"he said \\"text\\":\\"\\""}]}', True),
])
def test_byte_level_content_test(payload: bytes, expected: bool) -> None:
    assert has_content_bytes(payload) is expected


def test_kept_alive_connection_closed_by_the_server_is_retried_once(server) -> None:
    url, answers, accepted = server
    answers.append(HEAD + _chunked(BODY, 64))
    client = make_client(url)
    assert stream_request(client, "/v1/completions", {}).outcome == "ok"
    time.sleep(0.2)  # the server has closed that connection (as uvicorn does when idle)
    answers.append(HEAD + _chunked(BODY, 64))
    timing = stream_request(client, "/v1/completions", {})
    assert timing.outcome == "ok", timing.error
    assert accepted[0] == 2
