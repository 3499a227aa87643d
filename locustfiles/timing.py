"""Derive METRICS.md figures from raw stream timestamps: pure functions, unit-tested.

TTFT = first content event - sent; ITL = every gap between consecutive content events;
E2E = last byte - sent; TPOT = (E2E - TTFT) / (output tokens - 1) for >= 2 output tokens;
queued TTFT = first content event - scheduled; answer TTFT = first answer event (not reasoning) -
sent. Output tokens come from the server's usage; when
it sends none, the number of content events stands in and ``tokens_estimated`` is set.
"""

from __future__ import annotations

import dataclasses
from array import array
from operator import attrgetter
from typing import Any

from collectors.schemas import OUTCOME_OK, REQUEST_SCHEMA
from locustfiles.streaming import StreamTiming

_NS = 1e-9
# the record's columns that StreamTiming holds as they are (outcome, http_status, resent, ...):
# copied by name, so a figure a stream loop counts needs no line here
_AS_TAKEN = tuple(f.name for f in dataclasses.fields(StreamTiming)
                  if f.name in REQUEST_SCHEMA.names)
_take = attrgetter(*_AS_TAKEN)
# a lone request's session columns (REQUEST_SCHEMA): all null
_NO_SESSION = dict.fromkeys(("session_id", "turn", "history_tokens", "reusable_tokens",
                             "turn_step", "tool_calls", "tool_wait_s", "depends_on",
                             "agent"))


def percentile_sorted(values: list[float], q: float) -> float:
    """numpy's default (linear) percentile of an already sorted, non-empty list.

    Pure Python on purpose: for the tens to thousands of gaps of one request this is several
    times cheaper than converting to an array and calling ``np.percentile`` (per-request cost,
    measured in docs/BENCHMARKS.md). Analysis uses ``collectors.percentiles``, the
    same definition over arrays."""
    pos = (len(values) - 1) * q / 100.0
    lo = int(pos)
    if lo + 1 >= len(values):
        return values[-1]
    return values[lo] + (values[lo + 1] - values[lo]) * (pos - lo)


def build_record(
    timing: StreamTiming,
    *,
    run_id: str,
    worker_id: str,
    request_id: str,
    bucket: str | None,
    endpoint: str,
    target_prompt_tokens: int | None,
    max_tokens: int | None,
    scheduled_ns: int | None = None,
    scheduled_wall_ns: int | None = None,
    http_request_id: str | None = None,
    session: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One row of REQUEST_SCHEMA. ``scheduled_ns`` is on the same monotonic clock as sent.
    ``session``: a session turn's columns (session_id, turn, history_tokens, ...)."""
    content = timing.content_ns
    ok = timing.outcome == OUTCOME_OK
    ttft_s = (content[0] - timing.sent_ns) * _NS if content else None
    e2e_s = (
        (timing.last_byte_ns - timing.sent_ns) * _NS if timing.last_byte_ns is not None else None
    )
    gaps = None
    if len(content) > 1:
        gaps = [(b - a) * _NS for a, b in zip(content[:-1], content[1:], strict=True)]
    ordered = sorted(gaps) if gaps is not None else None

    usage = timing.usage or {}
    output_tokens = usage.get("completion_tokens")
    prompt_tokens = usage.get("prompt_tokens")
    estimated = output_tokens is None
    if estimated and content:
        output_tokens = len(content)

    tpot_s = None
    if ok and ttft_s is not None and e2e_s is not None and output_tokens and output_tokens >= 2:
        tpot_s = (e2e_s - ttft_s) / (output_tokens - 1)

    schedule_lag_s = queued_ttft_s = None
    if scheduled_ns is not None:
        schedule_lag_s = (timing.sent_ns - scheduled_ns) * _NS
        if content:
            queued_ttft_s = (content[0] - scheduled_ns) * _NS

    answer_index = timing.first_answer_index
    answer_ns = content[answer_index] if answer_index is not None else None
    reasoning_events = (answer_index if answer_index is not None else len(content)) if content \
        else None
    details = usage.get("completion_tokens_details")
    reasoning_tokens = details.get("reasoning_tokens") if isinstance(details, dict) else None
    prompt_details = usage.get("prompt_tokens_details")
    cached_tokens = prompt_details.get("cached_tokens") if isinstance(prompt_details,
                                                                     dict) else None

    record = {
        "run_id": run_id,
        "worker_id": worker_id,
        "request_id": request_id,
        "bucket": bucket,
        "endpoint": endpoint,
        "scheduled_wall_ns": scheduled_wall_ns,
        "schedule_lag_s": schedule_lag_s,
        "ttft_s": ttft_s,
        "queued_ttft_s": queued_ttft_s,
        "e2e_s": e2e_s,
        "tpot_s": tpot_s,
        "itl_count": len(gaps) if gaps is not None else 0,
        "itl_sum_s": sum(gaps) if gaps is not None else None,
        "itl_p50_s": percentile_sorted(ordered, 50) if ordered is not None else None,
        "itl_p99_s": percentile_sorted(ordered, 99) if ordered is not None else None,
        "itl_max_s": ordered[-1] if ordered is not None else None,
        # float32 like the column (REQUEST_SCHEMA), rounded here as numpy's astype did
        "itl_s": array("f", gaps).tolist() if gaps is not None else None,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "tokens_estimated": estimated,
        "target_prompt_tokens": target_prompt_tokens,
        "max_tokens": max_tokens,
        "content_events": len(content),
        "read_delay_s": (timing.read_delay_max_ns * _NS
                         if timing.read_delay_max_ns is not None else None),
        "answer_ttft_s": (answer_ns - timing.sent_ns) * _NS if answer_ns is not None else None,
        "reasoning_events": reasoning_events,
        "reasoning_tokens": reasoning_tokens,
        "http_request_id": http_request_id,
        "cached_tokens": cached_tokens,
        **_NO_SESSION,
        **(session or {}),
    }
    record.update(zip(_AS_TAKEN, _take(timing), strict=True))
    return record
