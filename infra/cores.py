"""CPU cores for a run's processes: a core of its own for each worker process, the others for
everything else (the run itself, the target, the master, the collectors)."""

from __future__ import annotations

import os
from dataclasses import dataclass


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
