"""Client-side balancing over several target URLs (locustfiles.context.ProcessContext.stream):
round robin takes turns, least-busy steers around a slow replica. No sockets: the request
itself is replaced by a greenlet that holds its replica for a while."""

from __future__ import annotations

from collections import Counter
from typing import Any

import gevent
import pytest

from locustfiles import context
from locustfiles.config import RunConfig
from locustfiles.context import ProcessContext
from locustfiles.streaming import StreamTiming

FAST, SLOW = "http://127.0.0.1:9001", "http://127.0.0.1:9002"


def _context(monkeypatch: pytest.MonkeyPatch, balance: str) -> ProcessContext:
    hold = {FAST: 0.001, SLOW: 0.05}

    def fake_stream(client: Any, path: str, payload: Any, request_id: Any = None,
                    **_options: Any) -> StreamTiming:  # keep_answer, headers
        gevent.sleep(hold[client.base_url])
        return StreamTiming(sent_ns=0, sent_wall_ns=0)

    monkeypatch.setattr(context, "stream_request", fake_stream)
    settings = RunConfig(run_id="t", model="m", targets=f"{FAST},{SLOW}", balance=balance)
    return ProcessContext(settings, FAST, 0)


def _send(ctx: ProcessContext, users: int, per_user: int) -> Counter[str]:
    seen: Counter[str] = Counter()

    def user() -> None:
        for _ in range(per_user):
            seen[ctx.stream("/v1/completions", {}).replica] += 1

    gevent.joinall([gevent.spawn(user) for _ in range(users)], timeout=30)
    return seen


def test_round_robin_takes_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _context(monkeypatch, "round-robin")
    assert [ctx.stream("/v1/completions", {}).replica for _ in range(4)] == [FAST, SLOW] * 2


def test_least_busy_sends_more_to_the_faster_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _send(_context(monkeypatch, "least-busy"), users=4, per_user=20)
    assert sum(seen.values()) == 80 and seen[FAST] > 3 * seen[SLOW], seen
    even = _send(_context(monkeypatch, "round-robin"), users=4, per_user=20)
    assert abs(even[FAST] - even[SLOW]) <= 4, even
