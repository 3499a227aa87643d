"""The study file: configurations x load steps, parsed into small typed objects.

A study file is YAML::

    name: max-num-seqs
    configurations:                  # each started once, swept through every step
      - {name: seqs-2, target: vllm-cpu, args: [--max-num-seqs=2]}
      - {name: seqs-8, target: vllm-cpu, args: [--max-num-seqs=8], steps: [2, 8, 16, 32]}
      # steps: (optional) this configuration's own load steps, in place of load.steps, for a
      # configuration expected to carry a different range (e.g. TP2 next to TP1)
      # target: sim (built-in simulator, args are `swarmload sim` flags), vllm-cpu (args go to
      # the vLLM server), vllm (real vLLM on this machine's GPU; args go to `vllm serve`),
      # llama-cpp (llama.cpp's llama-server), any kind of infra/targets/registry.py, or a base
      # URL http://127.0.0.1:8000 of a server already running (no args); configurations may
      # differ in target: two engines on the same model (examples/engines-cpu.yaml)
      - {name: api-4, target: vllm, model: /models/qwen2-1.5b, python: python3,
         env: {VLLM_USE_FLASHINFER_SAMPLER: "0"}, args: [--api-server-count=4]}
      # model (required for vllm), python and env: the kinds whose module takes them (vllm,
      # llama-cpp: the Engine's study_keys)
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
    precision: {metric: ttft_p95, half_width_pct: 5, min_s: 20, max_s: 120,
                min_e2e_multiple: 10}
                                     # a step runs min_s, then again until the 95% interval
                                     #   of its metric is within 5% or max_s is spent; once
                                     #   the server's E2E P95 and noise are measured, a step
                                     #   is as long as the 5% needs, and never shorter than
                                     #   min_e2e_multiple x E2E P95
    refine: {share: 0.05, max_steps: 6}
                                     # after the steps (the default, also without this key):
                                     #   measure where the fitted SLO curve crosses the SLO and
                                     #   where it bends until each interval is within 5%, 6
                                     #   loads at most; refine: off keeps a plain sweep
                                     #   (method: bisect, the bisection before it)
    reset_prefix_cache: false        # vllm/vllm-cpu: POST /reset_prefix_cache before each step
    expected_cache_hit_rate: 0.1     # a step whose prefix-cache hit rate is above is flagged
    gpu_hour_usd: 2.5                # (optional) price of a GPU-hour: cost per million output
                                     #   tokens in the verdict (or --gpu-hour-usd)
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

Adding a key
------------
Each key is declared once, on the dataclass of its section (:class:`StudySpec` for the top
level, :class:`LoadSpec`, :class:`Precision`, ...), with :func:`key`: its default, its check
(``ge``/``gt``/``le``, ``choices``, ``check=``) and its help, as ``RunConfig``'s options are
(``locustfiles/config.py: option``, the same :class:`OptionSpec`). The parser (:func:`_keys`),
the defaults of a study that leaves it out, and the study file reference
(``docs/reference/study-file.md``, from :func:`study_keys`) follow from it; a check that
involves two keys goes in the section's parser. A key that is a run option too (workers,
step_duration_s, a ``workload:`` or ``endpoint:`` key) is a ``RunConfig`` field with ``study=``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from collectors.headers import redact_header
from infra.faults import FaultPlanError, load_fault_plan
from infra.study import example_names, study_file
from infra.targets.engine import LaunchSpec
from infra.targets.haproxy import HealthCheck
from infra.targets.registry import ENGINES, KINDS, engine_of, kinds_text, kinds_that
from locustfiles.config import (
    BALANCE_CHOICES,
    ConfigError,
    OptionSpec,
    RunConfig,
    option,
    study_fields,
)
from workloads.arrivals import plan_from_dict
from workloads.errors import PlanError
from workloads.schema import arrival_unit
from workloads.yaml_lines import key_lines, locate, yaml_error_line

LOAD_KINDS = ("concurrency", "rate")
ENGINE_KEYS = ("model", "python", "env")  # a configuration's keys some target kinds take
ARRIVALS = ("poisson", "gamma", "bursts")
SLO_METRICS = ("ttft", "itl", "tpot", "e2e")
REPEAT_ORDERS = ("alternate", "shuffle", "up")
STEADY_STATE = ("mser5", "fixed")
PRECISION_METRICS = tuple(f"{m}_{p}" for m in ("ttft", "tpot", "e2e") for p in
                          ("p50", "p90", "p95", "p99")) + ("achieved",)
PERCENTILE_TAGS = ("p50", "p90", "p95", "p99")
REFINE_METHODS = ("curve", "bisect")
REFINE_OFF = ("off", "false", "no")  # refine: off (YAML reads off/no as false) keeps a sweep
# A step shorter than this many E2E P95 of the server does not measure its steady state: on a
# 7B shape on an H100 (128 output tokens, E2E P95 about 3 s), 15 s steps were about 5 E2E and two
# repeats of one load differed by 37% in throughput, while 60 s steps (about 20 E2E) agreed
# within 1%. 10 lets each user in a closed loop finish about ten requests in a step: the first
# E2E of a step is its ramp (every user starts at once), and the last one is cut unfinished.
MIN_E2E_MULTIPLE = 10.0
DEFAULT_AROUND = (0.5, 0.75, 0.9, 1.0, 1.1, 1.25)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SLO_KEY = re.compile(r"^(ttft|itl|tpot|e2e|task)(?:_(p50|p90|p95|p99))?_ms$")


class StudySpecError(ValueError):
    """The study file is malformed; the message names the key and what would be valid."""


# ------------------------------------------------------------------------------ key declarations

STRUCTURED = ("list", "mapping")  # kinds a section's own parser reads (steps, env, slo, ...)


def key(default: Any = MISSING, help: str = "", *, factory: Any = None, compare: bool = True,
        **declared: Any) -> Any:
    """A study file key: a field of the section's dataclass with its default, its check and its
    help, declared as :class:`RunConfig`'s options are (``locustfiles.config.option``, the same
    :class:`OptionSpec`: ``kind``, ``ge``/``gt``/``le``, ``choices``, ``check``, ``allowed``), so
    the parser (:func:`_keys`), the defaults and the study file reference
    (:func:`study_keys`) are derived from it. No default: a required key; ``factory``: a
    mutable default (a mapping); ``kind="list"`` or ``"mapping"``: a structured key, read by
    its section's own parser and only documented here."""
    first = None if default is MISSING or factory is not None else default
    spec = option(first, help, cli=False, required=default is MISSING and factory is None,
                  **declared).metadata
    if factory is not None:
        return field(default_factory=factory, compare=compare, metadata=spec)
    if default is MISSING:
        return field(metadata=spec)
    return field(default=default, compare=compare, metadata=spec)


def _declared(cls: type) -> Iterator[tuple[Field[Any], OptionSpec]]:
    """(field, declaration) of each key :func:`key` declared on ``cls``."""
    for f in fields(cls):
        spec = f.metadata.get("option")
        if spec is not None:
            yield f, spec


def default_of(cls: type, name: str) -> Any:
    """The declared default of the key ``name`` of ``cls``."""
    f = next(f for f, _ in _declared(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _checked(spec: OptionSpec, raw: Any, path: str) -> Any:
    """``raw`` (a YAML value) checked against its declaration; one line naming ``path``."""
    if raw is None and spec.optional and not spec.required:
        return None
    if spec.kind == "bool":
        if not isinstance(raw, bool):
            raise StudySpecError(f"{path}: expected true or false, got {raw!r}")
        return raw
    if spec.choices:
        if raw not in spec.choices:
            raise StudySpecError(f"{path}: {raw!r} is not one of {list(spec.choices)}")
    elif spec.kind == "str":
        if not isinstance(raw, str):
            raise StudySpecError(f"{path}: expected text, got {raw!r}")
    elif spec.kind == "int":
        low = spec.ge if spec.ge is not None else None if spec.gt is None else spec.gt + 1
        if isinstance(raw, bool) or not isinstance(raw, int) or (low is not None and raw < low):
            at_least = "" if low is None else f" >= {low:g}"
            raise StudySpecError(f"{path}: expected an integer{at_least}, got {raw!r}")
    elif isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise StudySpecError(f"{path}: expected a number, got {raw!r}")
    for op, bound, bad in ((">", spec.gt, lambda b: raw <= b), (">=", spec.ge, lambda b: raw < b),
                           ("<=", spec.le, lambda b: raw > b)):
        if bound is not None and bad(bound):
            raise StudySpecError(f"{path}: must be {op} {bound:g}, got {raw!r}")
    problem = spec.check(raw) if spec.check is not None else None
    if problem:
        raise StudySpecError(f"{path}: {problem}")
    return float(raw) if spec.kind == "float" else raw


def _keys(cls: type, value: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """The keys of ``cls`` that ``value`` gives, checked; a required one missing is an error.
    Structured keys are left to the section's parser; a key not given keeps its default."""
    found = {}
    for f, spec in _declared(cls):
        path = f"{where}.{f.name}" if where else f.name
        if f.name not in value:
            if spec.required:
                raise StudySpecError(f"{path}: required key missing ({spec.help})")
        elif spec.kind not in STRUCTURED:
            found[f.name] = _checked(spec, value[f.name], path)
    return found


def _name_problem(value: str) -> str | None:
    return None if _NAME.match(value) else (
        f"expected a folder-safe name (letters, digits, . _ -), got {value!r}")


def _taking(study_key: str) -> str:
    """The kinds that take ``study_key`` (model, python, env), in words."""
    return kinds_text([name for name, engine in ENGINES.items()
                       if study_key in engine.study_keys])


def _target_problem(value: str) -> str | None:
    if engine_of(value) is not None or value.startswith(("http://", "https://")):
        return None
    return f"{value!r}; use one of {list(KINDS)} or a base URL like http://127.0.0.1:8000"


@dataclass(frozen=True)
class Configuration:
    """One item of ``configurations:``: a server started once and swept through every step."""

    name: str = key(help="the configuration's name (its folder)", kind="str",
                    check=_name_problem)
    target: str = key(help="sim, vllm-cpu, vllm, ... (a target kind) or the base URL of a "
                      "running server", kind="str", check=_target_problem)
    args: tuple[str, ...] = key((), "the server's launch arguments (none for a URL)",
                                kind="list", allowed="a list of arguments")
    steps: tuple[float, ...] = key((), "this configuration's own load steps, in place of "
                                   "load.steps", kind="list", allowed="a list of loads")
    model: str | None = key(None, f"the model to serve (target {_taking('model')})",
                            kind="str")
    python: str | None = key(None, "the program that runs the engine (target "
                             f"{_taking('python')})", kind="str")
    env: tuple[tuple[str, str], ...] = key((), f"environment of the server (target "
                                           f"{_taking('env')})", kind="mapping",
                                           allowed="a mapping NAME: value")
    replicas: int = key(1, "servers of target behind balance", ge=1, le=64)
    balance: str = key("haproxy-leastconn", "how replicas share the load",
                       choices=BALANCE_CHOICES)
    fault_plan: str | None = key(None, "a fault plan file acted out in every step (relative "
                                 "to the study file; needs replicas >= 2)", kind="str")
    fault_loads: tuple[float, ...] = key((), "the steps the fault plan acts in (default: every "
                                         "step)", kind="list", allowed="a list of loads")

    def faults_in(self, load: float) -> str | None:
        """The fault plan of this configuration's step at ``load`` (None: no faults then)."""
        if self.fault_plan and (not self.fault_loads or load in self.fault_loads):
            return self.fault_plan
        return None

    def launch(self) -> LaunchSpec:
        """How this configuration's target is started (infra.targets.engine), its replicas
        behind its balance with HAProxy's default health checks."""
        run = RunConfig()
        return LaunchSpec(
            kind=self.target, args=self.args, model=self.model, python=self.python,
            env=self.env, replicas=self.replicas, balance=self.balance,
            health_check=HealthCheck(run.health_check_interval, run.health_check_fall,
                                     run.health_check_rise))

    def engine_keys(self) -> dict[str, Any]:
        """The keys of its target kind's own (model, python, env), for study.json."""
        engine = engine_of(self.target)
        values = {"model": self.model, "python": self.python, "env": dict(self.env)}
        return {key: values[key] for key in (engine.study_keys if engine else ())}


_WORKLOAD_KEYS = {f.name: key for f, key in study_fields()}  # RunConfig field -> study key


@dataclass(frozen=True)
class WorkloadSpec:
    """The ``workload:`` section: built-in mix settings, or ``folder``, a workload built by
    ``swarmload workload build``. Its keys, defaults and checks are the :class:`RunConfig`
    fields marked ``study`` (locustfiles/config.py), held in ``run``; ``rows`` is the study's
    own: rows of the workload built from the mix for open-loop steps."""

    run: RunConfig = field(default_factory=RunConfig)
    rows: int = key(2000, "rows of the workload built from the mix for open-loop steps", ge=1)

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
    """``load.auto``: probe until a step saturates, then sweep around the capacity found."""

    start: float = key(help="the first load to try", gt=0, kind="float")
    factor: float = key(2.0, "each probe's load is the last one's times this", gt=1)
    max_steps: int = key(6, "probes at most", ge=1)
    around: tuple[float, ...] = key(DEFAULT_AROUND, "the sweep's loads, as fractions of the "
                                    "capacity found", kind="list", allowed="a list of fractions")


@dataclass(frozen=True)
class LoadSpec:
    """``load:``: the load of each step."""

    kind: str = key(help="closed-loop users (concurrency) or open-loop requests per second "
                    "(rate)", kind="str", choices=LOAD_KINDS)
    steps: tuple[float, ...] = key((), "the loads (integers for concurrency), or auto",
                                   kind="list", allowed="a list of loads")
    auto: AutoSteps | None = key(None, "find the capacity first (load.auto's keys)",
                                 kind="mapping", allowed="a mapping (load.auto)")
    arrival: str = key("poisson", "rate only: the arrival process", choices=ARRIVALS)
    cv: float = key(1.0, "gamma arrivals only: the coefficient of variation", gt=0)
    burst: dict[str, Any] | None = key(
        None, "bursts arrivals: the bursts plan's keys (workloads/arrivals.py) but base_rps, "
        "which is the step's load", kind="mapping", allowed="a mapping")

    @property
    def unit(self) -> str:
        return "users" if self.kind == "concurrency" else "req/s"


@dataclass(frozen=True)
class Slo:
    """Thresholds in ms per latency metric (None: no SLO on it), checked at ``percentile``."""

    ttft_ms: float | None = key(None, "TTFT limit (ms; or ttft_p95_ms ...)", kind="float", gt=0)
    itl_ms: float | None = key(None, "ITL limit (ms)", kind="float", gt=0)
    tpot_ms: float | None = key(None, "TPOT limit (ms)", kind="float", gt=0)
    e2e_ms: float | None = key(None, "E2E latency limit (ms)", kind="float", gt=0)
    # agent workloads (docs/guides/agents.md): a task's time, its start to its last call's end
    task_ms: float | None = key(None, "task time limit (ms; agent workloads: the task's start "
                                "to its last call's last byte)", kind="float", gt=0)
    error_rate: float = key(0.01, "largest share of failed requests", ge=0, le=1)
    percentile: str = key("p95", "the percentile every limit is checked at",
                          choices=PERCENTILE_TAGS)

    def thresholds_s(self) -> dict[str, float]:
        """metric tag -> threshold in seconds, for the metrics that have one."""
        return {m: getattr(self, f"{m}_ms") / 1e3 for m in SLO_METRICS
                if getattr(self, f"{m}_ms") is not None}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StopWhen:
    """``stop_when:``: a configuration's sweep stops at a step past these."""

    error_rate: float = key(0.5, "a step's share of failed requests", ge=0, le=1)
    latency_growth: float = key(10.0, "a step's latency as a multiple of the lowest step's",
                                gt=0)


@dataclass(frozen=True)
class Precision:
    """A step runs ``min_s``, then again (pooled) until the 95% interval of ``metric`` is
    within ``half_width_pct`` percent of its value, or ``max_s`` of load is spent."""

    metric: str = key("ttft_p95", "the figure whose interval is narrowed",
                      choices=PRECISION_METRICS)
    half_width_pct: float = key(5.0, "the 95% interval's half-width to reach, in % of the value",
                                gt=0, le=100)
    min_s: float = key(20.0, "seconds a step runs at least", gt=0)
    max_s: float = key(120.0, "seconds of load a step spends at most (at least min_s)", gt=0)
    # no step is shorter than this many of the server's measured E2E P95 (MIN_E2E_MULTIPLE)
    min_e2e_multiple: float = key(MIN_E2E_MULTIPLE, "no step is shorter than this many of the "
                                  "server's measured E2E P95", ge=1)

    @property
    def column(self) -> str:
        return "achieved_req_per_s" if self.metric == "achieved" else f"{self.metric}_s"


@dataclass(frozen=True)
class Refine:
    """After the listed steps: loads where the fitted SLO curve crosses the SLO and where it
    bends (dashboards.analysis.study_search) until each interval's half-width is within
    ``share`` of its value, ``max_steps`` loads at most. On unless ``refine: off``."""

    share: float = key(0.05, "each interval's half-width to reach, as a share of its value",
                       gt=0, le=1)
    max_steps: int = key(6, "added loads at most", ge=0)
    # curve | bisect (the search before the curve's, for comparison)
    method: str = key("curve", "curve (the fitted SLO curve) or bisect (the search before it)",
                      choices=REFINE_METHODS)


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


def _labels_problem(value: Any) -> str | None:
    if isinstance(value, dict) and all(isinstance(k, str) and k.strip() and isinstance(
            v, str | int | float) for k, v in value.items()):
        return None
    return f"expected a mapping of names to text, e.g. {{engine: vllm-0.26}}, got {value!r}"


@dataclass(frozen=True)
class StudySpec:
    """A study file: its top-level keys. The sections' keys are their dataclasses' (the
    configurations, load, slo, ...); ``run`` holds the keys that are RunConfig options."""

    name: str = key(help="the study's name (its folder)", kind="str", check=_name_problem)
    configurations: tuple[Configuration, ...] = key(
        help="the configurations, each started once and swept through every step",
        kind="list", allowed="a list of configurations")
    load: LoadSpec = key(help="the load of each step", kind="mapping", allowed="a mapping")
    workload: WorkloadSpec = key(WorkloadSpec(), "the requests: the built-in mix's keys, or a "
                                 "workload folder", kind="mapping", allowed="a mapping")
    # every step's run configuration but its load, target and folder: the workload and
    # endpoint sections and the top-level keys of study_fields("study") (workers,
    # step_duration_s, drain_s, gpu_interval_s, server_traces), with the study's defaults
    run: RunConfig = field(default_factory=lambda: RunConfig.for_scope("study"))
    warmup_s: float = key(5.0, "seconds at a step's start left out of its measured window",
                          ge=0)
    cooldown_s: float = key(3.0, "seconds at a step's end left out of its measured window",
                            ge=0)
    slo: Slo = key(Slo(), "the service level each step is held to", kind="mapping",
                   allowed="a mapping")
    stop_when: StopWhen = key(StopWhen(), "when a configuration's sweep stops", kind="mapping",
                              allowed="a mapping")
    knee_metric: str = key("ttft", "the latency whose curve's bend is the knee",
                           choices=SLO_METRICS)
    knee_percentile: str | None = key(None, "the knee's percentile (default: slo.percentile)",
                                      kind="str", choices=PERCENTILE_TAGS)
    repeats: int = key(1, "times every (configuration, step) is measured", ge=1)
    repeat_order: str = key("alternate", "the order of the repeats: up then down, shuffled "
                            "(by seed), or always up", choices=REPEAT_ORDERS)
    seed: int = key(0, "the study's seed: shuffled orders and the bootstrap", ge=0)
    restart_between_repeats: bool = key(False, "restart the server before each repeat")
    steady_state: str = key("mser5", "where a step's window starts: where its series settled "
                            "(MSER-5), or after warmup_s alone (fixed)", choices=STEADY_STATE)
    precision: Precision | None = key(None, "a step runs until its figure is precise "
                                      "(precision's keys)", kind="mapping", allowed="a mapping")
    refine: Refine | None = key(None, "after the steps, measure where the fitted SLO curve "
                                "crosses and bends (on unless off; refine's keys)",
                                kind="mapping", allowed="off, on (the default), or a mapping")
    reset_prefix_cache: bool = key(False, f"{kinds_text(kinds_that('prefix_cache_reset'))}: "
                                   "empty the prefix cache before each step")
    expected_cache_hit_rate: float = key(0.1, "a step whose prefix-cache hit rate is above is "
                                         "flagged", ge=0, le=1)
    gpu_hour_usd: float | None = key(None, "price of a GPU-hour: the verdict's cost per million "
                                     "output tokens (or --gpu-hour-usd)", kind="float", gt=0)
    # stored in study.json and every step's manifest: what the Compare page filters on
    labels: dict[str, str] = key(help="names to text, kept in study.json and every step's "
                                 "manifest (the Compare page filters on them)", factory=dict,
                                 compare=False, kind="mapping", allowed="a mapping",
                                 check=_labels_problem)
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

    @property
    def load_unit(self) -> str:
        """What a step's load counts, as shown: users, req/s, or for a workload folder of
        sessions (agent tasks) under a rate plan sessions/s (tasks/s): its arrivals."""
        unit = arrival_unit(self.workload.folder) if (
            self.load.kind == "rate" and self.workload.folder) else ""
        return f"{unit}/s" if unit else self.load.unit

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


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise StudySpecError(f"{where}: expected a number, got {value!r}")
    if value <= 0:
        raise StudySpecError(f"{where}: must be > 0, got {value!r}")
    return float(value)


def _integer(value: Any, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise StudySpecError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return value


def _configurations(value: Any, kind: str,
                    base: Path | None = None) -> tuple[Configuration, ...]:
    if not isinstance(value, list) or not value:
        raise StudySpecError("configurations: expected a non-empty list of "
                             "{name, target, args}")
    configs: list[Configuration] = []
    for i, item in enumerate(value):
        where = f"configurations[{i}]"
        item = _mapping(item, where, tuple(f.name for f, _ in _declared(Configuration)))
        own = _keys(Configuration, item, where)
        name, target = own["name"], own["target"]
        if name in {c.name for c in configs}:
            raise StudySpecError(f"{where}.name: {name!r} is used twice")
        engine = engine_of(target)
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
        foreign = [k for k in ENGINE_KEYS
                   if k in item and k not in (engine.study_keys if engine else ())]
        if foreign:
            takers = [name for name, e in ENGINES.items() if foreign[0] in e.study_keys]
            raise StudySpecError(f"{where}.{foreign[0]}: only a configuration with target: "
                                 f"{kinds_text(takers)} takes {foreign[0]}")
        if engine is not None and engine.needs_model and not isinstance(item.get("model"), str):
            raise StudySpecError(f"{where}.model: target {target} needs the model folder to "
                                 "serve, e.g. model: /models/qwen2-1.5b (got "
                                 f"{item.get('model')!r})")
        env = item.get("env", {})
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in env.items()):
            raise StudySpecError(f"{where}.env: expected a mapping of variable -> value, "
                                 f"got {env!r}")
        replicas = own.get("replicas", default_of(Configuration, "replicas"))
        if replicas > 1 and (engine is None or not engine.replicas):
            raise StudySpecError(f"{where}.replicas: starts servers of target "
                                 f"{kinds_text(kinds_that('replicas'))}, not {target!r}")
        fault_plan, fault_loads = _fault_plan(item, where, replicas, target, base, kind)
        configs.append(Configuration(**{
            **own, "args": tuple(str(a) for a in args), "steps": steps,
            "env": tuple((k, str(v)) for k, v in env.items()), "fault_plan": fault_plan,
            "fault_loads": fault_loads}))
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
    own_keys = tuple(f.name for f, _ in _declared(WorkloadSpec))
    value = _mapping(value, "workload", (*_WORKLOAD_KEYS.values(), *own_keys))
    try:
        run = RunConfig.from_mapping({k: v for k, v in value.items() if k not in own_keys})
    except ConfigError as exc:
        raise StudySpecError(f"workload.{_WORKLOAD_KEYS[exc.field]}: {exc.problem}") from None
    return WorkloadSpec(run, **_keys(WorkloadSpec, value, "workload"))


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
    value = _mapping(value, "load", tuple(f.name for f, _ in _declared(LoadSpec)))
    own = _keys(LoadSpec, value, "load")
    kind = own["kind"]
    steps_raw, auto_raw = value.get("steps"), value.get("auto")
    if steps_raw is not None and auto_raw is not None:
        raise StudySpecError("load: give either steps: [..] or auto: {start, factor, max_steps}")
    steps: tuple[float, ...] = ()
    auto = None
    if steps_raw is not None:
        steps = _steps(steps_raw, "load.steps", kind)
    elif auto_raw is not None:
        auto_raw = _mapping(auto_raw, "load.auto", tuple(f.name for f, _ in _declared(AutoSteps)))
        auto_own = _keys(AutoSteps, auto_raw, "load.auto")
        if kind == "concurrency":
            _integer(auto_raw["start"], "load.auto.start")
        if "around" in auto_raw:
            around_raw = auto_raw["around"]
            if not isinstance(around_raw, list) or not around_raw:
                raise StudySpecError("load.auto.around: expected a list of fractions like "
                                     "[0.5, 0.9, 1.0, 1.1]")
            auto_own["around"] = tuple(_number(a, f"load.auto.around[{i}]")
                                       for i, a in enumerate(around_raw))
        auto = AutoSteps(**auto_own)
    if kind == "concurrency" and ("arrival" in value or "cv" in value):
        raise StudySpecError("load.arrival: only rate studies have an arrival process")
    load = LoadSpec(**own, steps=steps, auto=auto)
    return replace(load, burst=_burst(value.get("burst"), load.arrival))


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
    data = _keys(Slo, {k: v for k, v in value.items() if k in ("percentile", "error_rate")},
                 "slo")
    percentile = data.get("percentile", default_of(Slo, "percentile"))
    declared = dict((f.name, spec) for f, spec in _declared(Slo))
    for name, raw in value.items():
        where = f"slo.{name}"
        if name in ("percentile", "error_rate"):
            continue
        match = _SLO_KEY.match(str(name))
        if not match:
            raise StudySpecError(f"{where}: unknown key; valid: ttft_ms, itl_ms, tpot_ms, "
                                 "e2e_ms, task_ms (or ttft_p95_ms ...), error_rate, "
                                 "percentile")
        metric, pct = match.groups()
        if pct is not None and pct != percentile:
            raise StudySpecError(f"{where}: names {pct} but slo.percentile is {percentile}; "
                                 "one percentile per study")
        if f"{metric}_ms" in data:
            raise StudySpecError(f"{where}: the {metric} SLO is given twice")
        data[f"{metric}_ms"] = _checked(declared[f"{metric}_ms"], raw, where)
    return Slo(**data)


def _stop_when(value: Any) -> StopWhen:
    if value is None:
        return StopWhen()
    value = _mapping(value, "stop_when", tuple(StopWhen.__dataclass_fields__))
    return StopWhen(**_keys(StopWhen, value, "stop_when"))


# the study's own keys (StudySpec's); the top-level keys of RunConfig fields follow from
# study_fields("study")
_OWN_KEYS = (*(f.name for f, _ in _declared(StudySpec)), "endpoint")
_TOP_KEYS = (*_OWN_KEYS, *(key for _, key in study_fields("study")))

# the study file's sections ("": its top level) and the dataclass declaring each one's keys, in
# the reference's order; "endpoint" has RunConfig's keys only
SECTIONS: dict[str, type | None] = {
    "": StudySpec, "configurations[]": Configuration, "load": LoadSpec, "load.auto": AutoSteps,
    "workload": WorkloadSpec, "endpoint": None, "slo": Slo, "stop_when": StopWhen,
    "precision": Precision, "refine": Refine}
# the sections that hold RunConfig options too: section -> its name in study_fields
RUN_SECTIONS = {"": "study", "workload": "workload", "endpoint": "endpoint"}


@dataclass(frozen=True)
class StudyKey:
    """One key of a study file, as the reference shows it and a test checks its default."""

    section: str  # a key of SECTIONS
    name: str
    default: Any
    spec: OptionSpec
    run_option: bool  # a RunConfig option (its study default), not the study's own key


def study_keys() -> Iterator[StudyKey]:
    """Every key a study file may hold, section by section: the study's own (:func:`key`) and
    the RunConfig options of its top level, ``workload:`` and ``endpoint:`` with the study's
    defaults (``endpoint.stream`` is ``no_stream`` said the other way)."""
    study_run = RunConfig.for_scope("study")
    for section, cls in SECTIONS.items():
        if cls is not None:
            for f, spec in _declared(cls):
                yield StudyKey(section, f.name, default_of(cls, f.name), spec, False)
        if section in RUN_SECTIONS:
            values = study_run.study_section(RUN_SECTIONS[section])
            for f, name in study_fields(RUN_SECTIONS[section]):
                yield StudyKey(section, name, values[name], f.metadata["option"], True)


def _precision(value: Any) -> Precision | None:
    if value is None:
        return None
    value = _mapping(value, "precision", tuple(Precision.__dataclass_fields__))
    precision = Precision(**_keys(Precision, value, "precision"))
    if "max_s" not in value:  # the default, or min_s when that is longer
        return replace(precision, max_s=max(precision.max_s, precision.min_s))
    if precision.max_s < precision.min_s:
        raise StudySpecError(f"precision.max_s: must be >= precision.min_s "
                             f"({precision.min_s:g}), got {precision.max_s:g}")
    return precision


def _refine(value: Any, default: bool = True) -> Refine | None:
    """``refine:``: absent, the search with its defaults (``default`` false: none); false or
    off, a plain sweep; true, the defaults; a mapping, its keys."""
    if value is None:
        return Refine() if default else None
    if value is False or (isinstance(value, str) and value.strip().lower() in REFINE_OFF):
        return None
    if value is True:
        return Refine()
    if not isinstance(value, dict):
        raise StudySpecError(f"refine: expected off (a plain sweep), on, or a mapping with keys "
                             f"{list(Refine.__dataclass_fields__)}, got {value!r}")
    value = _mapping(value, "refine", tuple(Refine.__dataclass_fields__))
    return Refine(**_keys(Refine, value, "refine"))


def _labels(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    problem = _labels_problem(value)
    if problem:
        raise StudySpecError(f"labels: {problem}")
    return {k.strip(): str(v) for k, v in value.items()}


def study_from_dict(data: Any, base: Path | None = None) -> StudySpec:
    """A validated :class:`StudySpec` from the parsed YAML; raises :class:`StudySpecError`.
    ``base``: the study file's folder (a configuration's fault_plan is relative to it)."""
    data = _mapping(data, "study file", _TOP_KEYS)
    own = _keys(StudySpec, data)  # name, warmup_s, repeats, ...: the scalar keys given
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
        **own,
        configurations=configurations,
        load=load,
        workload=workload,
        run=run,
        slo=_slo(data.get("slo")),
        stop_when=_stop_when(data.get("stop_when")),
        labels=_labels(data.get("labels")),
        precision=_precision(data.get("precision")),
        # the search is on unless refine: off; bursts and fault drills measure recovery at the
        # loads listed, not a capacity, so they keep their steps unless refine: is given
        refine=_refine(data.get("refine"), default=load.arrival != "bursts" and not any(
            c.fault_plan for c in configurations)),
        raw=_public_raw(data),
    )
    if spec.precision is not None:
        if "step_duration_s" in data:
            raise StudySpecError("step_duration_s: give either step_duration_s (a fixed length) "
                                 "or precision: {min_s, max_s} (a step runs until precise)")
        spec = replace(spec, run=replace(spec.run, duration=spec.precision.min_s))
    if spec.reset_prefix_cache:
        for i, config in enumerate(spec.configurations):
            if config.target not in kinds_that("prefix_cache_reset"):
                raise StudySpecError(
                    f"reset_prefix_cache: configurations[{i}] ({config.name}) has target "
                    f"{config.target!r}; only a server swarmload starts can be reset "
                    f"({kinds_text(kinds_that('prefix_cache_reset'))}: vLLM needs "
                    "VLLM_SERVER_DEV_MODE=1, which it is given)")
    if spec.warmup_s + spec.cooldown_s >= spec.step_duration_s:
        if spec.precision is not None:
            raise StudySpecError(f"precision.min_s: warmup_s ({spec.warmup_s}) + cooldown_s "
                                 f"({spec.cooldown_s}) leave nothing of {spec.step_duration_s}")
        raise StudySpecError(f"warmup_s ({spec.warmup_s}) + cooldown_s ({spec.cooldown_s}) leave "
                             f"nothing of step_duration_s ({spec.step_duration_s})")
    if spec.load.kind == "concurrency" and spec.workload.folder:
        raise StudySpecError("workload.folder: a workload folder is replayed open-loop; use "
                             "load.kind: rate, or the built-in mix keys for concurrency steps")
    silent = [ENGINES[c.target] for c in spec.configurations
              if c.target in ENGINES and c.target not in kinds_that("spans")]
    if spec.server_traces and silent:
        raise StudySpecError(f"server_traces: the {silent[0].title} sends no spans; use "
                             f"target {kinds_text(kinds_that('spans'))}, or the URL of a vLLM "
                             "started with --otlp-traces-endpoint http://HOST:4318/v1/traces")
    _check_step_config(spec)
    return spec


def load_study(path: str | Path) -> StudySpec:
    """Read and validate a study YAML file; errors read ``FILE:LINE: key: problem``."""
    found = study_file(path)
    try:
        text = found.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except OSError as exc:
        raise StudySpecError(f"{path}: cannot read: {exc.strerror or exc} (or name a packaged "
                             f"example: {', '.join(example_names())})") from exc
    except yaml.YAMLError as exc:
        raise StudySpecError(yaml_error_line(path, exc)) from exc
    try:
        # a packaged example's relative paths (a fault plan) are beside it, not here
        return study_from_dict(data, found.parent)
    except StudySpecError as exc:
        line = locate(str(exc), key_lines(text))
        raise StudySpecError(f"{path}{f':{line}' if line else ''}: {exc}") from exc
