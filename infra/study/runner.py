"""``swarmload study run STUDY.yaml``: every configuration swept through its load steps.

    swarmload study run infra/study/examples/sim-two-configs.yaml
    swarmload study run infra/study/examples/vllm-cpu-max-num-seqs.yaml --results results/studies
    swarmload study run infra/study/examples/vllm-cpu-max-num-seqs.yaml \
        --resume results/studies/<dir>

For each configuration (study file format: :mod:`infra.study.spec`) the target is started once
(any kind of :mod:`infra.targets.registry`, through its :class:`~infra.targets.engine.Engine`: each
configuration its own, so two engines can share a study; a URL is used as it is) and probed with
a real streamed completion until it serves; then each load step is an ordinary ``swarmload
run`` against it (:func:`infra.orchestrate.run`, master + workers + collectors), written to
``<study_dir>/<config>/step-<k>/``. After each step the step is summarised
(:mod:`dashboards.analysis.study`), ``study_state.json``, ``study.json`` and the roll-up are
rewritten, and the configuration stops early when the step was over-saturated: error rate above
``stop_when.error_rate``, or the knee metric (at the SLO percentile) above ``latency_growth`` times
the configuration's lowest. Then the target is stopped and the next configuration starts.

``load.auto`` first probes (``start``, ``start*factor``, ...) until a step saturates (rate: achieved
below 95% of offered; concurrency: throughput grew less than :data:`PROBE_MIN_GAIN`; or the stop
rule), estimates the capacity (rate: the highest achieved req/s; concurrency: Little's law, highest
achieved req/s x the lowest step's P50 E2E, the concurrency at which the throughput ceiling is met
without queueing), then sweeps ``around`` x that estimate.

Ctrl-C (or SIGTERM) stops the running step (its records so far are kept, the step is marked
interrupted), stops the target and exits 130; ``--resume STUDY_DIR`` then skips every finished step
and configuration, moves interrupted step folders aside to ``<config>/.partial/`` and carries on.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import signal
import ssl
import sys
import time
import zlib
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import asdict, replace
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import yaml

from collectors import run_folder
from collectors.atomic import write_json_atomic
from collectors.headers import header_name, parse_headers
from collectors.manifest import parse_labels, utc_now_iso
from collectors.run_folder import update_manifest
from dashboards.analysis import burst, faults, frontier, study_search, study_stats
from dashboards.analysis import study as sa
from infra.orchestrate import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_UNREACHABLE,
    RunError,
    parse_or_exit,
    start_replicated,
    start_target,
)
from infra.orchestrate import build_parser as build_run_parser
from infra.orchestrate import run as run_swarmload
from infra.ports import free_port
from infra.preflight import PreflightError, UnknownModel, check_target
from infra.study.plan import (
    NOTHING,
    OVERHEADS_KEPT,
    STATE_KEY,
    Measured,
    e2e_multiple,
    fit_for_run,
    floor_s,
    overhead_s,
    precision_lines,
    repeat_lines,
    spread_k,
    total_seconds,
    unit_seconds,
    window_s,
)
from infra.study.spec import (
    Configuration,
    StudySpec,
    StudySpecError,
    load_study,
)
from infra.targets.engine import EngineError, LaunchSpec
from infra.targets.registry import engine_of
from locustfiles.config import RunConfig
from locustfiles.context import api_key
from workloads.arrivals import GammaPlan, PoissonPlan, plan_from_dict, save_plan
from workloads.builtin_mix import BuiltinMix
from workloads.schema import user_messages, workload_table, write_workload
from workloads.scrub import letters_id

# server_traces with a configuration given by URL: its vLLM exports to this port of this host
# (OTLP/HTTP's usual one), where each step's collector listens
SERVER_TRACES_PORT = 4318

STATE_FILE = "study_state.json"
STUDY_COPY = "study.yaml"
MERGED_KEY = "merged_from"  # study_state.json / study.json of a merged study: its sources
WORKLOAD_DIR = "workload"
PROBE_MIN_GAIN = 1.1  # concurrency probing: throughput must grow >= 10% per step to go on
SAME_LOAD = 0.03  # a planned load within 3% of a measured one is not measured again
SERVE_TIMEOUT_S = 300.0
# a precise step under this share of the floor its own load's E2E P95 sets (6 E2E at the
# default 10) gets one more part as long as the floor: the 15 s steps were 5 E2E
REDO_UNDER_FLOOR = 0.6


class StudyError(RuntimeError):
    """The study cannot go on; the message says why and what to do."""


class StudyInterrupted(Exception):
    """Ctrl-C or SIGTERM during a study."""


def _say(message: str) -> None:
    print(f"[study] {message}", flush=True)


# ------------------------------------------------------------------------------------- state


class StudyState:
    """``study_state.json`` (progress, for --resume) and ``study.json`` (the public record)."""

    def __init__(self, study_dir: Path, spec: StudySpec, data: dict[str, Any] | None = None):
        self.dir = study_dir
        self.spec = spec
        self.data = data or {
            "name": spec.name, "spec": spec.raw, "started_at": utc_now_iso(), "ended_at": None,
            "status": "running", "steps": [],
            "configs": {c.name: {"done": False, "stopped": None, "capacity_estimate": None}
                        for c in spec.configurations},
        }

    @classmethod
    def load(cls, study_dir: Path, spec: StudySpec) -> StudyState:
        path = study_dir / STATE_FILE
        if not path.is_file():
            raise StudyError(f"--resume {study_dir}: no {STATE_FILE}; is this a study folder?")
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("spec") != spec.raw:
            raise StudyError(f"--resume {study_dir}: the study file differs from the one this "
                             f"study started with ({study_dir / STUDY_COPY}); resume with that "
                             "file, or start a new study")
        data["status"], data["ended_at"] = "running", None
        return cls(study_dir, spec, data)

    def config(self, name: str) -> dict[str, Any]:
        return self.data["configs"][name]

    def steps_of(self, name: str, status: str | None = "done") -> list[dict[str, Any]]:
        return [s for s in self.data["steps"]
                if s["config"] == name and (status is None or s["status"] == status)]

    def next_step_number(self, name: str) -> int:
        return 1 + max((s["step"] for s in self.steps_of(name, None)), default=0)

    def save(self) -> None:
        write_json_atomic(self.dir / STATE_FILE, self.data)
        write_json_atomic(self.dir / run_folder.STUDY_FILE, self.public())

    def public(self) -> dict[str, Any]:
        """study.json: the public record of the study (analysis reads it)."""
        spec = self.spec
        return {
            "name": spec.name, "status": self.data["status"],
            "started_at": self.data["started_at"], "ended_at": self.data["ended_at"],
            "configurations": [{"name": c.name, "target": c.target, "args": list(c.args),
                                "steps": list(spec.steps_for(c)) or None,
                                **c.engine_keys(),
                                **({"replicas": c.replicas, "balance": c.balance}
                                   if c.replicas > 1 else {}),
                                **({"fault_plan": c.fault_plan,
                                    "fault_loads": list(c.fault_loads) or None}
                                   if c.fault_plan else {})}
                               for c in spec.configurations],
            # where the key comes from, never the key; header names, never their values
            "endpoint": {**{k: v or None if isinstance(v, str) else v
                            for k, v in spec.run.study_section("endpoint").items()},
                         "headers": [header_name(h) for h in spec.run.headers]},
            "load": {"kind": spec.load.kind, "steps": list(spec.load.steps) or None,
                     "auto": asdict(spec.load.auto) if spec.load.auto else None,
                     "arrival": spec.load.arrival if spec.load.kind == "rate" else None,
                     "burst": spec.load.burst},
            "workload": spec.workload.to_dict(), "slo": spec.slo.to_dict(),
            "stop_when": asdict(spec.stop_when), "step_duration_s": spec.step_duration_s,
            "warmup_s": spec.warmup_s, "cooldown_s": spec.cooldown_s,
            "knee_metric": spec.knee_metric, "knee_percentile": spec.knee_percentile,
            "workers": spec.workers or "auto", "labels": spec.labels,
            "gpu_interval_s": spec.gpu_interval_s, "server_traces": spec.server_traces,
            "repeats": spec.repeats, "repeat_order": spec.repeat_order, "seed": spec.seed,
            "restart_between_repeats": spec.restart_between_repeats,
            "steady_state": spec.steady_state,
            "precision": asdict(spec.precision) if spec.precision else None,
            "refine": asdict(spec.refine) if spec.refine else None,
            "reset_prefix_cache": spec.reset_prefix_cache,
            "expected_cache_hit_rate": spec.expected_cache_hit_rate,
            "gpu_hour_usd": spec.gpu_hour_usd,
            "budget_s": self.data.get("budget_s"),
            # the servers' start times, E2E P95 per load and noise (infra.study.plan.Measured)
            STATE_KEY: self.data.get(STATE_KEY) or {},
            "capacity_estimates": {n: c["capacity_estimate"]
                                   for n, c in self.data["configs"].items()},
            "capacity": self.data.get("capacity") or [],
            "verdict": self.data.get("verdict") or [],
            "frontier": self.data.get("frontier") or [],
            "steps": self.data["steps"],
            # a study joined from others (infra.study.merge): where each came from
            **({MERGED_KEY: self.data[MERGED_KEY]} if MERGED_KEY in self.data else {}),
        }


# ------------------------------------------------------------------------------------ workload


def builtin_workload(study_dir: Path, spec: StudySpec) -> Path:
    """The built-in mix written as a workload folder, for open-loop (rate) steps to replay."""
    out = study_dir / WORKLOAD_DIR
    if (out / "workload.parquet").is_file():
        return out
    wl = spec.workload.run
    mix = BuiltinMix(wl.bucket_spec, wl.max_tokens, wl.seed, wl.long_max_tokens)
    requests = [mix.request(i) for i in range(spec.workload.rows)]
    # The mix's own nonce carries hex digits, which the workload writer's identifier check
    # can take for a phone number; a letters-only nonce keeps prompts unique and clean.
    prompts = [mix.text_of_length(r.target_prompt_tokens, letters_id(i))
               for i, r in enumerate(requests)]
    chat = wl.endpoint == "chat"
    frame = workload_table(
        [r.bucket for r in requests], [r.target_prompt_tokens for r in requests],
        [r.max_tokens for r in requests],
        prompt=None if chat else prompts,
        messages=[user_messages(p) for p in prompts] if chat else None,
        prompt_source="synthesized")
    write_workload(frame, out, {"source": {"kind": "builtin-mix"}, **spec.workload.to_dict()})
    return out


def _plan_file(study_dir: Path, config: str, step: int, load: float, spec: StudySpec) -> Path:
    if spec.load.arrival == "bursts":  # the step's load is the base rate under the spikes
        plan = plan_from_dict({"kind": "bursts", "base_rps": load, **(spec.load.burst or {})})
    elif spec.load.arrival == "gamma":
        plan = GammaPlan(rate_rps=load, cv=spec.load.cv)
    else:
        plan = PoissonPlan(rate_rps=load)
    folder = study_dir / config / "plans"
    folder.mkdir(parents=True, exist_ok=True)
    return save_plan(plan, folder / f"step-{step}.yaml")


# ------------------------------------------------------------------------------------- targets


def wait_until_serving(base_url: str, model: str | None, timeout_s: float = SERVE_TIMEOUT_S,
                       endpoint: RunConfig | None = None) -> str:
    """Block until a streamed 2-token completion comes back whole; return the model name.

    ``endpoint``: the study's TLS settings, key source and headers, as the steps will use them.
    """
    endpoint = endpoint or RunConfig()
    key, _source = api_key(endpoint.api_key_env, endpoint.api_key_file)
    headers = dict(parse_headers(list(endpoint.headers)))
    if key:
        headers["Authorization"] = f"Bearer {key}"
    verify: bool | str = False if endpoint.insecure else (endpoint.ca_bundle or True)
    deadline = time.monotonic() + timeout_s
    problem = "no answer yet"
    with httpx.Client(timeout=httpx.Timeout(30.0), verify=verify, headers=headers) as client:
        while time.monotonic() < deadline:
            try:
                if not model:
                    listed = client.get(f"{base_url}/v1/models").json()
                    model = listed["data"][0]["id"]
                body = {"model": model, "prompt": "Hello", "max_tokens": 2, "stream": True,
                        "ignore_eos": True}
                texts, done = [], False
                with client.stream("POST", f"{base_url}/v1/completions", json=body) as response:
                    response.raise_for_status()
                    for line in response.iter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            done = True
                            break
                        texts += [c.get("text", "") for c in json.loads(data).get("choices", [])]
                if done and any(texts):
                    return str(model)
                problem = "stream ended without text and [DONE]"
            except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            time.sleep(1.0)
    raise StudyError(f"{base_url} did not serve a streamed completion within {timeout_s:.0f} s "
                     f"(last problem: {problem})")


# ------------------------------------------------------------------------------------- planning


def plan_around(estimate: float, around: tuple[float, ...], kind: str,
                measured: list[float]) -> list[float]:
    """Loads at ``around`` x ``estimate`` (whole users for concurrency), ascending, leaving out
    any within :data:`SAME_LOAD` of a load already measured."""
    loads: list[float] = []
    for fraction in sorted(around):
        load = estimate * fraction
        load = float(max(1, round(load))) if kind == "concurrency" else round(load, 3)
        if load <= 0 or any(abs(load - m) <= SAME_LOAD * m for m in [*measured, *loads]):
            continue
        loads.append(load)
    return loads


def over_saturated(row: pd.Series, earlier: list[pd.Series], spec: StudySpec) -> str | None:
    """Why the configuration should stop after this step (``all`` row), or None."""
    rate = row["error_rate"]
    if rate == rate and rate > spec.stop_when.error_rate:
        return f"error rate {rate:.1%} > stop_when.error_rate {spec.stop_when.error_rate:.1%}"
    column = f"{spec.knee_metric}_{spec.slo.percentile}_s"
    lows = [r[column] for r in [*earlier, row] if r[column] == r[column] and r[column] > 0]
    if lows and row[column] == row[column] and row[column] > spec.stop_when.latency_growth * min(
            lows):
        # a load the generator bent stops the sweep too (higher ones would bend more), said
        # as the generator's: the capacity does not take it for the server's limit
        bent = "the generator's, not the server's: " if row.get(
            "validity") == "generator_limited" else ""
        return (f"{bent}{column} {row[column] * 1e3:.0f} ms > "
                f"{spec.stop_when.latency_growth:g} x the lowest ({min(lows) * 1e3:.0f} ms)")
    return None


def probe_saturated(row: pd.Series, previous: pd.Series | None, kind: str) -> bool:
    if kind == "rate":
        ratio = row["achieved_ratio"]
        return bool(ratio == ratio and ratio < sa.SUSTAINABLE_RATIO)
    if previous is None:
        return False
    return bool(row["achieved_req_per_s"] < PROBE_MIN_GAIN * previous["achieved_req_per_s"])


def capacity_estimate(rows: list[pd.Series], kind: str) -> float:
    column = ("achieved_arrivals_per_s" if kind == "rate" and all(  # sessions/tasks per second
        r.get("offered_arrivals_per_s", math.nan) == r.get("offered_arrivals_per_s", math.nan)
        for r in rows) else "achieved_req_per_s")
    achieved = max(float(r[column]) for r in rows)
    if kind == "rate":
        return achieved
    lowest = min(rows, key=lambda r: r["offered_load"])
    return achieved * float(lowest["e2e_p50_s"])  # Little's law: N* = X_max * R_min


# ------------------------------------------------------------------------------------- running


class StudyRunner:
    def __init__(self, spec: StudySpec, study_dir: Path, state: StudyState,
                 progress: str = "auto", live: dict[str, Any] | None = None,
                 unfitted: StudySpec | None = None) -> None:
        # under --budget: the study as written, fitted again once its first step measured
        # the server (infra.study.plan.fit_for_run)
        self.unfitted = unfitted
        self.progress = progress  # live view of each step: auto | rich | plain | off
        # every step's master serves its figures for Prometheus here (RunConfig fields
        # prometheus_port / prometheus_bind), the configuration as a label
        self.live = live or {}
        self.spec = spec
        self.dir = study_dir
        self.state = state
        self.workload: Path | None = None
        self._launch: dict[str, Any] | None = None  # the running target's launch spec
        self._started: Any = None  # the configuration's replicas (infra.orchestrate.Target)
        # server_traces: {"port", "wait_s"} of the running configuration's spans
        self._traces: dict[str, Any] | None = None
        self._memo: dict[Any, Any] = {}  # points drawn already (sa.points_table's cache)
        self._cohorts: dict[str, pd.DataFrame] = {}  # run_dir -> its measured cohort

    def run(self) -> None:
        spec = self.spec
        if spec.load.kind == "rate":
            self.workload = (Path(spec.workload.folder).resolve() if spec.workload.folder
                             else builtin_workload(self.dir, spec))
        for index, config in enumerate(spec.configurations, 1):
            progress = self.state.config(config.name)
            if progress["done"]:
                _say(f"configuration {index}/{len(spec.configurations)} {config.name}: done "
                     "already, skipped")
                continue
            self._move_partial_steps(config.name)
            _say(f"configuration {index}/{len(spec.configurations)} {config.name}: "
                 f"target {config.target} {' '.join(config.args)}")
            self._run_configuration(config)

    def _move_partial_steps(self, name: str) -> None:
        for entry in self.state.steps_of(name, None):
            if entry["status"] == "done":
                continue
            folder = self.dir / entry["run_dir"]
            if folder.exists():
                aside = self.dir / name / ".partial" / f"{folder.name}.{int(time.time())}"
                aside.parent.mkdir(parents=True, exist_ok=True)
                folder.rename(aside)
                _say(f"moved the unfinished {entry['run_dir']} aside to "
                     f"{aside.relative_to(self.dir)}")
        self.state.data["steps"] = [s for s in self.state.data["steps"]
                                    if s["config"] != name or s["status"] == "done"]

    def _run_configuration(self, config: Configuration) -> None:
        """One server for every repeat (or, with restart_between_repeats, one per repeat),
        then the refinement on the last."""
        first = 1
        while first <= self.spec.repeats:
            repeats = [r for r in range(first, self.spec.repeats + 1)
                       if self._same_server(first, r)]
            last = repeats[-1] == self.spec.repeats
            if not self._all_done(config, repeats) or last and self._refine_pending(config):
                self._serve(config, repeats, last)
            # past the repeats that server measured, as the study is fitted after it
            served = first
            while self._same_server(first, served + 1):
                served += 1
            first = served + 1
        self.state.config(config.name)["done"] = True
        self.state.save()

    def _same_server(self, first: int, repeat: int) -> bool:
        """Whether the server started for repeat ``first`` measures ``repeat`` too: one server
        per repeat under restart_between_repeats, else one for all. Read from the study as
        fitted now: a budget fitted again after the first step may give repeats up or keep
        them all."""
        return first <= repeat <= self.spec.repeats and (
            repeat == first or not self.spec.restart_between_repeats)

    def _all_done(self, config: Configuration, repeats: list[int]) -> bool:
        """Every planned unit of these repeats is measured (load.auto: never known before)."""
        if self.spec.load.auto is not None and self.state.config(config.name)[
                "capacity_estimate"] is None:
            return False
        loads = self._loads(config)
        ceiling = self.state.config(config.name).get("ceiling")
        done = {(s.get("repeat", 1), s["offered_load"]) for s in self.state.steps_of(config.name)}
        return all((r, load) in done for r in repeats for load in loads
                   if ceiling is None or load <= ceiling)

    def _refine_pending(self, config: Configuration) -> bool:
        return self.spec.refine is not None and not self.state.config(config.name).get(
            "refined")

    def _serve(self, config: Configuration, repeats: list[int], last: bool) -> None:
        started = time.monotonic()
        launch = config.launch()
        engine = engine_of(config.target)
        if self.spec.reset_prefix_cache and engine is not None and engine.reset_env:
            launch = launch.with_env(dict(engine.reset_env))  # vLLM: its dev mode
        self._traces = None
        if self.spec.server_traces:
            # the steps' collectors receive its spans here; a server started here is told where
            launched = engine is not None and engine.spans
            port = free_port() if launched else SERVER_TRACES_PORT
            self._traces = {"port": port, "wait_s": 1.5 if launched else 6.0}
            if launched:
                launch = replace(launch, traces_endpoint=f"http://127.0.0.1:{port}/v1/traces")
        self._started = None
        stack = ExitStack()
        try:
            target = stack.enter_context(
                start_target(launch, _say)
                if config.replicas < 2 else self._replicas(config, launch))
        except (RunError, EngineError) as exc:  # --resume starts it again
            raise StudyError(f"{config.name}: the target did not start: "
                             f"{str(exc).splitlines()[0]}") from exc
        with stack:
            if config.replicas > 1:
                self._started = target
            _say(f"{config.name}: waiting until {target.base_url} serves ...")
            model = wait_until_serving(target.base_url, target.model,
                                       endpoint=self.spec.run)
            start_s = time.monotonic() - started
            _say(f"{config.name}: serving model {model} at {target.base_url} "
                 f"({start_s:.0f} s after start)")
            self._measured_data().setdefault("starts", []).append(
                {"config": config.name, "target": config.target, "seconds": round(start_s, 2)})
            self.state.save()
            self._launch = target.launch
            if self.spec.reset_prefix_cache and self._launch is not None:
                self._launch = {**self._launch, "reset_prefix_cache": True}
            try:
                self._sweep(config, target.base_url, model, target.kind,
                            list(target.launch_args), repeats, last)
            finally:
                _say(f"{config.name}: stopping the target ...")

    def _loads(self, config: Configuration) -> list[float]:
        """The loads every repeat measures: the listed steps, or under load.auto the probes'
        and the sweep around the capacity estimate (as the study is fitted now: a budget
        fitted again after the first step may have given some up)."""
        spec = self.spec
        if spec.load.auto is None:
            return list(spec.steps_for(spec.configuration(config.name)))
        progress = self.state.config(config.name)
        probes = [float(s["offered_load"]) for s in self.state.steps_of(config.name)
                  if s["phase"] == "probe"]
        estimate = progress["capacity_estimate"]
        planned = [] if estimate is None else plan_around(estimate, spec.load.auto.around,
                                                          spec.load.kind, probes)
        return sorted({*probes, *planned})

    def repeat_order(self, config: Configuration, loads: list[float], repeat: int
                     ) -> list[float]:
        """The loads of one repeat in the order it runs them (repeat_order)."""
        loads = sorted(loads)
        order = self.spec.repeat_order
        if order == "up" or repeat == 1 and order == "alternate":
            return loads
        if order == "alternate":
            return loads if repeat % 2 else loads[::-1]
        rng = random.Random(self.spec.seed * 1_000_003 + zlib.crc32(config.name.encode())
                            + repeat)
        rng.shuffle(loads)
        return loads

    def _replicas(self, config: Configuration, launch: LaunchSpec) -> Any:
        """``replicas: N`` servers of the configuration's target behind its balancer, started
        once for all its steps (their logs in ``<study>/<config>/``)."""
        folder = self.dir / config.name
        folder.mkdir(parents=True, exist_ok=True)
        return start_replicated(launch, folder, _say)

    def _sweep(self, config: Configuration, base_url: str, model: str, target_kind: str,
               launch_args: list[str], repeats: list[int], last: bool) -> None:
        spec = self.spec
        progress = self.state.config(config.name)
        run = {"base_url": base_url, "model": model, "target_kind": target_kind,
               "launch_args": launch_args}
        if spec.load.auto is not None and progress["capacity_estimate"] is None:
            self._probe(config, run)
        loads = self._loads(config)
        if spec.load.auto is not None:
            _say(f"{config.name}: capacity estimate {progress['capacity_estimate']:.2f} "
                 f"{spec.load_unit}; every repeat measures "
                 f"{', '.join(f'{p:g}' for p in loads)}")
        repeat = repeats[0]
        while self._same_server(repeats[0], repeat):
            measured: set[float] = set()
            while (load := self._next_sweep_load(config, repeat, measured)) is not None:
                measured.add(load)
                row = self._unit(config, repeat, load, "sweep", run)
                reason = over_saturated(row, self._rows_of(config.name, exclude=row), self.spec)
                ceiling = progress.get("ceiling")
                if reason and (ceiling is None or load < ceiling):
                    progress["ceiling"] = load
                    progress["stopped"] = reason
                    self._entry(config.name, int(row["step"]))["stopped"] = reason
                    self.state.save()
                    _say(f"{config.name}: over-saturated at {load:g} {spec.load_unit} "
                         f"({reason}); no higher load is measured")
            repeat += 1
        last = last or repeat - 1 >= self.spec.repeats
        if last and self.spec.refine is not None and not progress.get("refined"):
            self._refine(config, run)

    def _next_sweep_load(self, config: Configuration, repeat: int, measured: set[float]
                         ) -> float | None:
        """The next load of this repeat not ``measured`` yet, from the loads as the study is
        fitted now: the budget fitted again after the first step may give loads up, or keep
        all (an H100 study's first configuration skipped 72 users that the fit had kept), and
        none above an over-saturated ceiling."""
        ceiling = self.state.config(config.name).get("ceiling")
        for load in self.repeat_order(config, self._loads(config), repeat):
            if load not in measured and (ceiling is None or load <= ceiling):
                return load
        return None

    def _probe(self, config: Configuration, run: dict[str, Any]) -> None:
        """load.auto: probe start, start*factor, ... until a step saturates (repeat 1)."""
        spec = self.spec
        auto = spec.load.auto
        assert auto is not None
        progress = self.state.config(config.name)
        probes = [self._cached_row(s) for s in self.state.steps_of(config.name)
                  if s["phase"] == "probe"]
        load = auto.start * auto.factor ** len(probes)
        previous = probes[-1] if probes else None
        while True:
            if len(probes) >= auto.max_steps:
                _say(f"{config.name}: no saturation within {auto.max_steps} probe steps")
                break
            row = self._unit(config, 1, load, "probe", run)
            probes.append(row)
            stop = over_saturated(row, probes[:-1], spec)
            if stop or probe_saturated(row, previous, spec.load.kind):
                _say(f"{config.name}: saturated at {load:g} {spec.load_unit}"
                     f"{' (' + stop + ')' if stop else ''}")
                break
            previous, load = row, load * auto.factor
            if spec.load.kind == "concurrency":
                load = float(round(load))
        progress["capacity_estimate"] = capacity_estimate(probes, spec.load.kind)
        self.state.save()

    def _refine(self, config: Configuration, run: dict[str, Any]) -> None:
        """Bisection on the SLO boundary and steps around the knee (spec.refine)."""
        spec = self.spec
        refine = spec.refine
        assert refine is not None
        progress = self.state.config(config.name)
        while True:
            refined = {s["offered_load"] for s in self.state.steps_of(config.name)
                       if s["phase"] == "refine"}
            points, capacity = self.config_rollup(config.name)
            first = REFINE_PHASES[len(refined) % len(REFINE_PHASES)]
            decided = (self.verdict_decided(config.name, capacity) if refine.method == "curve"
                       else "")  # bisect: the search as it was, for comparison
            if decided:
                _say(f"{config.name}: search stopped, the verdict is decided: {decided}")
                break
            load, why = next_refinement(points, capacity, refine.share, spec.load.kind, first,
                                        spec.slo.to_dict() if refine.method == "curve"
                                        else None)
            if load is None:
                _say(f"{config.name}: refinement done: {why}")
                break
            if len(refined) >= refine.max_steps:
                _say(f"{config.name}: refinement budget spent ({refine.max_steps} loads); "
                     f"{why}")
                break
            over = self.over_budget(config, load)
            if over:
                _say(f"{config.name}: refinement stopped, {over}; {why}")
                break
            _say(f"{config.name}: refining at {load:g} {spec.load_unit}: {why}")
            for repeat in range(1, spec.repeats + 1):
                self._unit(config, repeat, load, "refine", run)
        progress["refined"] = True
        self.state.save()

    def verdict_decided(self, name: str, capacity: pd.Series) -> str:
        """Why this configuration's search may stop although its own figures are not yet as
        precise as asked: its max sustainable load's ratio to every configuration measured
        before it has an interval that excludes 1 by more than ``refine.share`` (the verdict
        between them holds whatever more loads show; an interval that just grazes 1, as
        [1.0002, 1.7] does where one load held and a slightly lower one of the other failed,
        decides nothing a reader can act on); "" otherwise, and for the first configuration."""
        names = [c.name for c in self.spec.configurations]
        earlier = [n for n in names[:names.index(name)] if self.state.config(n)["done"]]
        records = {r["config"]: r for r in self.state.data.get("capacity") or []}
        if not earlier or not bool(capacity.get("resolved", True)):
            return ""
        texts = []
        for other in earlier:
            record = records.get(other)
            if record is None or not record.get("resolved", True):
                return ""
            cap = {k: math.inf if v is None and k == "max_load_hi" else
                   (math.nan if v is None else v) for k, v in record.items()}
            ratio = study_stats.ratio_interval(cap, capacity)
            share = self.spec.refine.share if self.spec.refine else 0.0
            if not (ratio[1] > 1 + share or ratio[2] < 1 - share):  # NaN or near 1
                return ""
            texts.append(study_stats.format_ratio(
                other, name, ratio, (study_stats.above_sweep(cap),
                                     study_stats.above_sweep(capacity))))
        return "; ".join(texts)

    def _unit(self, config: Configuration, repeat: int, load: float, phase: str,
              run: dict[str, Any]) -> pd.Series:
        """One (repeat, load): its first part, then more until precise (spec.precision); each
        part as long as the measured noise needs and never shorter than the E2E floor
        (:meth:`_part_seconds`)."""
        spec = self.spec
        parts = [s for s in self.state.steps_of(config.name)
                 if s.get("repeat", 1) == repeat and s["offered_load"] == load]
        rows = [self._cached_row(s) for s in parts]
        precision = spec.precision
        half = math.nan
        while True:
            length: float | None = spec.step_duration_s
            if rows and precision is None:
                break
            if precision is not None:
                half = (self.half_width_pct([s["run_dir"] for s in parts], precision.column)
                        if rows else math.nan)
                length = self._part_seconds(config, load, parts, half)
                if length is None:
                    break
            number = self.state.next_step_number(config.name)
            row = self._run_step(config, number, load, phase, run["base_url"], run["model"],
                                 run["target_kind"], run["launch_args"], repeat=repeat,
                                 part=len(parts) + 1, length_s=length)
            rows.append(row)
            parts = [s for s in self.state.steps_of(config.name)
                     if s.get("repeat", 1) == repeat and s["offered_load"] == load]
        if precision is not None:
            self._note_noise(config, load, repeat, parts, rows, half)
        self._first_measured(config, load, parts)
        return rows[-1]

    def _part_seconds(self, config: Configuration, load: float, parts: list[dict[str, Any]],
                      half: float) -> float | None:
        """The next part of a precise (repeat, load), in seconds, or None when it is done:
        precise (``half``, the interval's half-width in % over its parts so far) with a part
        at least :func:`~infra.study.plan.floor_s` long, or ``max_s`` spent. Its length is
        what the interval needs (its window grows as (half / target)^2), and the first part's
        what the noise measured so far needs; at least ``min_s`` and the floor, at most what
        is left of ``max_s`` (a part as long as the floor runs even past ``max_s``). A first
        part found under :data:`REDO_UNDER_FLOOR` of the floor its own load's E2E sets gets one
        more as long as the floor."""
        spec = self.spec
        precision = spec.precision
        assert precision is not None
        measured = self.measured()
        name = config.name
        floor = floor_s(spec, measured, name, load)
        low = float(math.ceil(max(precision.min_s, floor) - 1e-9))  # whole seconds
        durations = [float(s.get("duration_s") or spec.step_duration_s) for s in parts]
        if not parts:  # as the noise measured so far needs (min_s before any is measured)
            return float(math.ceil(unit_seconds(spec, measured, name, load))
                         ) if measured.noise_k(name) else low
        spent = sum(durations)
        if len(parts) == 1 and durations[0] < floor - 1e-6:
            # a step sized before this load's own E2E was known (the study's first, or one
            # above every load measured), shorter than the floor that E2E sets: far under it,
            # once more, as long as the floor; else the later repeats are sized from it
            again = durations[0] < REDO_UNDER_FLOOR * floor
            _say(f"  {name} {load:g}: its step ({durations[0]:g} s) is under "
                 f"{e2e_multiple(spec):g} x the E2E P95 measured at it ({floor:.0f} s)"
                 + (f": another {low:.0f} s" if again else "; later repeats are sized from it"))
            if again:
                return low
        if half == half and half <= precision.half_width_pct:
            return None
        left = precision.max_s - spent
        if left < low - 1e-9:
            _say(f"  {name} {load:g}: precision.max_s ({precision.max_s:g} s) spent with the "
                 f"{precision.metric} interval at ±{half:.1f}%")
            return None
        window = sum(window_s(spec, d) for d in durations)
        wanted = (window * (half / precision.half_width_pct) ** 2 - window
                  + spec.warmup_s + spec.cooldown_s) if half == half else low
        length = float(round(min(max(wanted, low), left)))
        _say(f"  {name} {load:g}: {precision.metric} ±{half:.1f}% > "
             f"{precision.half_width_pct:g}%: another {length:g} s")
        return length

    # -------------------------------------------------------------- what the study measured

    def over_budget(self, config: Configuration, load: float) -> str:
        """Under ``--budget``: why a search load at ``load`` (every repeat) would take the study
        past it, counting what was spent (server starts and steps, as measured) and what the
        configurations after this one still plan (their search included); "" when it fits."""
        budget = float(self.state.data.get("budget_s") or 0.0)
        if not budget:
            return ""
        spec, measured = self.spec, self.measured()
        overhead = overhead_s(spec, measured)
        spent = sum(float(s["seconds"]) for s in self._measured_data().get("starts", []))
        spent += sum(float(s.get("duration_s") or spec.step_duration_s) + overhead
                     for s in self.state.data["steps"] if s["status"] == "done")
        this = spec.repeats * (unit_seconds(spec, measured, config.name, load) + overhead)
        names = [c.name for c in spec.configurations]
        later = [c for c in spec.configurations[names.index(config.name) + 1:]
                 if not self.state.config(c.name)["done"]]
        rest = total_seconds(replace(spec, configurations=tuple(later)), measured) if later \
            else 0.0
        if spent + this + rest <= budget:
            return ""
        return (f"--budget {budget / 60:g} min would run over: {spent / 60:.1f} min spent, "
                f"{this / 60:.1f} min for this load, {rest / 60:.1f} min planned after it")

    def _note_overhead(self, entry: dict[str, Any]) -> None:
        """The step's seconds beyond its load (plan.Measured ``step_overheads_s``): its wall time
        less its length, and the gap since the step before it when that was of the same
        configuration (a server start between two steps is measured apart)."""
        started = datetime.fromisoformat(entry["started_at"])
        wall = (datetime.fromisoformat(entry["ended_at"]) - started).total_seconds()
        overhead = wall - float(entry.get("duration_s") or self.spec.step_duration_s)
        before = [s for s in self.state.data["steps"]
                  if s is not entry and s["status"] == "done" and s.get("ended_at")]
        if before:
            last = max(before, key=lambda s: datetime.fromisoformat(s["ended_at"]))
            gap = (started - datetime.fromisoformat(last["ended_at"])).total_seconds()
            if last["config"] == entry["config"] and gap >= 0:
                overhead += gap
        kept = self._measured_data().setdefault("step_overheads_s", [])
        kept.append(round(max(overhead, 0.0), 2))
        del kept[:-OVERHEADS_KEPT]

    def _measured_data(self) -> dict[str, Any]:
        data: dict[str, Any] = self.state.data.setdefault(STATE_KEY, {})
        return data

    def measured(self) -> Measured:
        """What the study measured of its servers so far (:class:`infra.study.plan.Measured`)."""
        return Measured.from_state(self.state.data.get(STATE_KEY))

    def _config_measured(self, name: str) -> dict[str, Any]:
        configs = self._measured_data().setdefault("configs", {})
        entry: dict[str, Any] = configs.setdefault(name, {"e2e_p95_s": {}, "noise": {}})
        return entry

    def _note_e2e(self, config: Configuration, load: float, row: pd.Series) -> None:
        """The step's E2E P95 (the largest at its load); a fixed step_duration_s shorter than
        the E2E floor is said once a configuration."""
        e2e = float(row.get("e2e_p95_s", math.nan))
        if not e2e == e2e or e2e <= 0 or self.spec.load.kind == "rate" and not (
                row["achieved_ratio"] >= sa.SUSTAINABLE_RATIO):
            return  # an over-run rate step's E2E is its queue growing, not the server's pace
        table = self._config_measured(config.name)["e2e_p95_s"]
        known = table.get(f"{load:g}")
        table[f"{load:g}"] = round(max(e2e, known or 0.0), 4)
        floor = e2e_multiple(self.spec) * e2e
        entry = self._config_measured(config.name)
        if self.spec.precision is None and self.spec.step_duration_s < floor and not entry.get(
                "warned"):
            entry["warned"] = True
            _say(f"{config.name}: step_duration_s {self.spec.step_duration_s:g} s is "
                 f"{self.spec.step_duration_s / e2e:.1f} x the E2E P95 measured at {load:g} "
                 f"({e2e:.2f} s); steps shorter than {e2e_multiple(self.spec):g} x differ from "
                 "repeat to repeat: a longer step_duration_s, or precision: {...}, sizes them")

    def _note_noise(self, config: Configuration, load: float, repeat: int,
                    parts: list[dict[str, Any]], rows: list[pd.Series], half: float) -> None:
        """The precision metric's noise at this (repeat, load), as Measured.noise keeps it (the
        largest seen): its interval over the requests, the spread of its parts and, once
        another repeat measured this load, of the repeats."""
        spec = self.spec
        assert spec.precision is not None
        column = spec.precision.column
        windows = [window_s(spec, float(s.get("duration_s") or spec.step_duration_s))
                   for s in parts]
        noise = self._config_measured(config.name)["noise"]
        noise["metric"] = spec.precision.metric
        found = {"bootstrap": half * math.sqrt(sum(windows)) if half == half else math.nan,
                 "parts": spread_k([float(r[column]) for r in rows[-len(parts):]], windows)}
        by_repeat: dict[int, list[dict[str, Any]]] = {}
        for step in self.state.steps_of(config.name):
            if step["offered_load"] == load:
                by_repeat.setdefault(step.get("repeat", 1), []).append(step)
        if len(by_repeat) > 1:
            values, spans = [], []
            for steps in by_repeat.values():
                values.append(float(np.mean([self._cached_row(s)[column] for s in steps])))
                spans.append(sum(window_s(spec, float(s.get("duration_s")
                                                      or spec.step_duration_s))
                                 for s in steps))
            found["repeats"] = spread_k(values, spans)
        for key, k in found.items():
            if k == k:
                noise[key] = round(max(k, noise.get(key) or 0.0), 2)
        self.state.save()

    def _first_measured(self, config: Configuration, load: float,
                        parts: list[dict[str, Any]]) -> None:
        """After the study's first (repeat, load): its E2E P95 and noise, kept as measured then
        (--resume fits the budget with the same), and the budget fitted again with them."""
        data = self._measured_data()
        if data.get("first") or not parts:
            return
        measured = self.measured()
        e2e = measured.e2e(config.name, load)
        if e2e is None:
            return
        data["first"] = {"config": config.name, "load": load, "e2e_p95_s": e2e,
                         "noise": measured.noise_k(config.name),
                         "step_s": sum(float(s.get("duration_s") or 0.0) for s in parts)}
        self.state.save()
        budget = self.state.data.get("budget_s")
        if budget and self.unfitted is not None:
            fitted, lines = fit_for_run(self.unfitted, float(budget), self.measured(),
                                        strict=False)
            _say(f"measured at {config.name} {load:g}: E2E P95 {e2e:.2f} s"
                 + (f", {self.spec.precision.metric} noise ±{data['first']['noise']:.0f}% "
                    "over 1 s" if self.spec.precision and data["first"]["noise"] else "")
                 + "; the budget fitted again with it:")
            for line in lines:
                _say(line)
            self.spec = self.state.spec = fitted

    def half_width_pct(self, run_dirs: list[str], column: str) -> float:
        """Half the 95% interval of ``column`` over these parts (one repeat), in % of it."""
        frames = [pd.read_parquet(self.dir / r / sa.STEP_ROWS_FILE) for r in run_dirs]
        steps = pd.concat(frames, ignore_index=True)
        steps = steps[steps["bucket"] == sa.ALL_ROW]
        steps["repeat"] = 1
        cohorts = sa.read_cohorts(self.dir, run_dirs)
        clusters = sa._clusters(steps, cohorts, sa.ALL_ROW, self.spec.slo.to_dict())
        draws = study_stats.bootstrap_point(clusters, rng=np.random.default_rng(self.spec.seed))
        row = sa._point_row(steps, clusters, self.spec.slo.to_dict(), self.spec.load.kind)
        lo, hi = draws.interval(column)
        value = row.get(column, math.nan)
        return (hi - lo) / 2 / value * 100 if value and value == value and lo == lo else math.nan

    def _rows_of(self, config: str, exclude: pd.Series | None = None) -> list[pd.Series]:
        rows = [self._cached_row(s) for s in self.state.steps_of(config)]
        if exclude is None:
            return rows
        return [r for r in rows if int(r["step"]) != int(exclude["step"])]

    def _entry(self, config: str, step: int) -> dict[str, Any]:
        return next(s for s in self.state.data["steps"]
                    if s["config"] == config and s["step"] == step)

    def _cached_row(self, entry: dict[str, Any]) -> pd.Series:
        rows = pd.read_parquet(self.dir / entry["run_dir"] / sa.STEP_ROWS_FILE)
        return rows[rows["bucket"] == sa.ALL_ROW].iloc[0]

    def step_config(self, config: str, number: int, load: float, base_url: str,
                    model: str, repeat: int = 1, part: int = 1) -> RunConfig:
        """The ``swarmload run`` configuration of one step: the study's workload section with
        this step's target, load, folder and labels (the target was probed already:
        :func:`wait_until_serving`, so no preflight of its own)."""
        spec = self.spec
        # the step is --quiet, but its live progress shows (a panel on a terminal, lines else)
        progress = self.progress
        if progress == "auto":
            progress = "rich" if sys.stdout.isatty() else "plain"
        # every repeat and part its own arrivals and prompts (repeat 1, part 1: the study's)
        seed = spec.workload.run.seed + (repeat - 1) * 7919 + (part - 1) * 104_729
        run = replace(spec.run, target=base_url, model=model, seed=seed,
                      results=str(self.dir / config),
                      run_id=f"step-{number}", quiet=True, preflight_timeout=0.0,
                      labels=tuple(f"{key}={value}" for key, value in spec.labels.items()),
                      progress=progress, progress_title=(
                          f"study {spec.name}: {config} step {number}, {load:g} "
                          f"{spec.load_unit}"))
        if self.live.get("prometheus_port"):
            run = replace(run, **self.live, labels=(*run.labels, f"study={spec.name}",
                                                    f"config={config}"))
        traces = self._traces
        if traces:
            run = replace(run, server_traces=True, server_traces_port=traces["port"],
                          server_traces_wait=traces["wait_s"])
        if spec.load.kind == "concurrency":
            return replace(run, users=int(load))
        plan = _plan_file(self.dir, config, number, load, spec)
        return replace(run, workload=str(self.workload), plan=str(plan))

    def _run_step(self, config: Configuration, number: int, load: float, phase: str,
                  base_url: str, model: str, target_kind: str,
                  launch_args: list[str], repeat: int = 1, part: int = 1,
                  length_s: float | None = None) -> pd.Series:
        spec = self.spec
        length = length_s or spec.step_duration_s
        run_rel = f"{config.name}/step-{number}"
        entry = {"config": config.name, "step": number, "offered_load": load,
                 "load_kind": spec.load.kind, "run_dir": run_rel, "status": "running",
                 "phase": phase, "stopped": None, "started_at": utc_now_iso(),
                 "repeat": repeat, "part": part, "duration_s": length}
        self.state.data["steps"].append(entry)
        self.state.save()
        _say(f"{config.name} step {number} ({phase}, repeat {repeat}"
             f"{f', part {part}' if part > 1 else ''}): {load:g} {spec.load_unit}, "
             f"{length:g} s ...")
        if spec.reset_prefix_cache:
            reset_prefix_cache(base_url)
        run_config = self.step_config(config.name, number, load, base_url, model, repeat, part)
        run_config = replace(run_config, duration=length)
        if self._started is not None:  # the replicas, for the per-replica tables and faults
            run_config = replace(run_config, target=config.target, replicas=config.replicas,
                                 balance=config.balance,
                                 fault_plan=config.faults_in(load) or "")
        try:
            run_dir = run_swarmload(run_config, started=self._started)
        except RunError as exc:
            entry["status"] = "failed"
            self.state.save()
            raise StudyError(f"{config.name} step {number}: {exc}") from exc
        except KeyboardInterrupt:  # before or after the run's own Ctrl-C handling
            entry["status"] = "interrupted"
            self.state.save()
            raise StudyInterrupted from None
        manifest = update_manifest(run_dir, study={
            "name": spec.name, "config": config.name, "step": number, "offered_load": load,
            "load_kind": spec.load.kind, "phase": phase, "target_kind": target_kind,
            "repeat": repeat, "part": part,
            "target_args": list(config.args), "launch_args": launch_args,
            "launch": self._launch}).to_dict()
        if manifest.get("status") == "interrupted":
            entry["status"] = "interrupted"
            self.state.save()
            raise StudyInterrupted
        rows, cohort = sa.measure_step(
            run_dir, config=config.name, step=number, offered_load=load,
            load_kind=spec.load.kind, slo=spec.slo.to_dict(),
            step_duration_s=length, warmup_s=spec.warmup_s,
            cooldown_s=spec.cooldown_s, steady=spec.steady_state,
            expected_cache_hit_rate=spec.expected_cache_hit_rate)
        if rows.empty:
            entry["status"] = "failed"
            self.state.save()
            raise StudyError(f"{config.name} step {number} recorded no requests; see "
                             f"{run_dir / 'logs'}")
        first = rows[rows["bucket"] == sa.ALL_ROW].iloc[0]
        if first["ok"] == 0 and first.get("err_connect_error", 0) == 1.0:
            # nothing answered: the server is gone, and this step measured nothing of it
            entry["status"] = "failed"
            self.state.save()
            raise StudyError(f"{config.name} step {number}: every request was refused "
                             f"({base_url} stopped serving); --resume restarts the target and "
                             "measures the step again")
        sa.label_step(rows, entry)
        rows.to_parquet(run_dir / sa.STEP_ROWS_FILE, index=False)
        cohort.to_parquet(run_dir / sa.COHORT_FILE, index=False)
        entry["status"], entry["ended_at"] = "done", utc_now_iso()
        self._note_overhead(entry)
        self.state.save()
        self.write_rollup()
        row = rows[rows["bucket"] == sa.ALL_ROW].iloc[0]
        _say(format_step(row, spec))
        self._note_e2e(config, load, row)
        self.state.save()
        if spec.load.arrival == "bursts":  # recovery per spike, and the burst roll-up
            report = burst.burst_report(run_dir)
            for line in burst.spike_lines(report.spikes) if report else []:
                _say(f"    {line}")
            burst.write_study_bursts(self.dir)
        if config.faults_in(load):  # one line per fault, and the fault roll-up
            fault_report = faults.fault_report(run_dir)
            for line in faults.fault_lines(fault_report.faults) if fault_report else []:
                _say(f"    {line}")
            faults.write_study_faults(self.dir)
        return row

    def write_rollup(self) -> None:
        """The roll-up from the cached step rows and cohorts (the full rebuild is
        sa.rollup_study); points already drawn are kept in memory, not drawn again."""
        steps, cohorts = self._steps_and_cohorts()
        if steps.empty:
            return
        configs = [c.name for c in self.spec.configurations]
        points, capacity, verdict = sa.full_rollup(steps, cohorts, self.state.public(),
                                                   configs, self._memo)
        sa.write_rollup(self.dir, steps, capacity, points, verdict)
        record_rollup(self.state, capacity, points, verdict)

    def _steps_and_cohorts(self, config: str | None = None
                           ) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
        entries = [s for s in self.state.data["steps"] if s["status"] == "done"
                   and (config is None or s["config"] == config)]
        frames = [pd.read_parquet(self.dir / s["run_dir"] / sa.STEP_ROWS_FILE) for s in entries]
        for entry, frame in zip(entries, frames, strict=True):
            sa.label_step(frame, entry)  # a step cached before repeats: its place now
        steps = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        missing = [s["run_dir"] for s in entries if s["run_dir"] not in self._cohorts]
        self._cohorts.update(sa.read_cohorts(self.dir, missing))
        return steps, self._cohorts

    def config_rollup(self, config: str) -> tuple[pd.DataFrame, pd.Series]:
        """(this configuration's ``all`` points, its capacity row with intervals)."""
        steps, cohorts = self._steps_and_cohorts(config)
        points, capacity, _ = sa.full_rollup(steps, cohorts, self.state.public(), [config],
                                             self._memo)
        return points[points["bucket"] == sa.ALL_ROW], capacity.iloc[0]


def record_rollup(state: StudyState, capacity: pd.DataFrame, points: pd.DataFrame,
                  verdict: pd.DataFrame) -> None:
    """study.json (and study_state.json) gain the roll-up's headline: the capacity table with
    its intervals and what is behind each figure, the verdict's sentences, the frontier."""
    keep = ["config", "max_sustainable_load", "max_load_lo", "max_load_hi",
            "max_load_reached", "knee_load", "knee_lo", "knee_hi", "knee_reached", "metric",
            "repeats", "requests", "refined", "unsettled", "resolved", "resolution_note",
            "binding_slo", "note",
            *frontier.CAPACITY_COLUMNS]
    headline = capacity[[c for c in keep if c in capacity]].replace([np.inf, -np.inf], np.nan)
    state.data["capacity"] = json.loads(headline.to_json(orient="records"))
    state.data["verdict"] = [str(t) for t in verdict.get("text", [])]
    state.data["frontier"] = json.loads(frontier.frontier_table(points).replace(
        [np.inf, -np.inf], np.nan).to_json(orient="records"))
    state.save()


REFINE_PHASES = ("max_load", "knee")  # the search's two figures, which take turns


def _rounded(kind: str, value: float) -> float:
    """A load as the search measures it: whole users, or req/s to a thousandth."""
    return float(max(1, round(value))) if kind == "concurrency" else round(value, 3)


def next_refinement(points: pd.DataFrame, capacity: pd.Series, share: float, kind: str,
                    first: str = REFINE_PHASES[0], slo: Mapping[str, Any] | None = None
                    ) -> tuple[float | None, str]:
    """The next load the search measures, and why (None: every interval is within ``share``
    of its value, or no new load would narrow it).

    ``slo`` None: today's bisection, as before the curve search (``refine.method: bisect``).
    Two figures are refined: the SLO boundary (:func:`_max_load_refinement`: with ``slo``, just
    under and over where the fitted SLO figure crosses its threshold,
    :func:`dashboards.analysis.study_search.next_search_load`; else, or where the fit has no
    crossing in the bracket, bisect between the highest load that held and the lowest above it
    that did not) and the knee (:func:`_knee_refinement`: where the fit bends, then halve the
    wider gap beside it). ``first`` says whose turn it is;
    the runner alternates it, so a budget too small for both still narrows both (a search that
    always served the max load first spent every load of a 3-load budget on it and never
    placed one beside the knee). The other figure is refined when the first one needs no
    more loads.
    """
    if first not in REFINE_PHASES:
        raise ValueError(f"first must be one of {REFINE_PHASES}, not {first!r}")
    loads = sorted(float(v) for v in points["offered_load"])
    phases: dict[str, Callable[..., tuple[float | None, str]]] = {
        "max_load": partial(_max_load_refinement, slo=slo),
        "knee": partial(_knee_refinement, curve=slo is not None)}
    order = [first, *(name for name in REFINE_PHASES if name != first)]
    reasons = []
    for name in order:
        load, why = phases[name](points, capacity, share, loads, kind)
        if load is not None:
            return load, why
        if why:
            reasons.append(why)
    return None, "; ".join(reasons) or "no knee and no SLO boundary to refine"


def _max_load_refinement(points: pd.DataFrame, capacity: pd.Series, share: float,
                         loads: list[float], kind: str, slo: Mapping[str, Any] | None = None
                         ) -> tuple[float | None, str]:
    """The SLO boundary's next load: while the max sustainable load's interval is wider than
    ``share``, just under or over where the fitted SLO figure crosses its threshold (with
    ``slo``: study_search.next_search_load), else bisect between the highest load that held and
    the lowest above it that did not (rate steps: first a load just under the throughput
    ceiling, ``share`` below it or at its interval's lower end, where that lies inside). None
    at once when the capacity is not resolvable (a figure flat within its noise near the SLO):
    more loads would not resolve it."""
    if not bool(capacity.get("resolved", True)):
        return None, f"not resolvable: {capacity.get('resolution_note')}"
    measured = set(loads)
    best = float(capacity["max_sustainable_load"])
    lo, hi = float(capacity.get("max_load_lo", math.nan)), float(
        capacity.get("max_load_hi", math.nan))
    if best != best:
        return None, ""
    # a load the generator failed is no server failure to bisect towards (capacity_row)
    was_bent = sa.generator_failed_rows(points)
    failing = [load for load, ok, bent in zip(points["offered_load"], points["sustainable"],
                                              was_bent, strict=True)
               if load > best and not ok and not bent]
    bent_above = sorted(load for load, bent in zip(points["offered_load"], was_bent,
                                                   strict=True) if bent and load > best)
    half = (hi - lo) / 2 / best if lo == lo and hi == hi else math.inf
    # the server's own ceiling, where a load saturated it, is a sharper estimate of the
    # limit than the middle of the bracket: a load just under it (by the share asked for,
    # or at its interval's lower end when that is closer) is measured first
    ceiling = max(float(capacity.get("throughput_ceiling", math.nan)) * (1 - share),
                  float(capacity.get("throughput_ceiling_lo", math.nan)))
    if not failing:
        # the generator, not the server, failed above the best load (a starved worker on a
        # busy host): nothing bounds the server yet, and a load between them, which asks less
        # of the generator, says whether it holds more
        candidate = _rounded(kind, (best + bent_above[0]) / 2) if bent_above else math.nan
        if best < candidate < bent_above[0] and candidate not in measured:
            return candidate, (f"no load failed the SLO above {best:g} but the generator "
                               f"failed at {', '.join(f'{b:g}' for b in bent_above)}: measure "
                               f"{best:g}..{bent_above[0]:g}")
        return None, "no load failed the SLO: nothing to bisect"
    if half <= share:
        return None, f"max sustainable load ±{half:.1%} <= {share:.1%}"
    top = min(failing)
    if slo is not None:
        unit = "users" if kind == "concurrency" else "req/s"
        load, why, stop = study_search.next_search_load(
            points, slo, share, (lo if lo == lo else best, max(top, hi) if hi == hi else top),
            kind, unit, float(capacity.get("throughput_ceiling", math.nan)))
        if stop:
            return None, why
    if kind == "rate" and best * (1 + share) < ceiling < top * (1 - share) and (
            _rounded(kind, ceiling) not in measured):
        return _rounded(kind, ceiling), (
            f"max sustainable load {best:g} [{lo:g}, {hi:g}] is ±{half:.1%} > "
            f"{share:.1%}: just under the throughput ceiling, {ceiling:g} req/s, in "
            f"{best:g}..{top:g}")
    if slo is not None and load is not None and load not in measured:
        return load, (f"max sustainable load {best:g} [{lo:g}, {hi:g}] is ±{half:.1%} > "
                      f"{share:.1%}: {why}")
    middle = (best + top) / 2
    # a load the generator bent inside the bracket tells nothing of the server: the bracket
    # stays, and the loads beside its middle are measured instead of giving up on it
    bent = [load for load in bent_above if load < top]
    for at in (middle, (best + middle) / 2, (middle + top) / 2):
        candidate = _rounded(kind, at)
        if best < candidate < top and candidate not in measured:
            beside = (f" (beside {', '.join(f'{b:g}' for b in bent)}, bent by the generator)"
                      if bent else "")
            return candidate, (f"max sustainable load {best:g} [{lo:g}, {hi:g}] is ±"
                               f"{half:.1%} > {share:.1%}: bisect {best:g}..{top:g}{beside}")
    return None, f"the max-load bracket {best:g}..{top:g} is as fine as loads go"


def _knee_refinement(points: pd.DataFrame, capacity: pd.Series, share: float,
                     loads: list[float], kind: str, curve: bool = False
                     ) -> tuple[float | None, str]:
    """The knee's next load: while its interval is wider than ``share``, (``curve``) where the
    fit bends, then halve the wider gap beside the measured load the latency curve bends at. A
    saturated rate configuration's knee is its saturation throughput (dashboards.analysis.study,
    "Knee"), which loads beside it do not narrow: the bisection (``curve`` false) refined the
    latency bend beside it instead; the curve search leaves the bend as a figure shown, not
    searched, and spends its loads on the figures the decision rests on, as it does for a knee
    candidate that latency did not at least double past (on a closed loop sweeping a few
    loads past the SLO, Kneedle's candidate sat near the SLO crossing and took four of six
    search loads)."""
    saturated = capacity.get("knee_kind") == "saturation"
    if curve and not saturated and not bool(capacity.get("knee_reached", True)):
        return None, ("knee candidate only (latency did not at least double past it): not "
                      "searched")
    if curve and saturated:
        knee, k_lo, k_hi = (float(capacity.get(k, math.nan))
                            for k in ("knee_load", "knee_lo", "knee_hi"))
        half = (k_hi - k_lo) / 2 / knee if knee == knee and k_lo == k_lo else math.inf
        return None, (f"saturation point {knee:g} ±{half:.1%}: loads beside it do not narrow "
                      "it (the latency bend is shown, not searched)")
    name = "bend" if saturated else "knee"
    knee = float(capacity.get(f"{name}_load", math.nan))
    k_lo, k_hi = float(capacity.get(f"{name}_lo", math.nan)), float(capacity.get(f"{name}_hi",
                                                                                  math.nan))
    if knee != knee or not loads:
        return None, ""
    half = (k_hi - k_lo) / 2 / knee if k_lo == k_lo and k_hi == k_hi else math.inf
    if half <= share:
        return None, f"{name} ±{half:.1%} <= {share:.1%}"
    bend = _rounded(kind, knee)  # where the fit bends, when no load is there yet
    if curve and loads[0] < bend < loads[-1] and all(abs(bend - m) > SAME_LOAD * m
                                                     for m in loads):
        return bend, (f"{name} {knee:g} [{k_lo:g}, {k_hi:g}] is ±{half:.1%} > {share:.1%}: "
                      "measure where the fit bends")
    at = int(np.argmin([abs(load - knee) for load in loads]))  # the vertex it bends at
    gaps = [(loads[at] - loads[at - 1], (loads[at] + loads[at - 1]) / 2)] if at else []
    if at + 1 < len(loads):
        gaps.append((loads[at + 1] - loads[at], (loads[at] + loads[at + 1]) / 2))
    measured = set(loads)
    for _gap, middle in sorted(gaps, reverse=True):
        candidate = _rounded(kind, middle)
        if candidate not in measured:
            return candidate, (f"{name} {knee:g} [{k_lo:g}, {k_hi:g}] is ±{half:.1%} > "
                               f"{share:.1%}: halve the gap beside it")
    return None, f"the {name}'s neighbours are as close as loads go"


def reset_prefix_cache(base_url: str) -> None:
    """vLLM's own endpoint (served with VLLM_SERVER_DEV_MODE=1): the next step starts with an
    empty prefix cache."""
    try:
        response = httpx.post(f"{base_url}/reset_prefix_cache", timeout=30.0)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise StudyError(f"reset_prefix_cache: POST {base_url}/reset_prefix_cache failed "
                         f"({exc}); does the server run with VLLM_SERVER_DEV_MODE=1?") from exc


def format_step(row: pd.Series, spec: StudySpec) -> str:
    pct = spec.slo.percentile
    ms = {tag: row[f"{tag}_{pct}_s"] * 1e3 for tag in ("ttft", "tpot", "e2e")}
    unit = row.get("arrival_unit")  # "sessions", "tasks"; "" for lone requests
    unit = unit if isinstance(unit, str) and spec.load.kind == "rate" else ""
    requests = f"{row['achieved_req_per_s']:.2f} req/s"
    if unit:  # sessions, tasks: the rate plan counts them, and so does the ratio
        achieved = (f"{row['achieved_arrivals_per_s']:.2f} {unit}/s of "
                    f"{row['offered_arrivals_per_s']:.2f} offered ({row['achieved_ratio']:.0%}), "
                    f"{requests}")
    elif spec.load.kind == "rate":
        achieved = (f"{requests} of {row['offered_req_per_s']:.2f} offered "
                    f"({row['achieved_ratio']:.0%})")
    else:
        achieved = requests
    task = row.get(f"task_{pct}_s", math.nan)  # agent workloads: the tasks' time
    tasks = f", task {task:.2f} s" if task == task else ""
    return (f"  {row['config']} step {int(row['step'])}: {row['offered_load']:g} "
            f"{f'{unit}/s' if unit else spec.load_unit}: achieved {achieved}, "
            f"{row['output_tok_per_s']:.0f} tok/s, goodput {row['goodput_req_per_s']:.2f} req/s; "
            f"{pct.upper()} TTFT {ms['ttft']:.0f} ms, TPOT {ms['tpot']:.1f} ms, "
            f"E2E {ms['e2e']:.0f} ms{tasks}; errors {row['error_rate']:.1%}; "
            f"{'sustainable' if row['sustainable'] else 'NOT sustainable'}")


# ------------------------------------------------------------------------------------------ CLI


def build_parser() -> argparse.ArgumentParser:
    """``swarmload study run``'s flags: RunConfig's fields of the study-run command."""
    return build_run_parser("study-run", __doc__, prog="swarmload study run")


def preflight_endpoints(spec: StudySpec) -> None:
    """Every configuration whose target is a running server (a URL) answers before the study
    starts anything (:mod:`infra.preflight`), with the study's key, headers and TLS settings;
    started targets are probed once they are up (:func:`wait_until_serving`)."""
    endpoint = spec.run
    key, _source = api_key(endpoint.api_key_env, endpoint.api_key_file)
    headers = dict(parse_headers(list(endpoint.headers)))
    if key:
        headers["Authorization"] = f"Bearer {key}"
    verify: Any = (False if endpoint.insecure else
                   ssl.create_default_context(cafile=endpoint.ca_bundle) if endpoint.ca_bundle
                   else True)
    for config in spec.configurations:
        if config.target.startswith(("http://", "https://")):
            try:
                check_target(config.target, endpoint=spec.workload.endpoint, timeout_s=30.0,
                             headers=headers, verify=verify, stream=endpoint.stream)
            except PreflightError as exc:
                raise type(exc)(f"configurations: {config.name} ({config.target}): {exc}"
                                ) from None


def fit_to_budget(run_config: RunConfig,
                  spec: StudySpec) -> tuple[StudySpec, float, list[str]]:
    """``--budget`` (or, resuming, the one the study started with, with what its first step
    measured): (the fitted study, the budget in seconds or 0, the lines that say what it gave
    up); ValueError when a new study cannot fit."""
    resume = Path(run_config.study_resume) if run_config.study_resume else None
    budget = run_config.study_budget or (stored_budget(resume) if resume else 0.0)
    if not budget:
        return spec, 0.0, []
    measured = stored_measured(resume) if resume else NOTHING
    fitted, lines = fit_for_run(spec, budget, measured, strict=resume is None)
    return fitted, budget, lines


def print_precision(spec: StudySpec, study_dir: Path) -> None:
    """The half-widths the study reached (:func:`infra.study.plan.precision_lines`)."""
    rollup = study_dir / run_folder.ROLLUP_DIR
    capacity, points = rollup / run_folder.CAPACITY_FILE, rollup / run_folder.POINTS_FILE
    if capacity.is_file() and points.is_file():
        print("\nprecision reached (half-widths of the 95% intervals):")
        for line in precision_lines(spec, pd.read_parquet(capacity), pd.read_parquet(points)):
            print(f"  {line}")
    steps = rollup / run_folder.STEPS_FILE
    lines = repeat_lines(spec, pd.read_parquet(steps)) if steps.is_file() else []
    if lines:
        print("repeat to repeat (at one load each):")
        for line in lines:
            print(f"  {line}")


def stored_measured(study_dir: Path) -> Measured:
    """What a study measured so far (nothing when its folder cannot be read: StudyState.load
    says what is wrong with it)."""
    try:
        return Measured.from_study_dir(study_dir)
    except ValueError:
        return NOTHING


def stored_budget(study_dir: Path) -> float:
    """The ``--budget`` a study started with (0 without), so ``--resume`` fits it the same."""
    try:
        return float(json.loads((study_dir / STATE_FILE).read_text(encoding="utf-8")).get(
            "budget_s") or 0.0)
    except (OSError, ValueError):
        return 0.0  # StudyState.load says what is wrong with the folder


def _raise_interrupt(*_args: Any) -> None:
    raise KeyboardInterrupt


class _Refused(Exception):
    """A check before the study starts failed: its one line and the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def main(argv: list[str]) -> int:
    """``swarmload study run``: the study file and its endpoints checked, the study folder
    opened (or resumed), every step run, then what the roll-ups say. Exit codes: ``EXIT_*``
    of :mod:`infra.orchestrate`."""
    run_config = parse_or_exit(build_parser(), argv)
    try:
        unfitted = _load_spec(run_config)
        spec, budget, budget_lines = _fit_budget(run_config, unfitted)
        _check_endpoints(spec)
        study_dir, state = _open_study(run_config, spec)
    except _Refused as exc:
        print(f"swarmload study run: {exc}", file=sys.stderr)
        return exc.code
    if budget:  # kept, so --resume fits the study the same
        state.data["budget_s"] = budget
        for line in budget_lines:
            _say(line)
    code = _run_steps(run_config, spec, study_dir, state, unfitted if budget else None)
    print_outcome(spec, study_dir, precision=bool(budget) or spec.precision is not None
                   or spec.repeats > 1)
    return code


def _load_spec(run_config: RunConfig) -> StudySpec:
    try:
        spec = load_study(run_config.study_file)
        return replace(spec, labels={**spec.labels, **parse_labels(run_config.labels)},
                       gpu_hour_usd=run_config.study_gpu_hour_usd or spec.gpu_hour_usd)
    except (StudySpecError, ValueError) as exc:
        raise _Refused(str(exc), EXIT_BAD_INPUT) from None


def _fit_budget(run_config: RunConfig, spec: StudySpec) -> tuple[StudySpec, float, list[str]]:
    try:
        return fit_to_budget(run_config, spec)
    except ValueError as exc:
        raise _Refused(f"--budget: {exc}", EXIT_BAD_INPUT) from None


def _check_endpoints(spec: StudySpec) -> None:
    try:
        preflight_endpoints(spec)
    except PreflightError as exc:
        raise _Refused(str(exc), EXIT_BAD_INPUT if isinstance(exc, UnknownModel)
                       else EXIT_UNREACHABLE) from None
    except (ValueError, OSError) as exc:  # a key variable not set, a CA file not there
        raise _Refused(f"endpoint: {exc}", EXIT_BAD_INPUT) from None


def _open_study(run_config: RunConfig, spec: StudySpec) -> tuple[Path, StudyState]:
    """The folder and state of ``--resume``, or a new folder with the study file's copy."""
    if run_config.study_resume:
        study_dir = Path(run_config.study_resume).resolve()
        try:
            state = StudyState.load(study_dir, spec)
        except StudyError as exc:
            raise _Refused(str(exc), EXIT_BAD_INPUT) from None
        _say(f"resuming {study_dir}")
        return study_dir, state
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    study_dir = (Path(run_config.results) / f"{spec.name}-{stamp}").resolve()
    if study_dir.exists():
        raise _Refused(f"{study_dir} exists; wait a second", EXIT_BAD_INPUT)
    study_dir.mkdir(parents=True)
    if spec.run.headers:  # header values may be credentials: keep their names only
        (study_dir / STUDY_COPY).write_text(yaml.safe_dump(spec.raw, sort_keys=False))
    else:
        shutil.copyfile(run_config.study_file, study_dir / STUDY_COPY)
    plan = (f"auto {asdict(spec.load.auto)}" if spec.load.auto else "; ".join(
        f"{c.name} {', '.join(f'{s:g}' for s in spec.steps_for(c))}"
        for c in spec.configurations))
    precision = spec.precision
    length = (f"{spec.step_duration_s:g} s each" if precision is None else
              f"steps of {precision.min_s:g}-{precision.max_s:g} s as the noise needs, none "
              f"under {precision.min_e2e_multiple:g} x E2E P95")
    _say(f"study {spec.name}: {len(spec.configurations)} configuration(s), "
         f"{spec.load.kind} steps ({spec.load_unit}): {plan}, {length}; folder {study_dir}")
    return study_dir, StudyState(study_dir, spec)


def _run_steps(run_config: RunConfig, spec: StudySpec, study_dir: Path,
               state: StudyState, unfitted: StudySpec | None = None) -> int:
    """Every step (SIGTERM stops it as Ctrl-C does), the state's status and end, the roll-up;
    returns the exit code."""
    # each step's master serves its live figures, in turn, when asked for
    live = ({"prometheus_port": run_config.prometheus_port,
             "prometheus_bind": run_config.prometheus_bind} if run_config.prometheus_port else {})
    state.save()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    runner = StudyRunner(spec, study_dir, state, progress=run_config.progress, live=live,
                         unfitted=unfitted)
    code = 0
    try:
        runner.run()
        state.data["status"] = "finished"
    except (KeyboardInterrupt, StudyInterrupted):
        state.data["status"], code = "interrupted", EXIT_INTERRUPTED
        _say(f"interrupted; resume with: swarmload study run {run_config.study_file} --resume "
             f"{study_dir}")
    except StudyError as exc:
        state.data["status"], code = "failed", EXIT_FAILED
        print(f"swarmload study run: {exc}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)
        state.data["ended_at"] = utc_now_iso()
        state.save()
    runner.write_rollup()
    return code


def print_outcome(spec: StudySpec, study_dir: Path, precision: bool = False) -> None:
    """The capacity table (with ``precision``, the half-widths it reached), the verdict,
    bursts' recovery and fault drills, as far as the roll-ups hold them, then the folder."""
    capacity_path = study_dir / run_folder.ROLLUP_DIR / run_folder.CAPACITY_FILE
    if capacity_path.is_file():
        print(sa.format_capacity(pd.read_parquet(capacity_path), spec.load_unit))
    if precision:
        print_precision(spec, study_dir)
    verdict_path = study_dir / run_folder.ROLLUP_DIR / run_folder.VERDICT_FILE
    if verdict_path.is_file() and len(verdict := pd.read_parquet(verdict_path)):
        print("\nverdict (95% intervals; 'within noise': the interval holds no change):")
        print(sa.format_verdict(verdict))
    if spec.load.arrival == "bursts":
        bursts = burst.load_study_bursts(study_dir)
        if bursts is not None:
            print("\nrecovery from the same spikes:")
            configs = [c.name for c in spec.configurations]
            for line in burst.comparison_lines(burst.recovery_comparison(bursts[0], configs)):
                print(f"  {line}")
    if any(c.fault_plan for c in spec.configurations):  # the same drill, configuration by one
        drills = faults.study_faults(study_dir)
        if len(drills):
            print("\nfault drills:")
        for (config, step), group in drills.groupby(["config", "step"], sort=False):
            for line in faults.fault_lines(group):
                print(f"  {config} step {step}: {line}")
    print(f"study folder: {study_dir}")
