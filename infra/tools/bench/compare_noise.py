"""``swarmload bench compare``: does ``swarmload compare`` tell noise from a real change?

Two known answers, on real runs (``swarmload run``: Locust master + worker, streaming) against the
simulator in fixed-timing mode with a log-normal spread of first-token delays:

- **same configuration**: ``--repeats + 1`` runs against one simulator; each run compared with the
  next (``--repeats`` pairs). Every figure of a pair should come out "within noise" in at least
  19 of 20 pairs (the intervals are simultaneous over the figures at 95%).
- **+8%**: ``--slower-runs`` runs against a second simulator whose first-token delays are 8%
  longer, each compared with a baseline run: P50 TTFT should come out "worse", its interval
  covering 8%.

Prints a table and writes ``--out`` (JSON) with every pair's verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dashboards.analysis import compare
from infra.paths import PACKAGE_ROOT as REPO_ROOT
from infra.targets.simulator.launcher import running_simulator
from infra.targets.simulator.settings import SimulatorConfig


def _simulator(ttft_s: float, itl_s: float) -> SimulatorConfig:
    return SimulatorConfig(fixed_ttft_s=ttft_s, fixed_itl_s=itl_s, fixed_ttft_jitter=0.2)


def _run(base_url: str, results: Path, run_id: str, args: argparse.Namespace) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "run", "--target", base_url, "--workers", "1",
         "--users", str(args.users), "--duration", f"{args.duration:g}", "--max-tokens", "4",
         "--mix", "100/0/0", "--no-collectors", "--quiet", "--results", str(results),
         "--run-id", run_id],
        cwd=REPO_ROOT, text=True, capture_output=True, timeout=args.duration + 120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"run {run_id} failed: {done.stderr[-2000:]}")
    return results / run_id


def _pair(a: Path, b: Path) -> list[dict[str, Any]]:
    changes = compare.compare_items(compare.resolve(a), compare.resolve(b))
    return [{"figure": c.figure, "change": c.change, "low": c.low, "high": c.high,
             "verdict": c.verdict, "n_a": c.n_a, "n_b": c.n_b} for c in changes]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swarmload bench compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20, help="same-configuration pairs")
    parser.add_argument("--slower-runs", type=int, default=5, help="+8%% runs (0: none)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--ttft", type=float, default=0.5, help="baseline first-token delay, s")
    parser.add_argument("--itl", type=float, default=0.02,
                        help="gap between tokens, s: long beside the host's own scheduling "
                        "delays, which differ from run to run on a busy machine")
    parser.add_argument("--out", type=Path, default=None, help="JSON with every pair")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.slower_runs < 0 or args.duration <= 0:
        parser.error("--repeats >= 1, --slower-runs >= 0, --duration > 0")
    started = time.time()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="swarmload-compare-") as tmp:
        results = Path(tmp)
        with running_simulator(_simulator(args.ttft, args.itl)) as url:
            same = [_run(url, results, f"same-{i:02d}", args) for i in range(args.repeats + 1)]
        slower: list[Path] = []
        if args.slower_runs:
            with running_simulator(_simulator(args.ttft * 1.08, args.itl)) as url:
                slower = [_run(url, results, f"slower-{i:02d}", args)
                          for i in range(args.slower_runs)]
        same_pairs = [_pair(same[i], same[i + 1]) for i in range(args.repeats)]
        slower_pairs = [_pair(same[i], run) for i, run in enumerate(slower)]
    clean = sum(all(f["verdict"] == "within noise" for f in pair) for pair in same_pairs)
    flagged = Counter(f["figure"] for pair in same_pairs for f in pair
                      if f["verdict"] != "within noise")
    print(f"\nsame configuration: {clean} of {len(same_pairs)} pairs within noise on every "
          f"figure ({len(same_pairs[0])} figures, simultaneous 95%)")
    if flagged:
        print("  figures called different: " + ", ".join(f"{k} x{v}" for k, v in flagged.items()))
    medians = [next(f for f in pair if f["figure"] == "ttft_p50") for pair in slower_pairs]
    if medians:
        worse = sum(m["verdict"] == "worse" for m in medians)
        covered = sum(m["low"] <= 0.08 <= m["high"] for m in medians)
        print(f"+8% first-token delay: P50 TTFT 'worse' in {worse} of {len(medians)}, interval "
              f"covering +8% in {covered} of {len(medians)}")
        for m in medians:
            print(f"  {m['change']:+.1%} [{m['low']:+.1%}, {m['high']:+.1%}] n={m['n_a']}/"
                  f"{m['n_b']} {m['verdict']}")
    print(f"took {time.time() - started:.0f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"same_pairs": same_pairs, "slower_pairs": slower_pairs,
                                        "args": {k: str(v) for k, v in vars(args).items()}},
                                       indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
