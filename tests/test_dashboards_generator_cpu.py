"""The generator-CPU check: a worker at a full core is reported, an idle one is not."""

from __future__ import annotations

import pandas as pd

from collectors.schemas import HOST_KIND_PROCESS, HOST_KIND_SYSTEM
from dashboards.analysis.generator_cpu import generator_cpu, generator_remedy


def _rows(pid: int, selector: str, cpu: list[float], wait: float | None = None) -> list[dict]:
    return [{"kind": HOST_KIND_PROCESS, "pid": pid, "selector": selector, "cpu_pct": c,
             "wait_pct": wait, "wall_ns": i} for i, c in enumerate(cpu)]


def test_busy_worker_is_flagged_and_master_and_server_are_told_apart() -> None:
    host = pd.DataFrame(
        _rows(1, "name:run-x.*--worker", [0.0, 99.0, 98.0, 97.0, 40.0])
        + _rows(2, "name:run-x.*--master(?!-)", [0.0, 5.0, 6.0, 5.0, 5.0])
        + _rows(3, "pid", [0.0, 100.0, 100.0, 100.0, 100.0])  # the server: not the generator
    )
    table = generator_cpu(host).set_index("pid")
    assert set(table.index) == {1, 2}
    assert table.loc[1, "role"] == "worker" and table.loc[1, "busy_share"] == 0.75
    assert table.loc[2, "role"] == "master" and table.loc[2, "busy_share"] == 0.0


def _system(cpu: list[float], cores: int = 2) -> list[dict]:
    return [{"kind": HOST_KIND_SYSTEM, "sys_cpu_pct": c, "sys_cpu_count": cores, "wall_ns": i}
            for i, c in enumerate(cpu)]


def test_a_starved_host_is_told_from_too_few_workers() -> None:
    worker = "name:run-x.*--worker"
    # every core busy, the two workers at a third of a core each: the host is short of CPU
    starved = pd.DataFrame(_rows(1, worker, [0.0, 30.0, 35.0, 33.0, 30.0])
                           + _rows(2, worker, [0.0, 31.0, 30.0, 34.0, 29.0])
                           + _system([0.0, 100.0, 99.0, 97.0, 98.0]))
    remedy = generator_remedy(starved, workers=2)
    assert remedy.startswith("The host is CPU-STARVED: all 2 cores were busy in 100%")
    assert "more workers would compete for the same cores" in remedy
    # one worker at a full core on an 8-core host with cores to spare: add workers
    short = pd.DataFrame(_rows(1, worker, [0.0, 99.0, 99.0, 98.0, 99.0])
                         + _system([0.0, 20.0, 22.0, 21.0, 20.0], cores=8))
    assert generator_remedy(short, workers=1).startswith("Add workers (--workers 2; this host "
                                                         "has 8 cores)")
    # a worker on every core already: more workers cannot help
    assert generator_remedy(short, workers=8).startswith("Every one of the 8 cores has a worker")



def test_workers_that_waited_for_a_core_make_a_busy_host_starved_and_others_do_not() -> None:
    worker = "name:run-x.*--worker"
    busy = _system([0.0, 100.0, 99.0, 97.0, 98.0])
    waiting = pd.DataFrame(_rows(1, worker, [0.0, 30.0, 35.0, 33.0, 30.0], wait=40.0) + busy)
    remedy = generator_remedy(waiting, workers=2)
    assert remedy.startswith("The host is CPU-STARVED") and "waiting for one 40% of the time" \
        in remedy
    # every core busy, but the workers got theirs whenever they were ready: not starved
    served = pd.DataFrame(_rows(1, worker, [0.0, 30.0, 35.0, 33.0, 30.0], wait=1.0) + busy)
    assert not generator_remedy(served, workers=1).startswith("The host is CPU-STARVED")
