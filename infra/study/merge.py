"""``swarmload study merge STUDY_DIR... --out DIR``: studies measured apart, joined as one.

    swarmload study merge results/studies/h100-20261206-080540 \\
        results/studies/h200-20261207-101500 --out results/studies/h100-vs-h200

Teams measure one configuration per GPU session or per machine (the same configuration on an
H100 and an H200, two engines on different days, a study cut short by a device lease); the
merge makes the one study folder that would have measured them all, so its roll-up, verdict
and frontier compare them (:mod:`dashboards.analysis.study`), and the Study page and
``swarmload study export`` read it as any study.

What ``DIR`` holds:

- each source's configuration folders (``<config>/step-<k>/``, ``plans/``), hard-linked where
  the file system allows (``os.link``), copied where not; step numbers stay per configuration.
  A configuration name in more than one source is renamed ``<name>@<source>`` in each, the
  source being the study's name (its folder's name when two sources share one), so the same
  configuration on two machines stays two rows of the comparison. The step manifests keep the
  name they were measured under.
- ``study.yaml``: the first source's study file with every configuration (a configuration whose
  source swept other loads carries them as its own ``steps``).
- ``study_state.json`` and ``study.json`` as the runner writes them
  (:class:`infra.study.runner.StudyState`): the union of configurations and steps, ``status``
  ``finished`` (``interrupted`` when a source was not), ``started_at`` / ``ended_at`` the
  earliest start and latest end, ``measured`` joined (:class:`infra.study.plan.Measured`), and
  ``merged_from`` (:data:`infra.study.runner.MERGED_KEY`): each source's name, folder,
  started_at, ended_at, status, configurations (its names -> the names here) and the machines
  its step manifests name (host, platform, GPU models).
- ``rollup/``: :func:`dashboards.analysis.study.rollup_study`, its headline written into
  study.json as at the end of ``study run``. Each step keeps the measured window of its source
  (``warmup_s``, ``cooldown_s``, ``steady_state``, ``expected_cache_hit_rate`` in its entry).

Refused (one line naming the key and both values, exit 2, nothing written): sources whose
comparison means nothing: a different ``load.kind``, ``load.arrival``, ``slo`` or ``workload``;
a folder without ``study_state.json`` / ``study.json``; a folder given twice; an ``--out`` that
exists and is not an empty folder. Warned (one line each): a different step length,
``precision``, ``repeats``, measured window, knee metric or GPU-hour price: the merged study
reads the first source's, the steps keep their own windows.

A merged study is not resumed (``study run --resume`` refuses a renamed ``name@source``):
resume the source, then merge again.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from collectors import run_folder
from collectors.manifest import utc_now_iso
from dashboards.analysis import burst, faults
from dashboards.analysis import study as sa
from infra.orchestrate import EXIT_BAD_INPUT
from infra.study.plan import STATE_KEY
from infra.study.runner import (
    MERGED_KEY,
    STATE_FILE,
    STUDY_COPY,
    WORKLOAD_DIR,
    StudyState,
    print_outcome,
    record_rollup,
)
from infra.study.spec import StudySpec, StudySpecError, study_from_dict

RENAME_MARK = "@"  # <config>@<source>: a configuration name two sources share
# keys whose difference makes the comparison meaningless: (key, its value in a study)
REFUSED: tuple[tuple[str, Callable[[StudySpec], Any]], ...] = (
    ("load.kind", lambda s: s.load.kind),
    ("load.arrival", lambda s: s.load.arrival if s.load.kind == "rate" else None),
    ("slo", lambda s: s.slo.to_dict()),
    ("workload", lambda s: s.workload.to_dict()),
)
# keys that differ without spoiling it: a warning, the first source's value for the study
WARNED: tuple[tuple[str, Callable[[StudySpec], Any]], ...] = (
    ("step_duration_s", lambda s: s.step_duration_s),
    ("precision", lambda s: asdict(s.precision) if s.precision else None),
    ("repeats", lambda s: s.repeats),
    ("warmup_s", lambda s: s.warmup_s),
    ("cooldown_s", lambda s: s.cooldown_s),
    ("steady_state", lambda s: s.steady_state),
    ("knee_metric", lambda s: s.knee_metric),
    ("knee_percentile", lambda s: s.knee_percentile),
    ("gpu_hour_usd", lambda s: s.gpu_hour_usd),
)
# each step's measured window, kept in its entry (dashboards.analysis.study.rollup_study)
WINDOW_KEYS: tuple[tuple[str, Callable[[StudySpec], Any]], ...] = (
    ("warmup_s", lambda s: s.warmup_s),
    ("cooldown_s", lambda s: s.cooldown_s),
    ("steady_state", lambda s: s.steady_state),
    ("expected_cache_hit_rate", lambda s: s.expected_cache_hit_rate),
)


class MergeError(ValueError):
    """The studies cannot be merged; the message is the one line that says why."""


@dataclass(frozen=True)
class Source:
    """A study folder to merge: its state (study_state.json) and its study file, parsed."""

    folder: Path
    state: dict[str, Any]
    spec: StudySpec

    @property
    def name(self) -> str:
        return self.spec.name


def read_source(folder: str | Path) -> Source:
    """A study folder, or MergeError naming what is missing."""
    path = Path(folder).resolve()
    state_path = path / STATE_FILE
    if not state_path.is_file() or not (path / run_folder.STUDY_FILE).is_file():
        raise MergeError(f"{folder}: not a study folder (no {STATE_FILE} and "
                         f"{run_folder.STUDY_FILE})")
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        spec = study_from_dict(state["spec"], path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        reason = str(exc) if isinstance(exc, StudySpecError) else f"{type(exc).__name__}: {exc}"
        raise MergeError(f"{folder}: its {STATE_FILE} does not read as a study ({reason})"
                         ) from None
    return Source(path, state, spec)


def check_comparable(sources: Sequence[Source]) -> list[str]:
    """MergeError on a key of :data:`REFUSED` that differs; the warning lines of
    :data:`WARNED`'s that differ (the first source's value against each other)."""
    first = sources[0]
    warnings = []
    for key, value_of in REFUSED:
        for other in sources[1:]:
            if value_of(first.spec) != value_of(other.spec):
                raise MergeError(f"{key} differs: {_text(value_of(first.spec))} ({first.name}) "
                                 f"vs {_text(value_of(other.spec))} ({other.name}); studies "
                                 "compared must share it")
    for key, value_of in WARNED:
        differ = [o for o in sources[1:] if value_of(o.spec) != value_of(first.spec)]
        if differ:
            others = ", ".join(f"{_text(value_of(o.spec))} ({o.name})" for o in differ)
            warnings.append(f"{key} differs: {_text(value_of(first.spec))} ({first.name}) vs "
                            f"{others}; the merged study reads {first.name}'s"
                            + (", each step keeps its own window" if key in dict(WINDOW_KEYS)
                               else ""))
    return warnings


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else str(value)


def new_names(sources: Sequence[Source]) -> list[dict[str, str]]:
    """Per source, its configuration names -> the merged study's: a name more than one source
    has becomes ``<name>@<source>`` (the study's name, or its folder's when two share one)."""
    counts: dict[str, int] = {}
    for source in sources:
        for config in source.spec.configurations:
            counts[config.name] = counts.get(config.name, 0) + 1
    study_names = [s.name for s in sources]
    out = []
    for source in sources:
        tag = source.name if study_names.count(source.name) == 1 else source.folder.name
        out.append({c.name: f"{c.name}{RENAME_MARK}{tag}" if counts[c.name] > 1 else c.name
                    for c in source.spec.configurations})
    return out


def _machines(source: Source) -> list[dict[str, Any]]:
    """The distinct machines (host, platform, GPU models) the source's step manifests name."""
    seen: list[dict[str, Any]] = []
    for entry in source.state.get("steps") or []:
        manifest = run_folder.load_manifest(source.folder / entry["run_dir"])
        if not manifest:
            continue
        hosts = [h for h in manifest.get("hosts") or [] if h.get("role") == "orchestrator"]
        gpu = manifest.get("gpu") or {}
        machine = {"host": hosts[0].get("host") if hosts else None,
                   "platform": hosts[0].get("platform") if hosts else None,
                   "gpus": [g.get("name") for g in gpu.get("gpus") or []]}
        if machine not in seen:
            seen.append(machine)
    return seen


def _step_entry(entry: dict[str, Any], names: dict[str, str], spec: StudySpec
                ) -> dict[str, Any]:
    old = entry["config"]
    run_dir = Path(entry["run_dir"])
    return {**entry, "config": names[old],
            "run_dir": Path(names[old], *run_dir.parts[1:]).as_posix(),
            "duration_s": entry.get("duration_s") or spec.step_duration_s,
            **{key: value_of(spec) for key, value_of in WINDOW_KEYS}}


def merged_study(sources: Sequence[Source], name: str, gpu_hour_usd: float | None = None
                 ) -> tuple[StudySpec, dict[str, Any]]:
    """(the merged study's spec, its study_state.json data)."""
    first = sources[0].spec
    renames = new_names(sources)
    configs, raw_configs = [], []
    steps: list[dict[str, Any]] = []
    states: dict[str, Any] = {}
    starts: list[dict[str, Any]] = []
    measured_configs: dict[str, Any] = {}
    for source, names in zip(sources, renames, strict=True):
        spec = source.spec
        own_loads = spec.load.steps != first.load.steps  # swept other loads: its own steps
        for config, raw in zip(spec.configurations, spec.raw["configurations"], strict=True):
            loads = config.steps or (spec.load.steps if own_loads else ())
            configs.append(replace(config, name=names[config.name], steps=tuple(loads)))
            raw_configs.append({**raw, "name": names[config.name],
                                **({"steps": list(loads)} if loads else {})})
        steps += [_step_entry(e, names, spec) for e in source.state.get("steps") or []]
        states.update({names[k]: v for k, v in (source.state.get("configs") or {}).items()
                       if k in names})
        measured = source.state.get(STATE_KEY) or {}
        starts += [{**s, "config": names.get(s["config"], s["config"])}
                   for s in measured.get("starts") or []]
        measured_configs.update({names.get(k, k): v
                                 for k, v in (measured.get("configs") or {}).items()})
    price = gpu_hour_usd or first.gpu_hour_usd
    raw = {**first.raw, "name": name, "configurations": raw_configs,
           **({"gpu_hour_usd": price} if price else {})}
    spec = replace(first, name=name, configurations=tuple(configs), gpu_hour_usd=price, raw=raw)
    first_measured = (sources[0].state.get(STATE_KEY) or {}).get("first")
    if first_measured:
        first_measured = {**first_measured,
                          "config": renames[0].get(first_measured["config"],
                                                   first_measured["config"])}
    ends = [str(s.state["ended_at"]) for s in sources if s.state.get("ended_at")]
    data = {
        "name": name, "spec": raw,
        "started_at": min(s.state.get("started_at") or utc_now_iso() for s in sources),
        "ended_at": max(ends) if ends else None,
        "status": ("finished" if all(s.state.get("status") == "finished" for s in sources)
                   else "interrupted"),
        "steps": steps, "configs": states,
        STATE_KEY: {"starts": starts, "configs": measured_configs,
                    **({"first": first_measured} if first_measured else {})},
        MERGED_KEY: [{"name": s.name, "folder": str(s.folder),
                      "started_at": s.state.get("started_at"),
                      "ended_at": s.state.get("ended_at"), "status": s.state.get("status"),
                      "configurations": names, "machines": _machines(s)}
                     for s, names in zip(sources, renames, strict=True)],
    }
    return spec, data


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(src, dst)


def check_out(out: Path, sources: Sequence[Source]) -> None:
    """MergeError when ``out`` cannot take the merged study."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MergeError(f"--out {out}: exists and is not an empty folder; name a new one")
    for source in sources:
        if out.resolve().is_relative_to(source.folder):
            raise MergeError(f"--out {out}: inside the study {source.folder}; name a folder "
                             "outside it")


def merge_studies(folders: Sequence[str | Path], out: str | Path,
                  gpu_hour_usd: float | None = None, name: str | None = None
                  ) -> tuple[StudySpec, list[str]]:
    """Join the studies in ``folders`` into the study folder ``out`` and roll it up; returns
    (its spec, the warning lines). MergeError (nothing written) when they cannot be joined."""
    if len(folders) < 2:
        raise MergeError("give two or more study folders to merge")
    resolved = [Path(f).resolve() for f in folders]
    for index, folder in enumerate(resolved):
        if folder in resolved[:index]:
            raise MergeError(f"{folders[index]}: given twice")
    sources = [read_source(f) for f in folders]
    out = Path(out).resolve()
    check_out(out, sources)
    warnings = check_comparable(sources)
    spec, data = merged_study(sources, name or out.name, gpu_hour_usd)

    # built beside ``out`` and renamed into place: a failure leaves no half-merged folder
    out.parent.mkdir(parents=True, exist_ok=True)
    building = out.parent / f".{out.name}.merging-{os.getpid()}"
    try:
        building.mkdir()
        for source, names in zip(sources, new_names(sources), strict=True):
            for old, new in names.items():
                if (source.folder / old).is_dir():
                    shutil.copytree(source.folder / old, building / new, symlinks=True,
                                    copy_function=_link_or_copy)
        workloads = [s.folder / WORKLOAD_DIR for s in sources if (s.folder / WORKLOAD_DIR).is_dir()]
        if workloads:  # the rate steps' workload (the same in every source: REFUSED)
            shutil.copytree(workloads[0], building / WORKLOAD_DIR, copy_function=_link_or_copy)
        (building / STUDY_COPY).write_text(yaml.safe_dump(spec.raw, sort_keys=False),
                                           encoding="utf-8")
        StudyState(building, spec, data).save()
        if out.exists():
            out.rmdir()  # empty, checked above
        building.rename(out)
    finally:
        if building.exists():
            shutil.rmtree(building)
    rollup(out, spec, data)
    return spec, warnings


def rollup(out: Path, spec: StudySpec, data: dict[str, Any]) -> None:
    """The roll-up of the merged study, its headline in study.json as ``study run`` writes it,
    and the bursts' and fault drills' roll-ups where the study has them."""
    _steps, capacity = sa.rollup_study(out)
    folder = out / run_folder.ROLLUP_DIR
    points = pd.read_parquet(folder / run_folder.POINTS_FILE)
    verdict_path = folder / run_folder.VERDICT_FILE
    verdict = pd.read_parquet(verdict_path) if verdict_path.is_file() else pd.DataFrame()
    record_rollup(StudyState(out, spec, data), capacity, points, verdict)
    if spec.load.arrival == "bursts":
        burst.write_study_bursts(out)
    if any(c.fault_plan for c in spec.configurations):
        faults.write_study_faults(out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarmload study merge",
        description="Join studies measured separately (one configuration per machine or "
                    "session) into one study folder whose roll-up, verdict and frontier compare "
                    "their configurations.")
    parser.add_argument("study_dirs", nargs="+", type=Path, metavar="STUDY_DIR")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="the merged study folder (new, or an empty folder)")
    parser.add_argument("--name", default=None,
                        help="the merged study's name (default: the --out folder's name)")
    sa.add_price_option(parser)
    return parser


def main(argv: list[str]) -> int:
    """``swarmload study merge``: exit 0, or 2 with one line when the studies cannot be
    joined."""
    args = build_parser().parse_args(argv)
    try:
        spec, warnings = merge_studies(args.study_dirs, args.out, args.gpu_hour_usd, args.name)
    except MergeError as exc:
        print(f"swarmload study merge: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for line in warnings:
        print(f"[study] warning: {line}", flush=True)
    sources = json.loads((args.out / STATE_FILE).read_text(encoding="utf-8"))[MERGED_KEY]
    for source in sources:
        machines = "; ".join(", ".join(filter(None, [m["host"], *m["gpus"]]))
                             for m in source["machines"]) or "machine not recorded"
        configs = ", ".join(f"{old} as {new}" if old != new else old
                            for old, new in source["configurations"].items())
        print(f"[study] from {source['name']} ({source['status']}, {source['started_at']}, "
              f"{machines}): {configs}", flush=True)
    print_outcome(spec, args.out.resolve(),
                  precision=spec.precision is not None or spec.repeats > 1)
    return 0
