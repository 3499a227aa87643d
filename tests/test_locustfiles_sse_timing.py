"""The SSE parser and the derivation of METRICS.md figures, without sockets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from collectors.schemas import REQUEST_SCHEMA
from locustfiles.sse import EventKind, parse_line
from locustfiles.streaming import StreamTiming
from locustfiles.timing import build_record


def data(obj: object) -> str:
    return "data: " + json.dumps(obj)


@pytest.mark.parametrize(
    ("line", "kind", "has_content"),
    [
        (data({"choices": [{"text": "hi"}]}), EventKind.CONTENT, True),
        (data({"choices": [{"text": ""}]}), EventKind.EMPTY, False),
        (data({"choices": [{"delta": {"role": "assistant", "content": ""}}]}), EventKind.EMPTY,
         False),
        (data({"choices": [{"delta": {"role": "assistant"}}]}), EventKind.EMPTY, False),
        (data({"choices": [{"delta": {"content": "x"}}]}), EventKind.CONTENT, True),
        (data({"choices": [{"delta": {"reasoning_content": "think"}}]}), EventKind.CONTENT, True),
        (data({"choices": [], "usage": {"completion_tokens": 3}}), EventKind.USAGE, False),
        ("data: [DONE]", EventKind.DONE, False),
        ("data:[DONE]", EventKind.DONE, False),
        (": keep-alive comment", EventKind.IGNORED, False),
        ("event: message", EventKind.IGNORED, False),
        ("data: {not json", EventKind.MALFORMED, False),
        (data({"error": {"message": "boom"}}), EventKind.ERROR, False),
    ],
)
def test_parse_line_classifies_events(line: str, kind: EventKind, has_content: bool) -> None:
    event = parse_line(line)
    assert event.kind is kind
    assert event.has_content is has_content


def test_usage_chunk_keeps_counts() -> None:
    event = parse_line(data({"choices": [], "usage": {"prompt_tokens": 7,
                                                      "completion_tokens": 5}}))
    assert event.usage == {"prompt_tokens": 7, "completion_tokens": 5}


def _timing(content_ms: list[float], last_ms: float, usage: dict | None,
            outcome: str = "ok") -> StreamTiming:
    ms = 1_000_000
    return StreamTiming(
        sent_ns=1_000 * ms, sent_wall_ns=1_700_000_000_000_000_000, outcome=outcome,
        http_status=200, content_ns=[1_000 * ms + int(t * ms) for t in content_ms],
        last_byte_ns=1_000 * ms + int(last_ms * ms), usage=usage,
    )


def _record(timing: StreamTiming, **kw: object) -> dict:
    return build_record(timing, run_id="r", worker_id="w", request_id="1", bucket="short",
                        endpoint="completions", target_prompt_tokens=10, max_tokens=4, **kw)


def test_record_figures_follow_metrics_md() -> None:
    rec = _record(_timing([200, 220, 245, 260], 262, {"prompt_tokens": 10,
                                                        "completion_tokens": 4}))
    assert rec["ttft_s"] == pytest.approx(0.200)
    assert rec["e2e_s"] == pytest.approx(0.262)
    assert rec["tpot_s"] == pytest.approx((0.262 - 0.200) / 3)
    assert rec["itl_s"] == pytest.approx([0.020, 0.025, 0.015], abs=1e-7)
    assert rec["itl_count"] == 3
    assert rec["itl_max_s"] == pytest.approx(0.025)
    assert rec["itl_p50_s"] == pytest.approx(0.020)
    assert rec["output_tokens"] == 4 and rec["tokens_estimated"] is False
    assert set(rec) == set(REQUEST_SCHEMA.names)


def test_tokens_estimated_from_events_when_usage_missing() -> None:
    rec = _record(_timing([10, 20], 21, None))
    assert rec["output_tokens"] == 2
    assert rec["tokens_estimated"] is True


def test_single_token_has_no_tpot_and_no_itl() -> None:
    rec = _record(_timing([50], 51, {"completion_tokens": 1, "prompt_tokens": 3}))
    assert rec["tpot_s"] is None
    assert rec["itl_s"] is None and rec["itl_count"] == 0


def test_schedule_lag_and_queued_ttft() -> None:
    timing = _timing([100], 101, {"completion_tokens": 1})
    rec = _record(timing, scheduled_ns=timing.sent_ns - 5_000_000)
    assert rec["schedule_lag_s"] == pytest.approx(0.005)
    assert rec["queued_ttft_s"] == pytest.approx(0.105)


def test_failed_request_has_no_tpot() -> None:
    rec = _record(_timing([], 3, None, outcome="http_4xx"))
    assert rec["ttft_s"] is None and rec["tpot_s"] is None
    assert rec["outcome"] == "http_4xx"
    assert np.isclose(rec["e2e_s"], 0.003)
