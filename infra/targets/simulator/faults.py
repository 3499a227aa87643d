"""Faults on demand: the simulator misbehaves the way production servers do, one class at a time.

``--fault-cycle ok,first_token_stall,http_429,...`` gives the n-th generation request the
(n mod len)-th fault of the list, so a test knows exactly what it asked for; ``--fault-log PATH``
appends one JSON line per generation request saying what the server did (``n``, ``fault``, the
client's ``X-Request-Id``, ``wall_ns``), the truth a client's records are checked against.

Each fault and the client outcome it must produce (``collectors.schemas``; the fault-matrix test
checks every pair through a real ``swarmload run``):

==================  ===========================  ==============================================
fault               client outcome               what the server does
==================  ===========================  ==============================================
ok                  ok                           a normal stream
first_token_stall   timeout_before_first_token   headers, then silence (``--fault-stall-s``)
mid_stream_stall    timeout_mid_stream           two tokens, then silence
http_400            http_4xx                     400 with an OpenAI error body
http_429            http_429                     429 with ``Retry-After: 2``
http_500            http_5xx                     500
error_event         error_event                  a token, then ``data: {"error": ...}``, [DONE]
cut                 stream_cut                   two tokens, then the connection closes
malformed           malformed_event              a token, then a ``data:`` line that is not JSON
empty               empty_output                 only the usage chunk and [DONE]
not_event_stream    not_event_stream             200 with a whole JSON completion
short               short_output                 half of max_tokens, finish_reason ``length``
==================  ===========================  ==============================================

A stall ends when the client leaves (its timeout) or after ``--fault-stall-s``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING

from aiohttp import web

from infra.targets.simulator.protocol import DONE_EVENT, ChunkEncoder

if TYPE_CHECKING:
    from infra.targets.simulator.protocol import GenerationRequest

# fault -> the outcome a correct client records for it
FAULT_OUTCOMES: dict[str, str] = {
    "ok": "ok",
    "first_token_stall": "timeout_before_first_token",
    "mid_stream_stall": "timeout_mid_stream",
    "http_400": "http_4xx",
    "http_429": "http_429",
    "http_500": "http_5xx",
    "error_event": "error_event",
    "cut": "stream_cut",
    "malformed": "malformed_event",
    "empty": "empty_output",
    "not_event_stream": "not_event_stream",
    "short": "short_output",
}
RETRY_AFTER_S = 2
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def parse_cycle(text: str) -> tuple[str, ...]:
    """``"ok,cut"`` -> ``("ok", "cut")``; raises ValueError naming an unknown fault."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in FAULT_OUTCOMES]
    if unknown:
        raise ValueError(f"unknown fault(s) {unknown}; known: {', '.join(FAULT_OUTCOMES)}")
    return names


class FaultInjector:
    """Picks each generation request's fault and serves the misbehaving ones."""

    def __init__(self, cycle: str, log_path: str, stall_s: float, model: str) -> None:
        self.cycle = parse_cycle(cycle)
        self.stall_s = stall_s
        self.model = model
        self.count = 0
        # line-buffered append: each line is on disk when the request is answered, and lines
        # from a killed simulator stay readable
        self._log = open(log_path, "a", buffering=1) if log_path else None  # noqa: SIM115

    @property
    def active(self) -> bool:
        return bool(self.cycle) or self._log is not None

    def pick(self, request: web.Request) -> str:
        """The fault of this request (``ok`` without a cycle), logged."""
        n = self.count
        self.count += 1
        fault = self.cycle[n % len(self.cycle)] if self.cycle else "ok"
        if self._log is not None:
            self._log.write(json.dumps({
                "n": n, "fault": fault, "request_id": request.headers.get("X-Request-Id"),
                "wall_ns": time.time_ns()}) + "\n")
        return fault

    def close(self) -> None:
        if self._log is not None:
            self._log.close()

    async def serve(self, request: web.Request, fault: str, gen: GenerationRequest, *,
                    chat: bool, headers: dict[str, str]) -> web.StreamResponse:
        """Answer ``request`` with ``fault`` (anything but ``ok``)."""
        if fault in ("http_400", "http_429", "http_500"):
            status = int(fault[5:])
            extra = {"Retry-After": str(RETRY_AFTER_S)} if status == 429 else {}
            body = {"error": {"message": f"simulated {fault} (--fault-cycle)",
                              "type": "SimulatedFault", "code": status}}
            return web.json_response(body, status=status, headers={**headers, **extra})
        encoder = ChunkEncoder(chat=chat, model=self.model)
        if fault == "not_event_stream":
            return web.json_response({"id": encoder.request_id, "object": "text_completion",
                                      "model": self.model, "choices": [{"index": 0,
                                      "text": " whole", "finish_reason": "length"}]},
                                     headers=headers)
        response = web.StreamResponse(headers={**SSE_HEADERS, **headers})
        response.enable_chunked_encoding()
        await response.prepare(request)
        tokens = [encoder.token_chunk(i) for i in range(max(gen.max_tokens, 2))]
        usage = encoder.usage_chunk(gen.prompt_tokens, gen.max_tokens)
        if fault == "first_token_stall":
            await self._hold(request)
            return response
        if fault == "mid_stream_stall":
            await response.write(tokens[0] + tokens[1])
            await self._hold(request)
            return response
        if fault == "cut":
            await response.write(tokens[0] + tokens[1])
            if request.transport is not None:
                request.transport.close()  # mid-body: no terminating chunk
            return response
        if fault == "error_event":
            error = {"error": {"message": "simulated error event (--fault-cycle)",
                               "type": "SimulatedFault", "code": 500}}
            await response.write(tokens[0] + b"data: " + json.dumps(error).encode() + b"\n\n"
                                 + DONE_EVENT)
        elif fault == "malformed":
            await response.write(tokens[0] + b'data: {"choices": [oops\n\n'
                                 + b"".join(tokens[1:gen.max_tokens]) + usage + DONE_EVENT)
        elif fault == "empty":
            await response.write(encoder.usage_chunk(gen.prompt_tokens, 0) + DONE_EVENT)
        elif fault == "short":
            n = max(1, gen.max_tokens // 2)
            await response.write(b"".join(tokens[:n - 1]) + encoder.last_token_chunk(n, "length")
                                 + encoder.usage_chunk(gen.prompt_tokens, n) + DONE_EVENT)
        else:
            raise ValueError(f"fault {fault!r} is served by the engine, not here")
        await response.write_eof()
        return response

    async def _hold(self, request: web.Request) -> None:
        """Say nothing until the client leaves or ``stall_s`` has passed."""
        deadline = time.monotonic() + self.stall_s
        while time.monotonic() < deadline:
            transport = request.transport
            if transport is None or transport.is_closing():
                return
            await asyncio.sleep(0.05)
