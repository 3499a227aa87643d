"""llama.cpp's ``llama-server`` serving a GGUF model on this machine: the target ``llama-cpp``.

    swarmload run --target llama-cpp --target-arg=--parallel=4

or in a study::

    configurations:
      - {name: lcpp, target: llama-cpp, model: /models/tiny.gguf, python: /opt/llama/llama-server,
         args: [--parallel=4, --ctx-size=4096]}

``model`` is the GGUF file; without one it serves the tiny random-weight model
(:mod:`infra.targets.tiny_gguf`, the one vLLM serves on the CPU, written on first use to
``.cache/tiny-gguf/``). ``python`` (the study key every launched engine shares for "the program
that runs it") names the ``llama-server`` binary: given, ``$SWARMLOAD_LLAMA_SERVER``,
``llama-server`` on the PATH, or the one ``make llama-server`` built (``.cache/llama-server/``,
the newest). The server is started with ``--metrics`` (its ``/metrics``, read through
``collectors/metric_maps/llama_cpp.py``) and ``--alias`` (the name requests give), in its own
process group; "ready" is a real streamed completion from it (the engine-neutral base,
:mod:`infra.targets.launched`), not ``/health`` answering while the model still loads.

What differs from vLLM's OpenAI API, as the client sees it: a text completion's stream ends
with one chunk holding the finish reason, the usage (always, asked for or not) and llama.cpp's
own ``timings``; a prompt longer than a slot's context (``--ctx-size`` / ``--parallel``) is
refused with HTTP 400 before the stream starts; one that leaves less room than ``max_tokens``
is answered with fewer tokens (finish reason ``length``: a short output, as vLLM's). Its flags
take their value as the next argument, never after ``=``: :func:`split_flags` splits them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from infra.paths import CACHE_DIR
from infra.targets.engine import Engine, EngineStartError, LaunchSpec
from infra.targets.launched import LaunchedServer, find_program, replica_of, served
from infra.targets.tiny_gguf import TINY_GGUF, prepare_tiny_gguf

__all__ = ["BUILT_DIR", "ENGINE", "PROGRAM_ENV_VAR", "LlamaCppError", "LlamaServer",
           "built_program", "resolve_program"]

PROGRAM_ENV_VAR = "SWARMLOAD_LLAMA_SERVER"
PROGRAM = "llama-server"
BUILT_DIR = CACHE_DIR / "llama-server"
"""Where ``make llama-server`` puts the binary it builds: ``BUILT_DIR/VERSION/llama-server``."""


class LlamaCppError(EngineStartError):
    """llama-server is not there, could not start, or did not become ready."""


def built_program() -> Path | None:
    """The newest ``llama-server`` that ``make llama-server`` built, if any."""
    built = [path for path in BUILT_DIR.glob(f"*/{PROGRAM}") if os.access(path, os.X_OK)]
    return max(built, key=lambda path: path.stat().st_mtime) if built else None


def resolve_program(program: str | os.PathLike[str] | None) -> Path:
    """The ``llama-server`` binary: ``program``, ``$SWARMLOAD_LLAMA_SERVER``, the PATH's, or
    the one ``make llama-server`` built."""
    named = program or os.environ.get(PROGRAM_ENV_VAR)
    if not named and shutil.which(PROGRAM) is None:
        named = built_program()
    return find_program(str(named or PROGRAM), "llama-server", LlamaCppError,
                        f": run `make llama-server` (or build llama.cpp's llama-server and set "
                        f"${PROGRAM_ENV_VAR}, or python: in the study configuration)")


class LlamaServer(LaunchedServer):
    """One ``llama-server`` process group. ``model``: the GGUF file (None: the tiny model,
    written on first use); ``program``: the binary (see :func:`resolve_program`);
    ``extra_args``: llama-server flags."""

    ENGINE = "llama.cpp"
    LOG_PREFIX = "llama-cpp"
    LOG_DIR = CACHE_DIR / "llama-cpp"
    StartError = LlamaCppError
    READY_TIMEOUT_S = 300.0

    def __init__(self, model: str | os.PathLike[str] | None = None, program: str | None = None,
                 port: int | None = None, host: str = "127.0.0.1", extra_args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None,
                 log_path: str | os.PathLike[str] | None = None) -> None:
        if model is not None and not Path(model).is_file():
            raise LlamaCppError(f"model file {model} does not exist (llama-server serves a GGUF "
                                "file)")
        self._model = Path(model if model is not None else TINY_GGUF).resolve()
        self._tiny = model is None
        super().__init__(self._model.stem, port=port, host=host, extra_args=extra_args, env=env,
                         log_path=log_path)
        self._program = program

    def launch_record(self) -> dict[str, object]:
        return {"kind": "llama-cpp", "program": self._command[0] if self._command else None,
                "args": self.launch_args, "env": dict(self._env), "model": str(self._model),
                "ready_after_s": self.ready_after_s}

    def _interpreter(self) -> Path:
        return resolve_program(self._program)

    def _prepare(self, program: Path) -> None:
        if self._tiny:
            prepare_tiny_gguf(self._model)

    def _server_args(self) -> list[str]:
        return ["--model", str(self._model), "--alias", self.model_name, "--host", self._host,
                "--port", str(self._port), "--metrics", *split_flags(self._extra_args)]


def split_flags(args: Sequence[str]) -> list[str]:
    """``--flag=value`` as ``--flag value``: llama-server's parser takes no ``=``
    ("invalid argument: --parallel=4"), while ``--target-arg=--parallel=4`` and a study's
    ``args: [--parallel=4]`` are how swarmload writes a flag with its value."""
    out: list[str] = []
    for arg in args:
        if arg.startswith("-") and "=" in arg:
            out += arg.split("=", 1)
        else:
            out.append(arg)
    return out


def _server(spec: LaunchSpec, port: int | None, index: int) -> LlamaServer:
    return LlamaServer(spec.model, program=spec.python, port=port, extra_args=spec.args,
                       env=spec.env_vars)


ENGINE = Engine(
    name="llama-cpp", title="llama.cpp's llama-server (--target-model FILE.gguf, else a tiny "
                             "random-weight model)",
    metrics="llama.cpp", start_s=20.0,
    start=served("llama-cpp", _server, lambda spec: "starting llama-server serving "
                                                    f"{spec.model or 'the tiny model'} ..."),
    replica=replica_of("llama-cpp", _server),
    model_name=lambda spec: Path(spec.model or TINY_GGUF).stem,
    study_keys=("model", "python", "env"))
