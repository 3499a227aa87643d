"""A synthetic study folder of any size, and the study page's first-view time on it.

The folder follows the study runner's contract (``study.json``, ``rollup/steps.parquet``,
``rollup/capacity.parquet``, one run folder per step) with roll-ups consistent with
``--requests`` requests in all; ``--raw-steps`` steps also get their full raw request Parquet
(the rest only a manifest), so a page that reads raw data by mistake pays for it.

Usage::

    python -m infra.tools.bench.study_dashboard --out /tmp/study-10m --requests 10000000 \
        --raw-steps 2
    python -m infra.tools.bench.study_dashboard --out /tmp/study-10m --measure  # generate + measure
    python -m infra.tools.bench.study_dashboard --out /tmp/study-10m --measure --no-generate

``--measure`` prints (a) the AppTest run time of the study page (script start to the last
element, median of ``--repeat`` fresh sessions), (b) in headless Chromium, the time from
navigation to the study page until the latency chart's SVG marks are visible, with an empty
browser cache (a first visit) and with Streamlit's static JS cached (a second visit), and (c)
the cold time for a Streamlit page holding one metric, the floor Streamlit's own frontend sets
on this machine. It is a benchmark, not a test: nothing fails on a slow figure.

The latency model is a textbook queue, not a measurement: configuration *i* serves ``capacity``
req/s; at utilisation rho = offered / capacity, latency grows like rho / (1 - rho) and errors
start past saturation. Its knee and max load are therefore known.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from collectors.run_folder import STUDY_FILE, Manifest, write_manifest
from dashboards.analysis import frontier
from dashboards.analysis.study import write_rollup

_NS = 1_000_000_000
T0_NS = 1_750_000_000 * _NS
BUCKET_SCALE = {"short": 0.6, "medium": 1.0, "long": 1.8, "all": 1.1}
BUCKET_SHARE = {"short": 0.5, "medium": 0.3, "long": 0.2, "all": 1.0}
OUTPUT_TOKENS = {"short": 64, "medium": 192, "long": 512, "all": 180}
SLO: dict[str, Any] = {"ttft_p95_ms": 500.0, "tpot_p95_ms": 50.0, "error_rate": 0.01,
                       "percentile": "p95"}
READY_SELECTOR = ".st-key-chart-latency-throughput svg.marks"
GPU_HOUR_USD = 2.5  # the synthetic study's price of a GPU-hour
DEFAULT_CONFIGS = (("max-num-seqs-8", 40.0), ("max-num-seqs-32", 110.0))


def _queue_factor(rho: float) -> float:
    """rho / (1 - rho) below 0.95, then a steep straight line: a queue that never drains."""
    return rho / (1 - rho) if rho < 0.95 else 19.0 + 60.0 * (rho - 0.95)


def _step_rows(
    config: str, step: int, load: float, capacity: float, duration_s: float, start_ns: int
) -> list[dict[str, Any]]:
    rho = load / capacity
    queue = _queue_factor(rho)
    error_rate = 0.0 if rho <= 1.0 else min(0.12, 0.2 * (rho - 1.0))
    achieved = min(load, capacity * (1.0 - 0.01 * (step % 3))) * (1.0 - error_rate)
    rows = []
    for bucket, scale in BUCKET_SCALE.items():
        share = BUCKET_SHARE[bucket]
        ttft = 0.025 * scale * (1.0 + 0.6 * queue)
        itl = 0.008 * (1.0 + 0.4 * min(rho, 1.3))
        tpot = itl * 1.04
        e2e = ttft + tpot * OUTPUT_TOKENS[bucket]
        requests = round(load * duration_s * share)
        row: dict[str, Any] = {
            "config": config,
            "step": step,
            "bucket": bucket,
            "offered_load": load,
            "load_kind": "rate",
            "achieved_req_per_s": achieved * share,
            "output_tok_per_s": achieved * share * OUTPUT_TOKENS[bucket],
            "error_rate": error_rate,
            "err_http_5xx": error_rate * 0.7,
            "err_timeout_before_first_token": error_rate * 0.3,
            "requests": requests,
            "window_start_ns": start_ns,
            "window_end_ns": start_ns + round(duration_s * _NS),
            "gpu_util_mean": min(99.0, 97.0 * rho),
            "power_w_mean": 120.0 + 560.0 * min(rho, 1.0),
            "num_requests_running_mean": min(load * e2e, capacity * 0.6),
            "kv_cache_usage_mean": min(0.98, 0.9 * rho),
        }
        for metric, p50 in (("ttft", ttft), ("itl", itl), ("tpot", tpot), ("e2e", e2e)):
            row[f"{metric}_p50_s"] = p50
            row[f"{metric}_p95_s"] = p50 * 1.8
            row[f"{metric}_p99_s"] = p50 * 2.6
        meets = row["ttft_p95_s"] * 1e3 <= SLO["ttft_p95_ms"] and error_rate <= SLO["error_rate"]
        row["goodput_req_per_s"] = row["achieved_req_per_s"] if meets else 0.0
        rows.append(row)
    return rows


def _capacity_row(config: str, steps: pd.DataFrame, capacity: float) -> dict[str, Any]:
    view = steps[(steps["config"] == config) & (steps["bucket"] == "all")]
    view = view.sort_values("offered_load")
    meets = (
        (view["ttft_p95_s"] * 1e3 <= SLO["ttft_p95_ms"])
        & (view["tpot_p95_s"] * 1e3 <= SLO["tpot_p95_ms"])
        & (view["error_rate"] <= SLO["error_rate"])
        & (view["achieved_req_per_s"] >= 0.95 * view["offered_load"])
    )
    sustainable = view.loc[meets, "offered_load"]
    # the model bends at about 80% utilisation; take the step nearest to it
    knee_index = (view["offered_load"] - 0.8 * capacity).abs().idxmin()
    return {
        "config": config,
        "max_sustainable_load": float(sustainable.max()) if len(sustainable) else math.nan,
        "max_load_reached": bool(len(sustainable) and not meets.iloc[-1]),
        "knee_load": float(view.loc[knee_index, "offered_load"]),
        "knee_reached": True,
        "knee_latency_s": float(view.loc[knee_index, "ttft_p95_s"]),
        "metric": "ttft_p95_s",
        "slo": json.dumps(SLO),
    }


def _write_raw_requests(run_dir: Path, run_id: str, count: int, window: tuple[int, int]) -> None:
    """``count`` request records spread over the step's window (REQUEST_SCHEMA's required
    columns and the latencies); written in part files of 500k rows, as a run would."""
    from collectors.schemas import REQUEST_SCHEMA

    rng = np.random.default_rng(count)
    out = run_dir / "requests"
    out.mkdir(parents=True, exist_ok=True)
    part_rows = 500_000
    for part, first in enumerate(range(0, count, part_rows)):
        n = min(part_rows, count - first)
        ttft = rng.gamma(2.0, 0.03, n)
        columns = {
            "run_id": pa.array([run_id] * n, pa.string()),
            "worker_id": pa.array(["bench:1:0"] * n, pa.string()),
            "request_id": pa.array([f"r{first + i}" for i in range(n)], pa.string()),
            "bucket": pa.array(rng.choice(["short", "medium", "long"], n), pa.string()),
            "outcome": pa.array(["ok"] * n, pa.string()),
            "sent_wall_ns": pa.array(np.linspace(window[0], window[1], n).astype(np.int64)),
            "ttft_s": pa.array(ttft),
            "e2e_s": pa.array(ttft + 1.5),
            "tpot_s": pa.array(np.full(n, 0.0085)),
            "output_tokens": pa.array(np.full(n, 180, dtype=np.int32)),
        }
        table = pa.table(
            {
                name: columns.get(name, pa.nulls(n, REQUEST_SCHEMA.field(name).type))
                for name in REQUEST_SCHEMA.names
            },
            schema=REQUEST_SCHEMA,
        )
        pq.write_table(table, out / f"part-{part:05d}.parquet")


def write_synthetic_study(
    study_dir: str | Path,
    total_requests: int = 10_000_000,
    configs: Sequence[tuple[str, float]] = DEFAULT_CONFIGS,
    step_loads: Sequence[float] = (10, 20, 35, 50, 70, 90, 110, 130, 150, 170),
    raw_steps: int = 0,
    name: str = "synthetic-10m",
) -> Path:
    """Write a study folder whose roll-ups add up to ``total_requests`` requests.

    Each configuration runs every load in ``step_loads`` (req/s); the step duration is chosen
    so the requests add up. The first ``raw_steps`` step runs get their raw request Parquet.
    Returns the study folder.
    """
    root = Path(study_dir)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    duration_s = total_requests / (len(configs) * sum(step_loads))
    rows: list[dict[str, Any]] = []
    meta_steps: list[dict[str, Any]] = []
    start_ns = T0_NS
    for config, capacity in configs:
        for step, load in enumerate(step_loads):
            step_rows = _step_rows(config, step, float(load), capacity, duration_s, start_ns)
            rows += step_rows
            run_rel = f"{config}/step-{step}"
            run_dir = root / run_rel
            run_dir.mkdir(parents=True)
            run_id = f"{name}-{config}-step-{step}"
            manifest = Manifest(
                run_id=run_id,
                started_at=_iso(start_ns),
                ended_at=_iso(start_ns + round(duration_s * _NS)),
                target={"kind": "sim", "base_url": "http://127.0.0.1:8000", "model": "tiny"},
                workload={"kind": "synthetic"},
                load={"kind": "rate", "rate": load, "duration_s": duration_s},
                gpu={"available": False, "reason": "synthetic study", "gpus": []},
                study={"name": name, "config": config, "step": step},
            )
            write_manifest(run_dir, manifest)
            if len(meta_steps) < raw_steps:
                window = (start_ns, start_ns + round(duration_s * _NS))
                _write_raw_requests(run_dir, run_id, step_rows[-1]["requests"], window)
            meta_steps.append(
                {
                    "config": config,
                    "step": step,
                    "offered_load": float(load),
                    "load_kind": "rate",
                    "run_dir": run_rel,
                }
            )
            start_ns += round((duration_s + 30) * _NS)
    steps = pd.DataFrame(rows)
    capacity = pd.DataFrame([_capacity_row(c, steps, cap) for c, cap in configs])
    points, verdict = _intervals(steps, capacity, configs)
    write_rollup(root, steps, capacity, points, verdict)
    meta = {
        "name": name,
        "configurations": [
            {"name": c, "target": "sim", "args": ["--max-num-seqs", c.rsplit("-", 1)[-1]]}
            for c, _ in configs
        ],
        "status": "finished",
        "slo": SLO,
        "started_at": _iso(T0_NS),
        "ended_at": _iso(start_ns),
        "steps": meta_steps,
    }
    (root / STUDY_FILE).write_text(json.dumps(meta, indent=1))
    return root


INTERVAL_SHARE = 0.06  # the synthetic intervals: +-6% of each figure


def _intervals(steps: pd.DataFrame, capacity: pd.DataFrame,
               configs: Sequence[tuple[str, float]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """points (the steps as 3 repeats, every figure with an interval), capacity's intervals
    (added in place), and a verdict between the first two configurations: what a decision-grade
    study's roll-up holds, so the page draws its error bars and verdict table."""
    points = steps.copy()
    points["repeats"] = 3
    points["phase"] = "sweep"
    points["settled"] = True
    figures = [c for c in points.columns if c.endswith(("_s", "_per_s")) or c == "error_rate"]
    for column in figures:
        points[f"{column}_lo"] = points[column] * (1 - INTERVAL_SHARE)
        points[f"{column}_hi"] = points[column] * (1 + INTERVAL_SHARE)
    for name, column in (("max_load", "max_sustainable_load"), ("knee", "knee_load")):
        capacity[f"{name}_lo"] = capacity[column] * (1 - INTERVAL_SHARE)
        capacity[f"{name}_hi"] = capacity[column] * (1 + INTERVAL_SHARE)
    capacity["repeats"] = 3
    capacity["requests"] = [int(steps[(steps["config"] == c) & (steps["bucket"] == "all")][
        "requests"].sum()) for c in capacity["config"]]
    a, b = configs[0][0], configs[1][0]
    cap = capacity.set_index("config")
    ratio = cap.loc[b, "max_sustainable_load"] / cap.loc[a, "max_sustainable_load"]
    verdict = [{"config_a": a, "config_b": b, "kind": "max load", "offered_load": math.nan,
                "figure": "max_sustainable_load", "value_a": cap.loc[a, "max_sustainable_load"],
                "value_b": cap.loc[b, "max_sustainable_load"], "change": ratio,
                "lo": ratio * 0.9, "hi": ratio * 1.1, "relative": ratio - 1,
                "within_noise": False,
                "text": f"{b} sustains {ratio:.2f}x the load of {a} [{ratio * 0.9:.2f}, "
                        f"{ratio * 1.1:.2f}]"}]
    view = points[points["bucket"] == "all"].set_index(["config", "offered_load"])
    for load in sorted(set(view.loc[a].index) & set(view.loc[b].index)):
        for figure in ("ttft_p95_s", "tpot_p95_s", "error_rate"):
            va, vb = float(view.loc[(a, load), figure]), float(view.loc[(b, load), figure])
            spread = INTERVAL_SHARE * (abs(va) + abs(vb))
            verdict.append({"config_a": a, "config_b": b, "kind": "at load",
                            "offered_load": float(load), "figure": figure, "value_a": va,
                            "value_b": vb, "change": vb - va, "lo": vb - va - spread,
                            "hi": vb - va + spread, "relative": (vb - va) / va if va else 0.0,
                            "within_noise": bool(abs(vb - va) <= spread), "text": ""})
    # one GPU a configuration, drawing the synthetic power: the frontier and efficiency columns
    points["gpu_count"], points["gpu_power_w"] = 1.0, points["power_w_mean"]
    points = frontier.efficiency_columns(points, GPU_HOUR_USD)
    efficient = frontier.capacity_efficiency(capacity, points)
    for column in efficient.columns.difference(capacity.columns):
        capacity[column] = efficient[column]
    verdict += [{"config_a": a, "config_b": b, "kind": "frontier", "text": segment["text"],
                 "speed_lo": segment["speed_lo"], "speed_hi": segment["speed_hi"],
                 "outcome": segment["outcome"]}
                for segment in frontier.frontier_segments(points, {}, a, b)]
    verdict += [{"config_a": row["config"], "config_b": "", "kind": "efficiency",
                 "text": frontier.efficiency_text(row["config"], row, "req/s")}
                for row in capacity.to_dict("records")]
    return points, pd.DataFrame(verdict)


def _iso(ns: int) -> str:
    return pd.Timestamp(ns, unit="ns", tz="UTC").strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------------------- measure


def measure_apptest(results_dir: Path, study_name: str, repeat: int = 3) -> list[float]:
    """Seconds for a fresh AppTest session to run the study page to its end, ``repeat`` times."""
    from streamlit.testing.v1 import AppTest

    from dashboards import launch

    app = launch.APP_PATH
    os.environ["SWARMLOAD_RESULTS"] = str(results_dir)
    times = []
    for _ in range(repeat):
        at = AppTest.from_file(str(app), default_timeout=120)
        at.query_params["study"] = study_name
        at.run()  # first run registers the pages; the timed one is the study page's
        at.switch_page("ui/study_page.py")
        started = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - started)
        if at.exception:
            raise RuntimeError(f"study page raised: {at.exception[0].value}")
    return times


NETWORK_RETRIES = 3  # views redone when Chromium drops their requests for a network change


def measure_browser(
    results_dir: Path, study_name: str, repeat: int = 3, url_path: str | None = None,
    ready_selector: str = READY_SELECTOR, app: Path | None = None,
) -> tuple[list[float], list[float]]:
    """Seconds from ``page.goto`` of the study page until the latency chart's marks are
    visible, in headless Chromium against the dashboard server, ``repeat`` times each way,
    alternating: cold (a new browser context, so an empty HTTP cache: a first visit) and warm
    (one context that has visited once, so Streamlit's static JS comes from the cache, as on a
    stakeholder's second visit). Every view is a new page, so a new session and script run.
    One untimed visit first starts the server's Python side (imports, chart cache), which a
    user pays once per server, not per view, and its script run ends before the first timed
    view. ``url_path`` and ``ready_selector`` time another
    page the same way; ``app`` serves another script in the dashboard's place. Returns (cold,
    warm)."""
    from infra.tools.browser import (
        NetworkChanged,
        chromium_browser,
        dashboard_server,
        open_page,
        wait_for_script,
    )

    url_path = url_path or f"/study?study={study_name}"
    viewport = {"width": 1400, "height": 1000}
    cold: list[float] = []
    warm: list[float] = []
    served = dashboard_server(results_dir, app=app) if app else dashboard_server(results_dir)
    with served as url, chromium_browser() as browser:
        first = browser.new_page()
        open_page(first, url + url_path, ready_selector, timeout_ms=120_000)
        wait_for_script(first)
        first.close()
        cached = browser.new_context(viewport=viewport)
        page = cached.new_page()
        open_page(page, url + url_path, ready_selector, timeout_ms=120_000)
        wait_for_script(page)
        page.close()

        def timed(context: Any) -> float:
            # a view whose requests Chromium dropped for a network change (another process
            # adding an interface) is redone from a new page (a new context for a cold one),
            # never reloaded: a reload would count the cache the dropped view filled
            for attempt in range(NETWORK_RETRIES + 1):
                own = context or browser.new_context(viewport=viewport)
                page = own.new_page()
                try:
                    return open_page(page, url + url_path, ready_selector, timeout_ms=120_000,
                                     retries=0)
                except NetworkChanged as exc:
                    print(f"  (view redone: {exc})", flush=True)
                    if attempt == NETWORK_RETRIES:
                        raise
                finally:
                    page.close()
                    if context is None:
                        own.close()
            raise AssertionError("unreachable")

        for _ in range(repeat):
            cold.append(timed(None))
            warm.append(timed(cached))
        cached.close()
    return cold, warm


BASELINE_PAGE = """import streamlit as st
st.title("baseline")
st.metric("requests", "10,000,000")
"""


def measure_baseline(repeat: int = 3) -> list[float]:
    """The same Chromium timing on a Streamlit page holding only a title and a metric: what
    Streamlit's own frontend costs on this machine, before any of the study page's work."""
    import tempfile

    from infra import procs
    from infra.tools.browser import chromium_browser, free_port, open_page, wait_for_port

    times = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "baseline.py"
        script.write_text(BASELINE_PAGE)
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(script),
            "--server.port",
            str(port),
            "--server.address",
            "127.0.0.1",
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
            "--server.fileWatcherType",
            "none",
        ]
        with procs.running(command, name="streamlit-baseline", grace_s=15.0) as server:
            wait_for_port(server, port, 90)
            url = f"http://127.0.0.1:{port}/"
            with chromium_browser() as browser:
                warm = browser.new_page()
                open_page(warm, url, '[data-testid="stMetric"]')
                warm.close()
                for _ in range(repeat):
                    page = browser.new_page(viewport={"width": 1400, "height": 1000})
                    times.append(open_page(page, url, '[data-testid="stMetric"]'))
                    page.close()
    return times


def figures(times: list[float]) -> str:
    """Timed views as the benchmarks print them: the median, then every one."""
    listed = ", ".join(f"{t:.3f}" for t in times)
    return f"median {statistics.median(times):.3f} s over {len(times)} ({listed})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.tools.bench.study_dashboard",
        description="Generate a synthetic study folder and time the study page's first view.",
    )
    parser.add_argument("--out", type=Path, required=True, help="study folder to (re)write")
    parser.add_argument("--requests", type=int, default=10_000_000, help="requests in all")
    parser.add_argument("--raw-steps", type=int, default=0, help="steps with raw request files")
    parser.add_argument("--measure", action="store_true", help="time the study page on it")
    parser.add_argument("--no-generate", action="store_true", help="reuse an existing --out")
    parser.add_argument("--repeat", type=int, default=3, help="timed views per method (3)")
    args = parser.parse_args(argv)
    if not args.no_generate:
        started = time.perf_counter()
        write_synthetic_study(args.out, args.requests, raw_steps=args.raw_steps)
        took = time.perf_counter() - started
        print(f"wrote {args.out} ({args.requests:,} requests) in {took:.1f} s")
    if not args.measure:
        return 0
    meta = json.loads((args.out / STUDY_FILE).read_text())
    results_dir = args.out.resolve().parent
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cores, load average {load:.1f} (other work shares them)")
    apptest = measure_apptest(results_dir, meta["name"], args.repeat)
    print(f"first view, AppTest (study page script, server side): {figures(apptest)}")
    cold, warm = measure_browser(results_dir, meta["name"], args.repeat)
    print(f"first view, Chromium, cold cache (navigation -> latency chart drawn): {figures(cold)}")
    print(f"first view, Chromium, warm cache (static JS cached; same): {figures(warm)}")
    baseline = measure_baseline(args.repeat)
    print(f"baseline, Chromium (a Streamlit page with one metric): {figures(baseline)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
