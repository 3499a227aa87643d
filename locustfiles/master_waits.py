"""The headless Locust master's wait for its workers, cut to what it waits for.

A headless master looks for its ``--expect-workers`` once a second (``locust.main``): workers
that become ready 50 ms after its first look wait 950 ms, in every run, every study step and
every test run. :func:`wait_for_workers`, called at the end of the master's ``init``, looks every
:data:`POLL_S` instead, for at most :data:`FIRST_LOOK_S`; Locust's own loop then finds them ready
at its first look, and goes on as before when some are still missing (its messages,
``--expect-workers-max-wait``). The wait at the other end, for the workers' last reports, is the
recorder's (``collectors.request_recorder.RequestRecorder.quit_after_final_reports``).

Ready here means more than Locust's ``client_ready``: a worker sends that while it connects,
before its own ``init`` has registered this locustfile's message handlers, and a master that
starts at once would have its clock exchange and its spawn handled before them. A worker sends
:data:`INIT_MESSAGE` at the end of its ``init`` (:func:`announce`); the master counts only those
(:class:`WorkerInits`) and answers each with :data:`INIT_ACK_MESSAGE`.

The master answers ``client_ready`` whenever its own ``init`` first yields to the event loop (a
bind's address lookup does, and so may a user's own ``init`` listener that runs before ours), so
a worker's announcement can reach it before the handler for it is registered: Locust drops it as
an unknown message, and that worker never got its clock exchange (its host missing from the
manifest, its open-loop sends timed on its own clock). A worker therefore announces again every
:data:`ANNOUNCE_EVERY_S` until the master's answer comes, :data:`ANNOUNCE_FOR_S` at most.

Messages (declared here, where they live):
- ``swarmload_worker_init`` worker -> master, no data: this worker's handlers are registered
- ``swarmload_worker_init_ack`` master -> worker, no data: that announcement was counted
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import gevent
import gevent.event

INIT_MESSAGE = "swarmload_worker_init"
INIT_ACK_MESSAGE = "swarmload_worker_init_ack"
ANNOUNCE_EVERY_S = 0.5
ANNOUNCE_FOR_S = 30.0
POLL_S = 0.01
FIRST_LOOK_S = 5.0  # Locust's own loop starts logging "Waiting for workers" after 5 s


class WorkerInits:
    """Master side: the client ids of the workers whose ``init`` has run."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner  # the master's: it answers each announcement
        self.done: set[str] = set()
        self.listeners: list[Callable[[str], None]] = []  # called once with each client id

    def on_message(self, msg: Any, **_kwargs: Any) -> None:
        client_id = msg.node_id
        self.runner.send_message(INIT_ACK_MESSAGE, None, client_id=client_id)
        if client_id in self.done:  # an announcement sent again before our answer reached it
            return
        self.done.add(client_id)
        for listener in self.listeners:
            listener(client_id)


def announce(runner: Any, every_s: float = ANNOUNCE_EVERY_S,
             for_s: float = ANNOUNCE_FOR_S) -> gevent.Greenlet:
    """Worker side, at the end of its ``init``: tell the master its handlers are in place, again
    every ``every_s`` until it answers (``for_s`` at most). Returns the announcing greenlet."""
    answered = gevent.event.Event()
    runner.register_message(INIT_ACK_MESSAGE, lambda **_kw: answered.set())

    def _announce() -> None:
        deadline = time.monotonic() + for_s
        while True:
            runner.send_message(INIT_MESSAGE, None)
            if answered.wait(every_s) or time.monotonic() >= deadline:
                return

    return gevent.spawn(_announce)


def wait_for_workers(runner: Any, expected: int, inits: WorkerInits,
                     max_wait_s: float = 0.0) -> float:
    """Yield to the master's loop until ``expected`` workers are ready and through their
    ``init``, at most :data:`FIRST_LOOK_S` (or ``max_wait_s`` when smaller and set). Returns the
    seconds waited."""
    start = time.monotonic()
    limit = min(FIRST_LOOK_S, max_wait_s) if max_wait_s > 0 else FIRST_LOOK_S

    def ready() -> int:
        return sum(1 for client in runner.clients.ready if client.id in inits.done)

    while ready() < expected and time.monotonic() - start < limit:
        gevent.sleep(POLL_S)
    return time.monotonic() - start
