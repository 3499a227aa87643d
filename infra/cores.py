"""CPU cores for a run's processes (``swarmload run --pin-workers``, ``swarmload bench
--pin-workers``): a core of its own for each worker process, the others for everything else (the
run itself, the target, the master, the collectors).

A worker that shares its core with the target or the master is taken off it for a scheduler
tick now and then, and the sends due meanwhile go out late: on the 2-core machines schedule lag
P99 was 0.15-0.27 ms at 1,000-2,000 req/s with the worker free to move, 0.12-0.19 ms on a core of
its own (docs/results/hotpath/index.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import psutil


class CorePlanError(ValueError):
    """Too few cores for a core each and one more; says how many there are."""


@dataclass(frozen=True)
class CorePlan:
    """A core of its own for each worker process, and the others for everything else (this
    process, the target, the master): a worker then shares its core with nothing of the run."""

    workers: tuple[int, ...]
    rest: tuple[int, ...]


def core_plan(workers: int) -> CorePlan:
    """The last ``workers`` of the cores this process may use for the workers, the rest for
    the rest; CorePlanError when that leaves nothing for the rest."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) <= workers:
        raise CorePlanError(f"{workers} worker(s) need a core each and one more for the target "
                            f"and the master; this process may use {len(allowed)}")
    return CorePlan(tuple(allowed[len(allowed) - workers:]),
                    tuple(allowed[:len(allowed) - workers]))


def set_cores(pid: int, cores: Iterable[int]) -> frozenset[int]:
    """Every thread of process ``pid`` onto ``cores`` (a thread keeps the cores it had when a
    later one is set for its process); returns the process's cores as read back."""
    wanted = set(cores)
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        threads = [pid]
    for tid in threads:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.sched_setaffinity(tid, wanted)
    return frozenset(os.sched_getaffinity(pid))


@contextlib.contextmanager
def rest_of_the_run(plan: CorePlan) -> Iterator[None]:
    """This process and every process it has started (a study's replicas, already up) on
    ``plan.rest`` for the block, and so every process it starts meanwhile but the workers, which
    the caller moves to their own cores; this process's cores as they were after it."""
    before = os.sched_getaffinity(0)
    set_cores(os.getpid(), plan.rest)
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            set_cores(child.pid, plan.rest)
    try:
        yield
    finally:
        set_cores(os.getpid(), before)
