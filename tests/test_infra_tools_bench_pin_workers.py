"""``swarmload bench --pin-workers``: each worker process on a core of its own, the rest of the
bench (target, master) on the others, for whichever tree's swarmload runs."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from infra.cores import CorePlanError, core_plan
from infra.tools.bench.steps import _pin_workers


def test_the_workers_take_the_last_cores_and_leave_one_at_least(monkeypatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    plan = core_plan(2)
    assert (plan.workers, plan.rest) == ((2, 3), (0, 1))
    with pytest.raises(CorePlanError, match="need a core each and one more"):
        core_plan(4)
    assert core_plan(0) == type(plan)((), (0, 1, 2, 3))  # none pinned: every core for the rest


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_worker_process_is_moved_to_its_core_as_it_starts() -> None:
    core = max(os.sched_getaffinity(0))
    starter = (  # a run that starts a "--worker" child a moment later, as swarmload run does
        "import subprocess, sys, time; time.sleep(0.2); "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3)', "
        "'--worker']); print(child.pid, flush=True); child.wait()")
    run = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    threading.Thread(target=_pin_workers, args=(run, (core,)), daemon=True).start()
    assert run.stdout is not None
    worker = int(run.stdout.readline())
    deadline = time.monotonic() + 2.5
    while os.sched_getaffinity(worker) != {core} and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        assert os.sched_getaffinity(worker) == {core}
        assert os.sched_getaffinity(run.pid) != {core} or len(os.sched_getaffinity(0)) == 1
    finally:
        run.wait(timeout=10)
