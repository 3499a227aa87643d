"""Study folders for the dashboard: find them, read their roll-ups, shape the tables.

A study folder (written by ``swarmload study run``) holds::

    study.json                 name, configurations, status, slo, started_at, ended_at, steps
    rollup/steps.parquet       one row per config x step x bucket (short/medium/long/all)
    rollup/capacity.parquet    one row per config: max sustainable load, knee, flags
    rollup/points.parquet, verdict.parquet, frontier.parquet  (dashboards.analysis.study)
    <config>/step-<k>/         a normal run folder per step (manifest.json, requests/, gpu/, ...)

Everything here reads **only** ``study.json`` and the two roll-ups, a few kilobytes whatever the
number of requests, so the study page's first view does not grow with the study; the raw request
files are left to the run page. Missing files or columns give empty frames or absent columns,
never an error: the page shows what exists.

Usage::

    studies = list_studies("results")               # name, status, configs, steps, path, ...
    study = load_study(studies.loc[0, "path"])      # Study(meta, steps, capacity)
    view = select_steps(study.steps, bucket="all")  # rows of one bucket, ordered for charts
    latency_table_ms(study.steps, "ttft")           # P95/P99 per bucket, in ms
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from collectors.run_folder import (
    CAPACITY_FILE,
    FRONTIER_FILE,
    POINTS_FILE,
    ROLLUP_DIR,
    STEPS_FILE,
    STUDY_FILE,
    VERDICT_FILE,
    list_runs,
    load_study_meta,
    newest_first,
    study_dirs,
)
from dashboards.analysis import frontier
from dashboards.analysis.study_verdict import THROUGHPUT_FIGURES, arrivals_unit

BUCKETS = ("all", "short", "medium", "long")
# metric tag -> label; roll-up columns are f"{tag}_{pct}_s", as in dashboards.analysis.runs
METRICS: dict[str, str] = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "E2E"}
# agent workloads: a task's time, from its first call's send to its last call's end
# (dashboards.analysis.tasks); a Metric choice only where the roll-up has its percentiles
TASK_METRIC = "task"
METRIC_LABELS: dict[str, str] = {**METRICS, TASK_METRIC: "task time"}
PERCENTILE_TAGS: dict[str, str] = {"p50": "P50", "p95": "P95", "p99": "P99"}
# roll-up telemetry mean -> axis label; only those present are shown
TELEMETRY_COLUMNS: dict[str, str] = {
    "gpu_util_mean": "GPU utilisation (%)",
    "power_w_mean": "GPU power (W)",
    "num_requests_running_mean": "running requests (server)",
    "num_requests_waiting_mean": "waiting requests (server)",
    "kv_cache_usage_mean": "KV cache usage (fraction)",
}
THROUGHPUT_COLUMNS: dict[str, str] = {
    "achieved_req_per_s": "achieved (ok req/s)",
    "output_tok_per_s": "output tok/s",
    "goodput_req_per_s": "goodput (req/s within SLO)",
}
LOAD_UNITS = {"rate": "req/s", "concurrency": "concurrent streams"}
LOAD_UNITS_SHORT = {"rate": "req/s", "concurrency": "streams"}  # for headline figures


@dataclass(frozen=True)
class Study:
    """A study as the dashboard sees it: ``study.json`` and the two roll-up tables."""

    path: str
    meta: dict[str, Any] = field(default_factory=dict)
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    capacity: pd.DataFrame = field(default_factory=pd.DataFrame)
    points: pd.DataFrame = field(default_factory=pd.DataFrame)  # empty before intervals
    verdict: pd.DataFrame = field(default_factory=pd.DataFrame)
    frontier: pd.DataFrame = field(default_factory=pd.DataFrame)  # rollup/frontier.parquet

    @property
    def curves(self) -> pd.DataFrame:
        """What the curves draw: one row per configuration x load x bucket over all its
        repeats, with ``<figure>_lo`` / ``_hi`` (points.parquet), or the step rows of a study
        written before intervals."""
        return self.points if len(self.points) else self.steps

    @property
    def name(self) -> str:
        return str(self.meta.get("name") or Path(self.path).name)

    @property
    def configs(self) -> list[str]:
        """Configuration names in study order, then any others the roll-ups name."""
        names = [str(c.get("name")) for c in self.meta.get("configurations") or [] if c]
        for frame in (self.steps, self.capacity):
            if "config" in frame:
                names += [str(c) for c in frame["config"].dropna().unique() if str(c) not in names]
        return list(dict.fromkeys(names))

    @property
    def slo(self) -> dict[str, Any]:
        return dict(self.meta.get("slo") or {})


def list_studies(results_dir: str | Path) -> pd.DataFrame:
    """One row per study folder under ``results_dir``, newest ``started_at`` first.

    Columns: study_id (the folder relative to ``results_dir``, "." for itself), name, status,
    configs (count), steps (count), started_at, ended_at, path.
    """
    columns = ["study_id", "name", "status", "configs", "steps", "started_at", "ended_at", "path"]
    rows = []
    root = Path(results_dir)
    for path in study_dirs(root):
        meta = load_study_meta(path)
        rows.append(
            {
                # the folder, relative to the results folder: unique, where names may repeat
                "study_id": path.relative_to(root).as_posix(),
                "name": str(meta.get("name") or path.name),
                "status": meta.get("status"),
                "configs": len(meta.get("configurations") or []),
                "steps": len(meta.get("steps") or []),
                "started_at": meta.get("started_at"),
                "ended_at": meta.get("ended_at"),
                "path": str(path),
            }
        )

    return newest_first(rows, columns, "study_id")


def find_study(studies: pd.DataFrame, wanted: str | None) -> pd.Series | None:
    """The row whose ``study_id`` is ``wanted``, else the newest whose name is; ``None``."""
    if wanted is None or studies.empty:
        return None
    for column in ("study_id", "name"):
        match = studies[studies[column] == wanted]
        if len(match):
            return match.iloc[0]
    return None


def study_fingerprint(study_dir: str | Path) -> tuple[int, ...]:
    """mtimes (ns) of study.json and the roll-ups: a cache key that changes on each rewrite."""
    root = Path(study_dir)
    paths = [root / STUDY_FILE, root / ROLLUP_DIR / STEPS_FILE, root / ROLLUP_DIR / CAPACITY_FILE,
             root / ROLLUP_DIR / POINTS_FILE, root / ROLLUP_DIR / VERDICT_FILE,
             root / ROLLUP_DIR / FRONTIER_FILE]
    return tuple(p.stat().st_mtime_ns if p.is_file() else 0 for p in paths)


def _read_parquet(path: Path) -> pd.DataFrame:
    if not path.is_file():
        return pd.DataFrame()
    return pq.read_table(path).to_pandas()


def load_study(study_dir: str | Path) -> Study:
    """``study.json`` and the roll-ups of one study folder (empty frames where absent)."""
    root = Path(study_dir)
    steps = _read_parquet(root / ROLLUP_DIR / STEPS_FILE)
    capacity = _read_parquet(root / ROLLUP_DIR / CAPACITY_FILE)
    if "config" in steps:
        steps["config"] = steps["config"].astype(str)
    points = _read_parquet(root / ROLLUP_DIR / POINTS_FILE)
    verdict = _read_parquet(root / ROLLUP_DIR / VERDICT_FILE)
    frontier_points = _read_parquet(root / ROLLUP_DIR / FRONTIER_FILE)
    for frame in (capacity, points, frontier_points):
        if "config" in frame:
            frame["config"] = frame["config"].astype(str)
    return Study(path=str(root), meta=load_study_meta(root), steps=steps, capacity=capacity,
                 points=points, verdict=verdict, frontier=frontier_points)


# ----------------------------------------------------------------------------------------- shaping


def metric_column(metric: str, percentile: str) -> str:
    """Roll-up column of a latency figure: ``metric_column("ttft", "p95") == "ttft_p95_s"``."""
    if metric not in METRIC_LABELS:
        raise ValueError(f"unknown metric {metric!r}; valid: {list(METRIC_LABELS)}")
    if percentile not in PERCENTILE_TAGS:
        raise ValueError(f"unknown percentile {percentile!r}; valid: {list(PERCENTILE_TAGS)}")
    return f"{metric}_{percentile}_s"


def metrics_present(steps: pd.DataFrame) -> dict[str, str]:
    """The latency figures a study can be read by: the requests' (:data:`METRICS`), then the
    tasks' time where the roll-up has it (an agent workload's study)."""
    has_tasks = any(metric_column(TASK_METRIC, pct) in steps for pct in PERCENTILE_TAGS)
    return dict(METRIC_LABELS) if has_tasks else dict(METRICS)


def buckets_present(steps: pd.DataFrame) -> list[str]:
    """Buckets in the roll-up, ``all`` first, then short/medium/long, then any other."""
    if "bucket" not in steps:
        return []
    present = [str(b) for b in steps["bucket"].dropna().unique()]
    return [b for b in BUCKETS if b in present] + sorted(set(present) - set(BUCKETS))


def select_steps(
    steps: pd.DataFrame, bucket: str = "all", configs: Sequence[str] | None = None
) -> pd.DataFrame:
    """Rows of one bucket (all rows when the roll-up has no ``bucket`` column), of the chosen
    configurations, ordered by config then offered load."""
    view = steps
    if "bucket" in view:
        view = view[view["bucket"].astype(str) == bucket]
    if configs is not None and "config" in view:
        view = view[view["config"].isin(list(configs))]
    order = [c for c in ("config", "offered_load", "step") if c in view]
    return view.sort_values(order, kind="stable").reset_index(drop=True) if order else view


def load_unit(steps: pd.DataFrame, short: bool = False) -> str:
    """What the offered load counts ("req/s", "concurrent streams"; "streams" when ``short``),
    from ``load_kind``; "sessions/s" or "tasks/s" for a rate plan of them (``arrival_unit``)."""
    if "load_kind" not in steps:
        return ""
    kinds = {str(k) for k in steps["load_kind"].dropna().unique()}
    if len(kinds) != 1:
        return ""
    kind = kinds.pop()
    return arrivals_unit(steps) or (LOAD_UNITS_SHORT if short else LOAD_UNITS).get(kind, kind)


def error_classes(steps: pd.DataFrame) -> list[str]:
    """``err_<class>`` columns present, in file order."""
    return [c for c in steps.columns if c.startswith("err_")]


def _step_index(view: pd.DataFrame) -> pd.DataFrame:
    index = [c for c in ("config", "step", "offered_load") if c in view]
    return view.set_index(index) if index else view


def latency_table_ms(
    steps: pd.DataFrame,
    metric: str,
    percentiles: Sequence[str] = ("p95", "p99"),
    configs: Sequence[str] | None = None,
) -> pd.DataFrame:
    """One latency metric in ms: a row per config x step, a column per bucket x percentile
    (``"short P95"``, ``"short P99"``, ...); columns the roll-up lacks are left out. The task
    time is the whole step's (repeated on every bucket row): its ``all`` columns only."""
    buckets = buckets_present(steps) or ["all"]
    if metric == TASK_METRIC:
        buckets = buckets[:1]
    pieces = {}
    for bucket in buckets:
        view = _step_index(select_steps(steps, bucket, configs))
        for pct in percentiles:
            column = metric_column(metric, pct)
            if column in view:
                pieces[f"{bucket} {PERCENTILE_TAGS[pct]}"] = view[column] * 1e3
    return pd.DataFrame(pieces)


def latency_table_title(metric: str) -> str:
    """The heading of :func:`latency_table_ms`'s table: what it times, over what."""
    if metric == TASK_METRIC:
        return f"{METRIC_LABELS[metric]} (ms, ok tasks of the whole step)"
    return f"{METRIC_LABELS[metric]} per bucket (ms, ok requests)"


def error_table_pct(
    steps: pd.DataFrame, bucket: str = "all", configs: Sequence[str] | None = None
) -> pd.DataFrame:
    """Requests, error rate and each error class in %, a row per config x step of one bucket."""
    view = _step_index(select_steps(steps, bucket, configs))
    table = pd.DataFrame(index=view.index)
    if "requests" in view:
        table["requests"] = view["requests"]
    if "error_rate" in view:
        table["error %"] = view["error_rate"] * 100
    for column in error_classes(view):
        table[f"% {column[4:]}"] = view[column] * 100
    return table


def throughput_table(
    steps: pd.DataFrame, bucket: str = "all", configs: Sequence[str] | None = None
) -> pd.DataFrame:
    """Achieved req/s, output tok/s and goodput, a row per config x step of one bucket."""
    view = _step_index(select_steps(steps, bucket, configs))
    table = pd.DataFrame(index=view.index)
    for column, label in THROUGHPUT_COLUMNS.items():
        if column in view:
            table[label] = view[column]
    return table


def _flag(value: Any) -> bool | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return bool(value)


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number


def capacity_rows(capacity: pd.DataFrame) -> list[dict[str, Any]]:
    """Capacity rows as plain dicts with floats (NaN when absent) and flags (None when absent)."""
    rows = []
    for record in capacity.to_dict("records"):
        rows.append(
            {
                "config": str(record.get("config")),
                "max_sustainable_load": _number(record.get("max_sustainable_load")),
                "max_load_reached": _flag(record.get("max_load_reached")),
                "knee_load": _number(record.get("knee_load")),
                "knee_reached": _flag(record.get("knee_reached")),
                "knee_latency_s": _number(record.get("knee_latency_s")),
                "metric": record.get("metric"),
                "note": record.get("note"),
                "queue_knee_load": _number(record.get("queue_knee_load")),
                "max_load_lo": _number(record.get("max_load_lo")),
                "max_load_hi": _number(record.get("max_load_hi")),
                "knee_lo": _number(record.get("knee_lo")),
                "knee_hi": _number(record.get("knee_hi")),
                "repeats": _number(record.get("repeats")),
                "requests": _number(record.get("requests")),
                "refined": _number(record.get("refined")),
                "unsettled": _number(record.get("unsettled")),
                "knee_kind": str(record.get("knee_kind") or "bend"),
                "bend_load": _number(record.get("bend_load")),
                "bend_lo": _number(record.get("bend_lo")),
                "bend_hi": _number(record.get("bend_hi")),
                "resolved": _flag(record.get("resolved")) is not False,
            }
        )
    return rows


def interval_text(lo: float, hi: float) -> str:
    """" [38, 44]" (an upper bound of infinity: the sweep never found the limit); "" without."""
    if math.isnan(lo) or math.isnan(hi):
        return ""
    return f" [{lo:.3g}, {'∞' if math.isinf(hi) else f'{hi:.3g}'}]"


def format_load(value: float, reached: bool | None, unit: str = "") -> str:
    """A load as text: "40 req/s"; "≥ 170 req/s" when the sweep never went past it (the true
    figure is at least that); "none found"."""
    if math.isnan(value):
        return "none found"
    text = f"{value:g} {unit}".strip()
    return text if reached is not False else f"≥ {text}"


def capacity_table(capacity: pd.DataFrame, unit: str = "") -> pd.DataFrame:
    """The headline per configuration, as text a reader can quote.

    ``max sustainable load`` is the highest offered load meeting every SLO; "not reached" means
    the sweep never went past it, so the true figure is at least that. A knee "not reached"
    means the latency curve never bent within the sweep. An open-loop knee at the throughput
    ceiling (``knee_kind`` "saturation") is marked so, with the latency curve's bend beside it.
    """
    rows = []
    for row in capacity_rows(capacity):
        latency = row["knee_latency_s"]
        rows.append(
            {
                "config": row["config"],
                "max sustainable load": (format_load(
                    row["max_sustainable_load"], row["max_load_reached"], unit
                ) if row["resolved"] else "not resolved (see note)")
                + interval_text(row["max_load_lo"], row["max_load_hi"]),
                "knee": format_load(row["knee_load"], row["knee_reached"], unit)
                + interval_text(row["knee_lo"], row["knee_hi"])
                + (" (saturation)" if row["knee_kind"] == "saturation" else ""),
                "latency bend": "-" if row["knee_kind"] != "saturation" else format_load(
                    row["bend_load"], None, unit) + interval_text(row["bend_lo"], row["bend_hi"]),
                "repeats x requests": "-" if math.isnan(row["repeats"]) else
                f"{row['repeats']:.0f} x {row['requests']:.0f}",
                "latency at knee (ms)": "-" if math.isnan(latency) else f"{latency * 1e3:.1f}",
                "knee metric": str(row["metric"] or "-"),
                "queue knee (server)": format_load(row["queue_knee_load"], None, unit),
                "note": str(row["note"] or ""),
            }
        )
    columns = ["config", "max sustainable load", "knee", "latency bend", "latency at knee (ms)",
               "knee metric", "repeats x requests"]
    table = pd.DataFrame(rows, columns=[*columns, "queue knee (server)", "note"])
    table = table.set_index("config")
    if (table["repeats x requests"] == "-").all():  # a study from before intervals
        table = table.drop(columns="repeats x requests")
    if (table["latency bend"] == "-").all():  # no open-loop knee at its saturation point
        table = table.drop(columns="latency bend")
    # where the server's queue started to build, and the runner's own words on each figure
    # ("no knee reached: ..."), when the roll-up has them
    if not any(not math.isnan(row["queue_knee_load"]) for row in capacity_rows(capacity)):
        table = table.drop(columns="queue knee (server)")
    return table if table["note"].astype(bool).any() else table.drop(columns="note")


def telemetry_columns(steps: pd.DataFrame) -> list[str]:
    """Telemetry means present with at least one value."""
    return [c for c in TELEMETRY_COLUMNS if c in steps and steps[c].notna().any()]


def slo_percentile(slo: dict[str, Any]) -> str:
    """The SLO percentile as a tag ("p95"), from "p95", "P95", 95 or 95.0; p95 when unset."""
    value = slo.get("percentile")
    if value is None:
        return "p95"
    text = str(value).lower().removeprefix("p")
    try:
        return f"p{float(text):g}".replace(".", "")
    except ValueError:
        return "p95"


def slo_bounds_ms(slo: dict[str, Any]) -> dict[tuple[str, str], float]:
    """(metric, percentile tag) -> bound in ms, from either form the study file may use:
    ``{"ttft_ms": 500, "percentile": "p95"}`` or ``{"ttft_p95_ms": 500}``. Null bounds are
    left out."""
    bounds: dict[tuple[str, str], float] = {}
    default_pct = slo_percentile(slo)
    for key, value in slo.items():
        if value is None or not key.endswith("_ms"):
            continue
        pieces = key.removesuffix("_ms").split("_")
        if pieces[0] not in METRICS:
            continue
        pct = pieces[1] if len(pieces) == 2 else default_pct
        bounds[(pieces[0], pct)] = float(value)
    return bounds


def slo_text(slo: dict[str, Any]) -> str:
    """The SLOs as one line: "P95 TTFT <= 500 ms, P95 TPOT <= 50 ms, errors <= 1%"."""
    parts = [
        f"{pct.upper()} {METRICS[metric]} <= {bound:g} ms"
        for (metric, pct), bound in slo_bounds_ms(slo).items()
    ]
    if slo.get("task_ms") is not None:  # agent workloads: the task's time, not a request's
        parts.append(f"{slo_percentile(slo).upper()} task time <= "
                     f"{float(slo['task_ms']) / 1e3:g} s")
    if slo.get("error_rate") is not None:
        parts.append(f"errors <= {float(slo['error_rate']) * 100:g}%")
    return ", ".join(parts)


def slo_threshold_s(slo: dict[str, Any], metric: str, percentile: str) -> float | None:
    """The SLO bound in seconds for this metric and percentile, if the study sets one."""
    if metric == TASK_METRIC:
        task_ms = slo.get("task_ms")
        return (None if task_ms is None or percentile != slo_percentile(slo)
                else float(task_ms) / 1e3)
    bound = slo_bounds_ms(slo).get((metric, percentile))
    return None if bound is None else bound / 1e3


def step_runs(meta: dict[str, Any], study_dir: str | Path) -> pd.DataFrame:
    """``study.json``'s steps with each run folder resolved against the study folder."""
    rows = []
    for step in meta.get("steps") or []:
        run_dir = step.get("run_dir")
        if run_dir is not None and not Path(run_dir).is_absolute():
            run_dir = str(Path(study_dir) / run_dir)
        rows.append({**step, "run_dir": run_dir})
    return pd.DataFrame(rows)


def list_step_runs(results_dir: str | Path) -> pd.DataFrame:
    """The step runs of every study under ``results_dir``, shaped like
    :func:`dashboards.analysis.runs.list_runs`, with ``run_id`` set to ``<study>/<config>/step-<k>``
    (the folder relative to the results folder) so runs of different studies never clash."""
    root = Path(results_dir)
    frames = []
    for study_dir in study_dirs(root):
        for config_dir in sorted(p for p in study_dir.iterdir() if p.is_dir()):
            runs = list_runs(config_dir)
            if runs.empty:
                continue
            runs["run_id"] = [
                str(Path(path).resolve().relative_to(root.resolve()))
                if Path(path).resolve().is_relative_to(root.resolve())
                else str(path)
                for path in runs["path"]
            ]
            frames.append(runs)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def verdict_tables(verdict: pd.DataFrame, unit: str = "",
                   capacity: pd.DataFrame | None = None,
                   gpu_hour_usd: float | None = None) -> tuple[list[str], pd.DataFrame]:
    """(the verdict's sentences: each pair's headline, summary and frontier, then each
    configuration's efficiency, a table of the figures' changes per common load).

    The table: pair, load, figure, A, B, change with its 95% interval (throughput figures:
    relative, in %), and "within noise" or "B better" / "B worse" (lower latency and error rate,
    higher throughput and per-user speed are better). With ``capacity`` and ``gpu_hour_usd``
    the efficiency sentences are priced at that rate, not the roll-up's."""
    if verdict.empty:
        return [], pd.DataFrame()
    kinds = verdict["kind"]
    sentences = [str(t) for t in verdict[kinds.isin(["max load", "summary", "frontier"])]["text"]]
    if capacity is not None and gpu_hour_usd and len(capacity):
        sentences += [text for row in capacity.to_dict("records")
                      if (text := frontier.efficiency_text(str(row["config"]), row, unit,
                                                           gpu_hour_usd))]
    else:
        sentences += [str(t) for t in verdict[kinds == "efficiency"]["text"]]
    rows = [_verdict_cell(row, unit) for row in verdict[kinds == "at load"].itertuples(
        index=False)]
    return sentences, pd.DataFrame(rows)


def _verdict_cell(row: Any, unit: str) -> dict[str, str]:
    """One "at load" verdict row as the table shows it."""
    figure = str(row.figure)
    throughput = figure in THROUGHPUT_FIGURES
    latency = figure.endswith("_s") and not throughput
    if throughput:
        label, suffix = THROUGHPUT_FIGURES[figure]
        scale, suffix, digits = 1.0, f" {suffix}", 1
        label = label if label != "req/s" else "achieved req/s"
    else:
        scale, suffix, digits = (1e3, " ms", 1) if latency else (100.0, " %", 1)
        label = figure.removesuffix("_s").replace("_", " ").upper() if latency else "errors"
    if row.within_noise:
        word = "within noise"
    elif math.isnan(row.lo):
        word = "-"
    else:
        better = row.lo > 0 if throughput else row.hi < 0
        word = f"{row.config_b} better" if better else f"{row.config_b} worse"
    if throughput and row.value_a == 0 and row.value_b == row.value_b:
        # nothing to be relative to (B against a goodput of 0): the change in its unit
        change = f"{row.change:+.1f}{suffix} [{row.lo:+.1f}, {row.hi:+.1f}]"
    elif throughput:
        rel_lo, rel_hi = getattr(row, "rel_lo", math.nan), getattr(row, "rel_hi", math.nan)
        change = f"{row.relative * 100:+.0f}% [{rel_lo * 100:+.0f}, {rel_hi * 100:+.0f}]"
    else:
        change = f"{row.change * scale:+.1f} [{row.lo * scale:+.1f}, {row.hi * scale:+.1f}]"
    return {
        "pair": f"{row.config_b} vs {row.config_a}",
        f"load ({unit})" if unit else "load": f"{row.offered_load:g}",
        "figure": label,
        "A": f"{row.value_a * scale:.{digits}f}{suffix}",
        "B": f"{row.value_b * scale:.{digits}f}{suffix}",
        "B - A [95%]": change,
        "verdict": word,
    }


def verdict_by_load(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`verdict_tables`' table with a row per pair ("B vs A") and load, a column per
    figure, each cell "A → B, B - A [95%] verdict" (better or worse: B): the same figures in
    a quarter of the cells (a browser lays out every cell on a first view; 30 rows of seven
    cells were most of the Study page's excess over an empty page's)."""
    if table.empty:
        return table
    load = next(c for c in table.columns if c.startswith("load"))
    # "59.4 → 52.5 ms, -6.9 [-13.6, -0.2] better": the unit once, the pair's B once (its row)
    unit = table["B"].str.extract(r"( \S+)$", expand=False).fillna("")
    first = [a.removesuffix(u) for a, u in zip(table["A"], unit, strict=True)]
    word = [v.removeprefix(p.split(" vs ")[0] + " ") for v, p in zip(
        table["verdict"], table["pair"], strict=True)]
    cells = table.assign(cell=[f"{a} → {b}, {change} {w}" for a, b, change, w in zip(
        first, table["B"], table["B - A [95%]"], word, strict=True)])
    figures = list(dict.fromkeys(cells["figure"]))
    rows = pd.MultiIndex.from_tuples(list(dict.fromkeys(zip(cells["pair"], cells[load],
                                                            strict=True))),
                                     names=["pair", load])
    wide = cells.pivot(index=["pair", load], columns="figure", values="cell")
    wide = wide.reindex(index=rows, columns=figures).fillna("-")
    wide.columns = [f"{figure}: A → B, B - A [95%]" for figure in figures]
    return wide.reset_index()


def unsettled_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Step runs whose series never settled (``settled`` false, ``all`` rows), with what MSER
    would have cut and why: config, step, repeat, offered_load, steady_cut_s, steady_reasons."""
    if "settled" not in steps:
        return pd.DataFrame()
    view = select_steps(steps, "all")
    view = view[~view["settled"].astype(bool)]
    columns = [c for c in ("config", "step", "repeat", "offered_load", "steady_cut_s",
                           "steady_reasons") if c in view]
    return view[columns].reset_index(drop=True)


def generator_limited_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Step runs whose load generator bent the figures (``validity`` not ``valid``, ``all``
    rows), with by how much (``validity_reasons``): config, step, repeat, offered_load,
    sustainable, validity, validity_reasons. A load the generator failed is not the server's
    limit (``dashboards.analysis.study.capacity_row``)."""
    if "validity" not in steps:
        return pd.DataFrame()
    view = select_steps(steps, "all")
    view = view[view["validity"].fillna("valid") != "valid"]
    columns = [c for c in ("config", "step", "repeat", "offered_load", "sustainable",
                           "validity", "validity_reasons") if c in view]
    return view[columns].reset_index(drop=True)
