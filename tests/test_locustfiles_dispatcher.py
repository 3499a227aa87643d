"""The master's dispatcher on a real MasterRunner: which workers get leases, and with what."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
from locust.env import Environment
from locust.runners import WorkerNode

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
