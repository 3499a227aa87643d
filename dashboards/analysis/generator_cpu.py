"""Was the load generator's CPU the bottleneck, and why? A check over a run's host samples.

``swarmload run`` has its collector watch the run's Locust processes by command line (selectors
``name:--swarmload-run-id <run id> .*--worker`` and ``...--master(?!-)``; see
``infra.orchestrate``). A
gevent worker uses one core at most, so a worker near 100% of a core for a good part of the run
queued its own requests: its latencies include the generator's own waiting, whatever the schedule
lag says (closed-loop runs have no schedule lag at all).

Two causes are told apart, since their remedies are opposite: a worker at a full core while
the host had cores to spare (too few workers: add some) and a **starved host**, every core busy
(the system sample at or above :data:`BUSY_CPU_PCT` in :data:`BUSY_SHARE` of the samples or
more) while the workers got less than a core each: other processes (the target beside them,
other jobs) took the CPU, and more workers would only compete for the same cores.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from collectors.percentiles import percentile
from collectors.run_folder import load_host, load_manifest
from collectors.schemas import HOST_KIND_SYSTEM

BUSY_CPU_PCT = 90.0  # of one core
BUSY_SHARE = 0.25  # of a process's samples
HOST_STARVED = "HOST CPU-STARVED"  # opens the warning, which is no verdict on the figures
# A worker that waited for a core this much of the time (median of its samples, the host
# samples' wait_pct) did not get its CPU
STARVED_WAIT_PCT = 10.0


def generator_cpu(host: pd.DataFrame) -> pd.DataFrame:
    """Per Locust process of the run: role, samples, median/p90/max CPU % of one core, the
    share of samples at or above :data:`BUSY_CPU_PCT`, and the median share of the time it
    waited for a core (``wait_p50_pct``; NaN for runs sampled before ``wait_pct`` existed)."""
    if host.empty or "selector" not in host:
        return pd.DataFrame()
    selector = host["selector"].fillna("")
    procs = host[(host["kind"] == "process") & selector.str.startswith("name:")
                 & selector.str.contains("--(?:worker|master)", regex=True)
                 & host["cpu_pct"].notna()]
    rows = []
    for (pid, selector), group in procs.groupby(["pid", "selector"]):
        group = group.sort_values("wall_ns")
        cpu = group["cpu_pct"].to_numpy(dtype=float)[1:]  # 1st is 0
        if cpu.size == 0:
            continue
        wait = (group["wait_pct"].dropna().to_numpy(dtype=float) if "wait_pct" in group
                else np.empty(0))
        rows.append({"pid": int(pid), "role": "worker" if "--worker" in selector else
                     "master", "samples": int(cpu.size), "cpu_p50_pct": float(np.median(cpu)),
                     "cpu_p90_pct": percentile(cpu, 90), "cpu_max_pct": float(cpu.max()),
                     "busy_share": float((cpu >= BUSY_CPU_PCT).mean()),
                     "wait_p50_pct": float(np.median(wait)) if wait.size else float("nan")})
    return pd.DataFrame(rows)


def host_busy(host: pd.DataFrame) -> tuple[float, int]:
    """(share of the host's system samples with all cores together at or above
    :data:`BUSY_CPU_PCT`, its core count); (NaN, 0) without system samples."""
    if host.empty or "kind" not in host or "sys_cpu_pct" not in host:
        return float("nan"), 0
    system = host[host["kind"] == HOST_KIND_SYSTEM].sort_values("wall_ns")
    cpu = system["sys_cpu_pct"].to_numpy(dtype=float)[1:]  # the 1st is 0 (psutil's first call)
    cpu = cpu[~np.isnan(cpu)]
    cores = system["sys_cpu_count"].dropna()
    count = int(cores.iloc[-1]) if len(cores) else 0
    return (float((cpu >= BUSY_CPU_PCT).mean()) if cpu.size else float("nan")), count


def generator_remedy(host: pd.DataFrame, workers: int | None) -> str:
    """What to change where the generator limited a run, from what limited it: a starved host
    (every core busy, the workers short of a core each), a worker at a full core with cores
    to spare (add workers, to how many), or every core already with a worker."""
    busy_share, cores = host_busy(host)
    table = generator_cpu(host)
    worker_rows = table[table["role"] == "worker"] if len(table) else table
    full = bool(len(worker_rows)) and bool((worker_rows["busy_share"] >= BUSY_SHARE).any())
    waited = (worker_rows["wait_p50_pct"].dropna() if len(worker_rows)
              and "wait_p50_pct" in worker_rows else pd.Series(dtype=float))
    # the workers not getting their CPU: they waited for a core (where the samples say), or,
    # in runs sampled before that, none was at a full core while every core was busy
    short = bool((waited >= STARVED_WAIT_PCT).any()) if len(waited) else not full
    if busy_share == busy_share and busy_share >= BUSY_SHARE and short:
        p90 = (f", the workers {worker_rows['cpu_p90_pct'].max():.0f}% of a core at p90"
               if len(worker_rows) else "")
        wait = (f" and waiting for one {waited.max():.0f}% of the time (median)"
                if len(waited) else "")
        return (f"The host is CPU-STARVED: all {cores} cores were busy in {busy_share:.0%} of "
                f"the samples{p90}{wait}; more workers would compete for the same cores. Stop "
                "other work on this host, run the target on another machine, or lower the "
                "load.")
    if workers and cores and workers < cores:
        more = min(cores, workers * 2)
        return (f"Add workers (--workers {more}; this host has {cores} cores), or lower the "
                "rate.")
    if workers and cores:
        return (f"Every one of the {cores} cores has a worker: lower the load, or add a "
                "load-generator host (swarmload worker).")
    return "Add workers or lower the rate."


def run_remedy(run_dir: str | Path) -> str:
    """:func:`generator_remedy` of a run folder (its host samples and manifest)."""
    try:
        host = load_host(run_dir)
    except (FileNotFoundError, OSError, ValueError):
        host = pd.DataFrame()
    workers = (load_manifest(run_dir).get("load") or {}).get("workers")
    return generator_remedy(host, int(workers) if workers else None)


def host_starved_warning(run_dir: str | Path) -> list[str]:
    """One warning when the run's host was CPU-starved (see the module docstring), else none:
    a fact about the run, said even where its figures held."""
    try:
        host = load_host(run_dir)
    except (FileNotFoundError, OSError, ValueError):
        return []
    remedy = generator_remedy(host, None)
    starved = "The host is CPU-STARVED: "
    return [f"{HOST_STARVED}: {remedy.removeprefix(starved)}"] if remedy.startswith(
        starved) else []


def generator_cpu_warnings(run_dir: str | Path) -> list[str]:
    """Loud warnings for each Locust process that sat near a full core (empty if none, or no
    host samples)."""
    try:
        table = generator_cpu(load_host(run_dir))
    except (FileNotFoundError, OSError, ValueError):
        return []
    warnings = []
    remedy = ""
    for row in table.itertuples(index=False):
        if row.busy_share >= BUSY_SHARE:
            remedy = remedy or run_remedy(run_dir)
            warnings.append(
                f"GENERATOR CPU-BOUND: {row.role} pid {row.pid} used >= {BUSY_CPU_PCT:.0f}% of a "
                f"core in {row.busy_share:.0%} of {row.samples} samples (p90 "
                f"{row.cpu_p90_pct:.0f}%); the generator, not the server, may have been the "
                f"bottleneck. {remedy}"
            )
    return warnings
