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
two studies' intervals overlap (:mod:`infra.tools.bench.study_repeatability`). Exits 1 unless every
figure is within ``--tolerance-pct`` (3) of C with an interval that holds it.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from collectors.run_folder import load_study_meta
from infra.tools.bench.study_repeatability import (
    capacity_rows,
    repeatability_lines,
    studies_parser,
    write_csv,
)

KNOWN_FIGURES = ("max sustainable load", "knee")  # held to C; the latency bend is shown
SHOWN_FIGURES = (*KNOWN_FIGURES, "latency bend")


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
    """The study's knee and max sustainable load rows (study_repeatability.capacity_rows) of
    each qualifying configuration, with its capacity, error and whether the interval holds
    it."""
    meta = load_study_meta(study_dir)
    max_tokens = int((meta.get("workload") or {}).get("max_tokens") or 0)
    capacities = {c["name"]: analytic_capacity(c, max_tokens)
                  for c in meta.get("configurations") or []}
    rows = []
    for row in capacity_rows(study_dir):
        c = capacities.get(row["config"], math.nan)
        if math.isnan(c) or row["figure"] not in SHOWN_FIGURES:
            continue
        rows.append({**row, "capacity": c, "error_pct": (row["value"] - c) / c * 100,
                     "covers": bool(row["lo"] <= c <= row["hi"])})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = studies_parser("infra.tools.bench.study_known_answers", __doc__)
    parser.add_argument("--tolerance-pct", type=float, default=3.0,
                        help="the largest error that counts as a known answer met (%%)")
    args = parser.parse_args(argv)
    rows = [r for d in args.study_dirs for r in rows_of(d)]
    if not rows:
        print("no qualifying simulator configuration in these studies", file=sys.stderr)
        return 2
    print("| study | configuration | C (req/s) | figure | value | 95% interval | error | "
          "interval holds C | repeats | loads (refined) | requests |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['study']} | {r['config']} | {r['capacity']:g} | {r['figure']} | "
              f"{r['value']:.2f} | [{r['lo']:.2f}, {r['hi']:.2f}] | {r['error_pct']:+.1f}% | "
              f"{'yes' if r['covers'] else 'no'} | {r['repeats']} | {r['loads']} "
              f"({r['refined']}) | {r['requests']} |")
    frame = pd.DataFrame(rows)
    bend = frame[frame["figure"] == "latency bend"]
    frame = frame[frame["figure"].isin(KNOWN_FIGURES)]
    met = (frame["error_pct"].abs() <= args.tolerance_pct) & frame["covers"]
    print(f"\n{len(frame)} figures: {(frame['error_pct'].abs() <= args.tolerance_pct).mean():.0%}"
          f" within {args.tolerance_pct:g}% of C, {frame['covers'].mean():.0%} of intervals hold"
          f" C, {met.mean():.0%} both; largest error {frame['error_pct'].abs().max():.1f}%")
    if len(bend):  # not held to C: latency leaves its floor before the queue saturates
        print(f"latency bend (shown, not held to C): errors {bend['error_pct'].min():+.1f}% to "
              f"{bend['error_pct'].max():+.1f}%, median {bend['error_pct'].median():+.1f}%")
    lines, _apart = repeatability_lines(rows)
    print("\nrepeatability across the studies:")
    print("\n".join(lines) or "  (one study: nothing to compare)")
    if args.csv:
        write_csv(rows, args.csv)
    return 0 if met.all() else 1


if __name__ == "__main__":
    sys.exit(main())
