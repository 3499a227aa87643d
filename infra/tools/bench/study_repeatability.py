"""Repeatability: the same study run two or more times with different seeds. Per configuration
and capacity figure (max sustainable load, knee, throughput ceiling), each study's value, 95%
interval and half-width, and whether every two studies' intervals overlap.

    python -m infra.tools.bench.study_repeatability STUDY_DIR STUDY_DIR [...]  [--csv OUT.csv]

Reads each study's ``rollup/capacity.parquet`` (``swarmload study rollup DIR`` rebuilds it).
Exits 1 when two intervals of the same figure are apart (the studies disagree by more than
their intervals say), 2 when no configuration is in two of the studies.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from collectors.run_folder import CAPACITY_FILE, ROLLUP_DIR, load_study_meta

# (figure, value column, interval columns) of capacity.parquet
FIGURES = (("max sustainable load", "max_sustainable_load", "max_load_lo", "max_load_hi"),
           ("knee", "knee_load", "knee_lo", "knee_hi"),
           ("throughput ceiling", "throughput_ceiling", "throughput_ceiling_lo",
            "throughput_ceiling_hi"),
           ("latency bend", "bend_load", "bend_lo", "bend_hi"))


def capacity_rows(study_dir: Path) -> list[dict[str, Any]]:
    """One row per configuration and figure of a study's capacity table (figures it has)."""
    meta = load_study_meta(study_dir)
    capacity = pd.read_parquet(study_dir / ROLLUP_DIR / CAPACITY_FILE)
    rows = []
    for record in capacity.to_dict("records"):
        for figure, column, lo_column, hi_column in FIGURES:
            value = float(record.get(column, math.nan))
            lo, hi = (float(record.get(lo_column, math.nan)),
                      float(record.get(hi_column, math.nan)))
            if value != value:
                continue
            half = (hi - lo) / 2
            rows.append({"study": meta.get("name") or study_dir.name,
                         "config": record["config"], "figure": figure, "value": value,
                         "lo": lo, "hi": hi, "half_width": half,
                         "half_width_pct": half / value * 100 if value else math.nan,
                         "repeats": int(record.get("repeats", 0) or 0),
                         "loads": int(record.get("steps", 0) or 0),
                         "refined": int(record.get("refined", 0) or 0),
                         "requests": int(record.get("requests", 0) or 0)})
    return rows


def apart_pairs(part: pd.DataFrame) -> list[tuple[str, str]]:
    """The pairs of studies whose intervals of one figure do not overlap."""
    lo, hi, names = part["lo"].to_numpy(), part["hi"].to_numpy(), list(part["study"])
    return [(names[a], names[b]) for a in range(len(part)) for b in range(a + 1, len(part))
            if lo[a] > hi[b] or lo[b] > hi[a]]


def repeatability_lines(rows: Sequence[dict[str, Any]]) -> tuple[list[str], int]:
    """(a line per configuration and figure: half-widths across the studies and whether
    every two intervals overlap; the number of figures with two intervals apart)."""
    frame = pd.DataFrame(rows)
    lines, apart_figures = [], 0
    for (config, figure), part in frame.groupby(["config", "figure"], sort=False):
        if len(part) < 2:
            continue
        widths = ", ".join(f"{w:.1f}%" for w in part["half_width_pct"])
        apart = apart_pairs(part)
        apart_figures += bool(apart)
        verdict = "all overlap" if not apart else f"{len(apart)} pair(s) apart: " + ", ".join(
            f"{a}/{b}" for a, b in apart)
        lines.append(f"  {config} {figure}: half-widths ±{widths} of the value; {verdict}")
    return lines, apart_figures


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def studies_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """``python -m <module> STUDY_DIR [...] [--csv OUT.csv]``: the study benches' parser."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study_dirs", nargs="+", type=Path)
    parser.add_argument("--csv", type=Path, default=None, help="also write the rows here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = studies_parser("infra.tools.bench.study_repeatability", __doc__).parse_args(argv)
    rows = [r for d in args.study_dirs for r in capacity_rows(d)]
    print("| study | configuration | figure | value | 95% interval | half-width | repeats | "
          "loads (refined) | requests |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['study']} | {r['config']} | {r['figure']} | {r['value']:.2f} | "
              f"[{r['lo']:.2f}, {r['hi']:.2f}] | ±{r['half_width']:.2f} "
              f"({r['half_width_pct']:.1f}%) | {r['repeats']} | {r['loads']} ({r['refined']}) | "
              f"{r['requests']} |")
    lines, apart = repeatability_lines(rows)
    if not lines:
        print("no configuration is in two of these studies", file=sys.stderr)
        return 2
    print("\nrepeatability (every two studies' intervals of a figure overlap?):")
    print("\n".join(lines))
    if args.csv:
        write_csv(rows, args.csv)
    return 1 if apart else 0


if __name__ == "__main__":
    sys.exit(main())
