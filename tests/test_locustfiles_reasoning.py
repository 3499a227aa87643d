"""Reasoning models: every content field of METRICS.md's TTFT row starts TTFT, and the first
answer token is timed beside it (simulator streaming reasoning deltas before the answer)."""

from __future__ import annotations

import json
import re
import statistics

import httpx
import pytest

from infra.targets.simulator import running_simulator
from locustfiles.sse import EventKind, parse_line
from locustfiles.streaming import has_answer_bytes, has_content_bytes, make_client, stream_request
from locustfiles.timing import build_record


def _data(delta: dict[str, object]) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]})


@pytest.mark.parametrize(("delta", "content", "answer"), [
    ({"reasoning": "hm"}, True, False),
    ({"reasoning_content": "hm"}, True, False),
    ({"content": "yes"}, True, True),
    ({"tool_calls": [{"index": 0, "function": {"name": "f"}}]}, True, True),
    ({"role": "assistant", "content": ""}, False, False),
    ({"reasoning": ""}, False, False),
    ({"tool_calls": []}, False, False),
    ({"reasoning": None, "content": None}, False, False),
])
def test_content_and_answer_fields(delta: dict[str, object], content: bool, answer: bool) -> None:
    line = _data(delta)
    event = parse_line(line)
    assert (event.has_content, event.has_answer) == (content, answer)
    assert event.kind is (EventKind.CONTENT if content else EventKind.EMPTY)
    for spaced in (line, line.replace(":", ": ")):  # compact and spaced JSON alike
        raw = spaced.encode()
        assert (has_content_bytes(raw), has_answer_bytes(raw)) == (content, answer), spaced


def _server_ttft_sum(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics", timeout=5).text
    match = re.search(r"^vllm:time_to_first_token_seconds_sum\{[^}]*\} (\S+)$", text, re.M)
    assert match, text[:400]
    return float(match.group(1))


@pytest.mark.alone  # a 2 ms median against the simulator's clock: nothing beside it
@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_ttft_matches_the_simulators_first_reasoning_event(field: str) -> None:
    reasoning, itl = 10, 0.01
    with running_simulator(fixed_ttft_s=0.05, fixed_itl_s=itl, reasoning_events=reasoning,
                           reasoning_field=field) as url:
        client = make_client(url)
        body = {"model": "swarmload-sim", "messages": [{"role": "user", "content": "why"}],
                "max_tokens": 16, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        stream_request(client, "/v1/chat/completions", body)  # connect and warm up
        diffs, records = [], []
        for _ in range(11):
            before = _server_ttft_sum(url)
            timing = stream_request(client, "/v1/chat/completions", body)
            # the simulator's own time from the request's arrival to its first reasoning event
            server_ttft = _server_ttft_sum(url) - before
            record = build_record(timing, run_id="r", worker_id="w", request_id="x",
                                  bucket="short", endpoint="chat", target_prompt_tokens=1,
                                  max_tokens=16)
            assert record["outcome"] == "ok", record["error"]
            diffs.append(record["ttft_s"] - server_ttft)
            records.append(record)
        client.close()
    # TTFT is the first reasoning event's arrival, not the answer's (10 x 10 ms later)
    # (the simulator stamps a token when its timer fires; the bytes follow within microseconds)
    print(f"{field}: client TTFT - simulator's first reasoning event, median "
          f"{statistics.median(diffs) * 1e3:+.3f} ms over {len(diffs)} requests")
    assert abs(statistics.median(diffs)) < 0.002, diffs
    for record in records:
        assert record["content_events"] == 16 and record["reasoning_events"] == reasoning
        assert record["reasoning_tokens"] == reasoning and record["output_tokens"] == 16
    # the answer comes 10 gaps later (a first event delayed by a busy host shortens one gap)
    after = statistics.median(r["answer_ttft_s"] - r["ttft_s"] for r in records)
    assert abs(after - reasoning * itl) < 0.003, [r["answer_ttft_s"] for r in records]
