"""Known answers: a study's knee and max sustainable load against each simulator
configuration's analytic capacity, with their intervals and errors.

    python -m infra.tools.bench.study_known_answers results/studies/known-answers-*  [--csv OUT.csv]

A configuration qualifies when its simulator runs the batching model with a fixed decode step
and nothing else (``--decode-per-seq-s=0 --prefill-base-s=0 --prefill-per-token-s=0``) and every
request asks for the same output length (``workload.max_tokens`` with ``ignore_eos``): then each
request holds one of ``max_num_seqs`` slots for ``max_tokens x decode_base_s`` seconds and the
capacity is ``C = max_num_seqs / (max_tokens x decode_base_s)`` req/s. Prints one Markdown row
per study and configuration: C, the figure, its 95% interval, its error against C, whether the
interval holds C; then, per configuration, the half-widths across the studies and whether every
two studies' intervals overlap (repeatability).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from collectors.run_folder import CAPACITY_FILE, ROLLUP_DIR, load_study_meta


def analytic_capacity(config: dict[str, Any], max_tokens: int) -> float:
    """C in req/s of a simulator configuration (module docstring), NaN when it does not
    qualify."""
    args = dict(a.removeprefix("--").split("=", 1) for a in config.get("args") or []
                if isinstance(a, str) and "=" in a)
    if config.get("target") != "sim" or any(float(args.get(k, 1)) != 0 for k in (
            "decode-per-seq-s", "prefill-base-s", "prefill-per-token-s")):
        return math.nan
    return float(args["max-num-seqs"]) / (max_tokens * float(args["decode-base-s"]))


def rows_of(study_dir: Path) -> list[dict[str, Any]]:
    meta = load_study_meta(study_dir)
    capacity = pd.read_parquet(study_dir / ROLLUP_DIR / CAPACITY_FILE).set_index("config")
    max_tokens = int((meta.get("workload") or {}).get("max_tokens") or 0)
    rows = []
    for config in meta.get("configurations") or []:
        c = analytic_capacity(config, max_tokens)
        if math.isnan(c) or config["name"] not in capacity.index:
            continue
        row = capacity.loc[config["name"]]
        for figure, value, lo, hi in (
                ("max sustainable load", row["max_sustainable_load"], row.get("max_load_lo"),
                 row.get("max_load_hi")),
                ("knee", row["knee_load"], row.get("knee_lo"), row.get("knee_hi"))):
            rows.append({"study": meta.get("name") or study_dir.name, "config": config["name"],
                         "capacity": c, "figure": figure, "value": float(value),
                         "lo": float(lo), "hi": float(hi),
                         "error_pct": (float(value) - c) / c * 100,
                         "covers": bool(float(lo) <= c <= float(hi)),
                         "half_width_pct": (float(hi) - float(lo)) / 2 / c * 100,
                         "loads": int(row["steps"]), "refined": int(row.get("refined", 0)),
                         "requests": int(row.get("requests", 0))})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.tools.bench.study_known_answers",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study_dirs", nargs="+", type=Path)
    parser.add_argument("--csv", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = [r for d in args.study_dirs for r in rows_of(d)]
    if not rows:
        print("no qualifying simulator configuration in these studies", file=sys.stderr)
        return 2
    print("| study | configuration | C (req/s) | figure | value | 95% interval | error | "
          "interval holds C | loads (refined) | requests |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['study']} | {r['config']} | {r['capacity']:g} | {r['figure']} | "
              f"{r['value']:.2f} | [{r['lo']:.2f}, {r['hi']:.2f}] | {r['error_pct']:+.1f}% | "
              f"{'yes' if r['covers'] else 'no'} | {r['loads']} ({r['refined']}) | "
              f"{r['requests']} |")
    frame = pd.DataFrame(rows)
    within = (frame["error_pct"].abs() <= 3).mean() * 100
    covers = frame["covers"].mean() * 100
    print(f"\n{len(frame)} figures: {within:.0f}% within 3% of C, {covers:.0f}% of intervals "
          f"hold C; largest error {frame['error_pct'].abs().max():.1f}%")
    print("\nrepeatability: half-widths across the studies (% of C), and whether every two "
          "studies' intervals overlap:")
    for (config, figure), part in frame.groupby(["config", "figure"], sort=False):
        widths = ", ".join(f"{w:.1f}" for w in part["half_width_pct"])
        lo, hi = part["lo"].to_numpy(), part["hi"].to_numpy()
        apart = [(a, b) for a in range(len(part)) for b in range(a + 1, len(part))
                 if lo[a] > hi[b] or lo[b] > hi[a]]
        overlap = "all overlap" if not apart else f"{len(apart)} pair(s) apart: " + ", ".join(
            f"{part['study'].iloc[a]}/{part['study'].iloc[b]}" for a, b in apart)
        print(f"  {config} {figure}: ±{widths}; {overlap}")
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
