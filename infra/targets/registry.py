"""Every target kind swarmload starts, by name: :data:`ENGINES`.

Each kind is declared once, as ``ENGINE`` in its own module (:class:`infra.targets.engine.Engine`);
this list is where the declarations are gathered, in the order the help names them. The run's
``--target``, a study's ``target:``, its plan's start estimates and the run page's server figures
all read it from here.
"""

from __future__ import annotations

from infra.targets import llama_cpp, vllm_cpu, vllm_gpu
from infra.targets.engine import Engine
from infra.targets.simulator import target as simulator

ENGINES: dict[str, Engine] = {e.name: e for e in (
    simulator.ENGINE,
    vllm_cpu.ENGINE,
    vllm_gpu.ENGINE,
    llama_cpp.ENGINE,
)}
KINDS = tuple(ENGINES)


def engine_of(kind: str) -> Engine | None:
    """The declaration of ``kind`` (None: not a registered kind, e.g. a URL)."""
    return ENGINES.get(kind)


def kinds_that(can: str) -> list[str]:
    """The kinds with capability ``can`` (an :class:`Engine` attribute: replicas, spans ...)."""
    return [name for name, engine in ENGINES.items() if getattr(engine, can)]


def kinds_text(kinds: list[str] | tuple[str, ...] = KINDS, last: str = "or") -> str:
    """``sim, vllm-cpu or vllm``: kinds in words."""
    names = list(kinds)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def kinds_help() -> str:
    """``sim (built-in simulator), vllm-cpu (real vLLM on the CPU), ...``: for ``--target``."""
    return ", ".join(f"{name} ({engine.title})" for name, engine in ENGINES.items())
