"""GPU telemetry through NVML (nvidia-ml-py's ``pynvml``): a probe for the manifest and a sampler.

Usage::

    info = probe_gpus()          # {"available": False, "reason": "NVML init failed: ...", ...}
    sampler = GpuSampler(run_dir, run_id, interval_s=0.1)
    sampler.start()              # False, and nothing written, where there is no GPU
    ...
    sampler.stop()               # flushes; tables <run_dir>/gpu/ and <run_dir>/gpu_processes/

Rows follow ``collectors.schemas.GPU_SCHEMA`` (one per GPU per tick) and ``GPU_PROCESS_SCHEMA``.
A GPU whose read fails gets a row with ``error`` set while the others go on being sampled; after
a failure it is retried with a growing back-off (up to ``max_retry_s``), each attempt writing one
more error row, so a lost GPU is visible in the data without flooding it. Fields a device does not
support are left null and not asked for again.

``nvml`` may be any module-like object with pynvml's names (tests pass a fake one); by default
``pynvml`` is imported when first needed. This module imports only the standard library, pyarrow
and pynvml, so it runs on a GPU machine that has nothing else.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from collectors.parquet_sink import RollingParquetWriter
from collectors.periodic import RunSampler
from collectors.schemas import (
    GPU_PROCESS_SCHEMA,
    GPU_PROCESSES_TABLE,
    GPU_SCHEMA,
    GPU_TABLE,
)

log = logging.getLogger(__name__)

# NVML return codes meaning "this device will never answer this": stop asking, leave it null.
_NOT_SUPPORTED_CODES = frozenset({3, 4, 13})  # NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND
_NVML_VALUE_NOT_AVAILABLE = 2**64 - 1  # what usedGpuMemory holds when the driver will not say
_XID_EVENT_TYPE = 0x8  # nvmlEventTypeXidCriticalError
_MAX_EVENTS_PER_TICK = 64


def load_nvml() -> Any:
    """Import pynvml (package nvidia-ml-py). Raises ImportError when it is not installed."""
    import pynvml

    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def probe_gpus(nvml: Any = None) -> dict[str, Any]:
    """What the manifest's ``gpu`` key holds: whether NVML sees GPUs, and which.

    Never raises: a machine without pynvml, without the driver library or without GPUs gets
    ``available: False`` and the reason in words.
    """
    result: dict[str, Any] = {"available": False, "reason": None, "driver": None, "gpus": []}
    if nvml is None:
        try:
            nvml = load_nvml()
        except ImportError as exc:
            result["reason"] = f"nvidia-ml-py (pynvml) is not installed: {exc}"
            return result
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        result["reason"] = f"NVML init failed: {exc}"
        return result
    try:
        try:
            result["driver"] = _text(nvml.nvmlSystemGetDriverVersion())
        except Exception as exc:  # noqa: BLE001
            log.debug("driver version unreadable: %s", exc)
        count = int(nvml.nvmlDeviceGetCount())
        for index in range(count):
            entry: dict[str, Any] = {"index": index, "uuid": None, "name": None,
                                     "mem_total_bytes": None}
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                entry["uuid"] = _text(nvml.nvmlDeviceGetUUID(handle))
                entry["name"] = _text(nvml.nvmlDeviceGetName(handle))
                entry["mem_total_bytes"] = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            except Exception as exc:  # noqa: BLE001 - report the GPU, say what failed
                entry["error"] = str(exc)
            result["gpus"].append(entry)
        if count == 0:
            result["reason"] = "NVML reports no GPU"
        else:
            result["available"] = True
    except Exception as exc:  # noqa: BLE001
        result["reason"] = f"NVML query failed: {exc}"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001, S110 - nothing to do about a failing shutdown
            pass
    return result


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str | None
    name: str | None
    mem_total: int | None
    unsupported: set[str] = field(default_factory=set)
    failures: int = 0
    retry_at: float = 0.0
    pending_xids: list[int] = field(default_factory=list)


class GpuSampler(RunSampler):
    """Samples every GPU NVML sees, each ``interval_s`` (1 s default; 10 Hz works)."""

    name = "gpu"

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        run_id: str,
        interval_s: float = 1.0,
        *,
        host: str | None = None,
        nvml: Any = None,
        slow_interval_s: float = 1.0,
        flush_interval_s: float = 2.0,
        max_retry_s: float = 5.0,
        pcie: bool = True,
        ecc: bool = True,
        xid: bool = True,
        processes: bool = True,
    ) -> None:
        super().__init__(run_dir, run_id, interval_s, host, flush_interval_s)
        self.slow_interval_s = max(slow_interval_s, interval_s)
        self.max_retry_s = max_retry_s
        self.read_pcie, self.read_ecc, self.read_xid = pcie, ecc, xid
        self.read_processes = processes
        self.reason: str | None = None  # why the sampler stays idle, when it does
        self.gpu_rows = 0
        self.error_rows = 0
        self.process_rows = 0
        self.xid_events = 0
        self.xid_supported = False
        self._nvml = nvml
        self._gpus: list[_Gpu] = []
        self._event_set: Any = None
        self._next_slow = 0.0
        self._process_names: dict[int, str | None] = {}
        self._writer: RollingParquetWriter | None = None
        self._process_writer: RollingParquetWriter | None = None
        self._nvml_up = False

    # -- setup / teardown -----------------------------------------------------------------------
    def setup(self) -> bool:
        if self._nvml is None:
            try:
                self._nvml = load_nvml()
            except ImportError as exc:
                self.reason = f"nvidia-ml-py (pynvml) is not installed: {exc}"
                return False
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001
            self.reason = f"NVML init failed: {exc}"
            log.info("gpu sampler idle: %s", self.reason)
            return False
        self._nvml_up = True
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:  # noqa: BLE001
            self.reason = f"NVML query failed: {exc}"
            self._shutdown_nvml()
            return False
        for index in range(count):
            gpu = _Gpu(index=index, handle=None, uuid=None, name=None, mem_total=None)
            try:
                gpu.handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpu.uuid = _text(nvml.nvmlDeviceGetUUID(gpu.handle))
                gpu.name = _text(nvml.nvmlDeviceGetName(gpu.handle))
            except Exception as exc:  # noqa: BLE001 - sample it anyway; its rows will say why
                log.warning("gpu %d: identity unreadable: %s", index, exc)
            self._gpus.append(gpu)
        if not self._gpus:
            self.reason = "NVML reports no GPU"
            self._shutdown_nvml()
            return False
        if self.read_xid:
            self._register_xid_events()
        self._writer = self.open_table(GPU_TABLE, GPU_SCHEMA)
        if self.read_processes:
            self._process_writer = self.open_table(GPU_PROCESSES_TABLE, GPU_PROCESS_SCHEMA)
        return True

    def teardown(self) -> None:
        for writer in (self._writer, self._process_writer):
            if writer is not None:
                writer.close()
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except Exception:  # noqa: BLE001, S110
                pass
            self._event_set = None
        self._shutdown_nvml()

    def _shutdown_nvml(self) -> None:
        if self._nvml_up:
            self._nvml_up = False
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001, S110
                pass

    def _register_xid_events(self) -> None:
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except Exception as exc:  # noqa: BLE001
            log.info("XID events unavailable: %s", exc)
            return
        registered = 0
        for gpu in self._gpus:
            try:
                nvml.nvmlDeviceRegisterEvents(gpu.handle, _XID_EVENT_TYPE, self._event_set)
                registered += 1
            except Exception as exc:  # noqa: BLE001 - some devices/VMs offer no events
                log.info("gpu %d: XID events unavailable: %s", gpu.index, exc)
        self.xid_supported = registered > 0
        if not registered:
            try:
                nvml.nvmlEventSetFree(self._event_set)
            except Exception:  # noqa: BLE001, S110
                pass
            self._event_set = None

    # -- sampling -------------------------------------------------------------------------------
    def sample(self, wall_ns: int) -> None:
        now = time.monotonic()
        slow = now >= self._next_slow
        if slow:
            self._next_slow = now + self.slow_interval_s
        if self._event_set is not None:
            self._drain_xid_events()
        rows: list[dict[str, Any]] = []
        process_rows: list[dict[str, Any]] = []
        for gpu in self._gpus:
            if gpu.failures and now < gpu.retry_at:
                continue
            started = time.perf_counter()
            try:
                if gpu.failures:
                    gpu.handle = self._nvml.nvmlDeviceGetHandleByIndex(gpu.index)
                row = self._read_gpu(gpu, wall_ns, slow)
                if slow and self._process_writer is not None:
                    process_rows.extend(self._read_processes(gpu, wall_ns))
                gpu.failures = 0
            except Exception as exc:  # noqa: BLE001 - one GPU failing must not stop the others
                gpu.failures += 1
                backoff = min(self.interval_s * 2 ** (gpu.failures - 1), self.max_retry_s)
                gpu.retry_at = now + backoff
                row = self._base_row(gpu, wall_ns)
                row["error"] = f"{type(exc).__name__}: {exc}"
                self.error_rows += 1
                if gpu.failures == 1:
                    log.warning("gpu %d: read failed: %s", gpu.index, row["error"])
            row["read_s"] = time.perf_counter() - started
            rows.append(row)
        assert self._writer is not None
        self._writer.append_rows(rows)
        self.gpu_rows += len(rows)
        self._writer.maybe_flush()
        if self._process_writer is not None:
            if process_rows:
                self._process_writer.append_rows(process_rows)
                self.process_rows += len(process_rows)
            self._process_writer.maybe_flush()

    def _base_row(self, gpu: _Gpu, wall_ns: int) -> dict[str, Any]:
        return {"run_id": self.run_id, "host": self.host, "wall_ns": wall_ns,
                "gpu_index": gpu.index, "gpu_uuid": gpu.uuid, "gpu_name": gpu.name}

    def _optional(self, gpu: _Gpu, key: str, read: Any) -> Any:
        """Call ``read()``; None (and never again) when the device does not support it."""
        if key in gpu.unsupported:
            return None
        try:
            return read()
        except Exception as exc:  # noqa: BLE001 - only "not supported" is swallowed
            if _error_code(exc) in _NOT_SUPPORTED_CODES:
                gpu.unsupported.add(key)
                log.info("gpu %d: %s not supported: %s", gpu.index, key, exc)
                return None
            raise

    def _read_gpu(self, gpu: _Gpu, wall_ns: int, slow: bool) -> dict[str, Any]:
        nvml, h = self._nvml, gpu.handle
        row = self._base_row(gpu, wall_ns)
        util = self._optional(gpu, "util", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            row["util_gpu_pct"] = float(util.gpu)
            row["util_mem_pct"] = float(util.memory)
        mem = self._optional(gpu, "mem", lambda: nvml.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            row["mem_used_bytes"] = int(mem.used)
            row["mem_total_bytes"] = int(mem.total)
        power_mw = self._optional(gpu, "power", lambda: nvml.nvmlDeviceGetPowerUsage(h))
        row["power_w"] = None if power_mw is None else power_mw / 1000.0
        temp = self._optional(gpu, "temp", lambda: nvml.nvmlDeviceGetTemperature(h, 0))
        row["temperature_c"] = None if temp is None else float(temp)
        row["sm_clock_mhz"] = self._optional(
            gpu, "sm_clock", lambda: int(nvml.nvmlDeviceGetClockInfo(h, 1)))
        row["mem_clock_mhz"] = self._optional(
            gpu, "mem_clock", lambda: int(nvml.nvmlDeviceGetClockInfo(h, 2)))
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        if reasons is not None:
            row["throttle_reasons"] = self._optional(gpu, "throttle", lambda: int(reasons(h)))
        if slow:
            # Cumulative, so reading it only on slow ticks loses nothing; on the H200 (driver
            # 580) this one call cost 3.9 ms of CPU, 100 times any other field.
            row["energy_mj"] = self._optional(
                gpu, "energy", lambda: int(nvml.nvmlDeviceGetTotalEnergyConsumption(h)))
        if slow and self.read_pcie:
            row["pcie_tx_kb_s"] = self._optional(
                gpu, "pcie", lambda: int(nvml.nvmlDeviceGetPcieThroughput(h, 0)))
            if "pcie" not in gpu.unsupported:
                row["pcie_rx_kb_s"] = int(nvml.nvmlDeviceGetPcieThroughput(h, 1))
        if slow and self.read_ecc:
            row["ecc_corrected_volatile"] = self._optional(
                gpu, "ecc", lambda: int(nvml.nvmlDeviceGetTotalEccErrors(h, 0, 0)))
            if "ecc" not in gpu.unsupported:
                row["ecc_uncorrected_volatile"] = int(nvml.nvmlDeviceGetTotalEccErrors(h, 1, 0))
        if gpu.pending_xids:
            row["xid_events"], gpu.pending_xids = gpu.pending_xids, []
        return row

    def _read_processes(self, gpu: _Gpu, wall_ns: int) -> list[dict[str, Any]]:
        nvml = self._nvml
        procs = self._optional(
            gpu, "processes", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(gpu.handle))
        rows = []
        for proc in procs or ():
            pid = int(proc.pid)
            used = getattr(proc, "usedGpuMemory", None)
            if used is not None and int(used) >= _NVML_VALUE_NOT_AVAILABLE:
                used = None
            rows.append({"run_id": self.run_id, "host": self.host, "wall_ns": wall_ns,
                         "gpu_index": gpu.index, "gpu_uuid": gpu.uuid, "pid": pid,
                         "process_name": self._process_name(pid), "kind": "compute",
                         "used_mem_bytes": None if used is None else int(used)})
        return rows

    def _process_name(self, pid: int) -> str | None:
        if pid not in self._process_names:
            try:
                self._process_names[pid] = _text(self._nvml.nvmlSystemGetProcessName(pid))
            except Exception:  # noqa: BLE001 - a pid from another namespace has no name here
                self._process_names[pid] = None
        return self._process_names[pid]

    def _drain_xid_events(self) -> None:
        nvml = self._nvml
        by_uuid = {gpu.uuid: gpu for gpu in self._gpus}
        for _ in range(_MAX_EVENTS_PER_TICK):
            try:
                event = nvml.nvmlEventSetWait_v2(self._event_set, 0)
            except Exception:  # noqa: BLE001 - Timeout: no event pending
                return
            try:
                gpu = by_uuid.get(_text(nvml.nvmlDeviceGetUUID(event.device)))
            except Exception:  # noqa: BLE001
                gpu = None
            xid = int(event.eventData)
            self.xid_events += 1
            log.warning("XID %d on gpu %s", xid, gpu.index if gpu else "?")
            for target in [gpu] if gpu else self._gpus:
                target.pending_xids.append(xid)

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out.update(gpus=len(self._gpus), gpu_rows=self.gpu_rows, error_rows=self.error_rows,
                   process_rows=self.process_rows, xid_events=self.xid_events,
                   xid_supported=self.xid_supported, reason=self.reason,
                   unsupported={g.index: sorted(g.unsupported) for g in self._gpus
                                if g.unsupported})
        return out
