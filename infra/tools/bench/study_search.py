"""The study's search against known answers: the curve search and the bisection before it, side
by side, on simulator configurations whose figure rises steeply through the SLO (a queue of known
capacity) and on one whose figure is flat across it.

    swarmload bench search start DIR [--seeds 1,2,3,4,5] [--configs seqs-32,seqs-72]
                                     [--methods curve,bisect] [--no-flat]
                                     [--share 0.015] [--repeats 3]
    swarmload bench search wait DIR [--limit-s 540]     # then the report, as below
    swarmload bench search report DIR [--csv OUT.csv]

``start`` writes one study per seed, configuration and search under ``DIR/specs`` and starts them
all at once, each a ``swarmload study run`` in a process session of its own (it outlives the call
that started it), logs in ``DIR/logs``, results in ``DIR/results``:

- **steep**: every configuration of ``docs/results/studies/known-answers.yaml`` (capacity
  C = max_num_seqs / (8 tokens x 100 ms), open loop, 0.8 C and 1.2 C, 3 repeats, 12 s steps),
  with ``refine: {share: 0.015, max_steps: 5, method: curve}`` and the same with ``method:
  bisect`` (the search before the curve's);
- **flat**: ``docs/results/studies/search-flat.yaml`` (TTFT flat on its SLO at every load, TPOT
  growing through its own at 40 users), with the curve search.

``report`` prints one row per configuration and seed: for each search the loads it measured
(refined), the simulated minutes of load (every step's length, repeats and parts included), the
max sustainable load with its 95% interval, its error against C and whether the interval holds
C; then the totals per search; then the flat studies: resolved or not, and the note. Exits 1
unless every steep figure of the curve search is within ``--tolerance-pct`` (3) of C with an
interval that holds it and every flat one is reported unresolved.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from collectors.run_folder import CAPACITY_FILE, ROLLUP_DIR, load_study_meta
from infra.tools.bench.study_known_answers import analytic_capacity
from infra.tools.bench.study_repeatability import write_csv

REPO_ROOT = Path(__file__).resolve().parents[3]
STEEP_BASE = REPO_ROOT / "docs" / "results" / "studies" / "known-answers.yaml"
FLAT_BASE = REPO_ROOT / "docs" / "results" / "studies" / "search-flat.yaml"
METHODS = ("curve", "bisect")
STEEP_REFINE = {"share": 0.015, "max_steps": 5}


def study_files(seeds: list[int], configs: list[str] | None = None,
                methods: tuple[str, ...] = METHODS, flat_too: bool = True,
                overrides: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """name -> study of every seed, configuration and search (module docstring);
    ``overrides``: ``share`` (the steep studies' refine.share) and ``repeats``."""
    overrides = overrides or {}
    out: dict[str, dict[str, Any]] = {}
    steep = yaml.safe_load(STEEP_BASE.read_text(encoding="utf-8"))
    flat = yaml.safe_load(FLAT_BASE.read_text(encoding="utf-8"))
    for seed in seeds:
        for config in steep["configurations"]:
            if configs and config["name"] not in configs:
                continue
            for method in methods:
                name = f"steep-{method}-{seed}-{config['name']}"
                out[name] = {**steep, "name": name, "seed": seed,
                             "workload": {**steep["workload"], "seed": seed},
                             "configurations": [config],
                             "repeats": overrides.get("repeats") or steep["repeats"],
                             "refine": {**STEEP_REFINE, "method": method,
                                        "share": overrides.get("share")
                                        or STEEP_REFINE["share"]}}
        if flat_too:
            name = f"flat-curve-{seed}"
            out[name] = {**flat, "name": name, "seed": seed,
                         "workload": {**flat["workload"], "seed": seed}}
    return out


def start(folder: Path, seeds: list[int], configs: list[str] | None,
          methods: tuple[str, ...] = METHODS, flat_too: bool = True,
          overrides: dict[str, Any] | None = None) -> int:
    """Every study at once, from a copy of the code in ``DIR/code``: a device call copies the
    working tree again at each call, and a study whose step started Locust while that copy
    was being written failed to import (infra/tools/device/known_answers.sh)."""
    for sub in ("specs", "logs", "results"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    code = folder / "code"
    if not code.exists():
        shutil.copytree(REPO_ROOT, code, ignore=shutil.ignore_patterns(
            ".git", ".venv", ".venv-vllm", ".gpu", ".whl", "results", "__pycache__",
            folder.name))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(code), os.environ.get("PYTHONPATH", "")) if p)}
    studies = study_files(seeds, configs, methods, flat_too, overrides)
    for name, study in studies.items():
        spec = folder / "specs" / f"{name}.yaml"
        spec.write_text(yaml.safe_dump(study, sort_keys=False), encoding="utf-8")
        log = folder / "logs" / f"{name}.log"
        command = (f'"{sys.executable}" -m infra.cli study run "{spec}" --results '
                   f'"{folder / "results"}" --progress off > "{log}" 2>&1; echo $? > "{log}.rc"')
        subprocess.Popen(["bash", "-c", command], cwd=code, env=env,
                         start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"started {len(studies)} studies in {folder} at {time.strftime('%H:%M:%S')}; "
          f"load {os.getloadavg()[0]:.1f}")
    return 0


def _ended(folder: Path) -> tuple[int, int]:
    return (len(list((folder / "logs").glob("*.rc"))),
            len(list((folder / "specs").glob("*.yaml"))))


def wait(folder: Path, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        ended, total = _ended(folder)
        if ended == total:
            break
        time.sleep(10)
    ended, total = _ended(folder)
    print(f"{ended} of {total} studies ended at {time.strftime('%H:%M:%S')}; "
          f"load {os.getloadavg()[0]:.1f}")
    return ended == total


def study_row(study_dir: Path) -> dict[str, Any] | None:
    """One finished study's figures (module docstring), None without a capacity roll-up."""
    path = study_dir / ROLLUP_DIR / CAPACITY_FILE
    if not path.is_file():
        return None
    meta = load_study_meta(study_dir)
    record = pd.read_parquet(path).iloc[0].to_dict()
    config = (meta.get("configurations") or [{}])[0]
    name = str(meta.get("name") or study_dir.name)
    parts = name.split("-")
    if len(parts) < 3 or parts[0] not in ("steep", "flat") or not parts[2].isdigit():
        return None  # not one of this bench's studies
    kind, method, seed = parts[:3]
    steps = [s for s in meta.get("steps") or [] if s.get("status") == "done"]
    c = analytic_capacity(config, int((meta.get("workload") or {}).get("max_tokens") or 0))
    value = float(record.get("max_sustainable_load", math.nan))
    lo, hi = float(record.get("max_load_lo", math.nan)), float(record.get("max_load_hi",
                                                                           math.nan))
    return {"study": name, "kind": kind, "method": method, "seed": int(seed),
            "config": str(record["config"]), "capacity": c,
            "loads": len({float(s["offered_load"]) for s in steps}),
            "refined": len({float(s["offered_load"]) for s in steps
                            if s.get("phase") == "refine"}),
            "minutes": sum(float(s.get("duration_s") or meta.get("step_duration_s") or 0)
                           for s in steps) / 60,
            "value": value, "lo": lo, "hi": hi,
            "error_pct": (value - c) / c * 100 if c == c else math.nan,
            "covers": bool(lo <= c <= hi) if c == c else False,
            "resolved": bool(record.get("resolved", True)),
            "note": str(record.get("resolution_note") or ""),
            "binding_slo": str(record.get("binding_slo") or "")}


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "- | - | - | - |"
    return (f"{row['loads']} ({row['refined']}) | {row['minutes']:.1f} | {row['value']:.2f} "
            f"[{row['lo']:.2f}, {row['hi']:.2f}] | {row['error_pct']:+.1f}% "
            f"{'yes' if row['covers'] else 'no'} |")


def report(folder: Path, tolerance_pct: float, csv: Path | None = None) -> int:
    results = folder / "results" if (folder / "results").is_dir() else folder
    rows = [r for d in sorted(p for p in results.iterdir() if p.is_dir())
            if (r := study_row(d)) is not None]
    if not rows:
        print(f"no finished study under {results}", file=sys.stderr)
        return 2
    steep = {(r["config"], r["seed"], r["method"]): r for r in rows if r["kind"] == "steep"}
    print("| configuration | seed | C | curve: loads (refined) | minutes | max sustainable "
          "[95%] | error, holds C | bisection: loads (refined) | minutes | max sustainable "
          "[95%] | error, holds C |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for config, seed in sorted({(c, s) for c, s, _ in steep}):
        curve, bisect = steep.get((config, seed, "curve")), steep.get((config, seed, "bisect"))
        c = (curve or bisect or {}).get("capacity", math.nan)
        print(f"| {config} | {seed} | {c:g} | {_cell(curve)} {_cell(bisect)}")
    frame = pd.DataFrame(rows)
    ok = True
    for method in METHODS:
        part = frame[(frame["kind"] == "steep") & (frame["method"] == method)]
        if not len(part):
            continue
        met = (part["error_pct"].abs() <= tolerance_pct) & part["covers"]
        print(f"\n{method}: {len(part)} studies, loads {part['loads'].sum()} "
              f"(refined {part['refined'].sum()}), {part['minutes'].sum():.1f} simulated "
              f"minutes; within {tolerance_pct:g}% of C with an interval holding C: "
              f"{met.sum()} of {len(part)}; largest error {part['error_pct'].abs().max():.1f}%")
        if method == "curve":
            ok &= bool(met.all())
    flat = frame[frame["kind"] == "flat"]
    if len(flat):
        print("\n| flat study | loads (refined) | minutes | resolved | binding SLO | note |")
        print("|---|---|---|---|---|---|")
        for r in flat.to_dict("records"):
            print(f"| {r['study']} | {r['loads']} ({r['refined']}) | {r['minutes']:.1f} | "
                  f"{'yes' if r['resolved'] else 'no'} | {r['binding_slo'] or '-'} | "
                  f"{r['note']} |")
        print(f"\nflat: {int((~flat['resolved']).sum())} of {len(flat)} reported unresolved")
        ok &= bool((~flat["resolved"]).all())
    if csv is not None:
        write_csv(rows, csv)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swarmload bench search", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("verb", choices=("start", "wait", "report"))
    parser.add_argument("dir", type=Path)
    parser.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated (default 1-5)")
    parser.add_argument("--configs", default="", help="comma-separated steep configurations "
                        "(default: all of known-answers.yaml)")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="start: the searches of the steep studies (default curve,bisect)")
    parser.add_argument("--no-flat", action="store_true", help="start: no flat studies")
    parser.add_argument("--share", type=float, default=None,
                        help="start: the steep studies' refine.share (default 0.015)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="start: the steep studies' repeats (default known-answers.yaml's)")
    parser.add_argument("--limit-s", type=float, default=540.0, help="wait: at most this long")
    parser.add_argument("--tolerance-pct", type=float, default=3.0)
    parser.add_argument("--csv", type=Path, default=None, help="report: also write the rows")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
    if args.verb == "start":
        methods = tuple(m for m in args.methods.split(",") if m)
        if not methods or set(methods) - set(METHODS):
            parser.error(f"--methods: comma-separated, of {', '.join(METHODS)}")
        return start(args.dir.resolve(), seeds, [c for c in args.configs.split(",") if c],
                     methods, not args.no_flat, {"share": args.share, "repeats": args.repeats})
    if args.verb == "wait" and not wait(args.dir, args.limit_s):
        return 3
    return report(args.dir, args.tolerance_pct, args.csv)


if __name__ == "__main__":
    sys.exit(main())
