"""Host telemetry through psutil: system CPU and memory, CPU and RSS of watched processes.

Usage::

    sampler = HostSampler(run_dir, run_id, pids=[server_pid], name_patterns=["vllm"],
                          children_of=[launcher_pid])
    sampler.start()
    ...
    sampler.stop()       # table <run_dir>/host/, rows as collectors.schemas.HOST_SCHEMA

Watched processes: the sampler's own process ("self", i.e. the collector), each given pid, every
process whose name or command line matches a regular expression (the sampler itself excluded, since
its own command line names the pattern), and all descendants of each given pid (how a launcher
such as ``vllm serve`` that forks engine processes is followed). Name matches and descendants are
looked up again every ``rescan_interval_s``; a given pid that went away gets one error row.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from typing import Any

import psutil

from collectors.parquet_sink import RollingParquetWriter
from collectors.periodic import RunSampler
from collectors.schemas import HOST_KIND_PROCESS, HOST_KIND_SYSTEM, HOST_SCHEMA, HOST_TABLE


class HostSampler(RunSampler):
    name = "host"

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        run_id: str,
        interval_s: float = 1.0,
        *,
        pids: Iterable[int] = (),
        name_patterns: Iterable[str] = (),
        children_of: Iterable[int] = (),
        include_self: bool = True,
        host: str | None = None,
        rescan_interval_s: float = 2.0,
        flush_interval_s: float = 2.0,
    ) -> None:
        super().__init__(run_dir, run_id, interval_s, host, flush_interval_s)
        self.pids = [int(p) for p in pids]
        self.patterns = [(p, re.compile(p)) for p in name_patterns]
        self.children_of = [int(p) for p in children_of]
        self.include_self = include_self
        self.rescan_interval_s = rescan_interval_s
        self.rows = 0
        self._self_pid = os.getpid()
        self._procs: dict[int, psutil.Process] = {}  # kept so cpu_percent has a previous reading
        self._waited: dict[int, tuple[int, int]] = {}  # pid -> (run delay ns, monotonic ns)
        self._selectors: dict[int, str] = {}  # pid -> why it is watched
        self._gone_reported: set[int] = set()
        self._next_rescan = 0.0
        self._writer: RollingParquetWriter | None = None

    def setup(self) -> bool:
        psutil.cpu_percent(None)  # prime the system-wide counter
        self._writer = self.open_table(HOST_TABLE, HOST_SCHEMA)
        return True

    def teardown(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def _rescan(self) -> dict[int, str]:
        wanted: dict[int, str] = {}
        if self.include_self:
            wanted[self._self_pid] = "self"
        for pid in self.pids:
            wanted.setdefault(pid, "pid")
        if self.patterns:
            for proc in psutil.process_iter(["name", "cmdline"]):
                if proc.pid == self._self_pid:
                    continue
                text = " ".join([proc.info.get("name") or ""] + (proc.info.get("cmdline") or []))
                for raw, pattern in self.patterns:
                    if pattern.search(text):
                        wanted.setdefault(proc.pid, f"name:{raw}")
                        break
        for parent in self.children_of:
            try:
                children = psutil.Process(parent).children(recursive=True)
            except psutil.Error:
                continue
            for child in children:
                wanted.setdefault(child.pid, f"child_of:{parent}")
        return wanted

    def sample(self, wall_ns: int) -> None:
        now = time.monotonic()
        if now >= self._next_rescan:
            self._next_rescan = now + self.rescan_interval_s
            self._selectors = self._rescan()
        mem = psutil.virtual_memory()
        try:
            load1 = os.getloadavg()[0]
        except OSError:
            load1 = None
        base = {"run_id": self.run_id, "host": self.host, "wall_ns": wall_ns}
        rows: list[dict[str, Any]] = [{
            **base, "kind": HOST_KIND_SYSTEM, "sys_cpu_pct": psutil.cpu_percent(None),
            "sys_cpu_count": psutil.cpu_count(), "sys_mem_total_bytes": mem.total,
            "sys_mem_used_bytes": mem.total - mem.available,
            "sys_mem_available_bytes": mem.available, "load1": load1,
        }]
        for pid, selector in list(self._selectors.items()):
            row = {**base, "kind": HOST_KIND_PROCESS, "selector": selector, "pid": pid}
            try:
                proc = self._procs.get(pid)
                first_sight = proc is None
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                with proc.oneshot():
                    cpu = proc.cpu_percent(None)
                    row.update(ppid=proc.ppid(), name=proc.name(), rss_bytes=proc.memory_info().rss,
                               num_threads=proc.num_threads(),
                               cpu_pct=None if first_sight else cpu,
                               wait_pct=self._wait_pct(pid))
            except psutil.Error as exc:
                self._procs.pop(pid, None)
                del self._selectors[pid]
                if pid in self._gone_reported:
                    continue
                self._gone_reported.add(pid)
                row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
        assert self._writer is not None
        self._writer.append_rows(rows)
        self.rows += len(rows)
        self._writer.maybe_flush()

    def _wait_pct(self, pid: int) -> float | None:
        """How much of the time since the last sample ``pid`` was runnable but waited for a
        core, in % (the kernel's run delay, ``/proc/<pid>/schedstat``); None on first sight or
        where the kernel does not say."""
        try:
            with open(f"/proc/{pid}/schedstat", "rb") as f:
                delay_ns = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            return None
        now_ns = time.monotonic_ns()
        last = self._waited.get(pid)
        self._waited[pid] = (delay_ns, now_ns)
        if last is None or now_ns <= last[1]:
            return None
        return 100.0 * (delay_ns - last[0]) / (now_ns - last[1])

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out.update(rows=self.rows, watched=len(self._selectors))
        return out


def pid_listening_on(port: int) -> int | None:
    """The pid of the local process listening on TCP ``port`` (None when none is, or the
    system does not say): how a soak finds the server's process to watch its RSS."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            return conn.pid
    return None
