"""The master's waits at both ends of a run, on a real MasterRunner: the load starts as its
workers are ready, and the master quits once their last reports are in, not after fixed
seconds (about 2 s of every run, every study step, before)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gevent
import pytest
from locust.env import Environment
from locust.rpc import Message
from locust.runners import STATE_INIT, WorkerNode

from collectors import request_recorder
from infra.ports import free_port
from infra.targets.simulator import running_simulator
from locustfiles import clock_sync
from locustfiles.master_waits import (
    FIRST_LOOK_S,
    INIT_ACK_MESSAGE,
    INIT_MESSAGE,
    WorkerInits,
    announce,
    wait_for_workers,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


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
    inits = WorkerInits(runner)
    gevent.spawn_later(0.05, _connect, runner, inits, "w0")
    gevent.spawn_later(0.12, _connect, runner, inits, "w1")
    waited = wait_for_workers(runner, 2, inits)
    assert 0.12 <= waited < 0.4  # Locust's own look once a second: 1 s here


def test_a_worker_ready_before_its_init_is_not_counted(master: Any) -> None:
    """Locust's client_ready comes while the worker connects, before its init registers this
    locustfile's handlers: a spawn or a clock exchange sent then is handled without them."""
    _, runner = master
    inits = WorkerInits(runner)
    _connect(runner, inits, "w0", init_done=False)
    gevent.spawn_later(0.2, inits.on_message, msg=Message("swarmload_worker_init", None, "w0"))
    assert 0.2 <= wait_for_workers(runner, 1, inits) < 0.5


def test_missing_workers_are_left_to_locusts_own_loop(master: Any) -> None:
    _, runner = master
    assert 0.3 <= wait_for_workers(runner, 1, WorkerInits(runner), max_wait_s=0.3) < 0.6
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


class _Runner:
    """A worker's runner as announce() uses it: what it sent, the handlers it registered."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.handlers: dict[str, Any] = {}

    def send_message(self, msg_type: str, _data: Any = None, client_id: str | None = None
                     ) -> None:
        self.sent.append(msg_type)

    def register_message(self, msg_type: str, listener: Any) -> None:
        self.handlers[msg_type] = listener


def test_a_worker_announces_again_until_the_master_answers() -> None:
    worker = _Runner()
    announcing = announce(worker, every_s=0.02, for_s=5.0)
    gevent.sleep(0.09)
    assert worker.sent.count(INIT_MESSAGE) >= 3  # none answered yet: sent again
    worker.handlers[INIT_ACK_MESSAGE](msg=Message(INIT_ACK_MESSAGE, None, "master"))
    announcing.join(timeout=1)
    assert announcing.dead
    sent = len(worker.sent)
    gevent.sleep(0.06)
    assert len(worker.sent) == sent


def test_the_master_answers_every_announcement_and_counts_a_worker_once() -> None:
    master = _Runner()
    inits = WorkerInits(master)
    connected: list[str] = []
    inits.listeners.append(connected.append)
    for _ in range(3):
        inits.on_message(msg=Message(INIT_MESSAGE, None, "w0"))
    assert master.sent == [INIT_ACK_MESSAGE] * 3
    assert connected == ["w0"] and inits.done == {"w0"}


_SLOW_INIT_LOCUSTFILE = """
import gevent
from locust import events
from locust.runners import MasterRunner


@events.init.add_listener
def _own_setup(environment, **_kwargs):
    # a user's own set-up ahead of swarmload's (fetching a token, say): the master's loop runs
    # meanwhile, answers the waiting worker, and gets that worker's announcement
    if isinstance(environment.runner, MasterRunner):
        gevent.sleep({pause_s})


from locustfiles.llm_user import *  # noqa: E402,F403
"""


@pytest.mark.slow
def test_a_worker_announced_while_the_masters_init_waited_gets_its_clock_exchange(
        tmp_path: Path) -> None:
    """A worker already waiting when the master starts is answered while the master's ``init``
    yields, before swarmload's handlers are registered: its first announcement is dropped as an
    unknown message. It announces again, and the master still measures its clock and names its
    host (the compose file's order: workers up before their master)."""
    locustfile = tmp_path / "own_locustfile.py"
    locustfile.write_text(_SLOW_INIT_LOCUSTFILE.format(pause_s=3.0))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1",
           clock_sync.HOST_ENV: "worker-host-a"}
    with running_simulator(fixed_ttft_s=0.01, fixed_itl_s=0.002) as url:
        worker = subprocess.Popen(  # first: it waits for the master, as a container's does
            [sys.executable, "-m", "locust", "-f", str(locustfile), "--worker",
             "--master-port", str(port)], cwd=tmp_path, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            master = subprocess.run(
                [sys.executable, "-m", "locust", "-f", str(locustfile), "--master",
                 "--headless", "--expect-workers", "1", "--master-bind-port", str(port),
                 "-u", "2", "-r", "2", "-t", "2s", "--host", url, "--only-summary",
                 "--swarmload-max-tokens", "4"],
                cwd=tmp_path, env={**env, clock_sync.HOST_ENV: "master-host"},
                capture_output=True, text=True, timeout=120)
            worker.wait(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
    assert master.returncode in (0, 1), master.stderr[-3000:]
    # the first announcement was dropped: this test reaches the case it is about
    assert "Unknown message type received from worker" in master.stderr, master.stderr[-3000:]
    (stats,) = tmp_path.glob("results/*/recorder_stats.json")
    clock = json.loads(stats.read_text())["clock"]
    assert [entry["host"] for entry in clock.values()] == ["worker-host-a"], clock
    assert all(entry["samples"] >= clock_sync.BURST for entry in clock.values()), clock
