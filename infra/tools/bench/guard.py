"""The hot path's guard (``swarmload bench guard``): one worker's speed as a ratio to a bare
client's, measured in the same run against the same lean target, in turn.

What it measures, per turn:

- **swarmload**: a real ``swarmload run`` (master + one worker, open loop, records journalled
  and sent to the master as always) at ``--rate`` req/s for ``--seconds``; the worker's CPU time
  (``/proc`` through psutil, sampled every 50 ms) per request completed, from the first quarter
  of the completions to the last. The default rate is above a worker's ceiling on these
  machines: the worker runs flat out, as at its ceiling (and as when it is overloaded, where
  the landed code of 2026-12-01 spent a third more per request than before). Its inverse is
  the requests one core carries: the worker's ceiling when CPU is the limit, which it is
  against a target that answers at once.
- **reference**: the bare client of ``swarmload bench hotpath`` (``ghc-readline``:
  geventhttpclient's C parser and readline, the byte-level content test, nothing else) streaming
  back to back from its own process for the same number of seconds; its CPU time per request.

``ratio`` = reference CPU per request / worker CPU per request: the share of a bare client's
speed the worker keeps (1.0: as fast as the bare client). CPU time, not requests/s, because the
machines this runs on are shared: another process's load takes wall time from both, but not the
CPU time a request costs (measured: docs/results/hotpath/). Turns alternate reference, worker,
reference, worker, ...; the result is the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from infra.tools.bench.lean_target import BenchError, running_lean_target
from infra.tools.bench.steps import (
    parse_codes,
    run_swarmload,
    stepped_offsets,
    write_bench_workload,
)


def _worker_of(run_dir: Path) -> psutil.Process | None:
    """The Locust worker of the run writing into ``run_dir`` (its command line names it)."""
    needle = str(run_dir)
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if "--worker" in cmdline and any(needle in part for part in cmdline):
            return proc
    return None


class _CpuSampler(threading.Thread):
    """(wall ns, CPU seconds) of the run's worker every ``interval_s`` until stopped."""

    def __init__(self, run_dir: Path, interval_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.interval_s = run_dir, interval_s
        self.samples: list[tuple[int, float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        proc = None
        while not self.done.is_set():
            try:
                proc = proc or _worker_of(self.run_dir)
                if proc is not None:
                    times = proc.cpu_times()
                    self.samples.append((time.time_ns(), times.user + times.system))
            except psutil.Error:
                proc = None  # gone (the run ended) or not readable
            self.done.wait(self.interval_s)


def worker_cost(url: str, workdir: Path, tag: str, rate: float, seconds: float,
                tokens: int, code: Path | None = None) -> dict[str, Any]:
    """One ``swarmload run`` at ``rate``: the worker's CPU microseconds per request completed
    after the first quarter of them (warm-up: connections, first leases) until the last."""
    offsets, _ = stepped_offsets([rate], seconds, 0.0, seed=3)
    workload = write_bench_workload(workdir / f"workload-{tag}", offsets, 16, tokens)
    run_id = f"guard-{tag}"
    sampler = _CpuSampler(workdir / run_id)
    sampler.start()
    try:
        df = run_swarmload(url, workload, float(offsets.max()) + 0.5, workers=1,
                           results=workdir, run_id=run_id, code=code)
    finally:
        sampler.done.set()
        sampler.join(5)
    # completions, not sends: a worker that falls behind sends in bursts and reads later
    ends = np.sort((df["sent_wall_ns"] + df["e2e_s"].fillna(0.0) * 1e9).dropna()
                   .to_numpy(dtype=np.int64))
    if len(sampler.samples) < 4 or ends.size < 10:
        raise BenchError(f"guard {tag}: too little to measure ({len(sampler.samples)} CPU "
                         f"samples, {ends.size} requests)")
    first = ends.size // 4  # the middle of the load: after its first quarter of completions
    start, end = ends[first], ends[-1]
    wall = np.array([t for t, _ in sampler.samples], dtype=np.int64)
    cpu = np.array([c for _, c in sampler.samples])
    used_s = float(np.interp(end, wall, cpu) - np.interp(start, wall, cpu))
    requests = int(ends.size - first - 1)
    ok = int((df["outcome"] == "ok").sum())
    return {"rate": rate, "requests": requests, "ok": ok, "records": len(df),
            "cpu_s": used_s, "cpu_us_per_request": 1e6 * used_s / max(requests, 1),
            "lag_p99_s": float(np.nanpercentile(df["schedule_lag_s"].to_numpy(dtype=float),
                                                99)) if len(df) else None}


def reference_cost(url: str, seconds: float, tokens: int, concurrency: int = 8) -> dict[str, Any]:
    """The bare client's CPU microseconds per request, in its own process."""
    from infra.tools.bench.hotpath import compare

    (result,) = compare(url, ["ghc-readline"], concurrency, seconds, tokens)
    return result


def measure(*, rate: float = 4000.0, seconds: float = 2.0, ref_seconds: float = 2.0,
            rounds: int = 2, tokens: int = 64, workdir: Path,
            codes: list[tuple[str, Path | None]] | None = None,
            progress: Any = None) -> dict[str, Any]:
    """Rounds of reference then each tree's worker, against one lean target; the median ratio
    per tree (:data:`__doc__`)."""
    codes = codes or [("this", None)]
    turns: list[dict[str, Any]] = []
    with running_lean_target(None) as url:
        for round_no in range(1, rounds + 1):
            ref = reference_cost(url, ref_seconds, tokens)
            turns.append({"round": round_no, "who": "reference", **ref})
            if progress:
                progress(turns[-1])
            for label, tree in codes:
                mine = worker_cost(url, workdir, f"{label}-{round_no}", rate, seconds, tokens,
                                   code=tree)
                mine["ratio"] = ref["cpu_us_per_request"] / mine["cpu_us_per_request"]
                turns.append({"round": round_no, "who": label, **mine})
                if progress:
                    progress(turns[-1])
    ratios = {label: statistics.median(t["ratio"] for t in turns if t["who"] == label)
              for label, _ in codes}
    return {"rate": rate, "seconds": seconds, "tokens": tokens, "turns": turns,
            "ratio": ratios}


def format_guard(result: dict[str, Any]) -> str:
    lines = [f"{'round':>5} {'who':<10} {'CPU us/req':>10} {'req/CPU-s':>9} {'ratio':>6} "
             f"{'lag p99 ms':>10}"]
    for t in result["turns"]:
        us = t["cpu_us_per_request"]
        ratio = f"{t['ratio']:.3f}" if "ratio" in t else "-"
        lag = f"{t['lag_p99_s'] * 1e3:.2f}" if t.get("lag_p99_s") is not None else "-"
        lines.append(f"{t['round']:>5} {t['who']:<10} {us:>10.1f} {1e6 / us:>9.0f} {ratio:>6} "
                     f"{lag:>10}")
    lines.append("median ratio (reference CPU per request / worker's): " + ", ".join(
        f"{label} {ratio:.3f}" for label, ratio in result["ratio"].items()))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="swarmload bench guard", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=4000.0, help="the worker's offered req/s")
    p.add_argument("--seconds", type=float, default=2.0, help="seconds of load per worker turn")
    p.add_argument("--ref-seconds", type=float, default=2.0, help="seconds per reference turn")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--code", action="append", metavar="LABEL=DIR",
                   help="measure the swarmload of this source tree; repeat to compare trees")
    p.add_argument("--results", default="results")
    args = p.parse_args(argv)
    workdir = Path(args.results).resolve() / time.strftime("guard-%Y%m%d-%H%M%S", time.gmtime())
    workdir.mkdir(parents=True)
    try:
        result = measure(rate=args.rate, seconds=args.seconds, ref_seconds=args.ref_seconds,
                         rounds=args.rounds, tokens=args.tokens, workdir=workdir,
                         codes=parse_codes(args.code),
                         progress=lambda t: print(f"round {t['round']} {t['who']}: "
                                                  f"{t['cpu_us_per_request']:.1f} CPU us per "
                                                  "request", flush=True))
    except BenchError as exc:
        print(f"swarmload bench guard: {exc}")
        return 2
    (workdir / "guard.json").write_text(json.dumps(result, indent=1))
    print(format_guard(result))
    print(f"\nfigures: {workdir / 'guard.json'}")
    return 0
