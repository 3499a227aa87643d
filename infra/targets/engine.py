"""What a target kind is: one :class:`Engine` declaration, started from one :class:`LaunchSpec`.

A target kind (``sim``, ``vllm-cpu``, ``vllm``) is declared once, as ``ENGINE`` at the end of its
own module, and listed in :mod:`infra.targets.registry`. The declaration says:

- its name (``--target NAME``, ``target: NAME`` in a study) and a few words for the help;
- how it starts and stops: ``start(spec, say)``, a context manager yielding the :class:`Target`
  while it serves, and ``replica(spec, name, index, folder)`` for ``--replicas N`` (None: the kind
  has no replicas). Engines launched as a process build both from one server factory
  (:func:`infra.targets.launched.served` and :func:`~infra.targets.launched.replica_of`);
- the study keys it takes beyond the common ones (``model``, ``python``, ``env``) and whether a
  model folder is required;
- its start-time estimate for study plans (``start_s``);
- its server metric map: the engine whose ``/metrics`` names it serves
  (:mod:`collectors.engine_metrics`);
- what it can do: replicas, OTLP spans (``spans``), a prefix-cache reset (``reset_env``: the
  environment its server needs to serve the reset), dummy weights.

Every front end (``swarmload run``, a study's configuration, its replicas) builds the same
:class:`LaunchSpec`; nothing else describes how to start a target.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.targets.haproxy import HealthCheck
    from infra.targets.replicas import Replicas, ReplicaServer

Say = Callable[[str], None]


class EngineError(RuntimeError):
    """Base of every error about an engine swarmload starts (its install, its start-up)."""


class EngineStartError(EngineError):
    """The server could not be started or did not become ready."""


@dataclass(frozen=True)
class LaunchSpec:
    """How to start a target: one kind's server, or ``replicas`` of them behind ``balance``.

    ``kind`` is a registered kind or base URLs (comma-separated: several replicas running
    already). ``args`` go to the server unchanged; ``model``, ``python`` and ``env`` are for the
    kinds that take them (:attr:`Engine.study_keys`); ``traces_endpoint``: where a server that
    sends spans sends them (None: off)."""

    kind: str
    args: tuple[str, ...] = ()
    model: str | None = None  # a model folder to serve
    python: str | None = None  # the interpreter that runs the engine
    env: tuple[tuple[str, str], ...] = ()  # set for the server only
    traces_endpoint: str | None = None
    replicas: int = 1
    balance: str = "round-robin"
    health_check: HealthCheck | None = None  # HAProxy's checks of each replica
    session_header: str | None = None  # HAProxy keeps a session on one replica

    @property
    def env_vars(self) -> dict[str, str]:
        return dict(self.env)

    def with_env(self, extra: Mapping[str, str]) -> LaunchSpec:
        """This spec with ``extra`` added to the server's environment."""
        return replace(self, env=tuple({**dict(self.env), **extra}.items()))

    @property
    def urls(self) -> list[str]:
        """``kind`` as base URLs (empty for a kind swarmload starts)."""
        urls = [u.strip() for u in self.kind.split(",") if u.strip()]
        return urls if all(u.startswith(("http://", "https://")) for u in urls) else []


@dataclass
class Target:
    kind: str
    base_url: str
    model: str | None = None
    pid: int | None = None
    launch_args: list[str] = field(default_factory=list)
    launch: dict[str, Any] | None = None  # how the target was started (its launch record)
    replicas: Replicas | None = None  # several replicas (infra.targets.replicas)


def _no_model(spec: LaunchSpec) -> str | None:
    return None


@dataclass(frozen=True)
class Engine:
    """One target kind (see the module docstring)."""

    name: str
    title: str  # a few words for the help: "real vLLM on the CPU"
    metrics: str  # the engine whose /metrics it serves: a key of collectors.engine_metrics.MAPS
    start_s: float  # seconds from start until it serves (study plans)
    start: Callable[[LaunchSpec, Say], AbstractContextManager[Target]]
    replica: Callable[[LaunchSpec, str, int, Path], ReplicaServer] | None = None
    model_name: Callable[[LaunchSpec], str | None] = _no_model  # what its replicas serve
    study_keys: tuple[str, ...] = ()  # of model, python, env
    needs_model: bool = False  # a model folder is required (--target-model, model:)
    spans: bool = False  # sends OTLP spans when given an endpoint
    reset_env: tuple[tuple[str, str], ...] | None = None  # prefix-cache reset: its server's env
    dummy_weights: bool = False  # serves random weights without a checkpoint
    # raises ValueError(one line naming the problem) on launch arguments that cannot work
    check_args: Callable[[Sequence[str]], None] | None = None

    @property
    def replicas(self) -> bool:
        return self.replica is not None

    @property
    def prefix_cache_reset(self) -> bool:
        return self.reset_env is not None
