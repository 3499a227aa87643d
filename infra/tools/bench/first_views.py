"""Every dashboard page's cold first view in one run, each beside the floor measured with it.

    python -m infra.tools.bench.first_views --out /tmp/first-views --repeat 5
    python -m infra.tools.bench.first_views --out /tmp/first-views --repeat 5 --no-generate

Writes (once; ``--no-generate`` reuses them) under ``--out``: a 10-million-request study
(roll-ups, :func:`infra.tools.bench.study_dashboard.write_synthetic_study`) whose first step run
holds its raw requests, two more 10M studies labelled for the Compare page
(:func:`infra.tools.bench.compare_dashboard.write_studies`), the same 10M study marked as a burst
study with a spike per configuration for the Bursts page (:func:`write_burst_rollup`), a 72-hour
soak (:func:`write_synthetic_soak`: one-minute windows, process RSS every minute, the drift
report stored as ``swarmload soak`` stores it) and a session run of 10,000 six-turn
conversations (:func:`write_synthetic_sessions`, 60,000 requests: the Sessions view is the Run
page's Sessions section on it). Then, in headless Chromium against one
dashboard server, each page from navigation to the frame that draws its main chart
(:func:`infra.tools.bench.study_dashboard.measure_browser`: a new browser context per cold view, so
an empty HTTP cache), and in the same run the floor: one metric in the dashboard's frame
(:data:`infra.tools.bench.compare_dashboard.FLOOR_APP`), cold. It prints one table: page, cold and
warm medians, the floor, and the page's excess over the floor. A benchmark, not a test: nothing
fails on a slow figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from collectors.run_folder import update_manifest
from collectors.schemas import (
    HOST_KIND_PROCESS,
    HOST_SCHEMA,
    HOST_TABLE,
    WINDOW_SCHEMA,
    WINDOWS_TABLE,
)
from infra.tools.bench.compare_dashboard import FLOOR_APP, FLOOR_SELECTOR, write_studies
from infra.tools.bench.study_dashboard import measure_browser, write_synthetic_study

STUDY = "study-10m"
SOAK = "soak-72h"
SESSIONS = "sessions-60k"
_NS = 1_000_000_000
SOAK_T0_NS = 1_760_000_000 * _NS
# page -> (URL path, the element whose drawing ends the first view: its main chart)
PAGES: dict[str, tuple[str, str]] = {
    "Study": (f"/study?study={STUDY}", ".st-key-chart-latency-throughput img, "
                                       ".st-key-chart-latency-throughput svg.marks"),
    "Run": (f"/?run={quote(f'studies/{STUDY}/max-num-seqs-8/step-0')}",
            '[data-testid="stVegaLiteChart"] svg.marks, [data-testid="stMain"] img'),
    "Compare": ("/compare?items=study:studies/monday,study:studies/tuesday",
                ".st-key-chart-curves img"),
    "Bursts": (f"/bursts?study={STUDY}", ".st-key-chart-burst-recovery img, "
                                         ".st-key-chart-burst-recovery svg.marks"),
    "Soak": (f"/soak?run={SOAK}", '.st-key-chart-soak-latency img[src^="data:image/"]'),
    # the Run page of a session run: its Sessions section, whose first chart ends the view
    "Sessions": (f"/?run={SESSIONS}", ".st-key-chart-sessions-ttft-turn img, "
                                       ".st-key-chart-sessions-ttft-turn svg.marks"),
}


def write_synthetic_soak(run_dir: Path, hours: float = 72.0, window_s: float = 60.0,
                         workers: int = 2, rate_rps: float = 100.0) -> Path:
    """A finished soak run folder of ``hours`` of ``window_s`` windows at ``rate_rps``, with the
    server's, master's, workers' and collector's RSS sampled once a window (the server's grows
    4 MB/h: a leak the drift report flags), its drift report stored as ``swarmload soak``
    stores it (:func:`infra.soak.report`)."""
    from infra.soak import report

    rng = np.random.default_rng(72)
    run_dir.mkdir(parents=True, exist_ok=True)
    n = int(hours * 3600 / window_s)
    starts = SOAK_T0_NS + np.arange(n, dtype=np.int64) * int(window_s * _NS)
    requests = rng.poisson(rate_rps * window_s, n).astype(np.int64)
    errors = rng.binomial(requests, 0.001)
    ttft = rng.normal(0.05, 0.002, n)
    windows = {
        "window_start_ns": starts, "window_s": np.full(n, window_s),
        "segment": np.zeros(n, np.int32), "late": np.zeros(n, bool), "requests": requests,
        "ok": requests - errors, "errors": errors,
        "not_sent": np.zeros(n, np.int64), "error_rate": errors / requests,
        "errors_by_class": [json.dumps({"http_5xx": int(e)}) if e else "{}" for e in errors],
        "prompt_tokens": requests * 200, "output_tokens": requests * 64,
        "req_per_s": (requests - errors) / window_s, "output_tok_per_s": (requests - errors) * 64
        / window_s, "schedule_lag_p99_s": rng.uniform(0.0005, 0.002, n),
        "read_delay_p99_s": rng.uniform(0.0005, 0.002, n),
        "merged_gap_share": np.zeros(n), "ttft_bound_p99_s": np.zeros(n),
    }
    for tag, scale in (("ttft", 1.0), ("tpot", 0.1), ("e2e", 8.0)):
        for pct, factor in (("p50", 1.0), ("p95", 1.6), ("p99", 2.2)):
            windows[f"{tag}_{pct}_s"] = ttft * scale * factor
    table = pa.table({name: windows[name] for name in WINDOW_SCHEMA.names}, schema=WINDOW_SCHEMA)
    (run_dir / WINDOWS_TABLE).mkdir(exist_ok=True)
    pq.write_table(table, run_dir / WINDOWS_TABLE / "part-00000.parquet")
    processes = {"self": ("collector", 140.0, 0.0), "pid": ("server", 900.0, 4.0),
                 "name:locust.*--master": ("master", 180.0, 0.0),
                 **{f"name:locust.*--worker#{i}": ("worker", 145.0, 0.0) for i in range(workers)}}
    rows: dict[str, list] = {name: [] for name in ("wall_ns", "selector", "pid", "rss_bytes")}
    hours_at = (starts - SOAK_T0_NS) / 3600 / _NS
    for pid, (selector, (_, base_mb, mb_per_h)) in enumerate(processes.items(), 1000):
        rss = (base_mb + mb_per_h * hours_at + rng.normal(0, 1.5, n)) * 2**20
        rows["wall_ns"] += list(starts + int(window_s * _NS) // 2)
        rows["selector"] += [selector.split("#")[0]] * n
        rows["pid"] += [pid] * n
        rows["rss_bytes"] += list(rss.astype(np.int64))
    count = len(rows["pid"])
    host = pa.table({"run_id": [SOAK] * count, "host": ["bench"] * count,
                     "kind": [HOST_KIND_PROCESS] * count, **rows}).cast(
        pa.schema([HOST_SCHEMA.field(name) for name in
                   ("run_id", "host", "kind", "wall_ns", "selector", "pid", "rss_bytes")]))
    full = pa.table({name: host[name] if name in host.column_names
                     else pa.nulls(count, HOST_SCHEMA.field(name).type)
                     for name in HOST_SCHEMA.names}, schema=HOST_SCHEMA)
    (run_dir / HOST_TABLE).mkdir(exist_ok=True)
    pq.write_table(full, run_dir / HOST_TABLE / "part-00000.parquet")
    end_ns = int(starts[-1] + window_s * _NS)
    iso = lambda ns: pd.Timestamp(ns, unit="ns", tz="UTC").strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    update_manifest(
        run_dir, run_id=run_dir.name, status="finished", started_at=iso(SOAK_T0_NS),
        ended_at=iso(end_ns), target={"kind": "sim", "base_url": "http://127.0.0.1:8000",
                                      "model": "tiny"},
        load={"kind": "poisson", "rate": rate_rps, "duration_s": hours * 3600,
              "workers": workers},
        gpu={"available": False, "reason": "synthetic soak", "gpus": []},
        soak={"window_s": window_s, "warmup_s": 300.0, "drift_p": 0.01, "drift_share": 0.10,
              "segments": [{"segment": 0, "status": "finished", "started_wall_ns": SOAK_T0_NS,
                            "ended_wall_ns": end_ns}]})
    report(run_dir, warmup_s=300.0, drift_p=0.01, drift_share=0.10)
    return run_dir


def write_synthetic_sessions(run_dir: Path, sessions: int = 10_000, turns: int = 6,
                             rate_sps: float = 5.0) -> Path:
    """A finished run folder of ``sessions`` conversations of ``turns`` turns each (60,000
    requests by default), a new session every ``1 / rate_sps`` s and a turn every 4 s of it:
    history grows 400 tokens a turn, TTFT with it, the server's prefix cache reuses all but the
    last turn's text (what the Run page's Sessions section draws)."""
    from collectors.schemas import REQUEST_SCHEMA

    rng = np.random.default_rng(6)
    run_dir.mkdir(parents=True, exist_ok=True)
    session = np.repeat(np.arange(sessions), turns)
    turn = np.tile(np.arange(turns), sessions)
    n = session.size
    history = turn * 400
    prompt = history + 200
    sent = (SOAK_T0_NS + (session / rate_sps + turn * 4.0) * _NS).astype(np.int64)
    ttft = rng.gamma(2.0, 0.02, n) + history * 2e-5
    columns = {
        "run_id": pa.array([run_dir.name] * n, pa.string()),
        "worker_id": pa.array(["bench:1:0"] * n, pa.string()),
        "request_id": pa.array([f"s{s}#{t}" for s, t in zip(session, turn, strict=True)]),
        "bucket": pa.array(["chat"] * n, pa.string()),
        "outcome": pa.array(["ok"] * n, pa.string()),
        "sent_wall_ns": pa.array(sent), "ttft_s": pa.array(ttft),
        "e2e_s": pa.array(ttft + 64 * 0.008), "tpot_s": pa.array(np.full(n, 0.008)),
        "output_tokens": pa.array(np.full(n, 64, dtype=np.int32)),
        "session_id": pa.array([f"chat#{s}" for s in session], pa.string()),
        "turn": pa.array(turn.astype(np.int32)),
        "prompt_tokens": pa.array(prompt.astype(np.int32)),
        "history_tokens": pa.array(history.astype(np.int32)),
        "reusable_tokens": pa.array(history.astype(np.int32)),
        "cached_tokens": pa.array((history // 16 * 16).astype(np.int32)),
    }
    table = pa.table({name: columns.get(name, pa.nulls(n, REQUEST_SCHEMA.field(name).type))
                      for name in REQUEST_SCHEMA.names}, schema=REQUEST_SCHEMA)
    (run_dir / "requests").mkdir(exist_ok=True)
    pq.write_table(table, run_dir / "requests" / "part-00000.parquet")
    iso = lambda ns: pd.Timestamp(ns, unit="ns", tz="UTC").strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    update_manifest(
        run_dir, run_id=run_dir.name, status="finished", started_at=iso(SOAK_T0_NS),
        ended_at=iso(int(sent.max() + 2 * _NS)),
        target={"kind": "sim", "base_url": "http://127.0.0.1:8000", "model": "tiny"},
        load={"kind": "sessions", "duration_s": float(sent.max() - SOAK_T0_NS) / _NS},
        gpu={"available": False, "reason": "synthetic sessions", "gpus": []})
    return run_dir


def write_burst_rollup(study_dir: Path, spike_s: float = 30.0) -> None:
    """Mark ``study_dir`` a burst study and give each configuration's first step one spike of
    ``spike_s`` at 3x its capacity, its recovery drawn from a fluid queue (the same model as
    ``tests/test_dashboards_burst.py``), through :func:`dashboards.analysis.burst.analyze`."""
    from dashboards.analysis import burst

    meta = json.loads((study_dir / "study.json").read_text())
    configs = [c["name"] for c in meta["configurations"]]
    meta["load"] = {"kind": "rate", "arrival": "bursts",
                    "burst": {"peak_rps": 3.0, "spike_s": spike_s, "count": 1,
                              "first_spike_s": 60.0}}
    (study_dir / "study.json").write_text(json.dumps(meta, indent=1))
    spikes, timelines = [], []
    for i, config in enumerate(configs):
        capacity = 40.0 * (i + 1)
        base, peak, start, end = 0.5 * capacity, 3.0 * capacity, 60.0, 60.0 + spike_s
        times, t = [], 0.0
        while t < 300.0:
            times.append(t)
            t += 1.0 / (peak if start <= t < end else base)
        at = np.array(times)
        queue = np.clip(np.clip(at - start, 0, spike_s) * (peak - capacity)
                        - np.clip(at - end, 0, None) * (capacity - base), 0, None)
        sent = (SOAK_T0_NS + at * _NS).astype("int64")
        requests = pd.DataFrame({"scheduled_wall_ns": sent, "sent_wall_ns": sent,
                                 "outcome": ["ok"] * at.size, "ttft_s": 0.03 + queue / capacity,
                                 "tpot_s": np.full(at.size, 0.025),
                                 "e2e_s": 0.43 + queue / capacity})
        scrapes = np.arange(0, 300.0, 0.5)
        waiting = np.clip(np.clip(scrapes - start, 0, spike_s) * (peak - capacity)
                          - np.clip(scrapes - end, 0, None) * (capacity - base), 0, None)
        server = {"waiting": pd.DataFrame({"ref_ns": (SOAK_T0_NS + scrapes * _NS).astype("int64"),
                                           "value": np.floor(waiting)})}
        spike = burst.Spike(SOAK_T0_NS + int(start * _NS), SOAK_T0_NS + int(end * _NS), peak)
        result = burst.analyze(requests, [spike], SOAK_T0_NS, server)
        spikes.append(result.spikes.assign(config=config, step=0, offered_load=base,
                                           run_dir=f"{config}/step-0"))
        timelines.append(result.timelines[1].assign(config=config, step=0, spike=1))
    rollup = study_dir / "rollup"
    pd.concat(spikes).to_parquet(rollup / burst.BURSTS_FILE)
    pd.concat(timelines).to_parquet(rollup / burst.BURST_TIMELINES_FILE)


def generate(out: Path, requests: int) -> None:
    results = out
    write_studies(results, requests)  # studies/monday, studies/tuesday (Compare)
    study = write_synthetic_study(results / "studies" / STUDY, requests, raw_steps=1, name=STUDY)
    write_burst_rollup(study)
    write_synthetic_soak(results / SOAK)
    write_synthetic_sessions(results / SESSIONS)


def _median(times: Sequence[float]) -> float:
    return statistics.median(times) if times else float("nan")


@contextmanager
def _tree_env(tree: Path | None) -> Iterator[dict[str, Path]]:
    """While open: ``tree``'s packages first on PYTHONPATH (what a dashboard server started
    now imports); yields the keyword that serves its ``dashboards/app.py`` (none for this
    checkout)."""
    if tree is None:
        yield {}
        return
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), saved]))
    try:
        yield {"app": tree / "dashboards" / "app.py"}
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = saved


def _measure_tree(results: Path, url_path: str, ready: str, repeat: int,
                  tree: Path | None) -> tuple[list[float], list[float]]:
    """:func:`measure_browser` of this checkout's dashboard, or of ``tree``'s."""
    with _tree_env(tree) as app:
        return measure_browser(results, "", repeat, url_path=url_path, ready_selector=ready,
                               **app)


def measure_interleaved(results: Path, page: str, repeat: int, trees: Sequence[Path | None],
                        floor_app: Path) -> list[list[float]]:
    """Cold views of ``page`` from each of ``trees`` (None: this checkout) and of the floor,
    view by view in turn (the trees' order reversed every other round, the floor last), all
    served at once: under a load that drifts from minute to minute, every tree's views share
    the same moments, so their differences, view by view, hold where medians taken a minute
    apart do not. Returns each tree's times, then the floor's."""
    from infra.tools.browser import chromium_browser, dashboard_server, open_page, wait_for_script

    url_path, ready = PAGES[page]
    with ExitStack() as stack:
        targets = []
        for tree in trees:
            with _tree_env(tree) as app:
                served = dashboard_server(results, app=app["app"]) if app else \
                    dashboard_server(results)
                url = stack.enter_context(served)
            targets.append((url + url_path, ready))
        floor = stack.enter_context(dashboard_server(results, app=floor_app))
        targets.append((floor + "/compare", FLOOR_SELECTOR))
        browser = stack.enter_context(chromium_browser())
        for url, selector in targets:  # each server's Python side started, untimed
            first = browser.new_page()
            open_page(first, url, selector, timeout_ms=120_000)
            wait_for_script(first)
            first.close()
        times: list[list[float]] = [[] for _ in targets]
        for round_ in range(repeat):
            order = list(range(len(trees)))
            for i in (order if round_ % 2 == 0 else order[::-1]) + [len(trees)]:
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                view = context.new_page()
                try:
                    times[i].append(open_page(view, *targets[i], timeout_ms=120_000))
                finally:
                    view.close()
                    context.close()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.tools.bench.first_views",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="results folder to (re)write")
    parser.add_argument("--requests", type=int, default=10_000_000, help="requests per study")
    parser.add_argument("--no-generate", action="store_true", help="reuse an existing --out")
    parser.add_argument("--repeat", type=int, default=5, help="timed views per page and way")
    parser.add_argument("--pages", default=",".join(PAGES),
                        help=f"comma-separated, of {', '.join(PAGES)}")
    parser.add_argument("--code", type=Path, action="append", default=[], metavar="DIR",
                        help="also serve the dashboard of another checkout DIR (its "
                             "dashboards/app.py, its packages first on PYTHONPATH), page by "
                             "page beside this one's: before/after in one run (repeatable)")
    parser.add_argument("--interleave", action="store_true",
                        help="per page, every tree's cold views and the floor's in turn, "
                             "view by view (all served at once), with each --code tree's "
                             "difference to this checkout, view by view: before/after under a "
                             "drifting load")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if not args.no_generate:
        started = time.perf_counter()
        generate(out, args.requests)
        print(f"wrote {out} in {time.perf_counter() - started:.0f} s")
    pages = [p.strip() for p in args.pages.split(",") if p.strip()]
    unknown = [p for p in pages if p not in PAGES]
    if unknown:
        parser.error(f"--pages: unknown {unknown}; allowed: {', '.join(PAGES)}")
    loads = [os.getloadavg()[0]]
    print(f"machine: {os.cpu_count()} cores, load average {loads[0]:.1f} at the start")
    if args.interleave:
        return _interleaved(out, pages, args.repeat, [c.resolve() for c in args.code], loads)
    rows: list[tuple[str, float, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        floor_app = Path(tmp) / "floor_app.py"
        floor_app.write_text(FLOOR_APP)
        trees = [(None, "")] + [(code.resolve(), f" [{code.name}]") for code in args.code]
        for page in pages:
            url_path, ready = PAGES[page]
            for tree, tag in trees:
                cold, warm = _measure_tree(out, url_path, ready, args.repeat, tree)
                # the floor right after each page, so both see the same load
                floor, _ = measure_browser(out, "", args.repeat, url_path="/compare",
                                           ready_selector=FLOOR_SELECTOR, app=floor_app)
                loads.append(os.getloadavg()[0])
                rows.append((page + tag, _median(cold), _median(warm), _median(floor)))
                print(f"  {page}{tag}: cold {', '.join(f'{t:.2f}' for t in cold)} s; floor "
                      f"{', '.join(f'{t:.2f}' for t in floor)} s", flush=True)
    print(f"\nload average {min(loads):.1f}-{max(loads):.1f} during the run; medians of "
          f"{args.repeat} views; floor: one metric in the dashboard's frame, cold")
    width = max(9, *(len(row[0]) for row in rows))
    print(f"{'page':<{width}} {'cold':>6} {'warm':>6} {'floor':>6} {'over floor':>10}  "
          "within 1.5 s")
    for name, cold_s, warm_s, floor_s in rows:
        print(f"{name:<{width}} {cold_s:6.2f} {warm_s:6.2f} {floor_s:6.2f} "
              f"{cold_s - floor_s:+10.2f}  {'yes' if cold_s <= 1.5 else 'NO'}")
    return 0


def _interleaved(out: Path, pages: Sequence[str], repeat: int, codes: Sequence[Path],
                 loads: list[float]) -> int:
    trees: list[Path | None] = [None, *codes]
    names = ["this checkout", *(f"[{code.name}]" for code in codes)]
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        floor_app = Path(tmp) / "floor_app.py"
        floor_app.write_text(FLOOR_APP)
        for page in pages:
            *views, floor = measure_interleaved(out, page, repeat, trees, floor_app)
            loads.append(os.getloadavg()[0])
            for name, times in zip(names, views, strict=True):
                print(f"  {page} {name}: cold {', '.join(f'{t:.2f}' for t in times)} s",
                      flush=True)
            print(f"  {page} floor: {', '.join(f'{t:.2f}' for t in floor)} s", flush=True)
            cells = [f"{_median(times):.2f} ({_median(times) - _median(floor):+.2f})"
                     for times in views]
            for times in views[1:]:
                paired = [a - b for a, b in zip(views[0], times, strict=True)]
                cells.append(f"{statistics.median(paired):+.2f}")
            lines.append(f"{page:<9} {_median(floor):6.2f}  " + "  ".join(cells))
    print(f"\nload average {min(loads):.1f}-{max(loads):.1f} during the run; {repeat} cold "
          "views of each, in turn; cold median (over the floor's median); last: this checkout "
          "minus each --code tree, the median of the view-by-view differences")
    print(f"{'page':<9} {'floor':>6}  " + "  ".join(names)
          + "".join(f"  this - {name}" for name in names[1:]))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
