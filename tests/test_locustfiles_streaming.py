"""The SSE client of locustfiles.streaming (geventhttpclient underneath) against a raw socket
server that splits its bytes at awkward places: every outcome class of METRICS.md and the
keep-alive reuse a user would notice."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from locustfiles import streaming
from locustfiles.kernel_time import SO_TIMESTAMPNS
from locustfiles.streaming import (
    ClientSettings,
    StreamHTTPError,
    get_json,
    has_content_bytes,
    make_client,
    stream_request,
)


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


TOKENS = [_event({"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]})
          for i in range(5)]
USAGE = _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}})
BODY = b"".join(TOKENS) + USAGE + b"data: [DONE]\n\n"


def _chunked(body: bytes, size: int) -> bytes:
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


DROP = b"drop the connection"
# an answer ending with this goes out without it, and the connection closes, unannounced
SILENT_CLOSE = b"<then close silently>"
WRITE_SIZE = [7]  # how the server writes each answer: in pieces of this many bytes


@pytest.fixture
def server() -> Iterator[tuple[str, list[bytes], list[int]]]:
    """Serves each queued raw answer to one request, writing it in pieces of ``WRITE_SIZE``
    bytes, 7 unless a test says (``DROP``: closes the connection instead); counts accepted
    connections."""
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
                fields = head.lower().split(b"content-length:")
                length = int(fields[1].split(b"\r\n")[0]) if len(fields) > 1 else 0
                while len(rest) < length:
                    rest += conn.recv(65536)
                answer = answers.pop(0)
                if answer == DROP:
                    return  # close without a byte of an answer
                closes = answer.endswith(SILENT_CLOSE)
                answer = answer.removesuffix(SILENT_CLOSE)
                size = WRITE_SIZE[0]
                try:
                    for i in range(0, len(answer), size):
                        conn.sendall(answer[i:i + size])
                except ConnectionResetError:
                    return  # the client gave up on a broken answer

                if b"Connection: close" in answer or closes:
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
        b"HTTP/1.1 429 Too Many\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\nslow",
        b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy",
    ]
    client = make_client(url)
    assert stream_request(client, "/v1/completions", {}).outcome == "ok"
    limited = stream_request(client, "/v1/completions", {})
    assert limited.outcome == "http_429" and limited.retry_after_s == 7.0
    assert "Retry-After: 7" in limited.error
    failed = stream_request(client, "/v1/completions", {})
    assert failed.outcome == "http_5xx" and "busy" in failed.error


def test_4xx_and_error_event(server) -> None:
    url, answers, _ = server
    error_event = _event({"error": {"message": "out of memory", "code": 500}})
    answers += [b"HTTP/1.1 404 Not Found\r\nContent-Length: 7\r\n\r\nno path",
                HEAD + _chunked(TOKENS[0] + error_event + b"data: [DONE]\n\n", 64)]
    client = make_client(url)
    missing = stream_request(client, "/v1/completions", {})
    assert missing.outcome == "http_4xx" and missing.http_status == 404
    failed = stream_request(client, "/v1/completions", {})
    assert failed.outcome == "error_event" and "out of memory" in failed.error
    assert len(failed.content_ns) == 1


def test_timeouts_before_first_token_and_mid_stream(server) -> None:
    url, answers, accepted = server
    # the server sends these and then waits for a next request that never comes
    answers += [HEAD, b"unused", HEAD + b"%x\r\n%s\r\n" % (len(TOKENS[0]), TOKENS[0]), b"unused"]
    # the two timeouts apart: a first token may take longer than a stall may last
    client = make_client(url, ClientSettings(first_token_timeout_s=0.6, stall_timeout_s=0.2))
    before = stream_request(client, "/v1/completions", {})
    assert before.outcome == "timeout_before_first_token", before.error
    assert 0.55e9 < before.last_byte_ns - before.sent_ns < 3e9
    assert "first-token timeout" in before.error
    answers.pop(0)  # the first connection is gone (timed out): skip its next answer
    during = stream_request(client, "/v1/completions", {})
    assert during.outcome == "timeout_mid_stream", during.error
    assert len(during.content_ns) == 1 and accepted[0] == 2
    assert 0.15e9 < during.last_byte_ns - during.content_ns[0] < 0.55e9
    assert "stall timeout" in during.error


def test_keep_alive_comments_do_not_hold_off_the_first_token_timeout() -> None:
    # a proxy's keep-alive comments every 0.1 s, and never a token
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(HEAD)
            for _ in range(30):
                comment = b": ping\n\n"
                try:
                    conn.sendall(b"%x\r\n%s\r\n" % (len(comment), comment))
                except OSError:
                    return  # the client gave up
                time.sleep(0.1)

    threading.Thread(target=serve, daemon=True).start()
    client = make_client(f"http://127.0.0.1:{listener.getsockname()[1]}",
                         ClientSettings(first_token_timeout_s=0.3))
    timing = stream_request(client, "/v1/completions", {})
    listener.close()
    assert timing.outcome == "timeout_before_first_token", timing.error
    assert timing.last_byte_ns - timing.sent_ns < 1.5e9


def test_429_retry_after_as_a_date_and_200_that_is_not_an_event_stream(server) -> None:
    from email.utils import formatdate

    url, answers, _ = server
    date = formatdate(time.time() + 30, usegmt=True).encode()
    whole = b'{"choices":[{"text":"all at once"}]}'
    answers += [b"HTTP/1.1 429 Slow\r\nRetry-After: %s\r\nContent-Length: 0\r\n\r\n" % date,
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d"
                b"\r\n\r\n%s" % (len(whole), whole)]
    client = make_client(url)
    limited = stream_request(client, "/v1/completions", {})
    assert limited.outcome == "http_429" and 25 < limited.retry_after_s <= 31
    plain = stream_request(client, "/v1/completions", {})
    assert plain.outcome == "not_event_stream" and plain.http_status == 200
    assert "application/json" in plain.error and "all at once" in plain.error


def _tokens(n: int, *, chat: bool = False, text: str = " t{i}") -> list[bytes]:
    def choice(i: int) -> dict:
        value = text.format(i=i)
        return ({"index": 0, "delta": {"content": value}, "finish_reason": None} if chat
                else {"index": 0, "text": value, "finish_reason": None})
    return [_event({"id": "cmpl-1", "object": "x", "choices": [choice(i)]}) for i in range(n)]


def _last(text: str = " end", *, chat: bool = False) -> bytes:
    choice = ({"index": 0, "delta": {"content": text}, "finish_reason": "length"} if chat
              else {"index": 0, "text": text, "finish_reason": "length"})
    return _event({"id": "cmpl-1", "object": "x", "choices": [choice]})


ONE_READ_BODIES = {
    "completions": b"".join(_tokens(63)) + _last() + USAGE,
    "chat": b"".join(_tokens(63, chat=True)) + _last(chat=True) + USAGE,
    # empty text events in the middle are no content events
    "empty texts between": b"".join(_tokens(20) + _tokens(5, text="") + _tokens(20)) + USAGE,
    # usage on every chunk (vLLM's continuous usage stats): decoded in full, each
    "usage on each chunk": b"".join(
        t.replace(b"]}\n", b'],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n' % i)
        for i, t in enumerate(_tokens(30), 1)),
    "CRLF lines": b"".join(t.replace(b"\n", b"\r\n") for t in _tokens(30)) + USAGE,
    "reasoning after the answer": b"".join(_tokens(10) + [_event({"choices": [
        {"index": 0, "delta": {"reasoning": f"r{i}", "content": ""}}]}) for i in range(10)]
        + _tokens(10)) + USAGE,
    "a malformed line inside": b"".join(_tokens(20)) + b'data: {"choices":[{"text":" x"\n\n'
        + b"".join(_tokens(20)) + USAGE,
    "an error event inside": b"".join(_tokens(20)) + _event({"error": {"message": "boom"}})
        + b"".join(_tokens(20)) + USAGE,
}


@pytest.mark.parametrize("name", list(ONE_READ_BODIES))
def test_a_whole_answer_in_one_read_is_read_as_event_by_event(server, monkeypatch,
                                                             name: str) -> None:
    """An answer written at once (a read of many events, taken as runs of answer events) gives
    the same events, finish reason, usage and outcome as the same answer in 7-byte reads (line
    by line)."""
    url, answers, _ = server
    in_runs = []
    answer_run = streaming.answer_run
    monkeypatch.setattr(streaming, "answer_run",
                        lambda batch: in_runs.append(answer_run(batch)[0]) or answer_run(batch))
    body = HEAD + _chunked(ONE_READ_BODIES[name] + b"data: [DONE]\n\n", 300)
    client = make_client(url)
    seen = []
    for size in (7, len(body)):
        WRITE_SIZE[0] = size
        answers.append(body)
        try:
            timing = stream_request(client, "/v1/completions", {})
        finally:
            WRITE_SIZE[0] = 7
        seen.append((timing.outcome, len(timing.content_ns), timing.finish_reason, timing.usage,
                     timing.first_answer_index, timing.sse_events))
    assert seen[0] == seen[1], (name, seen)
    assert seen[0][1] >= 20
    if name == "completions":  # 63 tokens, the last one, usage and [DONE]
        assert seen[0][5] == 66
    if name in ("completions", "chat"):
        # most of it went in runs, not line by line (how the bytes split over reads varies)
        assert sum(in_runs) >= 48, in_runs


def test_a_connection_opened_ahead_carries_the_next_request(server) -> None:
    """The open-loop pacer opens a connection while it waits, so its next send needs no
    connect: one is left idle in the pool, and the request goes out on it."""
    url, answers, accepted = server
    answers.append(HEAD + _chunked(BODY, 1000))
    client = make_client(url)
    assert not client.has_idle_connection()
    client.connect_ahead()
    assert client.has_idle_connection()
    client.connect_ahead()  # one is idle already: nothing more
    deadline = time.monotonic() + 5
    while accepted[0] < 1 and time.monotonic() < deadline:  # the server's thread accepts it
        time.sleep(0.01)
    timing = stream_request(client, "/v1/completions", {"prompt": "x"})
    assert timing.outcome == "ok" and len(timing.content_ns) == 5, timing.error
    assert accepted[0] == 1  # sent on the connection opened ahead
    client.close()


def test_a_connection_opened_at_once_carries_the_next_request(server) -> None:
    """On loopback the handshake is over when connect returns: the connection is opened
    without yielding, waits in the pool, and the next request goes out on it. Before the
    target's address was looked up, nothing is opened (a lookup could yield)."""
    url, answers, accepted = server
    client = make_client(url)
    assert not client.connect_at_once()  # not looked up yet
    answers += [HEAD + _chunked(BODY, 1000), HEAD + _chunked(BODY, 1000)]
    assert stream_request(client, "/v1/completions", {"prompt": "x"}).outcome == "ok"
    pool = client.pool
    assert pool._socket_queue.qsize() == 1
    assert client.connect_at_once()
    assert pool._socket_queue.qsize() == 2 and not pool._semaphore.locked()
    deadline = time.monotonic() + 5
    while accepted[0] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert accepted[0] == 2
    timing = stream_request(client, "/v1/completions", {"prompt": "x"})
    assert timing.outcome == "ok" and len(timing.content_ns) == 5, timing.error
    assert accepted[0] == 2  # sent on a connection already open
    client.close()


def test_an_old_address_still_connects_at_once_while_it_is_looked_up_again(server) -> None:
    """Past RESOLVE_TTL_S the last address still serves a connect that cannot wait (a lookup
    can yield), and a greenlet looks it up again: a long run does not fall back to spawned
    connects every 30 s until some other send refreshes it."""
    url, answers, _ = server
    client = make_client(url)
    answers.append(HEAD + _chunked(BODY, 1000))
    assert stream_request(client, "/v1/completions", {"prompt": "x"}).outcome == "ok"
    pool = client.pool
    stale = time.monotonic() - streaming.RESOLVE_TTL_S - 1
    pool._resolved = (stale, pool._resolved[1])
    assert client.connect_at_once()
    pool._looking_up.join(timeout=5)
    assert pool._resolved[0] > stale  # looked up again
    client.close()


def _nothing_listening() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def test_a_refused_connect_at_once_opens_nothing() -> None:
    client = make_client(_nothing_listening())
    pool = client.pool
    pool._resolve()  # looked up (a send that failed to connect would have done so)
    assert not client.connect_at_once()
    assert not client.has_idle_connection() and not pool._semaphore.locked()
    assert pool._semaphore.counter == client.settings.max_connections  # nothing held
    client.close()


def test_a_failed_connect_ahead_is_left_to_the_send() -> None:
    client = make_client(_nothing_listening())
    client.connect_ahead()  # no exception, no connection
    assert not client.has_idle_connection()
    timing = stream_request(client, "/v1/completions", {"prompt": "x"})
    assert timing.outcome == "connect_error"
    client.close()


def test_answer_run_takes_whole_plain_answer_events_only() -> None:
    run = b"".join(_tokens(4))
    assert streaming.answer_run(run + USAGE) == (4, len(run))
    assert streaming.answer_run(b"\n" + run) == (4, len(run) + 1)  # a read after a cut pair
    assert streaming.answer_run(b"".join(_tokens(4, chat=True)) + USAGE)[0] == 4
    assert streaming.answer_run(b"".join(_tokens(2) + _tokens(1, text="") + _tokens(2))) == (
        2, len(b"".join(_tokens(2))))
    assert streaming.answer_run(USAGE + run) == (0, 0)
    assert streaming.answer_run(b": keep-alive\n\n" + run) == (0, 0)
    assert streaming.answer_run(run.replace(b"\n", b"\r\n")) == (0, 0)
    # generated text that spells a key is escaped JSON, not a key
    quoted = _event({"choices": [{"index": 0, "text": '"text":"x'}]})
    assert streaming.answer_run(quoted) == (1, len(quoted))
    # the line of a usage is not in the run, nor anything after it
    usage_inside = _tokens(2)[0] + USAGE + _tokens(2)[1]
    assert streaming.answer_run(usage_inside) == (1, len(_tokens(2)[0]))


def _line_by_line_run(batch: bytes) -> tuple[int, int]:
    """The run as the expression alone takes it (what answer_run did before it counted)."""
    end = min([i for i in (batch.find(b'"usage"'), batch.find(b'"error"')) if i >= 0]
              + [len(batch)])
    match = streaming._ANSWER_RUN.match(batch, 0, end)
    return (batch.count(b"}\n\n", 0, match.end()), match.end()) if match else (0, 0)


# one line of a run broken, each a way a server (or a proxy) could get it wrong
_BREAKS = {
    "an empty text": lambda line: line.replace(b'"text":" t', b'"text":"').replace(
        b'"text":"7', b'"text":"'),
    "a quote in the text": lambda line: line.replace(b' t7', b' t7\\"x'),
    "an unescaped quote": lambda line: line.replace(b' t7', b' t"7'),
    "a newline in the text": lambda line: line.replace(b' t7', b' t\n7'),
    "a raw newline in the text": lambda line: line.replace(b' t7', b' t\n\n7'),
    "usage on the line": lambda line: line.replace(b'"finish_reason":null', b'"usage":{}'),
    "an error instead": lambda line: _event({"error": {"message": "boom"}}),
    "another tail": lambda line: line.replace(b'null}]}', b'"stop"}]}'),
    "another head": lambda line: line.replace(b'"cmpl-1"', b'"cmpl-2"'),
    "a cut line": lambda line: line[:len(line) // 2] + b"\n\n",
    "a comment": lambda line: b": keep-alive\n\n",
    "CRLF": lambda line: line.replace(b"\n", b"\r\n"),
    "the key in the text": lambda line: line.replace(b' t7', b' \\"text\\":\\"x'),
    "a second text key": lambda line: line.replace(b'"finish_reason"', b'"text":"x","f"'),
    "usage among unescaped quotes": lambda line: line.replace(
        b' t7', b' t","usage":{"completion_tokens":1},"x":"7'),
}


@pytest.mark.parametrize("where", [0, 1, 7, 38, 39])
@pytest.mark.parametrize("name", list(_BREAKS))
def test_a_counted_run_takes_no_line_the_expression_would_not(name: str, where: int) -> None:
    """answer_run proves the usual run (every line its first line's head and tail around a
    text) by counting; with one line broken anywhere, it takes no line that the expression,
    line by line, would not take, and counts each line it takes once."""
    lines = _tokens(40)
    lines[where] = _BREAKS[name](lines[where].replace(b" t%d" % where, b" t7"))
    batch = b"".join(lines) + USAGE + b"data: [DONE]\n\n"
    events, stop = streaming.answer_run(batch)
    ref_events, ref_stop = _line_by_line_run(batch)
    assert stop <= ref_stop, (name, where)
    assert events == batch.count(b"}\n\n", 0, stop)
    if stop:
        assert streaming._ANSWER_RUN.fullmatch(batch, 0, stop), (name, where)
    whole = b"".join(_tokens(40)) + USAGE
    assert streaming.answer_run(whole) == (40, len(whole) - len(USAGE))  # unbroken: all of it
    assert streaming._template_run(whole) == (40, len(whole) - len(USAGE))  # by counting


def test_malformed_event_after_good_tokens_is_not_ok(server) -> None:
    url, answers, _ = server
    bad = b'data: {"choices":[{"text":" t9",\n\n'  # cut JSON, after a first good token
    answers += [HEAD + _chunked(TOKENS[0] + TOKENS[1] + bad + USAGE + b"data: [DONE]\n\n", 50),
                HEAD + _chunked(TOKENS[0] + b"data: hello there\n\n" + b"data: [DONE]\n\n", 50)]
    client = make_client(url)
    for expected_line in ("t9", "hello there"):
        timing = stream_request(client, "/v1/completions", {})
        assert timing.outcome == "malformed_event", timing
        assert expected_line in timing.error  # the record says what the line was


def test_finish_reason_and_short_output_under_ignore_eos(server) -> None:
    url, answers, _ = server
    last = _event({"choices": [{"index": 0, "text": " t4", "finish_reason": "length"}]})
    usage_3 = _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}})
    stop = _event({"choices": [{"index": 0, "text": " t2", "finish_reason": "stop"}]})
    answers += [
        HEAD + _chunked(b"".join(TOKENS[:4]) + last + USAGE + b"data: [DONE]\n\n", 64),
        HEAD + _chunked(b"".join(TOKENS[:2]) + last + usage_3 + b"data: [DONE]\n\n", 64),
        HEAD + _chunked(b"".join(TOKENS[:2]) + stop + b"data: [DONE]\n\n", 64),
        HEAD + _chunked(b"".join(TOKENS[:2]) + stop + b"data: [DONE]\n\n", 64),
    ]
    client = make_client(url)
    asked = {"max_tokens": 5, "ignore_eos": True}
    full = stream_request(client, "/v1/completions", asked)
    assert full.outcome == "ok" and full.finish_reason == "length"
    short = stream_request(client, "/v1/completions", asked)
    assert short.outcome == "short_output" and short.finish_reason == "length"
    assert "3 of max_tokens 5" in short.error
    no_usage = stream_request(client, "/v1/completions", asked)
    assert no_usage.outcome == "short_output" and no_usage.finish_reason == "stop"
    eos_allowed = stream_request(client, "/v1/completions", {"max_tokens": 5})
    assert eos_allowed.outcome == "ok" and eos_allowed.finish_reason == "stop"


def test_a_last_chunk_with_finish_reason_and_usage_together(server) -> None:
    """llama.cpp's text completions: the last chunk holds an empty text, the finish reason, the
    usage (asked for or not) and its own timings."""
    url, answers, _ = server
    last = _event({"choices": [{"text": "", "index": 0, "logprobs": None,
                                "finish_reason": "length"}],
                   "object": "text_completion", "usage": {"completion_tokens": 5,
                                                          "prompt_tokens": 3, "total_tokens": 8},
                   "timings": {"prompt_n": 3, "predicted_n": 5}})
    answers.append(HEAD + _chunked(b"".join(TOKENS) + last + b"data: [DONE]\n\n", 64))
    client = make_client(url)
    timing = stream_request(client, "/v1/completions", {"max_tokens": 5, "ignore_eos": True})
    assert timing.outcome == "ok" and timing.finish_reason == "length"
    assert timing.usage["completion_tokens"] == 5 and len(timing.content_ns) == 5


def test_killed_in_flight_hands_its_timing_on(server) -> None:
    import gevent

    url, answers, _ = server
    answers += [HEAD + b"%x\r\n%s\r\n" % (len(TOKENS[0]), TOKENS[0]), b"unused"]
    client = make_client(url)
    greenlet = gevent.spawn(stream_request, client, "/v1/completions", {})
    deadline = time.monotonic() + 10
    while len(answers) > 1 and time.monotonic() < deadline:  # until the server has answered
        gevent.sleep(0.05)
    gevent.sleep(0.3)
    greenlet.kill()
    timing = streaming.cancelled_timing(greenlet.value)  # a GreenletExit is its value
    assert timing is not None and timing.outcome == "cancelled"
    assert len(timing.content_ns) == 1 and timing.last_byte_ns - timing.sent_ns > 0.25e9


def test_close_delimited_body_and_get_json(server) -> None:
    url, answers, _ = server
    answers += [b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY]
    assert stream_request(make_client(url), "/v1/completions", {}).outcome == "ok"
    models = b'{"data":[{"id":"m"}]}'
    answers += [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(models), models),
                b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"]
    client = make_client(url + "/")
    assert get_json(client, "/v1/models") == {"data": [{"id": "m"}]}
    with pytest.raises(StreamHTTPError, match="HTTP 500"):
        get_json(client, "/v1/models")


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
    assert timing.outcome == "connect_error" and "refused" in timing.error.lower()
    with pytest.raises(httpx.HTTPError):  # what locustfiles/context.py catches
        get_json(make_client(f"http://127.0.0.1:{port}"), "/v1/models")


def test_connect_timeout_is_a_connect_error_apart_from_the_first_token_timeout() -> None:
    # a listener whose accept queue is full drops new SYNs: the connect hangs
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        queued = [socket.create_connection(("127.0.0.1", port), timeout=2)]  # fills it
        client = make_client(f"http://127.0.0.1:{port}",
                             ClientSettings(connect_timeout_s=0.3, first_token_timeout_s=30))
        started = time.monotonic()
        timing = stream_request(client, "/v1/completions", {})
        for sock in queued:
            sock.close()
    assert timing.outcome == "connect_error" and "timeout" in timing.error, timing.error
    assert time.monotonic() - started < 5


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


@pytest.mark.parametrize("fresh_s", [0.0, 1.0])
def test_only_a_connection_idle_past_the_fresh_time_is_checked_before_reuse(
        server, monkeypatch, fresh_s) -> None:
    """The check that an idle connection is still open is a system call per send: a connection
    back in the pool for less than FRESH_IDLE_S goes out unchecked. A server that closed it
    silently meanwhile is met by the send, and the request goes once more, marked ``resent``;
    checked, it goes on a new connection at once."""
    url, answers, accepted = server
    monkeypatch.setattr(streaming, "FRESH_IDLE_S", fresh_s)
    answers.append(HEAD + _chunked(BODY, 64))
    client = make_client(url)
    assert stream_request(client, "/v1/completions", {}).outcome == "ok"
    time.sleep(0.1)  # the server has closed that connection, saying nothing
    answers.append(HEAD + _chunked(BODY, 64))
    timing = stream_request(client, "/v1/completions", {})
    assert timing.outcome == "ok", timing.error
    assert timing.resent is (fresh_s > 0.1)
    assert accepted[0] == 2


def test_request_lost_as_the_server_closes_a_kept_alive_connection_is_sent_again(server) -> None:
    url, answers, accepted = server
    # The race the idle limit avoids and the retry covers: the connection looks alive, and
    # the server closes it as the request arrives.
    answers += [HEAD + _chunked(BODY, 64), DROP, HEAD + _chunked(BODY, 64)]
    client = make_client(url)
    first = stream_request(client, "/v1/completions", {})
    assert first.outcome == "ok" and not first.resent
    timing = stream_request(client, "/v1/completions", {})
    assert timing.outcome == "ok", timing.error
    assert timing.resent  # the record says so: the server may have started the first
    assert accepted[0] == 2


def test_a_server_that_closes_every_connection_after_its_answer_loses_no_request(server) -> None:
    """llama.cpp's llama-server: it announces keep-alive, then closes the connection after each
    streamed answer. A request sent on such a connection goes once more on a new one (not on
    another idle one, closed as well), and from then on idle connections are checked before
    reuse: eight users, every request ok."""
    import gevent

    url, answers, _ = server
    answers += [HEAD + _chunked(BODY, 64) + SILENT_CLOSE] * 80
    client = make_client(url)
    timings: list[streaming.StreamTiming] = []

    def user() -> None:
        for _ in range(10):
            timings.append(stream_request(client, "/v1/completions", {}))

    try:
        gevent.joinall([gevent.spawn(user) for _ in range(8)], raise_error=True)
    finally:
        client.close()
    assert [t.outcome for t in timings] == ["ok"] * 80, [t.error for t in timings if t.error]
    assert client.pool.check_fresh


def test_connection_idle_past_the_limit_is_not_reused(server, monkeypatch) -> None:
    url, answers, accepted = server
    answers += [HEAD + _chunked(BODY, 64), HEAD + _chunked(BODY, 64), b"unused"]
    monkeypatch.setattr(streaming, "IDLE_LIMIT_S", 0.1)
    client = make_client(url)
    assert stream_request(client, "/v1/completions", {}).outcome == "ok"
    time.sleep(0.3)  # the server still holds the connection open, but it idled too long
    assert stream_request(client, "/v1/completions", {}).outcome == "ok"
    assert accepted[0] == 2


_PACED_SERVER = r'''
import json, socket, sys, time
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
conn, _ = listener.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
data = b""
while b"\r\n\r\n" not in data:
    data += conn.recv(65536)
conn.sendall(HEAD)
writes = []  # (before, after) each write: CLOCK_MONOTONIC, shared with the test process
for delay in (0.05, 0.2, 0.1):
    time.sleep(delay)
    token = TOKENS[len(writes)]
    before = time.perf_counter_ns()
    conn.sendall(b"%x\r\n%s\r\n" % (len(token), token))
    writes.append((before, time.perf_counter_ns()))
tail = USAGE + b"data: [DONE]\n\n"
conn.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
print(json.dumps(writes), flush=True)
conn.recv(1)
'''


@pytest.mark.skipif(SO_TIMESTAMPNS is None, reason="kernel receive times are Linux's")
def test_a_busy_worker_does_not_add_its_own_delay_to_ttft_and_itl() -> None:
    """The first token lands while the worker's event loop is held by other work (the 150 ms
    after the headers came; tokens 50, 250 and 350 ms after them): TTFT and ITL still match the
    server's write times (kernel receive times), and the delay shows up as the request's read
    delay, the generator's self-check. (Bytes that wait in the socket while later bytes land are
    merged by the kernel and carry the later time: a loop held past the next token is only
    partly corrected.)"""
    import subprocess
    import sys

    import gevent

    prelude = (f"HEAD = {HEAD!r}\nTOKENS = {TOKENS!r}\nUSAGE = {USAGE!r}\n")
    server = subprocess.Popen([sys.executable, "-c", prelude + _PACED_SERVER],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())

        held_until: list[int] = []

        def hold_the_loop() -> None:
            end = time.perf_counter() + 0.15
            while time.perf_counter() < end:  # CPU work that never yields, like a long GC pass
                pass
            held_until.append(time.perf_counter_ns())

        client = make_client(f"http://127.0.0.1:{port}")
        read_headers = client.response

        def headers_then_hold(sock):  # the hold starts once the headers are in
            response = read_headers(sock)
            gevent.spawn(hold_the_loop)
            return response

        client.response = headers_then_hold
        gevent.sleep(0.05)  # a worker's client exists before its first request
        timing = stream_request(client, "/v1/completions", {"prompt": "x"})
        writes = json.loads(server.stdout.readline())
        client.close()
    finally:
        server.kill()
        server.wait()
    assert timing.outcome == "ok", timing.error
    assert len(timing.content_ns) == 3
    assert writes[0][1] < held_until[0] < writes[1][0], (
        "the first token must land while the loop is held")
    # each event's time is that of the server's write (loopback: tens of microseconds), to
    # 1 ms: from the stamp before the write to 1 ms after the one after it (a loaded machine
    # may keep the server off the CPU for a millisecond between a stamp and its write)
    errors_ms = [((got - before) / 1e6, (got - after) / 1e6)
                 for got, (before, after) in zip(timing.content_ns, writes, strict=True)]
    assert all(0 <= since_before and since_after < 1.0
               for since_before, since_after in errors_ms), (errors_ms, timing)
    # read only when the loop was free again: read times alone would be this much late
    assert timing.read_delay_max_ns is not None
    assert timing.read_delay_max_ns >= held_until[0] - writes[0][1] - 2e6


_ARRIVAL_SERVER = r'''
import socket, time
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
conn, _ = listener.accept()
data = b""
while not data.endswith(b'{"prompt":"x"}'):  # the request's last bytes
    data += conn.recv(65536)
arrived = time.perf_counter_ns()  # CLOCK_MONOTONIC, shared with the test process
conn.sendall(ANSWER)
print(arrived, flush=True)
conn.recv(1)
'''


class _ReturnsLate:
    """A raw socket whose ``send`` hands its bytes to the kernel and then keeps the thread for
    0.3 s before it returns: what the kernel does to a worker whose write woke the server and
    which it then keeps off the CPU."""

    def __init__(self, raw: socket.socket) -> None:
        self._raw = raw

    def send(self, data: bytes, flags: int = 0) -> int:
        sent = self._raw.send(data, flags)
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:  # the thread does not run meanwhile
            pass
        return sent

    def __getattr__(self, name: str) -> object:
        return getattr(self._raw, name)


def test_sent_precedes_the_servers_arrival_when_the_write_returns_late(monkeypatch) -> None:
    """On a loaded host the kernel can take the CPU from a worker as its write wakes the server
    (vLLM's span once began 667 ms before a stamp taken when the write returned, with the whole
    answer already streamed). "Sent" is stamped before the write's system call, so it precedes
    the server's arrival, and TTFT is the server's answer time, not the worker's absence."""
    import subprocess
    import sys

    original = streaming._IdleLimitedPool.after_connect

    def returns_late(pool: object, sock: object) -> None:
        original(pool, sock)
        sock._sock = _ReturnsLate(sock._sock)  # type: ignore[attr-defined]

    monkeypatch.setattr(streaming._IdleLimitedPool, "after_connect", returns_late)
    prelude = f"ANSWER = {HEAD + _chunked(BODY, 64)!r}\n"
    server = subprocess.Popen([sys.executable, "-c", prelude + _ARRIVAL_SERVER],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        client = make_client(f"http://127.0.0.1:{port}")
        timing = stream_request(client, "/v1/completions", {"prompt": "x"})
        arrived = int(server.stdout.readline())
        client.close()
    finally:
        server.kill()
        server.wait()
    assert timing.outcome == "ok", timing.error
    assert timing.sent_ns <= arrived, f"sent {(timing.sent_ns - arrived) / 1e6:.1f} ms late"
    assert arrived - timing.sent_ns < 0.1e9
    if SO_TIMESTAMPNS is not None:  # the answer's kernel times: TTFT without the 0.3 s away
        assert 0 <= timing.content_ns[0] - timing.sent_ns < 0.1e9


def test_a_recorded_tgi_chat_stream_is_timed_with_its_own_usage(server) -> None:
    """TGI's streamed chat completion as recorded (tests/fixtures/engines/tgi-chat-stream.sse,
    its header says where from): SSE comments before the first event, ``"usage": null`` in
    every chunk, the finish reason on the last content chunk and the usage in a chunk of its
    own. Every content chunk is timed and the usage is TGI's own."""
    from pathlib import Path

    capture = (Path(__file__).resolve().parent / "fixtures" / "engines" /
               "tgi-chat-stream.sse").read_bytes()
    url, answers, _ = server
    answers.append(HEAD + _chunked(capture, 64))
    client = make_client(url)
    timing = stream_request(client, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "What is deep learning?"}],
        "max_tokens": 10, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}})
    assert timing.outcome == "ok", timing.error
    assert timing.finish_reason == "length"
    assert timing.usage["completion_tokens"] == 10 and timing.usage["prompt_tokens"] == 40
    assert len(timing.content_ns) == 10
