"""Where in each step of a bench run its late sends were: ``python -m infra.tools.bench.lag_steps
RESULTS_DIR`` prints, for every run folder under it (``swarmload-*``), each step's schedule lag
P50 / P99 / max, how many sends were later than 0.2, 0.5 and 2 ms, and the five latest sends with
their time into the step. Steps are told apart by the gaps in the planned times (``--gap-s`` of
the bench)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

LATE_MS = (0.2, 0.5, 2.0)  # sends later than these are counted per step

def describe(run_dir: Path, gap_s: float = 0.5) -> list[str]:
    from collectors.run_folder import load_requests

    requests = load_requests(run_dir).sort_values("scheduled_wall_ns")
    lag_ms = requests["schedule_lag_s"].to_numpy(dtype=float) * 1e3
    planned = requests["scheduled_wall_ns"].to_numpy(dtype=np.int64)
    t = (planned - planned.min()) / 1e9
    lines = []
    for part in np.split(np.arange(len(t)), np.flatnonzero(np.diff(t) > gap_s) + 1):
        if not len(part):
            continue
        lag, at = lag_ms[part], t[part]
        span = max(at[-1] - at[0], 1e-9)
        worst = np.argsort(lag)[::-1][:5]
        late = ", ".join(f"{at[i] - at[0]:.3f} s: {lag[i]:.2f} ms" for i in sorted(worst))
        p50, p99 = np.median(lag), np.percentile(lag, 99)
        counts = " ".join(f">{limit:g}ms {int((lag > limit).sum())}" for limit in LATE_MS)
        lines.append(f"{run_dir.name} step at {at[0]:6.2f} s: n={len(part)} rate "
                     f"{len(part) / span:6.0f} lag p50 {p50:.3f} p99 {p99:.3f} max "
                     f"{lag.max():.2f} ms; {counts}; latest at {late}")
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m infra.tools.bench.lag_steps", description=__doc__)
    p.add_argument("results", type=Path, help="a bench's folder (results/bench-...)")
    p.add_argument("--gap-s", type=float, default=0.5, help="a gap in planned times this long "
                   "or longer starts a new step")
    args = p.parse_args(argv)
    for run_dir in sorted(args.results.glob("swarmload-*")):
        print("\n".join(describe(run_dir, args.gap_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
