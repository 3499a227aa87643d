"""Watch a soak from outside: RSS of each of its processes and the files per table, every minute.

    python -m infra.tools.bench.soak_watch RESULTS_DIR RUN_ID --interval 60 --limit 4200 \
        --out watch.csv

Independent of the run's own collector (which may be the thing that leaks): reads /proc through
psutil for every process whose command line names the run id (the Locust master, each worker,
the collector) and for the server listening on the run's target port, and counts the Parquet
files of each table. One CSV row per process per tick, plus one ``files:<table>`` row per table.
Stops after ``--limit`` seconds or when the run's manifest says it ended.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path
from urllib.parse import urlparse

import psutil

from collectors.host import pid_listening_on
from collectors.run_folder import load_manifest


def _role(cmdline: list[str]) -> str:
    text = " ".join(cmdline)
    if "soak_watch" in text:
        return "watch"
    if "collect" in cmdline:
        return "collector"
    if "soak" in cmdline:
        return "orchestrator"
    if "--worker" in cmdline:
        return "worker"
    if "--master" in cmdline:
        return "master"
    return "other"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m infra.tools.bench.soak_watch")
    p.add_argument("results")
    p.add_argument("run_id")
    p.add_argument("--interval", type=float, default=60.0)
    p.add_argument("--limit", type=float, default=4200.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    run_dir = Path(args.results) / args.run_id
    deadline = time.monotonic() + args.limit
    with open(args.out, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["wall_s", "what", "pid", "rss_mb", "files"])
        while time.monotonic() < deadline:
            now = time.time()
            for proc in psutil.process_iter(["pid", "cmdline", "memory_info"]):
                cmd = proc.info.get("cmdline") or []
                if args.run_id in " ".join(cmd) and proc.info.get("memory_info"):
                    out.writerow([f"{now:.0f}", _role(cmd), proc.info["pid"],
                                  f"{proc.info['memory_info'].rss / 2**20:.1f}", ""])
            try:
                manifest = load_manifest(run_dir)
            except (OSError, ValueError):
                manifest = {}
            url = (manifest.get("target") or {}).get("base_url") or ""
            port = urlparse(url).port if url else None
            server = pid_listening_on(port) if port else None
            if server:
                try:
                    rss = psutil.Process(server).memory_info().rss / 2**20
                    out.writerow([f"{now:.0f}", "server", server, f"{rss:.1f}", ""])
                except psutil.Error:
                    pass
            if run_dir.is_dir():
                for table in sorted(p for p in run_dir.iterdir() if p.is_dir()):
                    files = len(list(table.glob("*.parquet")))
                    if files:
                        out.writerow([f"{now:.0f}", f"files:{table.name}", "", "", files])
            fh.flush()
            if manifest.get("status") in ("finished", "interrupted", "failed"):
                break
            time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
