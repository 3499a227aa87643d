"""The master's waits at both ends of a run, on a real MasterRunner: the load starts as its
workers are ready, and the master quits once their last reports are in, not after fixed
seconds (about 2 s of every run, every study step, before)."""

from __future__ import annotations

import time
from typing import Any

import gevent
import pytest
from locust.env import Environment
from locust.rpc import Message
from locust.runners import STATE_INIT, WorkerNode

from collectors import request_recorder
from infra.ports import free_port
from locustfiles.master_waits import FIRST_LOOK_S, WorkerInits, wait_for_workers


@pytest.fixture
def master() -> Any:
    environment = Environment()
    runner = environment.create_master_runner("127.0.0.1", free_port())
    yield environment, runner
    runner.greenlet.kill(block=True)


def _connect(runner: Any, inits: WorkerInits, name: str, *, init_done: bool = True) -> None:
    runner.clients[name] = WorkerNode(name, state=STATE_INIT)  # Locust's client_ready
    if init_done:
        inits.on_message(msg=Message("swarmload_worker_init", None, name))


def test_the_wait_ends_as_the_last_worker_is_through_its_init(master: Any) -> None:
    _, runner = master
    inits = WorkerInits()
    gevent.spawn_later(0.05, _connect, runner, inits, "w0")
    gevent.spawn_later(0.12, _connect, runner, inits, "w1")
    waited = wait_for_workers(runner, 2, inits)
    assert 0.12 <= waited < 0.4  # Locust's own look once a second: 1 s here


def test_a_worker_ready_before_its_init_is_not_counted(master: Any) -> None:
    """Locust's client_ready comes while the worker connects, before its init registers this
    locustfile's handlers: a spawn or a clock exchange sent then is handled without them."""
    _, runner = master
    inits = WorkerInits()
    _connect(runner, inits, "w0", init_done=False)
    gevent.spawn_later(0.2, inits.on_message, msg=Message("swarmload_worker_init", None, "w0"))
    assert 0.2 <= wait_for_workers(runner, 1, inits) < 0.5


def test_missing_workers_are_left_to_locusts_own_loop(master: Any) -> None:
    _, runner = master
    assert 0.3 <= wait_for_workers(runner, 1, WorkerInits(), max_wait_s=0.3) < 0.6
    assert FIRST_LOOK_S <= 5  # Locust logs "Waiting for workers" after 5 s: not kept silent


def test_quit_ends_when_every_worker_has_sent_its_last_report(master: Any) -> None:
    environment, runner = master
    recorder = request_recorder.register(environment, None)
    runner.server.send_to_client = lambda _msg: None  # no worker processes here
    for name in ("w0", "w1"):
        runner.clients[name] = WorkerNode(name, state=STATE_INIT)

    def last_reports() -> None:
        for name in ("w0", "w1"):
            environment.events.worker_report.fire(client_id=name, data={
                request_recorder.FINAL_KEY: True})

    gevent.spawn_later(0.05, last_reports)
    start = time.monotonic()
    runner.quit()  # the recorder's: waits for both last reports
    first = time.monotonic() - start
    start = time.monotonic()
    runner.quit()  # Locust's shutdown quits again: both are in, nothing to wait for
    second = time.monotonic() - start
    assert recorder.final_reports == {"w0", "w1"}
    assert 0.05 <= first < 0.4 and second < 0.2, (first, second)  # 0.5 s each before
