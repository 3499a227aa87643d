"""``swarmload compare``: runs, study steps or studies side by side in the terminal and as HTML.

Usage::

    swarmload compare results/run-a results/run-b                  # baseline first
    swarmload compare results/studies/mon results/studies/tue --html compare.html
    swarmload compare BASE CANDIDATE --threshold ttft_p95=5 --only-thresholds   # a release gate

Exit codes: 0 no regression flagged, 1 a regression flagged (a "worse" figure past its
threshold: ``--max-regression`` for every figure, or ``--threshold FIGURE=PCT`` per figure),
2 bad input. The figures, intervals and verdicts come from :mod:`dashboards.analysis.compare`;
this module only writes them out.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from dashboards import study_charts
from dashboards.analysis import compare
from dashboards.analysis.compare_stats import DEFAULT_LEVEL, DEFAULT_MIN_EFFECT
from dashboards.analysis.runs import ALL_ROW
from dashboards.analysis.study import load_rollup

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
tr.regression td { color: #b00020; font-weight: bold; }
td.worse { color: #b00020; } td.better { color: #1b7f3b; }
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarmload compare",
        description="Compare runs, study steps or studies: the first is the baseline, each other "
                    "is compared with it, figure by figure, with bootstrap intervals and a "
                    "verdict. Exit 1 when a regression past a threshold is flagged (a release "
                    "gate), 2 on bad input.")
    parser.add_argument("paths", nargs="+", help="run folders, study step folders or study "
                        "folders; the first is the baseline")
    parser.add_argument("--bucket", default=ALL_ROW,
                        help="short, medium, long or all (default: all)")
    parser.add_argument("--level", type=float, default=DEFAULT_LEVEL,
                        help="simultaneous confidence level of the intervals (default 0.95)")
    parser.add_argument("--min-effect", type=float, default=DEFAULT_MIN_EFFECT * 100,
                        help="percent: smaller changes are 'within noise' (default 2)")
    parser.add_argument("--max-regression", type=float,
                        default=compare.DEFAULT_MAX_REGRESSION * 100,
                        help="percent (error rate: points) past which a 'worse' figure is a "
                        "regression (default 5); --threshold overrides it per figure")
    parser.add_argument("--threshold", action="append", default=[], metavar="FIGURE=PCT",
                        help="a figure's own regression threshold (repeatable); figures: "
                        + ", ".join(compare.KNOWN_FIGURES))
    parser.add_argument("--only-thresholds", action="store_true",
                        help="gate only the figures named by --threshold")
    parser.add_argument("--warmup", type=float, default=0.0,
                        help="seconds left out at a run's start (steps use their study's)")
    parser.add_argument("--cooldown", type=float, default=0.0,
                        help="seconds left out at a run's end")
    parser.add_argument("--html", type=Path, default=None, help="also write an HTML report")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    return parser


def _html_table(frame: pd.DataFrame) -> str:
    return frame.to_html(escape=True, border=0, na_rep="-")


def _pair_html(pair: compare.PairResult) -> str:
    rows = []
    for _, row in pair.table.iterrows():
        css = ' class="regression"' if row["regression"] else ""
        verdict = html.escape(str(row["verdict"])) + (" — regression" if row["regression"] else "")
        rows.append(
            f"<tr{css}><td>{html.escape(row['figure'])}</td>"
            f"<td>{compare.format_value(row['figure'], row['a'])}</td>"
            f"<td>{compare.format_value(row['figure'], row['b'])}</td>"
            f"<td>{html.escape(compare.format_change(row))}</td>"
            f"<td>{row['n_a']}/{row['n_b']}</td>"
            f'<td class="{html.escape(str(row["verdict"]))}">{verdict}</td></tr>')
    level = float(pair.table["level"].iloc[0]) if len(pair.table) else float("nan")
    context = f" ({html.escape(pair.context)})" if pair.context else ""
    return (f"<h3>{html.escape(pair.candidate)} vs baseline {html.escape(pair.baseline)}"
            f"{context}</h3><p>Intervals: {level:.2%} each, simultaneous over "
            f"{len(pair.table)} figures; {compare.sizes_note(pair.table)}.</p>"
            "<table><tr><th>figure</th>"
            "<th>baseline</th><th>candidate</th><th>change [interval]</th><th>n A/B</th>"
            "<th>verdict</th></tr>" + "".join(rows) + "</table>")


def curves_svg(study_dirs: Sequence[str | Path], metric: str = "ttft",
               percentile: str = "p95") -> str:
    """The latency-versus-load curves of several studies on one chart, as SVG ("" if none)."""
    pairs = []
    capacities = []
    for path in study_dirs:
        steps, capacity = load_rollup(path)
        name = str(json.loads((Path(path) / "study.json").read_text()).get("name")
                   or Path(path).name)
        pairs.append((name, steps[steps["bucket"] == ALL_ROW] if "bucket" in steps else steps))
        capacities.append((name, capacity))
    steps = compare.study_curves(pairs)
    if steps.empty:
        return ""
    import vl_convert

    spec = study_charts.latency_vs_load(steps, compare.study_capacities(capacities), metric,
                                        percentile)
    return vl_convert.vegalite_to_svg(spec)


def write_report(path: Path, side: pd.DataFrame, pairs: Sequence[compare.PairResult],
                 study_dirs: Sequence[str | Path] = ()) -> Path:
    """One self-contained HTML file: side by side, the curves (studies), every pair's verdicts."""
    flagged = sum(int(p.table["regression"].sum()) for p in pairs if len(p.table))
    verdict = (f"<p class='regression'><b>{flagged} regression(s) flagged</b></p>" if flagged
               else "<p>No regression flagged.</p>")
    svg = curves_svg(study_dirs) if study_dirs else ""
    body = [
        f"<h1>swarmload compare</h1><p>Written {datetime.now(UTC):%Y-%m-%d %H:%M UTC}.</p>",
        verdict,
        "<h2>Side by side</h2>", _html_table(compare.side_by_side_text(side)),
        *(["<h2>Latency against offered load</h2>", svg] if svg else []),
        "<h2>Is the difference real</h2>", *[_pair_html(p) for p in pairs],
    ]
    path.write_text("<!doctype html><html><head><meta charset='utf-8'><title>swarmload "
                    f"compare</title><style>{_STYLE}</style></head><body>"
                    + "\n".join(body) + "</body></html>", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        thresholds = compare.parse_thresholds(args.threshold)
        if not 0 < args.level < 1:
            raise compare.CompareError(f"--level must be in (0, 1), got {args.level}")
        if args.min_effect < 0 or args.max_regression < 0:
            raise compare.CompareError("--min-effect and --max-regression must be >= 0")
        side, pairs = compare.run_compare(
            args.paths, bucket=args.bucket, level=args.level, min_effect=args.min_effect / 100,
            thresholds=thresholds,
            default_threshold=None if args.only_thresholds else args.max_regression / 100,
            warmup_s=args.warmup, cooldown_s=args.cooldown, seed=args.seed)
    except (ValueError, FileNotFoundError) as exc:
        print(f"swarmload compare: {exc}", file=sys.stderr)
        return 2
    print(compare.format_side_by_side(side))
    for pair in pairs:
        print()
        if pair.context:
            print(f"[{pair.context}]")
        print(compare.format_comparison(pair.baseline, pair.candidate, pair.table))
    regressions = sum(int(p.table["regression"].sum()) for p in pairs if len(p.table))
    if args.html is not None:
        studies = [p for p in args.paths if (Path(p) / "study.json").is_file()]
        write_report(args.html, side, pairs, studies)
        print(f"\nreport: {args.html}")
    if regressions:
        print(f"\n{regressions} regression(s) flagged: exit 1", file=sys.stderr)
        return 1
    print("\nno regression flagged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
