"""The run configuration: every option of a swarmload run, defined once, in :class:`RunConfig`.

Each field carries its default, what values it allows and its help text. Everything else is
derived from the fields, so an option is never written twice:

- the flags of ``swarmload run``, ``master``, ``soak`` and ``worker``: :func:`add_cli_arguments`
  (``command=``) and :meth:`RunConfig.from_cli` (``infra/orchestrate.py``, ``roles.py``,
  ``soak.py``); ``master`` and ``soak`` build their run with ``dataclasses.replace``;
- the ``--swarmload-*`` Locust options and their ``SWARMLOAD_*`` environment variables:
  :func:`add_locust_arguments`, :meth:`RunConfig.locust_argv` (what the orchestrator passes to the
  master and the workers) and :meth:`RunConfig.from_locust_options` (what they read back);
- the workers' settings: ``locustfiles/context.py`` reads a :class:`RunConfig`, no defaults of its
  own;
- a study file's ``workload:`` and ``endpoint:`` sections and its top-level ``workers``,
  ``step_duration_s``, ``drain_s``, ``gpu_interval_s``, ``server_traces``: :func:`study_fields`
  and :meth:`RunConfig.from_mapping` (``infra/study``); a study step is
  ``dataclasses.replace(config, users=..., ...)``, never argv.

Validation happens when a :class:`RunConfig` is built (any way: CLI, Locust options, study file,
``replace``): a bad value raises :class:`ConfigError` naming the field, and each front end names it
its own way (``--users``, ``--swarmload-users``, ``study.yaml:12: workload.max_tokens``), so bad
input fails before anything starts.

Adding an option
----------------
Add ONE field to :class:`RunConfig` with :func:`option`, e.g.::

    api_key: str = option("", "Bearer token sent in the Authorization header",
                          cli=True, locust=True)
    connect_timeout: float = option(10.0, "Seconds to wait for a connection", gt=0, le=600,
                                    locust=True)

- the default: its type is the field's kind (``int``, ``float``, ``str``, ``bool``; a tuple is a
  repeatable flag); ``kind="duration"`` takes ``45``, ``45s``, ``2m``, ``1h30m``; ``kind="switch"``
  is a flag without a value (``--quiet``); ``optional=True`` allows ``None`` (not set);
- constraints: ``ge=`` / ``gt=`` / ``le=`` for numbers, ``choices=`` for text; ``allowed=`` and
  ``check=`` (a function returning what is wrong, or None) for anything else; checks that
  involve two fields go in :meth:`RunConfig._check_together`;
- where it appears: ``cli=`` (a flag of ``swarmload run``, ``master`` and ``soak``, on by
  default; or the command(s) named, e.g. ``cli="soak"``), ``locust=`` (a ``--swarmload-*``
  option that the master and every worker receive), ``study=`` (a key of a study's
  ``workload:`` section; a string gives the key when it differs from the field name, and
  ``"endpoint.KEY"`` / ``"study.KEY"`` put it in ``endpoint:`` / the top level); the flag is
  the field name with ``-`` for ``_`` (``flag=`` overrides it); ``defaults=`` gives a command
  (or the study file, ``"study"``) a default of its own;
- its concern: the ``concern("...")`` line above it in :class:`RunConfig` (target, load,
  workload, replay, client, telemetry, output, soak, roles): the group of its flag in
  ``--help`` and in the CLI reference.

The defaults of the prompt mix (45/40/15, 64,512, 64 output tokens, 1500) live in ``workloads/``
(:mod:`workloads.buckets`, :mod:`workloads.builtin_mix`), the lowest package that uses them; this
module takes them from there. Standard library only (dataclasses + argparse): the workers import
it at start-up.
"""

from __future__ import annotations

import argparse
import math
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, NoReturn
from urllib.parse import urlsplit

from collectors.headers import HeaderError, parse_header
from workloads.buckets import (
    DEFAULT_MIX,
    DEFAULT_THRESHOLDS,
    BucketSpec,
    BucketSpecError,
    parse_shares,
    parse_thresholds,
)
from workloads.builtin_mix import DEFAULT_LONG_MAX_TOKENS, DEFAULT_MAX_TOKENS

# a target kind's name (the kinds themselves are infra's: infra/targets/registry.py, which checks
# the name; this layer only knows its shape)
TARGET_KIND = re.compile(r"^[a-z][a-z0-9.-]{0,39}$")
# the commands whose parsers are derived from RunConfig: `cli=True` is a flag of the first three
# (`swarmload master` and `swarmload soak` are runs too); `cli="soak"` etc. a flag of one
RUN_COMMANDS = ("run", "master", "soak")
COMMANDS = (*RUN_COMMANDS, "worker", "study-run")  # study-run: `swarmload study run`
RUNS_AND_STUDY = (*RUN_COMMANDS, "study-run")
# the study file's sections holding RunConfig fields: `study=True` or `study="key"` is a key of
# `workload:`, `study="endpoint.key"` of `endpoint:`, `study="study.key"` of the top level
STUDY_SECTIONS = ("workload", "endpoint", "study")
# several replicas: balanced in each worker (round-robin, least-busy) or by HAProxy in front
BALANCE_CHOICES = ("round-robin", "least-busy", "haproxy", "haproxy-leastconn")
ENDPOINTS = ("completions", "chat", "responses")
# each endpoint's path; responses: the Responses API's typed events (locustfiles/responses_stream)
ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions",
                  "responses": "/v1/responses"}
LOCUST_PREFIX = "swarmload-"
AUTO_WORKERS = 0  # --workers auto, until the front end sizes it (infra/workers_auto.py)
MASTER_PORT = 5557  # `swarmload master` listens here unless --port says otherwise
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


class ConfigError(ValueError):
    """A run option has a value that cannot work.

    ``field`` is the :class:`RunConfig` field; ``problem`` says what is wrong and what is allowed.
    Front ends name the field in their own words (:func:`cli_flag`, :func:`locust_flag`).
    """

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name
        self.problem = problem


# ----------------------------------------------------------------------------- option metadata


@dataclass(frozen=True)
class OptionSpec:
    """What :func:`option` records on a field: kind, constraints, help, and where it appears."""

    help: str
    kind: str  # int | float | str | bool | switch | duration | list
    group: str = ""  # the concern: target, load, workload, client, telemetry, output, soak, ...
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] = ()
    optional: bool = False
    cli: tuple[str, ...] = RUN_COMMANDS  # the commands whose parser has the flag
    locust: bool = False
    study: str | None = None  # "section.key" (sections: STUDY_SECTIONS)
    study_negated: bool = False  # the study key says the opposite (endpoint.stream: no_stream)
    defaults: tuple[tuple[str, Any], ...] = ()  # (command or "study", its own default)
    required: bool = False  # its commands' parsers require the flag
    positional: bool = False  # an operand of its commands (required), not a flag
    quote: bool = True  # an error may show the value given (False: its length only)
    flag: str | None = None
    locust_name: str | None = None
    secret: bool = False
    allowed_text: str | None = None
    auto: int | None = None  # an int option's value for the word "auto" (resolved later)
    former: tuple[str, ...] = ()  # the flag's earlier names (no "--"), still accepted
    check: Callable[[Any], str | None] | None = None
    metavar: str | None = None

    def default_for(self, scope: str, default: Any) -> Any:
        """The default of ``scope`` (a command, or "study"): its own, else the field's."""
        return dict(self.defaults).get(scope, default)

    def allowed(self) -> str:
        """What values are allowed, in words, e.g. 'an integer >= 1'."""
        if self.allowed_text:
            return self.allowed_text
        if self.choices:
            return "one of " + ", ".join(self.choices)
        noun = {"int": "an integer", "float": "a number", "duration": "seconds",
                "bool": "true or false", "switch": "a flag without value",
                "list": "a list of text", "str": "text"}[self.kind]
        if self.ge is not None and self.le is not None:
            noun += f" from {_num(self.ge)} to {_num(self.le)}"
        else:
            bounds = [f"{op} {_num(v)}" for op, v in ((">=", self.ge), (">", self.gt),
                                                      ("<=", self.le)) if v is not None]
            noun += (" " + " and ".join(bounds)) if bounds else ""
        if self.kind == "duration":
            noun += " (45, 45s, 2m, 1h30m)"
        if self.auto is not None:
            noun += ", or auto"
        return noun

    def parse(self, raw: Any, *, strict: bool = False) -> Any:
        """``raw`` (command-line text, or a typed value from YAML/Python) as this kind; raises
        ValueError with what is wrong. ``strict``: typed input only (YAML), no text numbers."""
        if raw is None:
            if self.optional:
                return None
            raise ValueError("a value is required")
        kind = self.kind
        if kind in ("bool", "switch"):
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and not strict and raw.strip().lower() in _TRUE + _FALSE:
                return raw.strip().lower() in _TRUE
            raise ValueError("expected true or false")
        if kind == "list":
            if isinstance(raw, str) or not isinstance(raw, (list, tuple)):
                raise ValueError("expected a list")
            return tuple(str(item) for item in raw)
        if kind == "str":
            if not isinstance(raw, str):
                raise ValueError("expected text")
            return raw
        if isinstance(raw, bool):
            raise ValueError("expected a number")
        if self.auto is not None and isinstance(raw, str) and raw.strip().lower() == "auto":
            return self.auto
        number = self._number(raw, kind, strict)
        if self.auto is not None and isinstance(raw, str) and number == self.auto:
            # the word's stand-in is no number a user may type (--workers 0 is no workers);
            # an int here is the stand-in itself, parsed again by RunConfig.__post_init__
            raise ValueError(f"{raw!r} is not allowed; the word auto is")
        return number

    @staticmethod
    def _number(raw: Any, kind: str, strict: bool) -> Any:
        if isinstance(raw, str):
            if strict and kind != "duration":
                raise ValueError("expected a number, not text")
            text = raw.strip()
            if kind == "int":
                return int(text)
            return parse_duration(text) if kind == "duration" else float(text)
        if kind == "int":
            if isinstance(raw, float) and raw.is_integer():
                return int(raw)
            if not isinstance(raw, int):
                raise ValueError("expected an integer")
            return raw
        if not isinstance(raw, (int, float)):
            raise ValueError("expected a number")
        return float(raw)

    def problem(self, value: Any) -> str | None:
        """What is wrong with an already parsed ``value`` (``""``: only that it is not
        allowed), or None when it is fine."""
        if value is None:
            return None if self.optional else "a value is required"
        if self.auto is not None and value == self.auto:
            return None
        if self.kind in ("int", "float", "duration"):
            if isinstance(value, float) and not math.isfinite(value):
                return "not a finite number"
            if (self.ge is not None and value < self.ge) or (
                    self.gt is not None and value <= self.gt) or (
                    self.le is not None and value > self.le):
                return ""
        if self.choices and value not in self.choices:
            return ""
        if self.check is not None:
            return self.check(value)
        return None

    def error(self, name: str, value: Any, reason: str = "") -> ConfigError:
        """One line: the value given, why it is wrong (if more than 'not allowed'), and what
        is allowed."""
        if self.kind == "list" and reason:  # the reason names the one bad item
            return ConfigError(name, f"{reason}; allowed: {self.allowed()}")
        why = f" ({reason})" if reason else ""
        given = repr(value) if self.quote else f"a value of {len(str(value))} characters"
        return ConfigError(name, f"got {given}{why}; allowed: {self.allowed()}")


_CONCERN = [""]


def concern(name: str) -> None:
    """In :class:`RunConfig`'s body: the fields that follow belong to concern ``name`` (a
    group of the parsers' help and of the CLI reference)."""
    _CONCERN[0] = name


def option(default: Any, help: str, *, kind: str | None = None, ge: float | None = None,
           gt: float | None = None, le: float | None = None, choices: tuple[str, ...] = (),
           optional: bool = False, cli: bool | str | tuple[str, ...] = True,
           locust: bool = False, study: bool | str = False, study_negated: bool = False,
           flag: str | None = None, allowed: str | None = None,
           check: Callable[[Any], str | None] | None = None, metavar: str | None = None,
           locust_name: str | None = None, secret: bool = False,
           defaults: Mapping[str, Any] | None = None, required: bool = False,
           positional: bool = False, quote: bool = True, auto: int | None = None,
           former: tuple[str, ...] = ()) -> Any:
    """A :class:`RunConfig` field: its default, constraints, help and where it appears.

    ``cli``: True (``swarmload run``, ``master`` and ``soak``), False (no flag), or the
    command(s) whose parser has it; ``defaults``: a command's own default, or the study file's
    (``{"soak": 3600.0}``, ``{"study": 30.0}``); ``auto``: an int option's value for the word
    ``auto``, which the front end resolves (``--workers auto``); ``former``: flag names it had
    before (without ``--``), still accepted."""
    if kind is None:
        kind = {bool: "bool", int: "int", float: "float", str: "str", tuple: "list"}[
            type(default)]
    commands = RUN_COMMANDS if cli is True else () if cli is False else (
        (cli,) if isinstance(cli, str) else tuple(cli))
    unknown = sorted(set(commands) - set(COMMANDS))
    if unknown:
        raise ValueError(f"option: unknown command(s) {unknown}; known: {COMMANDS}")
    study_key = None if study is False else ("" if study is True else study)  # "": field name
    spec = OptionSpec(help=help, kind=kind, group=_CONCERN[0], ge=ge, gt=gt, le=le,
                      choices=choices, optional=optional or default is None, cli=commands,
                      locust=locust, study=study_key, study_negated=study_negated, flag=flag,
                      allowed_text=allowed, check=check, metavar=metavar,
                      locust_name=locust_name, secret=secret,
                      defaults=tuple((defaults or {}).items()), required=required,
                      positional=positional, quote=quote, auto=auto, former=former)
    return field(default=default, metadata={"option": spec})


def new_run_id() -> str:
    """``run-<UTC time>-<4 hex>``: the run id when none is given (the orchestrator's, and a
    plain ``locust -f`` run's)."""
    return time.strftime("run-%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(2)


def parse_duration(text: str) -> float:
    """'45', '45s', '2m', '1h30m' -> seconds; raises ValueError."""
    text = str(text).strip().lower()
    if not text:
        raise ValueError("empty duration")
    try:
        return float(text)
    except ValueError:
        pass
    total, number = 0.0, ""
    units = {"h": 3600, "m": 60, "s": 1}
    for char in text:
        if char.isdigit() or char == ".":
            number += char
        elif char in units and number:
            total += float(number) * units[char]
            number = ""
        else:
            raise ValueError(f"bad duration {text!r}; use e.g. 45, 45s, 2m, 1h30m")
    if number:
        raise ValueError(f"bad duration {text!r}: trailing number without unit")
    return total


def _target_problem(value: str) -> str | None:
    if TARGET_KIND.match(value):
        return None  # a kind's name: infra says whether swarmload starts such a target
    for url in value.split(","):  # several replicas: base URLs, comma-separated
        parts = urlsplit(url.strip())
        if not (parts.scheme in ("http", "https") and parts.hostname):
            return ""
        try:
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            return "the port is not a number from 0 to 65535"
    return None


def _headers_problem(value: tuple[str, ...]) -> str | None:
    try:
        for line in value:  # a blank line too is not 'Name: value' here
            parse_header(line)
    except HeaderError as exc:
        return str(exc)
    return None


def _salt_problem(value: str) -> str | None:
    return "" if value and not value.isalnum() else None


def _labels_problem(value: tuple[str, ...]) -> str | None:
    for pair in value:
        key, sep, _ = pair.partition("=")
        if not sep or not key.strip():
            return f"got {pair!r}, not KEY=VALUE"
    return None


def _env_name_problem(value: str) -> str | None:
    return "" if value and not _ENV_NAME.match(value) else None


_SIZE_UNITS = {"t": 1024.0**2, "g": 1024.0, "m": 1.0}  # to MiB


def size_mb(text: str) -> float | None:
    """'24GB', '512MB', '1.5G', '800MiB' -> MiB; None when it is not a size."""
    raw = text.strip().lower().removesuffix("b").removesuffix("i")
    if not raw or raw[-1] not in _SIZE_UNITS:
        return None
    try:
        value = float(raw[:-1]) * _SIZE_UNITS[raw[-1]]
    except ValueError:
        return None
    return value if value > 0 and math.isfinite(value) else None


def _size_problem(value: str) -> str | None:
    return "" if value and size_mb(value) is None else None


def slo_pair(text: str) -> tuple[str, float] | None:
    """'ttft_p95_s=0.5' -> ('ttft_p95_s', 0.5); None when it is not SERIES=SECONDS."""
    name, sep, value = text.partition("=")
    try:
        seconds = float(value)
    except ValueError:
        return None
    name = name.strip()
    if not sep or not name.endswith("_s") or not seconds > 0 or not math.isfinite(seconds):
        return None
    return name, seconds


def _slo_problem(value: tuple[str, ...]) -> str | None:
    for item in value:
        if slo_pair(item) is None:
            return f"got {item!r}, not SERIES=SECONDS"
    return None


def _run_id_problem(value: str) -> str | None:
    if value and not _RUN_ID.match(value):
        return ""
    return None


# ----------------------------------------------------------------------------------- RunConfig


@dataclass(frozen=True)
class RunConfig:
    """Everything one swarmload run needs. Built validated; see the module docstring.

    Flat fields (``config.users``), grouped by concern (``concern(...)``: each field's
    ``group``) for the parsers' help and the CLI reference."""

    concern("target")
    target: str = option(
        "sim", "a target kind swarmload starts (`swarmload run --help` lists them: sim, the "
               "built-in simulator, is one), or a base URL",
        check=_target_problem, metavar="TARGET",
        allowed="a target kind, or base URLs like http://127.0.0.1:8000 (comma-separated "
                "for replicas)")
    replicas: int = option(1, "start this many replicas of a --target kind swarmload starts "
                           "(vllm: one GPU each, CUDA_VISIBLE_DEVICES), balanced by --balance",
                           ge=1, le=64)
    balance: str = option("round-robin", "several replicas: round-robin / least-busy in each "
                          "worker, or HAProxy in front (haproxy = its roundrobin, "
                          "haproxy-leastconn)", choices=BALANCE_CHOICES, locust=True)
    health_check_interval: float = option(
        1.0, "--balance haproxy*: seconds between HAProxy's health checks of each replica "
             "(option httpchk GET /health); 0: no checks", ge=0, le=3600)
    health_check_fall: int = option(1, "--balance haproxy*: failed checks in a row that take "
                                    "a replica out", ge=1, le=100)
    health_check_rise: int = option(2, "--balance haproxy*: passing checks in a row that put "
                                    "it back", ge=1, le=100)
    fault_plan: str = option("", "fault plan file (YAML): kill, stop/cont, restart or slow a "
                             "replica this run starts at given times (docs/guides/"
                             "fault-drills.md)", metavar="FILE")
    targets: str = option("", "several target base URLs, comma-separated (replicas): each "
                          "request goes to one of them, chosen by balance; default: Locust's "
                          "--host alone", cli=False, locust=True)
    replica_header: str = option("X-Served-By", "response header naming the replica that "
                                 "answered (a load balancer's server name); empty: none",
                                 cli=False, locust=True)
    target_model: str = option("", "the model the started target serves: a folder (--target "
                               "vllm), a GGUF file (--target llama-cpp)", metavar="PATH",
                               former=("vllm-model",))
    target_python: str = option("", "the started target's program: the interpreter that "
                                "imports vllm (--target vllm; default $SWARMLOAD_VLLM_PYTHON, "
                                ".venv-vllm, python3), the llama-server binary (--target "
                                "llama-cpp)", metavar="PATH", former=("vllm-python",))
    target_args: tuple[str, ...] = option(
        (), "extra argument for the started target (repeatable), e.g. "
            "--target-arg=--max-num-seqs=8", flag="target-arg", metavar="ARG")
    model: str = option("", "model name (default: first of /v1/models)", locust=True)
    endpoint: str = option("completions", "OpenAI endpoint to stream from", choices=ENDPOINTS,
                           locust=True, study=True)
    concern("load")
    workers: int = option(2, "Locust worker processes; auto: as many as the load's streamed "
                          "events need, no more than the cores (infra/workers_auto.py)", ge=1,
                          le=512, study="study.workers", auto=AUTO_WORKERS,
                          defaults={"study": AUTO_WORKERS})
    pin_workers: bool = option(
        False, "a CPU core of its own for each worker started here (the last ones), the rest "
        "(the master, the collectors, a target started here) on the others: no process of the "
        "run takes a worker's core, so sends leave on time; needs a core more than the "
        "workers", kind="switch", study="study.pin_workers")
    users: int = option(16, "concurrent streaming users (closed loop)", ge=1, le=100_000)
    spawn_rate: float | None = option(None, "users started per second (default: all at once)",
                                      kind="float", gt=0)
    duration: float = option(45.0, "how long the load runs, e.g. 45s, 2m", kind="duration",
                             gt=0, le=7 * 24 * 3600, study="study.step_duration_s",
                             defaults={"soak": 3600.0, "study": 30.0})
    concern("workload")  # what each request asks for: the built-in prompt mix
    max_tokens: int = option(DEFAULT_MAX_TOKENS, "max_tokens of every request", ge=1,
                             le=1_000_000, locust=True, study=True)
    ignore_eos: bool = option(True, "send ignore_eos so outputs are exactly max_tokens",
                              locust=True, study=True)
    mix: str = option(DEFAULT_MIX, "short/medium/long shares, e.g. 45/40/15 (percent) or "
                      "short=0.45,medium=0.4,long=0.15", locust=True, study=True,
                      allowed="three shares short/medium/long that sum to 100 (or 1)")
    thresholds: str = option(DEFAULT_THRESHOLDS, "bucket thresholds in prompt tokens: "
                             "SHORT_MAX,LONG_MIN", locust=True, study=True,
                             allowed="SHORT_MAX,LONG_MIN: two integers, 0 < SHORT_MAX <= LONG_MIN")
    long_max_tokens: int = option(DEFAULT_LONG_MAX_TOKENS,
                                  "longest prompt of the long bucket, in tokens", ge=2,
                                  le=10_000_000, locust=True, study=True)
    seed: int = option(0, "prompt seed", ge=0, locust=True, study=True)
    prompt_salt: str = option(
        "", "opens every prompt (default: a fresh one per run, so no run meets another's "
            "prompts in the server's prefix cache); pass a run's manifest prompt_salt to repeat "
            "its prompts exactly, 'none' for none", locust=True, metavar="SALT",
        check=_salt_problem, allowed="letters and digits, or 'none'")
    concern("replay")  # open-loop replay of a workload folder
    workload: str = option("", "workload folder (swarmload workload build): replay it open-loop",
                           locust=True, study="folder")
    plan: str = option("", "arrival plan file (default: the workload's arrivals.yaml)",
                       locust=True)
    closed_replay: bool = option(
        False, "closed-loop users (--users) send the workload's requests in turn, back to back: "
        "swarmload run sets it for a workload without an arrival plan", cli=False, locust=True)
    drain: float = option(60.0, "open-loop: longest wait for in-flight requests after the "
                          "schedule", kind="duration", ge=0, study="study.drain_s",
                          defaults={"study": 30.0})
    inflight_cap: int = option(2000, "open-loop: most requests in flight per worker; arrivals "
                               "over it are recorded as dropped", ge=1, le=1_000_000,
                               locust=True)
    pacer_awake_us: float = option(
        200.0, "open-loop: the worker's event loop stays awake (polling its sockets) this many "
        "microseconds before each send (while sends are planned four times that far apart) "
        "instead of sleeping to it: an idle CPU, a VM's above all, wakes 0.1-0.3 ms late now "
        "and then; 0: sleep to the send (less CPU)", ge=0,
        le=100_000, locust=True)
    schedule_duration: float = option(0.0, "seconds of schedule to replay (default: "
                                       "--run-time minus drain)", ge=0, cli=False, locust=True)
    concern("sessions")  # workloads built with --sessions or synthetic:... (guides/sessions.md)
    session_history: str = option(
        "real", "sessions: what a turn's history holds of earlier answers: the server's real "
        "answers, or the workload's logged ones (exactly repeatable prompts)",
        choices=("real", "logged"), locust=True, study=True)
    tool_choice: str = option(
        "required", "sessions: tool_choice of a turn that offers tools ('required' makes vLLM "
        "constrain the answer to a call)", choices=("required", "auto"), locust=True)
    tool_max_tokens: int = option(256, "sessions: max_tokens of a request that offers tools "
                                  "(the call; the final answer has the turn's own)", ge=1,
                                  le=1_000_000, locust=True)
    session_header: str = option(
        "X-Session-Id", "sessions: request header naming the session (a balancer in front, "
        "HAProxy here, keeps a session on one replica by it); empty: none", locust=True)
    no_stream: bool = option(False, "non-streaming requests: E2E and usage only (no TTFT, said "
                             "in the summary)", kind="switch", locust=True,
                             study="endpoint.stream", study_negated=True)
    concern("client")  # timeouts (each its own outcome class), TLS, credentials, headers
    connect_timeout: float = option(10.0, "seconds to wait for a TCP connect (outcome "
                                    "connect_error)", gt=0, le=3600, locust=True)
    first_token_timeout: float = option(
        120.0, "sent -> first token limit (outcome timeout_before_first_token; default 120 s: "
               "queueing and prefill of long prompts)", kind="duration", gt=0, le=86_400,
        locust=True)
    stall_timeout: float = option(30.0, "longest silence after the first token (outcome "
                                  "timeout_mid_stream)", kind="duration", gt=0, le=86_400,
                                  locust=True)
    ca_bundle: str = option("", "https targets: trust these CA certificates (PEM) instead of "
                            "the system store", metavar="PEM", locust=True,
                            study="endpoint.ca_bundle")
    insecure: bool = option(False, "https targets: do NOT verify the certificate (said in "
                            "summary and manifest)", kind="switch", locust=True,
                            study="endpoint.insecure")
    api_key_env: str = option("", "environment variable holding the API key, sent as "
                              "'Authorization: Bearer' (default: OPENAI_API_KEY when set); "
                              "never the key itself", metavar="NAME", locust=True,
                              study="endpoint.api_key_env", check=_env_name_problem,
                              allowed="an environment variable name like OPENAI_API_KEY",
                              quote=False)  # a key given by mistake is not shown
    api_key_file: str = option("", "file holding the API key (instead of an environment "
                               "variable)", metavar="FILE", locust=True,
                               study="endpoint.api_key_file")
    headers: tuple[str, ...] = option(
        (), "extra header on every request (repeatable); values stay out of the run folder",
        flag="header", metavar="'NAME: VALUE'", locust=True, locust_name="headers",
        secret=True, check=_headers_problem, study="endpoint.headers",
        allowed="'Name: value' with a header name without spaces")
    preflight_timeout: float = option(
        30.0, "seconds each preflight request may take: /v1/models and one streamed token "
              "before any load (0: no preflight)", ge=0, le=3600)
    concern("telemetry")
    gpu_interval: float = option(1.0, "GPU (NVML) sample interval, seconds; 0: off", ge=0,
                                 le=3600, study="study.gpu_interval_s")
    metrics_interval: float = option(
        0.5, "interval between scrapes of the server's /metrics, seconds; 0: off (each scrape "
             "costs a busy vLLM API server a few ms: docs/BENCHMARKS.md, the collectors' "
             "effect)", ge=0, le=3600)
    telemetry_tail: float = option(3.0, "keep sampling telemetry after the load stops until "
                                   "every sampler has a sample showing the server settled (no "
                                   "request running or waiting), at most this long",
                                   kind="duration", ge=0, le=3600)
    no_collectors: bool = option(False, "skip telemetry collectors", kind="switch")
    server_traces: bool = option(
        False, "receive vLLM's own per-request spans (OpenTelemetry, OTLP/HTTP) into the "
               "server_requests table and explain each request's TTFT (docs: the telemetry guide); "
               "a vLLM the run starts gets --otlp-traces-endpoint, a server given by URL must "
               "be started with it", kind="switch", study="study.server_traces")
    server_traces_port: int = option(
        0, "--server-traces: the port spans are received on; 0: a free port for a vLLM the run "
           "starts, 4318 (OTLP/HTTP's usual port) for a server given by URL", ge=0, le=65535)
    server_traces_host: str = option(
        "127.0.0.1", "--server-traces: the address to listen on (0.0.0.0 when the server runs "
                     "on another host)", metavar="HOST")
    server_traces_wait: float = option(
        6.0, "--server-traces: after the load, wait this long for the last spans (vLLM exports "
             "every OTEL_BSP_SCHEDULE_DELAY ms, 5000 by default; a vLLM the run starts gets "
             "500, and the run waits at most 1.5 s for it)", kind="duration", ge=0, le=600)
    prometheus_port: int = option(
        0, "serve the run's live figures for Prometheus at http://HOST:PORT/metrics from the "
           "master (docs/guides/prometheus.md); 0: off", ge=0, le=65535, locust=True,
        cli=RUNS_AND_STUDY)
    prometheus_bind: str = option(
        "127.0.0.1", "--prometheus-port: the address to listen on (0.0.0.0 for a Prometheus "
                     "on another host)", locust=True, metavar="HOST", cli=RUNS_AND_STUDY)
    remote_collector: tuple[str, ...] = option(
        (), "a `swarmload collect --serve` on another host (repeatable): its clock offset is "
            "measured and its files are copied into the run folder", flag="remote-collector",
        metavar="URL")
    concern("output")
    results: str = option("results", "results folder (study run: of new studies)",
                          cli=RUNS_AND_STUDY, defaults={"study-run": "results/studies"})
    run_id: str = option("", "run id and folder name (default: run-<UTC time>-<hex>)",
                         check=_run_id_problem, locust=True,
        allowed="a folder name of letters, digits, '.', '_', '-' (at most 128)")
    run_dir: str = option("", "run folder for Parquet records (default: results/<run id>)",
                          cli=False, locust=True)
    quiet: bool = option(False, "print only the summary", kind="switch")
    progress: str = option("auto", "live progress: auto = a panel on a terminal, plain lines "
                           "every 10 s otherwise (off with --quiet unless asked for)",
                           choices=("auto", "rich", "plain", "off"), cli=RUNS_AND_STUDY)
    progress_title: str = option("", "title of the live progress view (default: run <id>)",
                                 cli=False)
    labels: tuple[str, ...] = option(
        (), "a label stored in the manifest (repeatable), e.g. engine=vllm-0.26; the Compare "
            "page and `swarmload compare` filter and show them", flag="label",
        metavar="KEY=VALUE", check=_labels_problem, allowed="KEY=VALUE with a non-empty KEY",
        locust=True, cli=RUNS_AND_STUDY)  # the master labels its Prometheus series
    concern("soak")  # `swarmload soak` (infra/soak.py); the workers read the first six
    soak: bool = option(False, "soak mode: lazy schedule, per-window records, compaction, "
                        "trimmed Locust stats", kind="switch", cli=False, locust=True)
    window: float = option(60.0, "window of the windows table and the drift series, seconds",
                           kind="duration", gt=0, le=86_400, cli="soak", locust=True)
    compact_every: float = option(3600.0, "merge part files this often, seconds",
                                  kind="duration", gt=0, cli="soak", locust=True)
    stats_keep: float = option(600.0, "seconds of Locust's per-second live stats kept",
                               kind="duration", gt=0, cli="soak", locust=True)
    segment: int = option(0, "soak: segment number of a resumed run (0: first)", ge=0,
                          cli=False, locust=True)
    start_seq: int = option(0, "soak: the open-loop schedule resumes at this sequence number",
                            ge=0, cli=False, locust=True)
    sample_interval: float = option(5.0, "telemetry sample interval in a soak, seconds (GPU, "
                                    "server /metrics, host)", gt=0, le=3600, cli="soak")
    server_pid: int | None = option(None, "pid of the server to watch (default: the one "
                                    "started, or the local process listening on the target's "
                                    "port)", kind="int", ge=1, cli="soak")
    warmup: float = option(300.0, "drift report: leave out windows in the first WARMUP",
                           kind="duration", ge=0, cli="soak")
    drift_p: float = option(0.01, "drift: Mann-Kendall p below this", gt=0, le=1, cli="soak")
    drift_share: float = option(0.10, "drift: change over the run above this share of the "
                                "start", ge=0, cli="soak")
    memory_limit: str = option(
        "", "early warning: the server's memory limit, e.g. 24GB, 512MB (default: the host's "
            "memory); its RSS trend is projected to it", metavar="SIZE", cli="soak",
        check=_size_problem, allowed="a size like 24GB, 512MB or 1.5T")
    slo: tuple[str, ...] = option(
        (), "early warning: a latency's SLO, e.g. ttft_p95_s=0.5 (repeatable); its trend is "
            "projected to it", metavar="SERIES=SECONDS", cli="soak", check=_slo_problem,
        allowed="SERIES=SECONDS, a soak latency series (ttft_p95_s, e2e_p99_s, ...) and "
                "seconds > 0")
    early_every: float = option(
        0.0, "early warning while the soak runs: project the trends this often (0: every two "
             "windows, at least 30 s); written to early_warning.json, printed, and served with "
             "--prometheus-port", kind="duration", ge=0, cli="soak")
    resume: str = option("", "continue this run folder as a new segment (same settings)",
                         metavar="RUN_DIR", cli="soak")
    report: str = option("", "only (re)compute the drift report of this soak folder with "
                         "--warmup, --drift-p and --drift-share; nothing is run",
                         metavar="RUN_DIR", cli="soak")
    concern("study")  # `swarmload study run` (infra/study/runner.py)
    study_file: str = option("", "study YAML (see infra/study/spec.py)", cli="study-run",
                             positional=True, metavar="STUDY_FILE")
    study_resume: str = option("", "carry on a study cut short, skipping its finished steps",
                               flag="resume", metavar="STUDY_DIR", cli="study-run")
    study_budget: float = option(
        0.0, "fit the study into this long (30m, 1h, 900; 0: as written): lower precision.max_s, "
        "refine.max_steps and repeats as `study plan --budget` does, then say what precision "
        "it reached", kind="duration", ge=0, le=7 * 24 * 3600, flag="budget",
        metavar="DURATION", cli="study-run")
    study_gpu_hour_usd: float = option(
        0.0, "price of a GPU-hour in US dollars: the verdict's cost per million output tokens "
        "(0: the study file's gpu_hour_usd, else none)", ge=0, flag="gpu-hour-usd",
        metavar="USD", cli="study-run")
    concern("roles")  # `swarmload master` and `worker` (infra/roles.py); `run` keeps all local
    master_bind: str = option("127.0.0.1", "address the master listens on for workers",
                              flag="bind", cli="master", defaults={"master": "0.0.0.0"})
    master_port: int = option(0, "master port (0: a free one)", ge=0, le=65535, flag="port",
                              cli="master", defaults={"master": MASTER_PORT})
    local_workers: int | None = option(None, "workers started on this host (default: all of "
                                       "--workers)", kind="int", ge=0, cli=False)
    worker_wait_s: float = option(60.0, "longest wait for the workers to connect, seconds",
                                  gt=0, le=86_400, flag="worker-wait", cli="master",
                                  defaults={"master": 120.0})
    master_address: str = option("", f"the master's address (port {MASTER_PORT} if left out)",
                                 flag="master", metavar="HOST[:PORT]", cli="worker",
                                 required=True)
    processes: int = option(1, "worker processes on this machine (one per core is the most "
                            "useful)", ge=1, le=1024, cli="worker")
    host_name: str = option("", "host name in records and the manifest (default: this "
                            "machine's)", flag="name", metavar="NAME", cli="worker")

    def __post_init__(self) -> None:
        for f in fields(self):
            spec: OptionSpec = f.metadata["option"]
            value = getattr(self, f.name)
            try:
                parsed = spec.parse(value)
            except ValueError:
                raise spec.error(f.name, value) from None
            if parsed is not value:
                object.__setattr__(self, f.name, parsed)  # e.g. 4 -> 4.0, [..] -> (..)
            problem = spec.problem(parsed)
            if problem is not None:
                raise spec.error(f.name, parsed, problem)
        self._check_together()

    def _check_together(self) -> None:
        """Checks that involve two or more fields (order, sums, combinations)."""
        thresholds, mix = _spec(_field("thresholds")), _spec(_field("mix"))
        try:
            short_max, long_min = parse_thresholds(self.thresholds)
        except BucketSpecError:
            raise thresholds.error("thresholds", self.thresholds) from None
        if not 0 < short_max <= long_min:
            raise thresholds.error("thresholds", self.thresholds, "out of order")
        try:
            shares = parse_shares(self.mix)
        except BucketSpecError:
            raise mix.error("mix", self.mix) from None
        total = sum(shares.values())
        if abs(total - 1.0) > 1e-6:
            raise mix.error("mix", self.mix, f"sums to {total:.0%}")
        try:
            BucketSpec(short_max, long_min, shares)
        except BucketSpecError as exc:
            raise mix.error("mix", self.mix, str(exc)) from None
        if self.long_max_tokens <= long_min:
            raise ConfigError("long_max_tokens", f"got {self.long_max_tokens}; allowed: more "
                              f"than LONG_MIN of the thresholds ({long_min})")
        if self.plan and not self.workload:
            raise ConfigError("plan", "needs a workload folder (--workload) to replay")
        if self.local_workers is not None and self.workers == AUTO_WORKERS:
            raise ConfigError("workers", "got 'auto' with workers on other hosts; allowed: a "
                              "count, so the master knows how many to wait for")
        if self.local_workers is not None and self.local_workers > self.workers:
            raise ConfigError("local_workers", f"got {self.local_workers}; allowed: at most "
                              f"--workers ({self.workers})")
        if self.server_traces and self.no_collectors:
            raise ConfigError("server_traces", "spans are received by the collectors; leave "
                              "out --no-collectors")
        if self.fault_plan and self.replicas < 2:
            raise ConfigError("fault_plan", "acts on replicas the run starts: add --replicas N "
                              "(2 or more) of a --target kind swarmload starts")
        if self.endpoint == "responses" and (self.no_stream or self.workload):
            raise ConfigError("endpoint", "responses: streamed closed-loop runs only (leave "
                              "out --no-stream and --workload)")
        if self.target_args and self.target.startswith(("http://", "https://")):
            raise ConfigError("target_args", f"a running endpoint ({self.target}) takes no "
                              "launch arguments")

    # --- derived values (parsed once, here)

    @property
    def bucket_spec(self) -> BucketSpec:
        short_max, long_min = parse_thresholds(self.thresholds)
        return BucketSpec(short_max, long_min, parse_shares(self.mix))

    @property
    def memory_limit_mb(self) -> float | None:
        """``memory_limit`` in MiB (None: not stated)."""
        return size_mb(self.memory_limit) if self.memory_limit else None

    @property
    def slo_seconds(self) -> dict[str, float]:
        """``slo`` as {series: seconds}."""
        pairs = (slo_pair(item) for item in self.slo)
        return {pair[0]: pair[1] for pair in pairs if pair is not None}

    @property
    def target_urls(self) -> tuple[str, ...]:
        """``targets`` (replicas' base URLs) as a tuple."""
        return tuple(u.strip().rstrip("/") for u in self.targets.split(",") if u.strip())

    @property
    def stream(self) -> bool:
        return not self.no_stream

    @property
    def open_loop(self) -> bool:
        return bool(self.workload)

    # --- construction from each front end

    @classmethod
    def from_cli(cls, namespace: argparse.Namespace, **overrides: Any) -> RunConfig:
        """From the flags :func:`add_cli_arguments` added for a command (a Namespace with one
        attribute per field; None or absent: the field's default)."""
        return cls._from_raw({f.name: getattr(namespace, f.name, None) for f in _fields("cli")},
                             overrides)

    @classmethod
    def for_scope(cls, scope: str, base: RunConfig | None = None) -> RunConfig:
        """``base`` (default: the defaults) with the fields that have a default of their own
        for ``scope`` (a command, or "study") set to it."""
        return replace(base or cls(), **{f.name: _spec(f).default_for(scope, f.default)
                                         for f in fields(cls) if _spec(f).defaults})

    @classmethod
    def from_locust_options(cls, options: Any) -> RunConfig:
        """From Locust's parsed options (``options.swarmload_<name>``; None or '': default)."""
        raw: dict[str, Any] = {}
        for f in _fields("locust"):
            value = getattr(options, "swarmload_" + _locust_name(f).replace("-", "_"), None)
            if _spec(f).kind == "list" and isinstance(value, str):  # one item per line
                value = tuple(line for line in value.splitlines() if line.strip())
            raw[f.name] = None if value in ("", ()) else value
        return cls._from_raw(raw, {})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], base: RunConfig | None = None,
                     section: str = "workload") -> RunConfig:
        """From a study file's section (typed YAML values, strictly checked); keys are
        :func:`study_fields` of ``section``. Unknown keys are the caller's to report."""
        keys = {key: f for f, key in study_fields(section)}
        values: dict[str, Any] = {}
        for key, raw in data.items():
            f = keys[key]
            spec = _spec(f)
            try:
                value = spec.parse(raw, strict=True)
            except ValueError:
                raise spec.error(f.name, raw) from None
            values[f.name] = (not value) if spec.study_negated else value
        return replace(base or cls(), **values)

    def study_section(self, section: str) -> dict[str, Any]:
        """The keys of a study file's ``section`` with this configuration's values."""
        return {key: (not getattr(self, f.name)) if _spec(f).study_negated
                else getattr(self, f.name) for f, key in study_fields(section)}

    @classmethod
    def _from_raw(cls, raw: dict[str, Any], overrides: dict[str, Any]) -> RunConfig:
        values: dict[str, Any] = {}
        for name, value in raw.items():
            if value is None:
                continue
            spec = _spec(_field(name))
            try:
                values[name] = spec.parse(value)
            except ValueError:
                raise spec.error(name, value) from None
        return cls(**{**values, **overrides})

    # --- back to the Locust processes

    def locust_argv(self) -> list[str]:
        """``--swarmload-*`` arguments for the master and workers: the fields that differ from
        their default (the workers' defaults are these same fields)."""
        argv: list[str] = []
        for f in _fields("locust"):
            value = getattr(self, f.name)
            if value != f.default and not _spec(f).secret:
                text = "\n".join(value) if isinstance(value, tuple) else _text(value)
                argv += [locust_flag(f.name), text]  # a list: one item per line
        return argv

    def locust_env(self) -> dict[str, str]:
        """The ``secret`` options (header values, ...) as the ``SWARMLOAD_*`` environment of
        the Locust processes: never on a command line, which ``ps``, logs and the manifest show.
        """
        env = {}
        for f in _fields("locust"):
            value = getattr(self, f.name)
            if _spec(f).secret and value != f.default:
                env[_env_var(f)] = "\n".join(value) if isinstance(value, tuple) else _text(value)
        return env


# ---------------------------------------------------------------------------- field helpers


def _spec(f: Any) -> OptionSpec:
    return f.metadata["option"]


def _field(name: str) -> Any:
    for f in fields(RunConfig):
        if f.name == name:
            return f
    raise KeyError(name)


def _fields(scope: str) -> Iterator[Any]:
    for f in fields(RunConfig):
        if getattr(_spec(f), scope):
            yield f


def _flag(f: Any) -> str:
    return _spec(f).flag or f.name.replace("_", "-")


def _locust_name(f: Any) -> str:
    return _spec(f).locust_name or _flag(f)


def _env_var(f: Any) -> str:
    return "SWARMLOAD_" + _locust_name(f).upper().replace("-", "_")


def _num(value: float) -> str:
    return f"{int(value)}" if float(value).is_integer() else f"{value:g}"


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def cli_flag(name: str) -> str:
    """The ``swarmload run`` flag of a field, e.g. 'max_tokens' -> '--max-tokens'."""
    return "--" + _flag(_field(name))


def locust_flag(name: str) -> str:
    """The Locust option of a field, e.g. 'max_tokens' -> '--swarmload-max-tokens'."""
    return "--" + LOCUST_PREFIX + _locust_name(_field(name))


def study_fields(section: str = "workload") -> list[tuple[Any, str]]:
    """(field, key) of every option a study file's ``section`` (``workload``, ``endpoint``, or
    ``study``: the top level) may set."""
    if section not in STUDY_SECTIONS:
        raise ValueError(f"unknown study section {section!r}; known: {STUDY_SECTIONS}")
    found = []
    for f in fields(RunConfig):
        study = _spec(f).study
        if study is None:
            continue
        where, _, key = study.rpartition(".") if "." in study else ("workload", "", study)
        if where == section:
            found.append((f, key or f.name))
    return found


def command_fields(command: str) -> list[Any]:
    """The fields that are flags of ``command`` (:data:`COMMANDS`)."""
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}; known: {COMMANDS}")
    return [f for f in fields(RunConfig) if command in _spec(f).cli]


# ------------------------------------------------------------------------------ argparse glue


class RunArgumentParser(argparse.ArgumentParser):
    """argparse with swarmload's one-line errors: ``swarmload run: --users: got -3; allowed:
    an integer from 1 to 100000`` and exit status 2, no usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message.removeprefix('argument ')}\n")


def _cli_type(name: str, spec: OptionSpec, one_item: bool = False) -> Callable[[str], Any]:
    """argparse ``type=``: the text as the field's kind, checked against the field's own
    constraints (checks across fields are :meth:`RunConfig._check_together`'s)."""
    def convert(text: str) -> Any:
        try:
            value = text if one_item else spec.parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(spec.error(name, text).problem) from None
        problem = spec.check((value,)) if one_item and spec.check else (
            None if one_item else spec.problem(value))
        if problem is not None:
            raise argparse.ArgumentTypeError(spec.error(name, value, problem).problem)
        return value

    convert.__name__ = name  # argparse names the type in some messages
    return convert


def add_cli_arguments(parser: argparse.ArgumentParser, command: str = "run") -> None:
    """The flags of ``command`` (``run``, ``master``, ``soak``, ``worker``), one per field whose
    ``cli`` names it, in one argument group per concern, each typed and checked by its field
    (so a Namespace holds the same values a :class:`RunConfig` would) and defaulting to the
    field's default for that command; :meth:`RunConfig.from_cli` adds the checks across
    fields. The only place a swarmload run option becomes a flag."""
    groups: dict[str, Any] = {}
    for f in command_fields(command):
        spec = _spec(f)
        value = spec.default_for(command, f.default)
        shown = f"{value:g}" if isinstance(value, float) else _text(value)
        default = "" if value in ("", None, ()) or spec.kind == "switch" else (
            f" (default {shown})")
        common: dict[str, Any] = {"dest": f.name, "help": f"{spec.help}{default}"}
        if spec.required:
            common["required"] = True
        if spec.kind == "switch":
            common.update(action="store_const", const=True, default=value)
        elif spec.kind == "list":  # argparse copies the default list before appending
            common.update(action="append", default=list(value), metavar=spec.metavar or "VALUE",
                          type=_cli_type(f.name, spec, one_item=True))
        else:
            common.update(default=value, type=_cli_type(f.name, spec),
                          metavar=spec.metavar or ("{" + ",".join(spec.choices) + "}"
                                                   if spec.choices else f.name.upper()))
        if spec.group not in groups:
            groups[spec.group] = parser.add_argument_group(spec.group or None)
        if spec.positional:  # argparse names an operand by its dest
            del common["dest"], common["default"]
            groups[spec.group].add_argument(f.name, **common)
        else:
            groups[spec.group].add_argument(
                cli_flag(f.name), *(f"--{name}" for name in spec.former), **common)


def add_locust_arguments(parser: Any) -> None:
    """The ``--swarmload-*`` options on Locust's parser (``init_command_line_parser``), one per
    field with ``locust=True``; each also read from ``SWARMLOAD_<NAME>``."""
    group = parser.add_argument_group("swarmload", "swarmload load generation and recording")
    for f in _fields("locust"):
        spec = _spec(f)
        typed: dict[str, Any] = {}
        default: Any = f.default
        if spec.kind == "int":
            typed["type"] = int
        elif spec.kind in ("float", "duration"):
            typed["type"] = float
        elif spec.kind in ("bool", "switch"):
            default = _text(f.default)  # Locust's web form shows it as text: true/false
        elif spec.kind == "list":
            default = ""  # one item per line (a multi-line environment variable)
        if spec.choices:
            typed["choices"] = list(spec.choices)
        group.add_argument("--" + LOCUST_PREFIX + _locust_name(f), env_var=_env_var(f),
                           default=default, help=spec.help, **typed)
