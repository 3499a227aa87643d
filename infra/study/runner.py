"""``swarmload study run STUDY.yaml``: every configuration swept through its load steps.

    swarmload study run infra/study/examples/sim-two-configs.yaml
    swarmload study run infra/study/examples/vllm-cpu-max-num-seqs.yaml --results results/studies
    swarmload study run infra/study/examples/vllm-cpu-max-num-seqs.yaml \
        --resume results/studies/<dir>

For each configuration (study file format: :mod:`infra.study.spec`) the target is started once
(``sim``, ``vllm-cpu``; a URL is used as it is) and probed with a real streamed completion until it
serves; then each load step is an ordinary ``swarmload run`` against it
(:func:`infra.orchestrate.run`, master + workers + collectors), written to
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
from contextlib import ExitStack
from dataclasses import asdict, replace
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
from dashboards.analysis import burst, faults, study_stats
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
from infra.study.plan import fit_for_run, precision_lines
from infra.study.spec import (
    Configuration,
    StudySpec,
    StudySpecError,
    load_study,
)
from infra.targets.vllm_cpu import VllmError
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
WORKLOAD_DIR = "workload"
PROBE_MIN_GAIN = 1.1  # concurrency probing: throughput must grow >= 10% per step to go on
SAME_LOAD = 0.03  # a planned load within 3% of a measured one is not measured again
SERVE_TIMEOUT_S = 300.0


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
                                **({"model": c.model, "python": c.python, "env": dict(c.env)}
                                   if c.target == "vllm" else {}),
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
            "workers": spec.workers, "labels": spec.labels,
            "gpu_interval_s": spec.gpu_interval_s, "server_traces": spec.server_traces,
            "repeats": spec.repeats, "repeat_order": spec.repeat_order, "seed": spec.seed,
            "restart_between_repeats": spec.restart_between_repeats,
            "steady_state": spec.steady_state,
            "precision": asdict(spec.precision) if spec.precision else None,
            "refine": asdict(spec.refine) if spec.refine else None,
            "reset_prefix_cache": spec.reset_prefix_cache,
            "expected_cache_hit_rate": spec.expected_cache_hit_rate,
            "budget_s": self.data.get("budget_s"),
            "capacity_estimates": {n: c["capacity_estimate"]
                                   for n, c in self.data["configs"].items()},
            "capacity": self.data.get("capacity") or [],
            "verdict": self.data.get("verdict") or [],
            "steps": self.data["steps"],
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
        return (f"{column} {row[column] * 1e3:.0f} ms > {spec.stop_when.latency_growth:g} x the "
                f"lowest ({min(lows) * 1e3:.0f} ms)")
    return None


def probe_saturated(row: pd.Series, previous: pd.Series | None, kind: str) -> bool:
    if kind == "rate":
        ratio = row["achieved_ratio"]
        return bool(ratio == ratio and ratio < sa.SUSTAINABLE_RATIO)
    if previous is None:
        return False
    return bool(row["achieved_req_per_s"] < PROBE_MIN_GAIN * previous["achieved_req_per_s"])


def capacity_estimate(rows: list[pd.Series], kind: str) -> float:
    achieved = max(float(r["achieved_req_per_s"]) for r in rows)
    if kind == "rate":
        return achieved
    lowest = min(rows, key=lambda r: r["offered_load"])
    return achieved * float(lowest["e2e_p50_s"])  # Little's law: N* = X_max * R_min


# ------------------------------------------------------------------------------------- running


class StudyRunner:
    def __init__(self, spec: StudySpec, study_dir: Path, state: StudyState,
                 progress: str = "auto", live: dict[str, Any] | None = None) -> None:
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
        spec = self.spec
        groups = ([[r] for r in range(1, spec.repeats + 1)] if spec.restart_between_repeats
                  else [list(range(1, spec.repeats + 1))])
        for index, repeats in enumerate(groups):
            last = index == len(groups) - 1
            if self._all_done(config, repeats) and not (last and self._refine_pending(config)):
                continue
            self._serve(config, repeats, last)
        self.state.config(config.name)["done"] = True
        self.state.save()

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
        options = config.target_options()
        if self.spec.reset_prefix_cache:  # vLLM serves /reset_prefix_cache in dev mode only
            options["env"] = {**options["env"], "VLLM_SERVER_DEV_MODE": "1"}
        self._traces = None
        if self.spec.server_traces:
            # the steps' collectors receive its spans here; a vLLM started here is told where
            launched = config.target in ("vllm", "vllm-cpu")
            port = free_port() if launched else SERVER_TRACES_PORT
            self._traces = {"port": port, "wait_s": 1.5 if launched else 6.0}
            if launched:
                options["traces_endpoint"] = f"http://127.0.0.1:{port}/v1/traces"
        self._started = None
        stack = ExitStack()
        try:
            target = stack.enter_context(
                start_target(config.target, list(config.args), _say, options)
                if config.replicas < 2 else self._replicas(config, options))
        except (RunError, VllmError) as exc:  # --resume starts it again
            raise StudyError(f"{config.name}: the target did not start: "
                             f"{str(exc).splitlines()[0]}") from exc
        with stack:
            if config.replicas > 1:
                self._started = target
            _say(f"{config.name}: waiting until {target.base_url} serves ...")
            model = wait_until_serving(target.base_url, target.model,
                                       endpoint=self.spec.run)
            _say(f"{config.name}: serving model {model} at {target.base_url} "
                 f"({time.monotonic() - started:.0f} s after start)")
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
        and the sweep around the capacity estimate."""
        spec = self.spec
        if spec.load.auto is None:
            return list(spec.steps_for(config))
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

    def _replicas(self, config: Configuration, options: dict[str, Any]) -> Any:
        """``replicas: N`` servers of the configuration's target behind its balancer, started
        once for all its steps (their logs in ``<study>/<config>/``)."""
        folder = self.dir / config.name
        folder.mkdir(parents=True, exist_ok=True)
        defaults = RunConfig()
        args = argparse.Namespace(
            target=config.target, target_args=list(config.args), replicas=config.replicas,
            balance=config.balance, health_check_interval=defaults.health_check_interval,
            health_check_fall=defaults.health_check_fall,
            health_check_rise=defaults.health_check_rise, vllm_model=config.model or "",
            vllm_python=config.python or "", vllm_env=dict(options.get("env") or {}),
            traces_endpoint=options.get("traces_endpoint"))
        return start_replicated(args, folder, _say)

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
                 f"{spec.load.unit}; every repeat measures "
                 f"{', '.join(f'{p:g}' for p in loads)}")
        for repeat in repeats:
            for load in self.repeat_order(config, loads, repeat):
                ceiling = progress.get("ceiling")
                if ceiling is not None and load > ceiling:
                    continue
                row = self._unit(config, repeat, load, "sweep", run)
                reason = over_saturated(row, self._rows_of(config.name, exclude=row), spec)
                if reason and (ceiling is None or load < ceiling):
                    progress["ceiling"] = load
                    progress["stopped"] = reason
                    self._entry(config.name, int(row["step"]))["stopped"] = reason
                    self.state.save()
                    _say(f"{config.name}: over-saturated at {load:g} {spec.load.unit} "
                         f"({reason}); no higher load is measured")
        if last and spec.refine is not None and not progress.get("refined"):
            self._refine(config, run)

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
                _say(f"{config.name}: saturated at {load:g} {spec.load.unit}"
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
            load, why = next_refinement(points, capacity, refine.share, spec.load.kind, first)
            if load is None:
                _say(f"{config.name}: refinement done: {why}")
                break
            if len(refined) >= refine.max_steps:
                _say(f"{config.name}: refinement budget spent ({refine.max_steps} loads); "
                     f"{why}")
                break
            _say(f"{config.name}: refining at {load:g} {spec.load.unit}: {why}")
            for repeat in range(1, spec.repeats + 1):
                self._unit(config, repeat, load, "refine", run)
        progress["refined"] = True
        self.state.save()

    def _unit(self, config: Configuration, repeat: int, load: float, phase: str,
              run: dict[str, Any]) -> pd.Series:
        """One (repeat, load): its first part, then more until precise (spec.precision)."""
        spec = self.spec
        parts = [s for s in self.state.steps_of(config.name)
                 if s.get("repeat", 1) == repeat and s["offered_load"] == load]
        rows = [self._cached_row(s) for s in parts]
        precision = spec.precision
        while True:
            spent = sum(float(s.get("duration_s") or spec.step_duration_s) for s in parts)
            if rows and precision is None:
                break
            if rows and precision is not None:
                half = self.half_width_pct([s["run_dir"] for s in parts], precision.column)
                if half == half and half <= precision.half_width_pct:
                    break
                if spent + precision.min_s > precision.max_s + 1e-9:
                    _say(f"  {config.name} {load:g}: precision.max_s ({precision.max_s:g} s) "
                         f"spent with the {precision.metric} interval at ±{half:.1f}%")
                    break
                _say(f"  {config.name} {load:g}: {precision.metric} ±{half:.1f}% > "
                     f"{precision.half_width_pct:g}%: another {precision.min_s:g} s")
            number = self.state.next_step_number(config.name)
            row = self._run_step(config, number, load, phase, run["base_url"], run["model"],
                                 run["target_kind"], run["launch_args"], repeat=repeat,
                                 part=len(parts) + 1)
            rows.append(row)
            parts = [s for s in self.state.steps_of(config.name)
                     if s.get("repeat", 1) == repeat and s["offered_load"] == load]
        return rows[-1]

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
                          f"{spec.load.unit}"))
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
                  launch_args: list[str], repeat: int = 1, part: int = 1) -> pd.Series:
        spec = self.spec
        run_rel = f"{config.name}/step-{number}"
        entry = {"config": config.name, "step": number, "offered_load": load,
                 "load_kind": spec.load.kind, "run_dir": run_rel, "status": "running",
                 "phase": phase, "stopped": None, "started_at": utc_now_iso(),
                 "repeat": repeat, "part": part, "duration_s": spec.step_duration_s}
        self.state.data["steps"].append(entry)
        self.state.save()
        _say(f"{config.name} step {number} ({phase}, repeat {repeat}"
             f"{f', part {part}' if part > 1 else ''}): {load:g} {spec.load.unit}, "
             f"{spec.step_duration_s:g} s ...")
        if spec.reset_prefix_cache:
            reset_prefix_cache(base_url)
        run_config = self.step_config(config.name, number, load, base_url, model, repeat, part)
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
            step_duration_s=spec.step_duration_s, warmup_s=spec.warmup_s,
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
        self.state.save()
        self.write_rollup()
        row = rows[rows["bucket"] == sa.ALL_ROW].iloc[0]
        _say(format_step(row, spec))
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
        # study.json carries the headline with its intervals and what is behind each figure
        keep = ["config", "max_sustainable_load", "max_load_lo", "max_load_hi",
                "max_load_reached", "knee_load", "knee_lo", "knee_hi", "knee_reached", "metric",
                "repeats", "requests", "refined", "unsettled", "note"]
        headline = capacity[[c for c in keep if c in capacity]].replace([np.inf, -np.inf],
                                                                         np.nan)
        self.state.data["capacity"] = json.loads(headline.to_json(orient="records"))
        self.state.data["verdict"] = [str(t) for t in verdict.get("text", [])]
        self.state.save()

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


REFINE_PHASES = ("max_load", "knee")  # the search's two figures, which take turns


def _rounded(kind: str, value: float) -> float:
    """A load as the search measures it: whole users, or req/s to a thousandth."""
    return float(max(1, round(value))) if kind == "concurrency" else round(value, 3)


def next_refinement(points: pd.DataFrame, capacity: pd.Series, share: float, kind: str,
                    first: str = REFINE_PHASES[0]) -> tuple[float | None, str]:
    """The next load the search measures, and why (None: every interval is within ``share``
    of its value, or no new load would narrow it).

    Two figures are refined: the SLO boundary (:func:`_max_load_refinement`: bisect between the
    highest load that held and the lowest above it that did not) and the knee
    (:func:`_knee_refinement`: halve the wider gap beside it). ``first`` says whose turn it is;
    the runner alternates it, so a budget too small for both still narrows both (a search that
    always served the max load first spent every load of a 3-load budget on it and never
    placed one beside the knee). The other figure is refined when the first one needs no
    more loads.
    """
    if first not in REFINE_PHASES:
        raise ValueError(f"first must be one of {REFINE_PHASES}, not {first!r}")
    loads = sorted(float(v) for v in points["offered_load"])
    phases = {"max_load": _max_load_refinement, "knee": _knee_refinement}
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
                         loads: list[float], kind: str) -> tuple[float | None, str]:
    """The SLO boundary's next load: while the max sustainable load's interval is wider than
    ``share``, bisect between the highest load that held and the lowest above it that did not
    (rate steps: first a load just under the throughput ceiling, ``share`` below it or at its
    interval's lower end, where that lies inside)."""
    measured = set(loads)
    best = float(capacity["max_sustainable_load"])
    lo, hi = float(capacity.get("max_load_lo", math.nan)), float(
        capacity.get("max_load_hi", math.nan))
    if best != best:
        return None, ""
    failing = [load for load, ok in zip(points["offered_load"], points["sustainable"],
                                        strict=True) if load > best and not ok]
    half = (hi - lo) / 2 / best if lo == lo and hi == hi else math.inf
    # the server's own ceiling, where a load saturated it, is a sharper estimate of the
    # limit than the middle of the bracket: a load just under it (by the share asked for,
    # or at its interval's lower end when that is closer) is measured first
    ceiling = max(float(capacity.get("throughput_ceiling", math.nan)) * (1 - share),
                  float(capacity.get("throughput_ceiling_lo", math.nan)))
    if not failing:
        return None, "no load failed the SLO: nothing to bisect"
    if half <= share:
        return None, f"max sustainable load ±{half:.1%} <= {share:.1%}"
    top = min(failing)
    if kind == "rate" and best * (1 + share) < ceiling < top * (1 - share) and (
            _rounded(kind, ceiling) not in measured):
        return _rounded(kind, ceiling), (
            f"max sustainable load {best:g} [{lo:g}, {hi:g}] is ±{half:.1%} > "
            f"{share:.1%}: just under the throughput ceiling, {ceiling:g} req/s, in "
            f"{best:g}..{top:g}")
    candidate = _rounded(kind, (best + top) / 2)
    if candidate not in measured:
        return candidate, (f"max sustainable load {best:g} [{lo:g}, {hi:g}] is ±"
                           f"{half:.1%} > {share:.1%}: bisect {best:g}..{top:g}")
    return None, f"the max-load bracket {best:g}..{top:g} is as fine as loads go"


def _knee_refinement(points: pd.DataFrame, capacity: pd.Series, share: float,
                     loads: list[float], kind: str) -> tuple[float | None, str]:
    """The knee's next load: while its interval is wider than ``share``, halve the wider gap
    beside the measured load the latency curve bends at. A saturated rate configuration's knee
    is its throughput ceiling (dashboards.analysis.study, "Knee"), which loads beside it do not
    narrow: there the bend beside it is refined."""
    name = "bend" if capacity.get("knee_kind") == "saturation" else "knee"
    knee = float(capacity.get(f"{name}_load", math.nan))
    k_lo, k_hi = float(capacity.get(f"{name}_lo", math.nan)), float(capacity.get(f"{name}_hi",
                                                                                  math.nan))
    if knee != knee or not loads:
        return None, ""
    half = (k_hi - k_lo) / 2 / knee if k_lo == k_lo and k_hi == k_hi else math.inf
    if half <= share:
        return None, f"{name} ±{half:.1%} <= {share:.1%}"
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
    offered = (f" of {row['offered_req_per_s']:.2f} offered ({row['achieved_ratio']:.0%})"
               if spec.load.kind == "rate" else "")
    return (f"  {row['config']} step {int(row['step'])}: {row['offered_load']:g} "
            f"{spec.load.unit}: achieved {row['achieved_req_per_s']:.2f} req/s{offered}, "
            f"{row['output_tok_per_s']:.0f} tok/s, goodput {row['goodput_req_per_s']:.2f} req/s; "
            f"{pct.upper()} TTFT {ms['ttft']:.0f} ms, TPOT {ms['tpot']:.1f} ms, "
            f"E2E {ms['e2e']:.0f} ms; errors {row['error_rate']:.1%}; "
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


def fit_to_budget(args: RunConfig, spec: StudySpec) -> tuple[StudySpec, float, str]:
    """``--budget`` (or, resuming, the one the study started with): (the fitted study, the
    budget in seconds or 0, the line that says what it lowered); ValueError when it cannot
    fit."""
    budget = args.study_budget or (stored_budget(Path(args.study_resume))
                                   if args.study_resume else 0.0)
    if not budget:
        return spec, 0.0, ""
    fitted, line = fit_for_run(spec, budget)
    return fitted, budget, line


def print_precision(spec: StudySpec, study_dir: Path) -> None:
    """The half-widths the study reached (:func:`infra.study.plan.precision_lines`)."""
    rollup = study_dir / run_folder.ROLLUP_DIR
    capacity, points = rollup / run_folder.CAPACITY_FILE, rollup / run_folder.POINTS_FILE
    if capacity.is_file() and points.is_file():
        print("\nprecision reached (half-widths of the 95% intervals):")
        for line in precision_lines(spec, pd.read_parquet(capacity), pd.read_parquet(points)):
            print(f"  {line}")


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
    args = parse_or_exit(build_parser(), argv)
    try:
        spec, budget, budget_line = _fit_budget(args, _load_spec(args))
        _check_endpoints(spec)
        study_dir, state = _open_study(args, spec)
    except _Refused as exc:
        print(f"swarmload study run: {exc}", file=sys.stderr)
        return exc.code
    if budget:  # kept, so --resume fits the study the same
        state.data["budget_s"] = budget
        _say(budget_line)
    code = _run_steps(args, spec, study_dir, state)
    _print_outcome(spec, study_dir, precision=bool(budget) or spec.precision is not None)
    return code


def _load_spec(args: RunConfig) -> StudySpec:
    try:
        spec = load_study(args.study_file)
        return replace(spec, labels={**spec.labels, **parse_labels(args.labels)})
    except (StudySpecError, ValueError) as exc:
        raise _Refused(str(exc), EXIT_BAD_INPUT) from None


def _fit_budget(args: RunConfig, spec: StudySpec) -> tuple[StudySpec, float, str]:
    try:
        return fit_to_budget(args, spec)
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


def _open_study(args: RunConfig, spec: StudySpec) -> tuple[Path, StudyState]:
    """The folder and state of ``--resume``, or a new folder with the study file's copy."""
    if args.study_resume:
        study_dir = Path(args.study_resume).resolve()
        try:
            state = StudyState.load(study_dir, spec)
        except StudyError as exc:
            raise _Refused(str(exc), EXIT_BAD_INPUT) from None
        _say(f"resuming {study_dir}")
        return study_dir, state
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    study_dir = (Path(args.results) / f"{spec.name}-{stamp}").resolve()
    if study_dir.exists():
        raise _Refused(f"{study_dir} exists; wait a second", EXIT_BAD_INPUT)
    study_dir.mkdir(parents=True)
    if spec.run.headers:  # header values may be credentials: keep their names only
        (study_dir / STUDY_COPY).write_text(yaml.safe_dump(spec.raw, sort_keys=False))
    else:
        shutil.copyfile(args.study_file, study_dir / STUDY_COPY)
    plan = (f"auto {asdict(spec.load.auto)}" if spec.load.auto else "; ".join(
        f"{c.name} {', '.join(f'{s:g}' for s in spec.steps_for(c))}"
        for c in spec.configurations))
    _say(f"study {spec.name}: {len(spec.configurations)} configuration(s), "
         f"{spec.load.kind} steps ({spec.load.unit}): {plan}, {spec.step_duration_s:g} s "
         f"each; folder {study_dir}")
    return study_dir, StudyState(study_dir, spec)


def _run_steps(args: RunConfig, spec: StudySpec, study_dir: Path,
               state: StudyState) -> int:
    """Every step (SIGTERM stops it as Ctrl-C does), the state's status and end, the roll-up;
    returns the exit code."""
    # each step's master serves its live figures, in turn, when asked for
    live = ({"prometheus_port": args.prometheus_port, "prometheus_bind": args.prometheus_bind}
            if args.prometheus_port else {})
    state.save()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    runner = StudyRunner(spec, study_dir, state, progress=args.progress, live=live)
    code = 0
    try:
        runner.run()
        state.data["status"] = "finished"
    except (KeyboardInterrupt, StudyInterrupted):
        state.data["status"], code = "interrupted", EXIT_INTERRUPTED
        _say(f"interrupted; resume with: swarmload study run {args.study_file} --resume "
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


def _print_outcome(spec: StudySpec, study_dir: Path, precision: bool = False) -> None:
    """The capacity table (with ``precision``, the half-widths it reached), the verdict,
    bursts' recovery and fault drills, as far as the roll-ups hold them, then the folder."""
    capacity_path = study_dir / run_folder.ROLLUP_DIR / run_folder.CAPACITY_FILE
    if capacity_path.is_file():
        print(sa.format_capacity(pd.read_parquet(capacity_path), spec.load.unit))
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
