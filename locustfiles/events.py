"""What swarmload's Locust processes say to each other, declared in one place.

Declared the way Locust's own ``locust/event.py`` declares its hooks: each name with its
arguments and the moment it fires. The user (:mod:`locustfiles.llm_user`) and the open-loop
replay (:mod:`locustfiles.replay`) both import this module, so neither imports the other.

Custom event (on ``environment.events``; created by :func:`collectors.request_recorder.register`,
which listens to it):

``swarmload_record(record)``
    Fired once per request, when its outcome is final, in the process that owns the request:

    - by a closed-loop user on a worker (or a local runner) when its stream ends, well or badly;
    - by the worker's replay scheduler when a leased request ends, is ``dropped`` over the
      in-flight cap, or is ``cancelled`` by the end of the run while in flight;
    - by the master's replay dispatcher for a request that never reached a live worker
      (``worker_lost``).

    :param record: one row of ``REQUEST_SCHEMA`` (``collectors/schemas.py``) as a dict, built by
        :func:`locustfiles.timing.build_record` (raw timestamps plus derived TTFT, ITL, E2E).

Master/worker messages (``runner.send_message(name, data)``; the receiver registers a handler
with ``runner.register_message(name, handler)`` in ``llm_user``'s ``init`` listener):

:data:`LEASE_MESSAGE` (``swarmload_lease``), master -> one worker
    Sent by the replay dispatcher every tick (``tick_s``, 0.05 s) with the requests due within
    the next ``lookahead_s`` (1.5 s) that it hands to that worker (round-robin over the live
    workers), and again for a missing worker's requests that are not yet due; in messages
    of at most ``LEASE_PART_ITEMS`` (32) requests, since a worker unpacks each one whole.
    ``data = {"t0_wall_ns": int, "items": [schedule item, ...], "clock_offset_ns": int}``: run
    start on the master's wall clock, that worker's clock minus the master's (measured by
    :mod:`locustfiles.clock_sync`), and each full request (``rid``, ``seq``, ``off`` seconds from
    ``t0``, ``bucket``, ``endpoint``, ``ptoks``, ``max_tokens``, prompt or messages), so workers
    need no shared files.

:data:`SENT_MESSAGE` (``swarmload_sent``), worker -> master
    Sent every ``ack_interval_s`` (and once when the worker stops) with the requests it has
    settled since the last one: sent, or recorded as ``dropped``, and the sessions that ended
    here since: ``data = {"seqs": [int, ...], "done": [int, ...]}``. The master never re-leases
    a settled request when a worker goes missing; under a closed plan it leases the next
    session for each one done.

Declared where they live: the recorder's message ``swarmload_records`` in
:mod:`collectors.request_recorder`; the clock exchange ``swarmload_clock_ping`` /
``swarmload_clock_pong`` in :mod:`locustfiles.clock_sync`.
"""

from __future__ import annotations

from typing import Any

from locust.env import Environment

LEASE_MESSAGE = "swarmload_lease"
SENT_MESSAGE = "swarmload_sent"


class StreamError(Exception):
    """Stable per-class message, so Locust's error table does not grow per request."""


def fire_record(environment: Environment, record: dict[str, Any]) -> None:
    """``swarmload_record``: one request's record to the recorder (collectors.request_recorder
    declares the event on the environment)."""
    events: Any = environment.events
    events.swarmload_record.fire(record=record)


def fire_live_stats(environment: Environment, record: dict[str, Any]) -> None:
    """TTFT and E2E as two Locust entries per bucket (Locust rounds them: live view only), and
    ``answer TTFT`` for requests whose answer came after reasoning.

    Called next to every ``swarmload_record`` fired for a request that was sent; Locust's own
    ``request`` event carries them to its web UI and console table.
    """
    fire = environment.events.request.fire
    name = record["bucket"] or "all"
    tokens = record["output_tokens"] or 0
    if record["outcome"] == "ok":
        if record["ttft_s"] is not None:  # non-streaming requests have no TTFT
            fire(request_type="TTFT", name=name, response_time=record["ttft_s"] * 1000.0,
                 response_length=tokens, exception=None, context={})
        if record.get("reasoning_events") and record.get("answer_ttft_s") is not None:
            # a reasoning model: the wait for the answer, next to TTFT (first reasoning token)
            fire(request_type="answer TTFT", name=name,
                 response_time=record["answer_ttft_s"] * 1000.0, response_length=tokens,
                 exception=None, context={})
        fire(request_type="E2E", name=name, response_time=record["e2e_s"] * 1000.0,
             response_length=tokens, exception=None, context={})
    else:
        status = record["http_status"]
        message = record["outcome"] + (f" (HTTP {status})" if status else "")
        fire(request_type="E2E", name=name, response_time=(record["e2e_s"] or 0.0) * 1000.0,
             response_length=0, exception=StreamError(message), context={})
