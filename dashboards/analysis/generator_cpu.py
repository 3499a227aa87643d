"""Was the load generator's CPU the bottleneck? A check over a run's host samples.

``swarmload run`` has its collector watch the run's Locust processes by command line (selectors
``name:--swarmload-run-id <run id> .*--worker`` and ``...--master(?!-)``; see
``infra.orchestrate``). A
gevent worker uses one core at most, so a worker near 100% of a core for a good part of the run
queued its own requests: its latencies include the generator's own waiting, whatever the schedule
lag says (closed-loop runs have no schedule lag at all).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from collectors.percentiles import percentile
from collectors.run_folder import load_host

BUSY_CPU_PCT = 90.0  # of one core
BUSY_SHARE = 0.25  # of a process's samples


def generator_cpu(host: pd.DataFrame) -> pd.DataFrame:
    """Per Locust process of the run: role, samples, median/p90/max CPU % of one core, and the
    share of samples at or above :data:`BUSY_CPU_PCT`."""
    if host.empty or "selector" not in host:
        return pd.DataFrame()
    selector = host["selector"].fillna("")
    procs = host[(host["kind"] == "process") & selector.str.startswith("name:")
                 & selector.str.contains("--(?:worker|master)", regex=True)
                 & host["cpu_pct"].notna()]
    rows = []
    for (pid, selector), group in procs.groupby(["pid", "selector"]):
        cpu = group.sort_values("wall_ns")["cpu_pct"].to_numpy(dtype=float)[1:]  # 1st is 0
        if cpu.size == 0:
            continue
        rows.append({"pid": int(pid), "role": "worker" if "--worker" in selector else
                     "master", "samples": int(cpu.size), "cpu_p50_pct": float(np.median(cpu)),
                     "cpu_p90_pct": percentile(cpu, 90), "cpu_max_pct": float(cpu.max()),
                     "busy_share": float((cpu >= BUSY_CPU_PCT).mean())})
    return pd.DataFrame(rows)


def generator_cpu_warnings(run_dir: str | Path) -> list[str]:
    """Loud warnings for each Locust process that sat near a full core (empty if none, or no
    host samples)."""
    try:
        table = generator_cpu(load_host(run_dir))
    except (FileNotFoundError, OSError, ValueError):
        return []
    warnings = []
    for row in table.itertuples(index=False):
        if row.busy_share >= BUSY_SHARE:
            warnings.append(
                f"GENERATOR CPU-BOUND: {row.role} pid {row.pid} used >= {BUSY_CPU_PCT:.0f}% of a "
                f"core in {row.busy_share:.0%} of {row.samples} samples (p90 "
                f"{row.cpu_p90_pct:.0f}%); the generator, not the server, may have been the "
                "bottleneck. Add workers."
            )
    return warnings
