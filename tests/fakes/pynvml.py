"""A stand-in for nvidia-ml-py's ``pynvml``: simulated GPUs that can fail, for tests without GPUs.

Two ways to use it:
- in-process, loaded under another name and passed as ``nvml=`` (see ``load_fake_nvml`` in the
  tests), then steered with ``configure()``, ``lose()``, ``inject_xid()``, ``set_util()``;
- in a subprocess, by putting this folder first on ``PYTHONPATH`` so ``import pynvml`` finds it,
  steered by environment variables: ``FAKE_NVML_GPUS`` (count, default 2), ``FAKE_NVML_MISSING=1``
  (no driver library), ``FAKE_NVML_LOSE="<index>@<seconds after init>"``.

Only the names ``collectors.gpu`` uses are here; error codes and structures match pynvml's.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


_state: dict = {}


def configure(gpus: int | None = None, missing: bool | None = None,
              lose: str | None = None) -> None:
    """Reset the simulation (defaults from the FAKE_NVML_* environment variables)."""
    if gpus is None:
        gpus = int(os.environ.get("FAKE_NVML_GPUS", "2"))
    if missing is None:
        missing = os.environ.get("FAKE_NVML_MISSING") == "1"
    lose = os.environ.get("FAKE_NVML_LOSE") if lose is None else lose
    lose_at = {}
    if lose:
        index, after = lose.split("@")
        lose_at[int(index)] = float(after)
    _state.clear()
    _state.update(gpus=gpus, missing=missing, lose_at=lose_at, lost=set(), inits=0,
                  init_at=None, util={i: 0.0 for i in range(gpus)}, xids=[], calls=0)


configure()


def lose(index: int) -> None:
    _state["lost"].add(index)


def inject_xid(index: int, xid: int) -> None:
    _state["xids"].append((index, xid))


def set_util(index: int, pct: float) -> None:
    _state["util"][index] = pct


def _check(index: int | None = None) -> None:
    if not _state["inits"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    _state["calls"] += 1
    if index is None:
        return
    after = _state["lose_at"].get(index)
    if after is not None and time.monotonic() - _state["init_at"] >= after:
        _state["lost"].add(index)
    if index in _state["lost"]:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)


def nvmlInit() -> None:
    if _state["missing"]:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    _state["inits"] += 1
    if _state["init_at"] is None:
        _state["init_at"] = time.monotonic()


def nvmlShutdown() -> None:
    _state["inits"] = max(0, _state["inits"] - 1)


def nvmlSystemGetDriverVersion() -> str:
    _check()
    return "580.00-fake"


def nvmlDeviceGetCount() -> int:
    _check()
    return _state["gpus"]


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    _check(index)
    return _Handle(index)


def nvmlDeviceGetUUID(h: _Handle) -> str:
    _check(h.index)
    return f"GPU-fake-{h.index}"


def nvmlDeviceGetName(h: _Handle) -> bytes:
    _check(h.index)
    return b"Fake H200"  # old pynvml versions return bytes


def nvmlDeviceGetMemoryInfo(h: _Handle) -> SimpleNamespace:
    _check(h.index)
    total = 143_771_287_552
    used = 1_000_000_000 + int(_state["util"][h.index] * 1e9)
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetUtilizationRates(h: _Handle) -> SimpleNamespace:
    _check(h.index)
    util = _state["util"][h.index]
    return SimpleNamespace(gpu=int(util), memory=int(util / 2))


def nvmlDeviceGetPowerUsage(h: _Handle) -> int:
    _check(h.index)
    return int(120_000 + 5_000 * _state["util"][h.index])  # milliwatts


def nvmlDeviceGetTotalEnergyConsumption(h: _Handle) -> int:
    _check(h.index)
    return int((time.monotonic() - _state["init_at"]) * 120_000)  # millijoules


def nvmlDeviceGetTemperature(h: _Handle, sensor: int) -> int:
    _check(h.index)
    return 35


def nvmlDeviceGetClockInfo(h: _Handle, clock: int) -> int:
    _check(h.index)
    return 1980 if clock == 1 else 3201


def nvmlDeviceGetCurrentClocksEventReasons(h: _Handle) -> int:
    _check(h.index)
    return 0x1 if _state["util"][h.index] == 0 else 0x0


def nvmlDeviceGetPcieThroughput(h: _Handle, counter: int) -> int:
    _check(h.index)
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # as in some VMs: the sampler must leave it null


def nvmlDeviceGetTotalEccErrors(h: _Handle, error_type: int, counter_type: int) -> int:
    _check(h.index)
    return 0


def nvmlDeviceGetComputeRunningProcesses(h: _Handle) -> list[SimpleNamespace]:
    _check(h.index)
    return [SimpleNamespace(pid=4242, usedGpuMemory=2**30),
            SimpleNamespace(pid=4343, usedGpuMemory=2**64 - 1)]  # driver will not say


def nvmlSystemGetProcessName(pid: int) -> str:
    _check()
    if pid == 4242:
        return "vllm-engine"
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def nvmlEventSetCreate() -> list:
    _check()
    return []


def nvmlDeviceRegisterEvents(h: _Handle, event_types: int, event_set: list) -> None:
    _check(h.index)
    event_set.append(h.index)


def nvmlEventSetWait_v2(event_set: list, timeout_ms: int) -> SimpleNamespace:
    _check()
    for i, (index, xid) in enumerate(_state["xids"]):
        if index in event_set:
            del _state["xids"][i]
            return SimpleNamespace(device=_Handle(index), eventType=0x8, eventData=xid)
    raise NVMLError(NVML_ERROR_TIMEOUT)


def nvmlEventSetFree(event_set: list) -> None:
    event_set.clear()
