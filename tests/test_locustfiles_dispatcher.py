"""The master's dispatcher on a real MasterRunner: which workers get leases, and with what."""

from __future__ import annotations

import socket
import time
from typing import Any

import gevent
import pytest
from locust.env import Environment
from locust.runners import STATE_MISSING, WorkerNode

from locustfiles.replay import ScheduleDispatcher


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def master() -> Any:
    environment = Environment()
    runner = environment.create_master_runner("127.0.0.1", _free_port())
    yield environment, runner
    runner.quit()


def test_a_worker_gets_no_lease_before_its_clock_offset_is_known(master: Any) -> None:
    """A skewed worker leased to before its first clock exchange would turn the master's due
    times into its own clock with offset 0: every send moved by its skew."""
    environment, runner = master
    sent: list[tuple[str, dict[str, Any]]] = []
    runner.send_message = lambda kind, data, client_id: sent.append((client_id, data))
    for worker in ("early", "late"):
        runner.clients[worker] = WorkerNode(worker)
    known = {"early": 7, "late": None}
    items = [{"seq": i, "rid": f"r{i}", "off": i * 0.01} for i in range(40)]
    dispatcher = ScheduleDispatcher(
        environment, items, run_id="t", run_dir=None, lookahead_s=0.2, start_delay_s=0.0,
        clock_offset_ns=lambda w: known[w] or 0, clock_ready=lambda w: known[w] is not None)
    dispatcher.t0_wall_ns = time.time_ns()

    dispatcher._check_workers()
    dispatcher._lease_due()
    assert sent and {worker for worker, _ in sent} == {"early"}
    assert all(data["clock_offset_ns"] == 7 for _, data in sent)

    known["late"] = -3  # its exchange came back: it joins the rotation
    dispatcher._check_workers()
    dispatcher.lookahead_ns = 10**9
    dispatcher._lease_due()
    offsets = {worker: data["clock_offset_ns"] for worker, data in sent}
    assert offsets == {"early": 7, "late": -3}
    leased = sum(len(data["items"]) for _, data in sent)
    assert leased == len(items) and dispatcher.counts["worker_lost"] == 0


def test_items_wait_while_every_worker_is_on_its_clock_exchange(master: Any) -> None:
    environment, runner = master
    runner.send_message = lambda *_a, **_k: None
    runner.clients["w"] = WorkerNode("w")
    items = [{"seq": i, "rid": f"r{i}", "off": 0.0} for i in range(5)]
    dispatcher = ScheduleDispatcher(environment, items, run_id="t", run_dir=None,
                                    clock_ready=lambda _w: False)
    dispatcher.t0_wall_ns = time.time_ns() - 10**9  # all due already
    dispatcher._check_workers()
    dispatcher._lease_due()
    assert dispatcher.joining == 1 and len(dispatcher.pending) == 5
    assert dispatcher.counts["worker_lost"] == 0  # not lost: leased once the offset is known


def test_what_a_worker_gives_back_after_the_last_lease_is_leased_again(master: Any) -> None:
    """The whole schedule can be leased (seconds ahead) before Locust finds a worker missing:
    its requests not yet due go to the others then, not lost without a record."""
    environment, runner = master
    sent: list[tuple[str, dict[str, Any]]] = []
    runner.send_message = lambda kind, data, client_id: sent.append((client_id, data))
    for worker in ("a", "b"):
        runner.clients[worker] = WorkerNode(worker)
    items = [{"seq": i, "rid": f"r{i}", "off": 1.5 + i * 0.1} for i in range(6)]
    dispatcher = ScheduleDispatcher(environment, items, run_id="t", run_dir=None,
                                    lookahead_s=5.0, tick_s=0.01, drain_timeout_s=1.0)
    dispatcher.t0_wall_ns = time.time_ns()
    loop = gevent.spawn(dispatcher._loop)
    gevent.sleep(0.2)
    leased = {w: {i["seq"] for to, d in sent if to == w for i in d["items"]} for w in "ab"}
    assert leased == {"a": {0, 2, 4}, "b": {1, 3, 5}} and not dispatcher.pending  # draining
    runner.clients["a"].state = STATE_MISSING
    loop.join(timeout=10)
    to_b = [i["seq"] for w, d in sent if w == "b" for i in d["items"]]
    assert sorted(to_b) == [0, 1, 2, 3, 4, 5]
    assert dispatcher.counts["released"] == 3 and dispatcher.counts["worker_lost"] == 0
