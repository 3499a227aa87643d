"""The study file: configurations x load steps, parsed into small typed objects.

A study file is YAML::

    name: max-num-seqs
    configurations:                  # each started once, swept through every step
      - {name: seqs-2, target: vllm-cpu, args: [--max-num-seqs=2]}
      - {name: seqs-8, target: vllm-cpu, args: [--max-num-seqs=8], steps: [2, 8, 16, 32]}
      # steps: (optional) this configuration's own load steps, in place of load.steps, for a
      # configuration expected to carry a different range (e.g. TP2 next to TP1)
      # target: sim (built-in simulator, args are `swarmload sim` flags), vllm-cpu (args go to
      # the vLLM server), vllm (real vLLM on this machine's GPU; args go to `vllm serve`), or a
      # base URL http://127.0.0.1:8000 of a server already running (no args)
      - {name: api-4, target: vllm, model: /models/qwen2-1.5b, python: python3,
         env: {VLLM_USE_FLASHINFER_SAMPLER: "0"}, args: [--api-server-count=4]}
      # model (required), python and env: target vllm only (infra/targets/vllm_gpu.py)
      - {name: two-replicas, target: sim, replicas: 2, balance: haproxy-leastconn,
         fault_plan: faults.yaml, fault_loads: [12]}
      # replicas: N servers of target (sim, vllm-cpu, vllm: one GPU each, or --tensor-parallel-
      #   size K of them) behind balance (default haproxy-leastconn, with health checks);
      #   fault_plan: a fault plan (docs/guides/fault-drills.md; relative to the study file)
      #   acted out in every step, or only in the steps of fault_loads
    workload:                        # built-in prompt mix (these keys) ...
      mix: 45/40/15                  # short/medium/long shares
      thresholds: 64,512
      max_tokens: 64                 # output tokens of every request (ignore_eos: true)
      ignore_eos: true
      endpoint: completions          # or chat
      seed: 0
      # ... or a workload folder built by `swarmload workload build`: {folder: wl/}
    load:
      kind: concurrency              # concurrency (closed-loop users) | rate (open-loop req/s)
      steps: [1, 2, 4, 8, 16]        # or auto: {start: 1, factor: 2, max_steps: 6}
      arrival: poisson               # rate only: poisson | gamma (with cv: 2.0) | bursts
      # burst: {peak_rps: 30, spike_s: 5, count: 1, first_spike_s: 10}  # bursts only: the
      #   bursts plan's keys (workloads/arrivals.py) but base_rps, which is the step's load
    step_duration_s: 30
    warmup_s: 5                      # measured window = [first send + warmup_s,
    cooldown_s: 3                    #                    first send + step_duration_s - cooldown_s]
    drain_s: 30                      # rate only: longest wait for requests still in flight
    workers: 2
    gpu_interval_s: 1.0              # GPU (NVML) sample interval of every step; 0.1 = 10 Hz
    server_traces: false             # true: vLLM's span per request, TTFT split per step
                                     #   (docs: the telemetry guide; vllm/vllm-cpu or a URL)
    slo: {ttft_ms: 500, tpot_ms: 50, error_rate: 0.01, percentile: p95}
    stop_when: {error_rate: 0.5, latency_growth: 10}
    knee_metric: ttft                # ttft | itl | tpot | e2e
    knee_percentile: p95             # default: slo.percentile
    # decision-grade studies (docs/guides/decision-grade-studies.md):
    repeats: 3                       # every (configuration, step) measured 3 times ...
    repeat_order: alternate          # ... up, then down, ... (or shuffle, with seed; or up)
    seed: 0                          # the study's seed: shuffled orders and the bootstrap
    restart_between_repeats: false   # true: restart the server before each repeat
    steady_state: mser5              # window starts where the step's series settled (MSER-5);
                                     #   fixed: warmup_s alone (warmup_s stays the minimum)
    precision: {metric: ttft_p95, half_width_pct: 5, min_s: 20, max_s: 120}
                                     # a step runs min_s, then again until the 95% interval
                                     #   of its metric is within 5% or max_s is spent
    refine: {share: 0.05, max_steps: 6}
                                     # after the steps: bisect the SLO boundary and refine the
                                     #   knee until each interval is within 5%, 6 steps at most
    reset_prefix_cache: false        # vllm/vllm-cpu: POST /reset_prefix_cache before each step
    expected_cache_hit_rate: 0.1     # a step whose prefix-cache hit rate is above is flagged
    endpoint:                        # (optional) an https target, a key, headers
      api_key_env: MY_KEY            # the variable's NAME (default: OPENAI_API_KEY when set);
      ca_bundle: corp-ca.pem         #   a study file never holds the key itself
      insecure: false
      headers: ["X-Tenant: team-a"]  # study.json keeps the names only
      stream: true                   # false: E2E and usage only

``load.auto`` finds capacity first: steps ``start, start*factor, ...`` (at most ``max_steps``)
until one saturates, then adds steps at ``around`` (fractions, default 0.5 0.75 0.9 1.0 1.1 1.25)
of the estimated capacity. SLO keys may also name their percentile, ``ttft_p95_ms: 500``, as long
as every such key agrees with ``percentile``.

Errors: :class:`StudySpecError` (a ``ValueError``), whose message names the bad key by its path
(``load.steps[2]``) and says what would be valid.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from collectors.headers import redact_header
from infra.faults import FaultPlanError, load_fault_plan
from infra.study import example_names, study_file
from locustfiles.config import (
    BALANCE_CHOICES,
    TARGET_KINDS,
    ConfigError,
    RunConfig,
    study_fields,
)
from workloads.arrivals import plan_from_dict
from workloads.errors import PlanError
from workloads.yaml_lines import key_lines, locate, yaml_error_line

LOAD_KINDS = ("concurrency", "rate")
ARRIVALS = ("poisson", "gamma", "bursts")
SLO_METRICS = ("ttft", "itl", "tpot", "e2e")
REPEAT_ORDERS = ("alternate", "shuffle", "up")
STEADY_STATE = ("mser5", "fixed")
PRECISION_METRICS = tuple(f"{m}_{p}" for m in ("ttft", "tpot", "e2e") for p in
                          ("p50", "p90", "p95", "p99")) + ("achieved",)
PERCENTILE_TAGS = ("p50", "p90", "p95", "p99")
DEFAULT_AROUND = (0.5, 0.75, 0.9, 1.0, 1.1, 1.25)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SLO_KEY = re.compile(r"^(ttft|itl|tpot|e2e)(?:_(p50|p90|p95|p99))?_ms$")


class StudySpecError(ValueError):
    """The study file is malformed; the message names the key and what would be valid."""


@dataclass(frozen=True)
class Configuration:
    name: str
    target: str  # sim | vllm-cpu | vllm | http(s)://...
    args: tuple[str, ...] = ()
    steps: tuple[float, ...] = ()  # overrides load.steps for this configuration
    model: str | None = None  # target vllm: the model folder
    python: str | None = None  # target vllm: the interpreter that imports vllm
    env: tuple[tuple[str, str], ...] = ()  # target vllm: environment of the server
    replicas: int = 1  # servers of target behind balance
    balance: str = "haproxy-leastconn"
    fault_plan: str | None = None  # absolute path of a fault plan file
    fault_loads: tuple[float, ...] = ()  # the steps the plan acts in (empty: every step)

    def faults_in(self, load: float) -> str | None:
        """The fault plan of this configuration's step at ``load`` (None: no faults then)."""
        if self.fault_plan and (not self.fault_loads or load in self.fault_loads):
            return self.fault_plan
        return None

    def target_options(self) -> dict[str, Any]:
        """What infra.orchestrate.start_target takes as ``options``."""
        return {"model": self.model, "python": self.python, "env": dict(self.env)}


_WORKLOAD_KEYS = {f.name: key for f, key in study_fields()}  # RunConfig field -> study key


@dataclass(frozen=True)
class WorkloadSpec:
    """The ``workload:`` section: built-in mix settings, or ``folder``, a workload built by
    ``swarmload workload build``. Its keys, defaults and checks are the :class:`RunConfig`
    fields marked ``study`` (locustfiles/config.py), held in ``run``; ``rows`` is the study's
    own: rows of the workload built from the mix for open-loop steps."""

    run: RunConfig = field(default_factory=RunConfig)
    rows: int = 2000

    def __getattr__(self, name: str) -> Any:
        """``spec.workload.mix`` etc.: the run configuration's value under its study key."""
        for field_name, key in _WORKLOAD_KEYS.items():
            if key == name:
                value = getattr(self.run, field_name)
                return None if key == "folder" and not value else value
        raise AttributeError(name)

    def to_dict(self) -> dict[str, Any]:
        """The section as written in study.json: every key with its value."""
        return {**{key: getattr(self, key) for key in _WORKLOAD_KEYS.values()},
                "rows": self.rows}


@dataclass(frozen=True)
class AutoSteps:
    start: float
    factor: float = 2.0
    max_steps: int = 6
    around: tuple[float, ...] = DEFAULT_AROUND


@dataclass(frozen=True)
class LoadSpec:
    kind: str  # concurrency | rate
    steps: tuple[float, ...] = ()
    auto: AutoSteps | None = None
    arrival: str = "poisson"
    cv: float = 1.0  # gamma arrivals only
    burst: dict[str, Any] | None = None  # bursts arrivals: the plan's keys but base_rps

    @property
    def unit(self) -> str:
        return "users" if self.kind == "concurrency" else "req/s"


@dataclass(frozen=True)
class Slo:
    """Thresholds in ms per latency metric (None: no SLO on it), checked at ``percentile``."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    error_rate: float = 0.01
    percentile: str = "p95"

    def thresholds_s(self) -> dict[str, float]:
        """metric tag -> threshold in seconds, for the metrics that have one."""
        return {m: getattr(self, f"{m}_ms") / 1e3 for m in SLO_METRICS
                if getattr(self, f"{m}_ms") is not None}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StopWhen:
    error_rate: float = 0.5
    latency_growth: float = 10.0


@dataclass(frozen=True)
class Precision:
    """A step runs ``min_s``, then again (pooled) until the 95% interval of ``metric`` is
    within ``half_width_pct`` percent of its value, or ``max_s`` of load is spent."""

    metric: str = "ttft_p95"
    half_width_pct: float = 5.0
    min_s: float = 20.0
    max_s: float = 120.0

    @property
    def column(self) -> str:
        return "achieved_req_per_s" if self.metric == "achieved" else f"{self.metric}_s"


@dataclass(frozen=True)
class Refine:
    """After the listed steps: bisection on the SLO boundary and steps around the knee until
    each interval's half-width is within ``share`` of its value, ``max_steps`` loads at most."""

    share: float = 0.05
    max_steps: int = 6


def _endpoint(value: Any, base: RunConfig) -> RunConfig:
    """``endpoint:``: the RunConfig fields of ``study_fields("endpoint")`` (TLS, where the key
    is, extra headers, streaming) on ``base``, checked as the flags are."""
    if value is None:
        return base
    if isinstance(value, dict) and "api_key" in value:
        raise StudySpecError("endpoint.api_key: a study file names the environment variable "
                             "that holds the key (api_key_env: NAME) or a file (api_key_file), "
                             "never the key itself")
    return _section(value, "endpoint", base)


def _section(value: Any, section: str, base: RunConfig) -> RunConfig:
    """A study section's RunConfig keys (``study_fields(section)``) on ``base``; an error
    names the key by its path."""
    keys = {f.name: key for f, key in study_fields(section)}
    where = "study file" if section == "study" else section
    value = _mapping(value, where, tuple(keys.values()))
    try:
        return RunConfig.from_mapping(value, base, section)
    except ConfigError as exc:
        path = keys[exc.field] if section == "study" else f"{section}.{keys[exc.field]}"
        raise StudySpecError(f"{path}: {exc.problem}") from None


def _public_raw(data: dict[str, Any]) -> dict[str, Any]:
    """The study file as study.json keeps it: header values left out (they may be secrets)."""
    raw = dict(data)
    endpoint = raw.get("endpoint")
    if isinstance(endpoint, dict) and endpoint.get("headers"):
        raw["endpoint"] = {**endpoint, "headers": [
            redact_header(h) for h in endpoint["headers"]]}
    return raw


@dataclass(frozen=True)
class StudySpec:
    name: str
    configurations: tuple[Configuration, ...]
    load: LoadSpec
    workload: WorkloadSpec = WorkloadSpec()
    # every step's run configuration but its load, target and folder: the workload and
    # endpoint sections and the top-level keys of study_fields("study") (workers,
    # step_duration_s, drain_s, gpu_interval_s, server_traces), with the study's defaults
    run: RunConfig = field(default_factory=lambda: RunConfig.for_scope("study"))
    warmup_s: float = 5.0
    cooldown_s: float = 3.0
    slo: Slo = Slo()
    stop_when: StopWhen = StopWhen()
    knee_metric: str = "ttft"
    knee_percentile: str | None = None  # None: the SLO's percentile
    repeats: int = 1
    repeat_order: str = "alternate"
    seed: int = 0
    restart_between_repeats: bool = False
    steady_state: str = "mser5"
    precision: Precision | None = None
    refine: Refine | None = None
    reset_prefix_cache: bool = False
    expected_cache_hit_rate: float = 0.1
    # stored in study.json and every step's manifest: what the Compare page filters on
    labels: dict[str, str] = field(default_factory=dict, compare=False)
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def step_duration_s(self) -> float:
        return self.run.duration

    @property
    def drain_s(self) -> float:
        return self.run.drain

    @property
    def workers(self) -> int:
        return self.run.workers

    @property
    def gpu_interval_s(self) -> float:
        return self.run.gpu_interval

    @property
    def server_traces(self) -> bool:
        return self.run.server_traces

    def steps_for(self, config: Configuration) -> tuple[float, ...]:
        """The configuration's fixed load steps, ascending (empty under load.auto)."""
        return tuple(sorted(config.steps or self.load.steps))

    def configuration(self, name: str) -> Configuration:
        for config in self.configurations:
            if config.name == name:
                return config
        raise StudySpecError(f"no configuration named {name!r}; have "
                             f"{[c.name for c in self.configurations]}")


# ------------------------------------------------------------------------------------- parsing


def _mapping(value: Any, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise StudySpecError(f"{where}: expected a mapping with keys {list(allowed)}, "
                             f"got {value!r}")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise StudySpecError(f"{where}: unknown key(s) {unknown}; valid keys: {list(allowed)}")
    return value


def _number(value: Any, where: str, *, positive: bool = True, minimum: float | None = None,
            maximum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise StudySpecError(f"{where}: expected a number, got {value!r}")
    if positive and value <= 0:
        raise StudySpecError(f"{where}: must be > 0, got {value!r}")
    if minimum is not None and value < minimum:
        raise StudySpecError(f"{where}: must be >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise StudySpecError(f"{where}: must be <= {maximum}, got {value!r}")
    return float(value)


def _integer(value: Any, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise StudySpecError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return value


def _choice(value: Any, where: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise StudySpecError(f"{where}: {value!r} is not one of {list(choices)}")
    return str(value)


def _configurations(value: Any, kind: str,
                    base: Path | None = None) -> tuple[Configuration, ...]:
    if not isinstance(value, list) or not value:
        raise StudySpecError("configurations: expected a non-empty list of "
                             "{name, target, args}")
    configs: list[Configuration] = []
    for i, item in enumerate(value):
        where = f"configurations[{i}]"
        item = _mapping(item, where, ("name", "target", "args", "steps", "model", "python",
                                      "env", "replicas", "balance", "fault_plan",
                                      "fault_loads"))
        name = item.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise StudySpecError(f"{where}.name: expected a folder-safe name (letters, digits, "
                                 f". _ -), got {name!r}")
        if name in {c.name for c in configs}:
            raise StudySpecError(f"{where}.name: {name!r} is used twice")
        target = item.get("target")
        if not isinstance(target, str) or not (
                target in TARGET_KINDS or target.startswith(("http://", "https://"))):
            raise StudySpecError(f"{where}.target: {target!r}; use one of {list(TARGET_KINDS)} "
                                 "or a base URL like http://127.0.0.1:8000")
        args = item.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
            raise StudySpecError(f"{where}.args: expected a list of launch arguments like "
                                 f"['--max-num-seqs=8'], got {args!r}")
        if args and target.startswith("http"):
            raise StudySpecError(f"{where}.args: a running endpoint ({target}) takes no launch "
                                 "arguments")
        steps: tuple[float, ...] = ()
        if "steps" in item:
            steps = _steps(item["steps"], f"{where}.steps", kind)
        vllm_keys = [k for k in ("model", "python", "env") if k in item]
        if target != "vllm" and vllm_keys:
            raise StudySpecError(f"{where}.{vllm_keys[0]}: only a configuration with target: "
                                 "vllm takes model, python and env")
        if target == "vllm" and not isinstance(item.get("model"), str):
            raise StudySpecError(f"{where}.model: target vllm needs the model folder to serve, "
                                 f"e.g. model: /models/qwen2-1.5b (got {item.get('model')!r})")
        python = item.get("python")
        if python is not None and not isinstance(python, str):
            raise StudySpecError(f"{where}.python: expected an interpreter path or command, "
                                 f"got {python!r}")
        env = item.get("env", {})
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in env.items()):
            raise StudySpecError(f"{where}.env: expected a mapping of variable -> value, "
                                 f"got {env!r}")
        replicas = _integer(item.get("replicas", 1), f"{where}.replicas")
        if replicas > 64:
            raise StudySpecError(f"{where}.replicas: at most 64, got {replicas}")
        if replicas > 1 and target not in TARGET_KINDS:
            raise StudySpecError(f"{where}.replicas: starts servers of target sim, vllm-cpu or "
                                 f"vllm, not {target!r}")
        balance = _choice(item.get("balance", "haproxy-leastconn"), f"{where}.balance",
                          BALANCE_CHOICES)
        fault_plan, fault_loads = _fault_plan(item, where, replicas, target, base, kind)
        configs.append(Configuration(name, target, tuple(str(a) for a in args), steps,
                                     item.get("model"), python,
                                     tuple((k, str(v)) for k, v in env.items()), replicas,
                                     balance, fault_plan, fault_loads))
    return tuple(configs)


def _fault_plan(item: dict[str, Any], where: str, replicas: int, target: str,
                base: Path | None, kind: str) -> tuple[str | None, tuple[float, ...]]:
    """A configuration's fault plan, read and checked now (its own file:line errors), and the
    loads of the steps it acts in."""
    loads = _steps(item["fault_loads"], f"{where}.fault_loads", kind) if (
        "fault_loads" in item) else ()
    plan = item.get("fault_plan")
    if plan is None:
        if loads:
            raise StudySpecError(f"{where}.fault_loads: needs fault_plan")
        return None, ()
    if not isinstance(plan, str) or not plan:
        raise StudySpecError(f"{where}.fault_plan: a fault plan file, got {plan!r}")
    if replicas < 2:
        raise StudySpecError(f"{where}.fault_plan: acts on replicas the study starts: give "
                             "replicas: 2 or more")
    path = Path(plan) if Path(plan).is_absolute() or base is None else base / plan
    try:
        load_fault_plan(path).check(replicas, target)
    except FaultPlanError as exc:
        raise StudySpecError(f"{where}.fault_plan: {exc}") from None
    return str(path.resolve()), loads


def _steps(value: Any, where: str, kind: str) -> tuple[float, ...]:
    if not isinstance(value, list) or not value:
        raise StudySpecError(f"{where}: expected a non-empty list, got {value!r}")
    if kind == "concurrency":
        steps = tuple(float(_integer(s, f"{where}[{i}]")) for i, s in enumerate(value))
    else:
        steps = tuple(_number(s, f"{where}[{i}]") for i, s in enumerate(value))
    if len(set(steps)) != len(steps):
        raise StudySpecError(f"{where}: a load appears twice in {list(value)}")
    return steps


def _workload(value: Any) -> WorkloadSpec:
    if value is None:
        return WorkloadSpec()
    value = _mapping(value, "workload", (*_WORKLOAD_KEYS.values(), "rows"))
    rows = _integer(value["rows"], "workload.rows") if "rows" in value else 2000
    try:
        run = RunConfig.from_mapping({k: v for k, v in value.items() if k != "rows"})
    except ConfigError as exc:
        raise StudySpecError(f"workload.{_WORKLOAD_KEYS[exc.field]}: {exc.problem}") from None
    return WorkloadSpec(run, rows)


def _check_step_config(spec: StudySpec) -> None:
    """Every step's run configuration is valid (fail now, not at step 5)."""
    loads = [*spec.load.steps, *(s for c in spec.configurations for s in c.steps)]
    if spec.load.auto is not None:
        loads.append(spec.load.auto.start)
    if spec.load.kind == "concurrency":
        for load in loads:
            try:
                replace(spec.run, users=int(load))
            except ConfigError as exc:
                raise StudySpecError(f"load.steps: {exc.problem}") from None


def _load(value: Any) -> LoadSpec:
    value = _mapping(value, "load", ("kind", "steps", "auto", "arrival", "cv", "burst"))
    kind = _choice(value.get("kind"), "load.kind", LOAD_KINDS)
    steps_raw, auto_raw = value.get("steps"), value.get("auto")
    if steps_raw is not None and auto_raw is not None:
        raise StudySpecError("load: give either steps: [..] or auto: {start, factor, max_steps}")
    steps: tuple[float, ...] = ()
    auto = None
    if steps_raw is not None:
        steps = _steps(steps_raw, "load.steps", kind)
    elif auto_raw is not None:
        auto_raw = _mapping(auto_raw, "load.auto", ("start", "factor", "max_steps", "around"))
        if "start" not in auto_raw:
            raise StudySpecError("load.auto.start: required (the first load to try)")
        start = (float(_integer(auto_raw["start"], "load.auto.start")) if kind == "concurrency"
                 else _number(auto_raw["start"], "load.auto.start"))
        factor = _number(auto_raw.get("factor", 2.0), "load.auto.factor")
        if factor <= 1:
            raise StudySpecError(f"load.auto.factor: must be > 1, got {factor}")
        around_raw = auto_raw.get("around", list(DEFAULT_AROUND))
        if not isinstance(around_raw, list) or not around_raw:
            raise StudySpecError("load.auto.around: expected a list of fractions like "
                                 "[0.5, 0.9, 1.0, 1.1]")
        around = tuple(_number(a, f"load.auto.around[{i}]") for i, a in enumerate(around_raw))
        auto = AutoSteps(start, factor, _integer(auto_raw.get("max_steps", 6),
                                                 "load.auto.max_steps"), around)
    arrival = _choice(value.get("arrival", "poisson"), "load.arrival", ARRIVALS)
    cv = _number(value.get("cv", 1.0), "load.cv")
    if kind == "concurrency" and ("arrival" in value or "cv" in value):
        raise StudySpecError("load.arrival: only rate studies have an arrival process")
    burst = _burst(value.get("burst"), arrival)
    return LoadSpec(kind, steps, auto, arrival, cv, burst)


def _burst(value: Any, arrival: str) -> dict[str, Any] | None:
    """``load.burst``: a bursts plan without base_rps (each step's load is its base rate)."""
    if value is None:
        if arrival == "bursts":
            raise StudySpecError("load.burst: required with arrival: bursts, e.g. {peak_rps: "
                                 "30, spike_s: 5, count: 1, first_spike_s: 10}")
        return None
    if arrival != "bursts":
        raise StudySpecError(f"load.burst: only with arrival: bursts (arrival is {arrival!r})")
    if not isinstance(value, dict):
        raise StudySpecError(f"load.burst: expected a mapping of bursts plan keys, got {value!r}")
    if "base_rps" in value or "kind" in value:
        raise StudySpecError("load.burst: leave out base_rps and kind: each step's load is the "
                             "base rate of a bursts plan")
    try:
        plan_from_dict({"kind": "bursts", "base_rps": 1.0, **value})
    except PlanError as exc:
        raise StudySpecError(f"load.burst: {exc}") from exc
    return dict(value)


def _slo(value: Any) -> Slo:
    if value is None:
        return Slo()
    if not isinstance(value, dict):
        raise StudySpecError(f"slo: expected a mapping like {{ttft_ms: 500, tpot_ms: 50}}, "
                             f"got {value!r}")
    percentile = _choice(value.get("percentile", "p95"), "slo.percentile", PERCENTILE_TAGS)
    data: dict[str, Any] = {"percentile": percentile}
    for key, raw in value.items():
        where = f"slo.{key}"
        if key == "percentile":
            continue
        if key == "error_rate":
            data["error_rate"] = _number(raw, where, positive=False, minimum=0, maximum=1)
            continue
        match = _SLO_KEY.match(str(key))
        if not match:
            raise StudySpecError(f"{where}: unknown key; valid: ttft_ms, itl_ms, tpot_ms, "
                                 "e2e_ms (or ttft_p95_ms ...), error_rate, percentile")
        metric, pct = match.groups()
        if pct is not None and pct != percentile:
            raise StudySpecError(f"{where}: names {pct} but slo.percentile is {percentile}; "
                                 "one percentile per study")
        if f"{metric}_ms" in data:
            raise StudySpecError(f"{where}: the {metric} SLO is given twice")
        data[f"{metric}_ms"] = _number(raw, where)
    return Slo(**data)


def _stop_when(value: Any) -> StopWhen:
    if value is None:
        return StopWhen()
    value = _mapping(value, "stop_when", ("error_rate", "latency_growth"))
    data = {}
    if "error_rate" in value:
        data["error_rate"] = _number(value["error_rate"], "stop_when.error_rate", positive=False,
                                     minimum=0, maximum=1)
    if "latency_growth" in value:
        data["latency_growth"] = _number(value["latency_growth"], "stop_when.latency_growth")
    return StopWhen(**data)


# the study's own keys; the top-level keys of RunConfig fields follow from study_fields("study")
_OWN_KEYS = ("name", "configurations", "workload", "load", "warmup_s", "cooldown_s", "slo",
             "stop_when", "knee_metric", "knee_percentile", "labels", "endpoint", "repeats",
             "repeat_order", "seed", "restart_between_repeats", "steady_state", "precision",
             "refine", "reset_prefix_cache", "expected_cache_hit_rate")
_TOP_KEYS = (*_OWN_KEYS, *(key for _, key in study_fields("study")))


def _precision(value: Any) -> Precision | None:
    if value is None:
        return None
    value = _mapping(value, "precision", tuple(Precision.__dataclass_fields__))
    metric = _choice(value.get("metric", "ttft_p95"), "precision.metric", PRECISION_METRICS)
    half = _number(value.get("half_width_pct", 5.0), "precision.half_width_pct", maximum=100)
    min_s = _number(value.get("min_s", 20.0), "precision.min_s")
    max_s = _number(value.get("max_s", max(120.0, min_s)), "precision.max_s")
    if max_s < min_s:
        raise StudySpecError(f"precision.max_s: must be >= precision.min_s ({min_s:g}), "
                             f"got {max_s:g}")
    return Precision(metric, half, min_s, max_s)


def _refine(value: Any) -> Refine | None:
    if value is None or value is False:
        return None
    if value is True:
        return Refine()
    value = _mapping(value, "refine", tuple(Refine.__dataclass_fields__))
    share = _number(value.get("share", 0.05), "refine.share", maximum=1)
    return Refine(share, _integer(value.get("max_steps", 6), "refine.max_steps", minimum=0))


def _labels(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and k.strip() and isinstance(v, str | int | float)
            for k, v in value.items()):
        raise StudySpecError(f"labels: expected a mapping of names to text, e.g. "
                             f"{{engine: vllm-0.26}}, got {value!r}")
    return {k.strip(): str(v) for k, v in value.items()}


def study_from_dict(data: Any, base: Path | None = None) -> StudySpec:
    """A validated :class:`StudySpec` from the parsed YAML; raises :class:`StudySpecError`.
    ``base``: the study file's folder (a configuration's fault_plan is relative to it)."""
    data = _mapping(data, "study file", _TOP_KEYS)
    for key in ("name", "configurations", "load"):
        if key not in data:
            raise StudySpecError(f"{key}: required key missing")
    name = data["name"]
    if not isinstance(name, str) or not _NAME.match(name):
        raise StudySpecError(f"name: expected a folder-safe name (letters, digits, . _ -), "
                             f"got {name!r}")
    load = _load(data["load"])
    workload = _workload(data.get("workload"))
    run = _endpoint(data.get("endpoint"), RunConfig.for_scope("study", workload.run))
    run = _section({k: v for k, v in data.items() if k not in _OWN_KEYS}, "study", run)
    configurations = _configurations(data["configurations"], load.kind, base)
    for i, config in enumerate(configurations):
        if not config.steps and not load.steps and load.auto is None:
            raise StudySpecError(f"configurations[{i}] ({config.name}) has no load steps: give "
                                 "load.steps, load.auto, or its own steps")
        if config.steps and load.auto is not None:
            raise StudySpecError(f"configurations[{i}].steps: load.auto places the steps; "
                                 "leave one of them out")
    spec = StudySpec(
        name=name,
        configurations=configurations,
        load=load,
        workload=workload,
        run=run,
        warmup_s=_number(data.get("warmup_s", 5.0), "warmup_s", positive=False, minimum=0),
        cooldown_s=_number(data.get("cooldown_s", 3.0), "cooldown_s", positive=False, minimum=0),
        slo=_slo(data.get("slo")),
        stop_when=_stop_when(data.get("stop_when")),
        knee_metric=_choice(data.get("knee_metric", "ttft"), "knee_metric", SLO_METRICS),
        knee_percentile=(_choice(data["knee_percentile"], "knee_percentile", PERCENTILE_TAGS)
                         if "knee_percentile" in data else None),
        labels=_labels(data.get("labels")),
        repeats=_integer(data.get("repeats", 1), "repeats"),
        repeat_order=_choice(data.get("repeat_order", "alternate"), "repeat_order",
                             REPEAT_ORDERS),
        seed=_integer(data.get("seed", 0), "seed", minimum=0),
        restart_between_repeats=_flag(data.get("restart_between_repeats", False),
                                      "restart_between_repeats"),
        steady_state=_choice(data.get("steady_state", "mser5"), "steady_state", STEADY_STATE),
        precision=_precision(data.get("precision")),
        refine=_refine(data.get("refine")),
        reset_prefix_cache=_flag(data.get("reset_prefix_cache", False), "reset_prefix_cache"),
        expected_cache_hit_rate=_number(data.get("expected_cache_hit_rate", 0.1),
                                        "expected_cache_hit_rate", positive=False, minimum=0,
                                        maximum=1),
        raw=_public_raw(data),
    )
    if spec.precision is not None:
        if "step_duration_s" in data:
            raise StudySpecError("step_duration_s: give either step_duration_s (a fixed length) "
                                 "or precision: {min_s, max_s} (a step runs until precise)")
        spec = replace(spec, run=replace(spec.run, duration=spec.precision.min_s))
    if spec.reset_prefix_cache:
        for i, config in enumerate(spec.configurations):
            if config.target not in ("vllm", "vllm-cpu"):
                raise StudySpecError(
                    f"reset_prefix_cache: configurations[{i}] ({config.name}) has target "
                    f"{config.target!r}; only a vLLM swarmload starts (vllm, vllm-cpu) can be "
                    "reset (it needs VLLM_SERVER_DEV_MODE=1)")
    if spec.warmup_s + spec.cooldown_s >= spec.step_duration_s:
        if spec.precision is not None:
            raise StudySpecError(f"precision.min_s: warmup_s ({spec.warmup_s}) + cooldown_s "
                                 f"({spec.cooldown_s}) leave nothing of {spec.step_duration_s}")
        raise StudySpecError(f"warmup_s ({spec.warmup_s}) + cooldown_s ({spec.cooldown_s}) leave "
                             f"nothing of step_duration_s ({spec.step_duration_s})")
    if spec.load.kind == "concurrency" and spec.workload.folder:
        raise StudySpecError("workload.folder: a workload folder is replayed open-loop; use "
                             "load.kind: rate, or the built-in mix keys for concurrency steps")
    if spec.server_traces and any(c.target == "sim" for c in spec.configurations):
        raise StudySpecError("server_traces: the simulator sends no spans; use target vllm, "
                             "vllm-cpu, or the URL of a vLLM started with "
                             "--otlp-traces-endpoint http://HOST:4318/v1/traces")
    _check_step_config(spec)
    return spec


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise StudySpecError(f"{key}: expected true or false, got {value!r}")
    return value


def load_study(path: str | Path) -> StudySpec:
    """Read and validate a study YAML file; errors read ``FILE:LINE: key: problem``."""
    try:
        text = study_file(path).read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except OSError as exc:
        raise StudySpecError(f"{path}: cannot read: {exc.strerror or exc} (or name a packaged "
                             f"example: {', '.join(example_names())})") from exc
    except yaml.YAMLError as exc:
        raise StudySpecError(yaml_error_line(path, exc)) from exc
    try:
        return study_from_dict(data, Path(path).parent)
    except StudySpecError as exc:
        line = locate(str(exc), key_lines(text))
        raise StudySpecError(f"{path}{f':{line}' if line else ''}: {exc}") from exc
