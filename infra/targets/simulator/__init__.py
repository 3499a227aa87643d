"""swarmload's built-in LLM server simulator: OpenAI-compatible, vLLM-shaped, with a real knee.

Serve it with ``swarmload sim [flags]`` (or ``python -m infra.targets.simulator``); start it from
Python code with :func:`running_simulator`, which yields the base URL of a subprocess. Three latency
models (see :class:`SimulatorConfig`):

- continuous batching (default): one engine loop, ``max_num_seqs`` running, FIFO waiting queue,
  step time ``decode_base_s + decode_per_seq_s * batch`` plus prefill of admitted prompts, so
  throughput saturates near ``max_num_seqs / (step time * output tokens)`` requests/s;
- fixed timing (``--fixed-ttft-s``, ``--fixed-itl-s``): every request gets exactly that TTFT and
  inter-token gap whatever the load (a missing one counts as 0); ``--fixed-itl-per-seq-s``
  makes the gap grow with the streams in flight while TTFT stays flat;
- zero latency (``--zero-latency``): tokens as fast as the server can write them.

Faults: ``--error-rate`` (HTTP 500) and ``--cut-rate`` (stream closed before ``[DONE]``), seeded by
``--seed`` like the early-stop lengths of requests without ``ignore_eos``; and every outcome class
on demand, in turn, with a per-request log (``--fault-cycle``, ``--fault-log``: ``faults``).

Modules: ``config`` (dataclass + CLI), ``protocol`` (wire format, token counting), ``engine``
(timing), ``metrics`` (Prometheus), ``server`` (aiohttp routes), ``launcher`` (subprocess),
``faults`` (faults on demand), ``probe`` (a load client to measure the simulator itself).
"""

from __future__ import annotations

from infra.targets.simulator.launcher import (
    SimulatorProcess,
    SimulatorStartError,
    running_simulator,
)
from infra.targets.simulator.settings import SimulatorConfig, SimulatorConfigError

__all__ = [
    "SimulatorConfig",
    "SimulatorConfigError",
    "SimulatorProcess",
    "SimulatorStartError",
    "main",
    "running_simulator",
]


def main(argv: list[str] | None = None) -> int:
    """``swarmload sim``: serve until interrupted. Imports aiohttp only when called."""
    # late: aiohttp's server only when serving
    from infra.targets.simulator.server import main as serve_main  # noqa: PLC0415

    return serve_main(argv)
