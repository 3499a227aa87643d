"""Simulator settings: one dataclass, and the CLI built from its fields so the two never drift.

Every field of :class:`SimulatorConfig` is a flag of ``swarmload sim`` named after it
(``max_num_seqs`` -> ``--max-num-seqs``); :meth:`SimulatorConfig.to_argv` writes the flags back,
which is how :func:`infra.targets.simulator.running_simulator` hands a config to its subprocess.

Times are in seconds, token counts in simulator tokens (whitespace-separated words).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
from dataclasses import dataclass, field
from typing import Any, Union, get_args, get_origin, get_type_hints

DEFAULT_MODEL_NAME = "swarmload-sim"
# the line the simulator prints once it listens, before its URL (launchers and tests wait for it)
READY_LINE_PREFIX = "swarmload-sim listening on "
# what POST /admin/knobs may change while serving (a "slow" fault of a fault plan): the time costs
# of every latency model and the injected error rates
TIME_KNOBS = ("prefill_base_s", "prefill_per_token_s", "decode_base_s", "decode_per_seq_s",
              "fixed_ttft_s", "fixed_itl_s")
RUNTIME_KNOBS = (*TIME_KNOBS, "max_num_seqs", "error_rate", "cut_rate")


class SimulatorConfigError(ValueError):
    """A setting is out of range; the message names the setting and the valid range."""


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class SimulatorConfig:
    """All knobs of the simulator. See the module docstring of ``infra.targets.simulator``."""

    host: str = field(default="127.0.0.1", metadata=_help("address to listen on (loopback)"))
    port: int = field(default=8000, metadata=_help("TCP port; 0 picks a free one"))
    model: str = field(default=DEFAULT_MODEL_NAME, metadata=_help("served model name"))
    max_model_len: int = field(
        default=4096, metadata=_help("prompt + max_tokens above this -> HTTP 400")
    )
    # Continuous-batching latency model.
    max_num_seqs: int = field(default=256, metadata=_help("sequences decoded per engine step"))
    kv_cache_tokens: int = field(
        default=262_144,
        metadata=_help("KV cache capacity in tokens; running out preempts the newest sequence"),
    )
    prefill_base_s: float = field(
        default=0.002, metadata=_help("added to a step that admits at least one sequence")
    )
    prefill_per_token_s: float = field(
        default=0.00002, metadata=_help("added to a step per prompt token admitted")
    )
    decode_base_s: float = field(default=0.008, metadata=_help("fixed cost of each decode step"))
    decode_per_seq_s: float = field(
        default=0.0001, metadata=_help("decode step cost per running sequence")
    )
    # Load-independent modes.
    fixed_ttft_s: float | None = field(
        default=None, metadata=_help("fixed-timing mode: first token this long after arrival")
    )
    fixed_itl_s: float | None = field(
        default=None, metadata=_help("fixed-timing mode: gap between tokens")
    )
    zero_latency: bool = field(
        default=False, metadata=_help("stream every token as fast as possible (no model)")
    )
    fixed_itl_per_seq_s: float = field(
        default=0.0, metadata=_help("fixed-timing mode: each gap between tokens grows by this "
                                    "much per stream in flight, the first token's delay does "
                                    "not (a server that admits every request into its batch: "
                                    "TPOT grows with the load while TTFT stays flat)")
    )
    # Reasoning models (chat streams only).
    fixed_ttft_jitter: float = field(
        default=0.0, metadata=_help("fixed-timing mode: each request's first-token delay is "
                                    "fixed_ttft_s x a log-normal factor of this sigma (0: none); "
                                    "a spread with a known shape, so a scaled TTFT is a known "
                                    "change of every percentile")
    )
    reasoning_events: int = field(
        default=0, metadata=_help("chat streams: the first N tokens are reasoning deltas, "
                                  "then the answer's delta.content")
    )
    reasoning_field: str = field(
        default="reasoning", metadata=_help("delta field of reasoning tokens: reasoning (vLLM "
                                            ">= 0.10) or reasoning_content (older vLLM, SGLang)")
    )
    # Real endpoints: HTTPS and an API key.
    ssl_certfile: str = field(default="", metadata=_help("serve HTTPS with this PEM certificate"))
    ssl_keyfile: str = field(default="", metadata=_help("private key of --ssl-certfile"))
    api_key_env: str = field(
        default="", metadata=_help("require 'Authorization: Bearer <key>' with the key in this "
                                   "environment variable (401 otherwise), as vLLM's --api-key")
    )
    # Faults and randomness.
    error_rate: float = field(default=0.0, metadata=_help("fraction of requests answered 500"))
    cut_rate: float = field(
        default=0.0, metadata=_help("fraction of streams cut (connection closed) before [DONE]")
    )
    fault_cycle: str = field(
        default="", metadata=_help("comma-separated faults given to generation requests in turn "
                                   "(ok, first_token_stall, mid_stream_stall, http_400, "
                                   "http_429, http_500, error_event, cut, malformed, empty, "
                                   "not_event_stream, short); see infra/targets/simulator/"
                                   "faults.py")
    )
    fault_log: str = field(
        default="", metadata=_help("append one JSON line per generation request: its number, "
                                   "fault and X-Request-Id")
    )
    fault_stall_s: float = field(
        default=600.0, metadata=_help("longest silence of a stall fault (it ends sooner when "
                                      "the client leaves)")
    )
    request_log: str = field(
        default="", metadata=_help("append one JSON line when each generation request arrives "
                                   "and one when it ends (how: the finish reason, abort, cut, "
                                   "or the HTTP status of an error), with its X-Request-Id: "
                                   "what the server saw, line by line even if it is killed")
    )
    seed: int = field(default=0, metadata=_help("seed for output lengths and faults"))
    # Slow drift, so a soak's drift report can be checked against known answers.
    leak_mb_per_min: float = field(
        default=0.0, metadata=_help("memory leak: grow the process's resident memory by this "
                                    "many MB a minute (real, touched pages)")
    )
    ttft_creep_pct_per_h: float = field(
        default=0.0, metadata=_help("latency creep: time to first token grows by this share of "
                                    "its starting value per hour (fixed mode: fixed_ttft_s; "
                                    "batching mode: the prefill cost)")
    )

    # A slow start, so a study's steady-state detection can be checked against a known answer.
    slow_start_s: float = field(
        default=0.0, metadata=_help("batching mode: engine steps are slower for this many "
                                    "seconds after the first request that follows 2 s or more "
                                    "of idleness, by slow_start_factor at first, falling "
                                    "linearly to 1 (a server warming up at every new load)")
    )
    slow_start_factor: float = field(
        default=1.0, metadata=_help("how much slower the first engine step is (see "
                                    "slow_start_s)")
    )

    def with_knobs(self, knobs: dict[str, Any]) -> SimulatorConfig:
        """This config with the runtime knobs of :data:`RUNTIME_KNOBS` replaced (validated);
        raises :class:`SimulatorConfigError` naming a knob that is not one."""
        unknown = sorted(set(knobs) - set(RUNTIME_KNOBS))
        if unknown:
            raise SimulatorConfigError(f"not a runtime knob: {', '.join(unknown)}; runtime "
                                       f"knobs: {', '.join(RUNTIME_KNOBS)}")
        hints = get_type_hints(SimulatorConfig)
        typed = {}
        for name, value in knobs.items():
            kind = _scalar_type(hints[name])
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SimulatorConfigError(f"{name}: a number, got {value!r}")
            typed[name] = kind(value)
        changed = dataclasses.replace(self, **typed)
        if changed.mode != self.mode:
            raise SimulatorConfigError("the knobs may not change the latency model "
                                       f"({self.mode} -> {changed.mode})")
        changed.validate()
        return changed

    @property
    def mode(self) -> str:
        """``"zero"``, ``"fixed"`` or ``"batching"``: which latency model serves requests."""
        if self.zero_latency:
            return "zero"
        if self.fixed_ttft_s is not None or self.fixed_itl_s is not None:
            return "fixed"
        return "batching"

    def validate(self) -> None:
        """Raise :class:`SimulatorConfigError` naming the first bad setting."""
        positive = {"max_model_len": self.max_model_len, "max_num_seqs": self.max_num_seqs}
        for name, value in positive.items():
            if value < 1:
                raise SimulatorConfigError(f"{name} must be >= 1, got {value}")
        if self.kv_cache_tokens < self.max_model_len:
            raise SimulatorConfigError(
                f"kv_cache_tokens ({self.kv_cache_tokens}) must hold one full sequence "
                f"(max_model_len={self.max_model_len})"
            )
        for name in ("prefill_base_s", "prefill_per_token_s", "decode_base_s", "decode_per_seq_s",
                     "fixed_ttft_s", "fixed_itl_s", "fixed_itl_per_seq_s"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise SimulatorConfigError(f"{name} must be >= 0, got {value}")
        if self.fixed_ttft_jitter < 0:
            raise SimulatorConfigError(
                f"fixed_ttft_jitter must be >= 0, got {self.fixed_ttft_jitter}")
        if self.slow_start_s < 0 or self.slow_start_factor < 1:
            raise SimulatorConfigError("slow_start_s must be >= 0 and slow_start_factor >= 1")
        if self.leak_mb_per_min < 0 or self.ttft_creep_pct_per_h < 0:
            raise SimulatorConfigError("leak_mb_per_min and ttft_creep_pct_per_h must be >= 0")
        for name in ("error_rate", "cut_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise SimulatorConfigError(f"{name} must be in [0, 1], got {value}")
        if self.zero_latency and (self.fixed_ttft_s is not None or self.fixed_itl_s is not None):
            raise SimulatorConfigError(
                "zero_latency and fixed_ttft_s/fixed_itl_s exclude each other"
            )
        if self.reasoning_events < 0:
            raise SimulatorConfigError(
                f"reasoning_events must be >= 0, got {self.reasoning_events}")
        if self.reasoning_field not in ("reasoning", "reasoning_content"):
            raise SimulatorConfigError(
                f"reasoning_field must be reasoning or reasoning_content, "
                f"got {self.reasoning_field!r}")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise SimulatorConfigError("ssl_certfile and ssl_keyfile go together")
        if self.fault_stall_s < 0:
            raise SimulatorConfigError(f"fault_stall_s must be >= 0, got {self.fault_stall_s}")
        # here, not at the top: the faults module serves them (aiohttp, 0.17 s of CPU), and every
        # `swarmload run` reads these settings without starting a server in its own process
        from infra.targets.simulator.faults import parse_cycle  # noqa: PLC0415

        try:
            parse_cycle(self.fault_cycle)
        except ValueError as exc:
            raise SimulatorConfigError(f"fault_cycle: {exc}") from exc
        if not 0 <= self.port <= 65535:
            raise SimulatorConfigError(f"port must be in [0, 65535], got {self.port}")

    def to_argv(self) -> list[str]:
        """Flags that make :func:`parse_args` return this config (defaults left out)."""
        argv: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            flag = _flag(f.name)
            if isinstance(value, bool):
                argv.append(flag if value else f"--no-{flag[2:]}")
            else:
                argv += [flag, repr(value) if isinstance(value, float) else str(value)]
        return argv


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _scalar_type(hint: Any) -> Any:
    """``float | None`` -> ``float``; plain types pass through."""
    if get_origin(hint) in (Union, types.UnionType):
        (inner,) = [arg for arg in get_args(hint) if arg is not type(None)]
        return inner
    return hint


def build_parser(prog: str = "swarmload sim") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="OpenAI-compatible LLM server simulator with a continuous-batching "
        "latency model, vLLM-named /metrics and fault injection.",
    )
    hints = get_type_hints(SimulatorConfig)
    for f in dataclasses.fields(SimulatorConfig):
        kind = _scalar_type(hints[f.name])
        help_text = f"{f.metadata.get('help', '')} (default: {f.default})"
        if kind is bool:
            parser.add_argument(
                _flag(f.name), action=argparse.BooleanOptionalAction, default=f.default,
                help=help_text,
            )
        else:
            parser.add_argument(_flag(f.name), type=kind, default=f.default, help=help_text)
    return parser


def parse_args(argv: list[str]) -> SimulatorConfig:
    """Parse CLI flags into a validated config; exits with usage on a bad flag."""
    parser = build_parser()
    namespace = parser.parse_args(argv)
    config = SimulatorConfig(**vars(namespace))
    try:
        config.validate()
    except SimulatorConfigError as exc:
        parser.error(str(exc))
    return config
