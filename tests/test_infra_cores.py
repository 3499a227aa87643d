"""``swarmload run --pin-workers``: each local worker on a CPU core of its own, the master, the
collectors and a target started by the run on the others (infra/cores.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from infra.cores import CorePlan, rest_of_the_run

REPO_ROOT = Path(__file__).resolve().parent.parent
CORES = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs two cores")


def _role(cmdline: list[str]) -> str:
    if "--worker" in cmdline:
        return "worker"
    if "--master" in cmdline:
        return "master"
    if any("simulator" in part for part in cmdline):
        return "simulator"
    if "collect" in cmdline:
        return "collector"
    return "other"


@needs_two_cores
def test_a_pinned_worker_shares_its_core_with_no_process_of_the_run(tmp_path: Path) -> None:
    run = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "run", "--target", "sim", "--workers", "1",
         "--duration", "4", "--pin-workers", "--results", str(tmp_path), "--run-id", "pinned"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # each process's cores as last seen (a worker is moved right after it starts: a look in
    # between sees the cores it was started with)
    last: dict[int, tuple[str, set[int]]] = {}
    deadline = time.monotonic() + 90
    while run.poll() is None and time.monotonic() < deadline:
        for child in psutil.Process(run.pid).children(recursive=True):
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    continue  # an exited process: no command line, not scheduled any more
                role = _role(child.cmdline())
                if role == "other" and child.pid in last:
                    # forked but not yet exec'd reads as its parent; what it became stands
                    role = last[child.pid][0]
                cores: set[int] = set()
                for thread in child.threads():
                    cores.update(os.sched_getaffinity(thread.id))
                last[child.pid] = (role, cores)
            except (psutil.Error, ProcessLookupError):
                continue
        time.sleep(0.1)
    out = run.communicate(timeout=30)[0]
    seen: dict[str, set[int]] = {}  # role -> the cores its processes had, last seen
    for role, cores in last.values():
        seen.setdefault(role, set()).update(cores)
    assert run.returncode == 0, out[-2000:]
    worker_core = CORES[-1]
    assert seen["worker"] == {worker_core}, seen
    for role in ("master", "simulator", "collector"):
        assert role in seen and worker_core not in seen[role], seen
    manifest = json.loads((tmp_path / "pinned" / "manifest.json").read_text())
    assert manifest["cpu_cores"] == {"workers": {"worker-0": [worker_core]}, "rest": CORES[:-1]}
    assert "worker-0 on [" in out


@needs_two_cores
def test_more_workers_than_cores_to_spare_is_refused_before_anything_starts(
        tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "run", "--target", "sim", "--workers",
         str(len(CORES)), "--duration", "2", "--pin-workers", "--results", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--pin-workers" in done.stderr and "need a core each and one more" in done.stderr
    assert not any(tmp_path.iterdir())  # no run folder


@needs_two_cores
def test_the_rest_of_the_run_moves_what_it_started_and_gives_its_cores_back() -> None:
    before = os.sched_getaffinity(0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with rest_of_the_run(CorePlan((CORES[-1],), tuple(CORES[:-1]))):
            assert os.sched_getaffinity(0) == set(CORES[:-1])
            assert os.sched_getaffinity(child.pid) == set(CORES[:-1])  # started before
        assert os.sched_getaffinity(0) == before
    finally:
        child.kill()
        child.wait()
