"""The simulator as a target kind (``--target sim``): its engine declaration and its replica
(a fault plan's knobs act on it while it serves). Its launch arguments are ``swarmload sim`` flags.
"""

from __future__ import annotations

import contextlib
import io
import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from infra.targets.engine import Engine, LaunchSpec, Say, Target
from infra.targets.replicas import ReplicaError, ReplicaServer
from infra.targets.simulator.launcher import (
    SimulatorProcess,
    SimulatorStartError,
    running_simulator,
)
from infra.targets.simulator.settings import SimulatorConfig, parse_args


class SimReplica(ReplicaServer):
    kind = "sim"

    def __init__(self, name: str, config: Any, request_log: str | None = None,
                 log_path: str | None = None) -> None:
        super().__init__(name)
        extra = {"request_log": request_log} if request_log else {}
        self.process = SimulatorProcess(config, log_path=log_path, **extra)

    @property
    def pid(self) -> int | None:
        proc = self.process.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _start(self) -> str:
        try:
            return self.process.start()
        except SimulatorStartError as exc:
            raise ReplicaError(f"replica {self.name}: {exc}") from exc

    def stop(self) -> None:
        self.process.stop()

    def knobs(self, values: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if values is None else json.dumps(values).encode()
        request = urllib.request.Request(f"{self.url}/admin/knobs", data=data,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5.0) as response:
                answer: dict[str, Any] = json.loads(response.read())
                return answer
        except urllib.error.HTTPError as exc:
            raise ReplicaError(f"replica {self.name}: {exc.read().decode(errors='replace')}"
                               ) from None
        except OSError as exc:
            raise ReplicaError(f"replica {self.name}: knobs not reachable: {exc}") from None

    def request_log(self) -> Path | None:
        path = self.process.config.request_log
        return Path(path) if path else None

    def launch(self) -> dict[str, Any]:
        return {"kind": "sim", "argv": self.process.argv[3:],
                "request_log": self.process.config.request_log or None}




# -- the target kind --------------------------------------------------------------------------


def check_args(args: Sequence[str]) -> None:
    """Raise ValueError (one line) unless ``args`` are ``swarmload sim`` flags that can work."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            parse_args(list(args))
    except SystemExit:
        problem = said.getvalue().strip().splitlines()[-1:] or ["not a simulator option"]
        raise ValueError(f"{problem[0].split(': error: ')[-1]} (see swarmload sim --help)"
                         ) from None


def _config(spec: LaunchSpec) -> SimulatorConfig:
    return parse_args(list(spec.args))


@contextlib.contextmanager
def _start(spec: LaunchSpec, say: Say) -> Iterator[Target]:
    config = _config(spec)
    say("starting the built-in simulator ...")
    with running_simulator(config) as base_url:
        yield Target("sim", base_url, config.model, launch_args=config.to_argv())


def _replica(spec: LaunchSpec, name: str, index: int, folder: Path) -> SimReplica:
    """Replica ``name``; it logs every request it saw
    (``<folder>/replicas/NAME-requests.jsonl``)."""
    folder = folder / "replicas"
    folder.mkdir(parents=True, exist_ok=True)
    return SimReplica(name, _config(spec), request_log=str(folder / f"{name}-requests.jsonl"),
                      log_path=str(folder / f"{name}.log"))


ENGINE = Engine(
    name="sim", title="built-in simulator", metrics="vllm", start_s=3.0, start=_start,
    replica=_replica, model_name=lambda spec: _config(spec).model, check_args=check_args)
