"""Where the vLLM interpreter lives, how to run vLLM's own tools (``vllm bench serve``) with it,
and what vLLM on the CPU (``vllm_cpu``) and on a GPU (``vllm_gpu``) share: their errors and the
span export settings (``--otlp-traces-endpoint``, :data:`TRACES_ENV`).

vLLM (the ``vllm-cpu`` distribution) lives in its own venv, ``.venv-vllm`` at the repository root
(``make vllm-venv``), so the target and the reference client run in an interpreter apart from the
project's ``.venv``. ``SWARMLOAD_VLLM_PYTHON`` names another interpreter (a path to ``python``)
instead; an installed package (no checkout) looks for ``.venv-vllm`` in the current folder.

The ``vllm`` console script is broken in that install (it looks up the distribution ``vllm``);
:func:`vllm_cli_command` builds a command that goes through ``infra/targets/vllm_entry.py``
instead::

    subprocess.run(vllm_cli_command(["bench", "serve", "--help"]), check=True)
"""

from __future__ import annotations

import os
from pathlib import Path

from infra.paths import CHECKOUT, PACKAGE_ROOT
from infra.targets.engine import EngineError, EngineStartError

DEFAULT_VENV = ".venv-vllm"
PYTHON_ENV_VAR = "SWARMLOAD_VLLM_PYTHON"
MAKE_HINT = ("run `make vllm-venv` to create it" if CHECKOUT else
             f"set ${PYTHON_ENV_VAR} (or --target-python) to an interpreter that imports vllm")
ENTRY_SCRIPT = Path(__file__).resolve().parent / "vllm_entry.py"


class VllmError(EngineError):
    """Base of every error about the vLLM install or a vLLM target (``infra.targets.vllm_cpu``)."""


class VllmVenvMissingError(VllmError):
    """The interpreter that has vLLM installed is not there."""


class VllmStartError(VllmError, EngineStartError):
    """The server could not be started or did not become ready."""


def traces_args(endpoint: str | None) -> list[str]:
    """vLLM's flag sending one OpenTelemetry span per request to ``endpoint`` (None: off)."""
    return ["--otlp-traces-endpoint", endpoint] if endpoint else []


def traces_env(endpoint: str | None) -> dict[str, str]:
    """The exporter settings that go with :func:`traces_args` (:data:`TRACES_ENV`)."""
    return dict(TRACES_ENV) if endpoint else {}


# --otlp-traces-endpoint: vLLM exports gRPC unless told otherwise (our receiver is OTLP/HTTP,
# collectors.otlp_traces), and in batches every 5 s by default; 0.5 s lets a run end sooner. An
# export retries for up to its timeout (10 s by default), and vLLM's exit waits for the last one:
# with no receiver listening (between runs) that added 10 s to every stop; 3 s is ample for a
# receiver on this host or the next.
TRACES_ENV = {
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    "OTEL_BSP_SCHEDULE_DELAY": "500",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "3",
}


def vllm_python(venv: str | os.PathLike[str] | None = None) -> Path:
    """Path of the interpreter that has vLLM (may not exist; see :func:`require_vllm_python`).

    Order: ``$SWARMLOAD_VLLM_PYTHON`` when set, else ``<venv>/bin/python`` where ``venv`` (default
    ``.venv-vllm``) is taken relative to the repository root (installed: the current folder) unless
    absolute.
    """
    override = os.environ.get(PYTHON_ENV_VAR)
    if override:
        return Path(override).expanduser()
    folder = Path(venv if venv is not None else DEFAULT_VENV).expanduser()
    if not folder.is_absolute():
        folder = (PACKAGE_ROOT if CHECKOUT else Path.cwd()) / folder
    return folder / "bin" / "python"


def require_vllm_python(venv: str | os.PathLike[str] | None = None) -> Path:
    """:func:`vllm_python`, or :class:`VllmVenvMissingError` saying how to create it."""
    python = vllm_python(venv)
    if python.exists():
        return python
    if os.environ.get(PYTHON_ENV_VAR):
        raise VllmVenvMissingError(f"${PYTHON_ENV_VAR} names {python}, which does not exist")
    raise VllmVenvMissingError(f"no vLLM interpreter at {python}: {MAKE_HINT}")


def vllm_cli_command(args: list[str], venv: str | os.PathLike[str] | None = None) -> list[str]:
    """argv running ``vllm <args>`` (e.g. ``["bench", "serve", ...]``) with the vLLM venv."""
    return [str(require_vllm_python(venv)), str(ENTRY_SCRIPT), *args]
