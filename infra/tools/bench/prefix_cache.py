"""``swarmload bench prefix-cache``: how much of each run vLLM served from its prefix cache.

    swarmload bench prefix-cache --target http://127.0.0.1:8000 --runs 2 -- --duration 20
    swarmload bench prefix-cache --target http://127.0.0.1:8000 --study study.yaml

Reads ``vllm:prefix_cache_hits_total`` and ``vllm:prefix_cache_queries_total`` (tokens) from the
server's ``/metrics`` before and after each ``swarmload run`` (or each step of a study, whose
configurations must name the same ``--target`` URL) and prints hits / queries per run. A run whose
prompts share nothing should show hits only where its own workload shares prefixes; a second run
of the same prompts shows the distortion the prompt salt exists to prevent.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

_COUNTER = re.compile(r"^(vllm:prefix_cache_(?:hits|queries)_total)\{[^}]*\} (\S+)$", re.M)


def cache_counters(base_url: str) -> dict[str, float]:
    """{"hits": tokens, "queries": tokens} summed over the server's engines."""
    text = httpx.get(base_url.rstrip("/") + "/metrics", timeout=30).text
    totals = {"hits": 0.0, "queries": 0.0}
    for name, value in _COUNTER.findall(text):
        totals["hits" if "hits" in name else "queries"] += float(value)
    return totals


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    hits, queries = after["hits"] - before["hits"], after["queries"] - before["queries"]
    return {"hit_tokens": hits, "query_tokens": queries,
            "hit_pct": round(100.0 * hits / queries, 1) if queries else 0.0}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="swarmload bench prefix-cache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="base URL of a running vLLM server")
    parser.add_argument("--runs", type=int, default=2, help="consecutive runs (default 2)")
    parser.add_argument("--study", default=None, help="run this study instead, step by step")
    parser.add_argument("--results", default="results/prefix-cache")
    parser.add_argument("--out", default=None, help="also write the figures to this JSON file")
    args, rest = parser.parse_known_args(argv)
    rest = [a for a in rest if a != "--"]
    rows: list[dict[str, object]] = []
    if args.study:
        # The study runs in its own process; watch the server's counters between steps by
        # polling the study's state file for finished steps.
        before = cache_counters(args.target)
        proc = subprocess.Popen([sys.executable, "-m", "infra.cli", "study", "run", args.study,
                                 "--results", args.results, *rest])
        seen: set[str] = set()
        state_files: list[Path] = []
        while True:
            done = proc.poll() is not None
            state_files = state_files or list(Path(args.results).glob("*/study_state.json"))
            finished = []
            for state_file in state_files:
                try:
                    state = json.loads(state_file.read_text())
                except (OSError, ValueError):
                    continue
                finished = [s for s in state.get("steps", []) if s.get("status") == "done"]
            for step in finished:
                key = f"{step['config']}/step-{step['step']}"
                if key not in seen:
                    seen.add(key)
                    after = cache_counters(args.target)
                    rows.append({"run": key, **_delta(before, after)})
                    print(json.dumps(rows[-1]), flush=True)
                    before = after
            if done:
                break
            time.sleep(0.5)
        if proc.returncode:
            return proc.returncode
    else:
        for n in range(1, args.runs + 1):
            before = cache_counters(args.target)
            subprocess.run([sys.executable, "-m", "infra.cli", "run", "--target", args.target,
                            "--results", args.results, "--quiet", *rest], check=True)
            rows.append({"run": n, **_delta(before, cache_counters(args.target))})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0
