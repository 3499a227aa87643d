"""Proof run of the GPU sampler on a real GPU machine (the lent H200); not collected by pytest.

Run from the repository root on the GPU machine (it needs only pynvml, pyarrow and torch)::

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 tests/device/h200_gpu_proof.py --out "$OUT"

What it does, in one go:
1. times each NVML call the sampler makes (mean wall and CPU per call);
2. starts two real ``collectors.standalone`` processes, GPU only: one at 10 Hz, one at 1 Hz;
3. after ``--idle-before`` s runs a torch bf16 matmul loop in a separate process for ``--load-s``
   s, holding ~``--hog-gb`` GB of device memory, then leaves the GPU idle;
4. every 5 s reads each collector's RSS and CPU time from /proc (the sampler's own cost);
5. stops both collectors with SIGTERM after ``--total-s`` s and writes to ``--out``:
   gpu_10hz.parquet, gpu_processes_10hz.parquet, gpu_1hz.parquet, proof.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def _load(seconds: float, hog_gb: float) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    hog = torch.ones(int(hog_gb * 1e9), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    start_ns = time.time_ns()
    end = time.monotonic() + seconds
    matmuls = 0
    while time.monotonic() < end:
        for _ in range(50):
            a @ b
        torch.cuda.synchronize()
        matmuls += 50
    end_ns = time.time_ns()
    tflops = matmuls * 2 * 8192**3 / ((end_ns - start_ns) / 1e9) / 1e12
    del hog
    print(json.dumps({"load_start_wall_ns": start_ns, "load_end_wall_ns": end_ns,
                      "matmuls": matmuls, "tflops": round(tflops, 1)}), flush=True)


def _nvml_call_costs() -> dict:
    import pynvml as n

    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    calls = {
        "utilization": lambda: n.nvmlDeviceGetUtilizationRates(h),
        "memory": lambda: n.nvmlDeviceGetMemoryInfo(h),
        "power": lambda: n.nvmlDeviceGetPowerUsage(h),
        "energy": lambda: n.nvmlDeviceGetTotalEnergyConsumption(h),
        "temperature": lambda: n.nvmlDeviceGetTemperature(h, 0),
        "sm_clock": lambda: n.nvmlDeviceGetClockInfo(h, 1),
        "throttle": lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h),
        "ecc": lambda: n.nvmlDeviceGetTotalEccErrors(h, 0, 0),
        "processes": lambda: n.nvmlDeviceGetComputeRunningProcesses(h),
        "pcie_tx": lambda: n.nvmlDeviceGetPcieThroughput(h, 0),
    }
    out = {}
    for name, call in calls.items():
        reps = 10 if name.startswith("pcie") else 200
        try:
            call()
            w0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(reps):
                call()
            out[name] = {"wall_us": round((time.perf_counter() - w0) / reps * 1e6, 1),
                         "cpu_us": round((time.thread_time() - c0) / reps * 1e6, 1)}
        except Exception as exc:  # noqa: BLE001
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        es = n.nvmlEventSetCreate()
        n.nvmlDeviceRegisterEvents(h, 0x8, es)
        out["xid_events"] = "registered"
        n.nvmlEventSetFree(es)
    except Exception as exc:  # noqa: BLE001
        out["xid_events"] = f"{type(exc).__name__}: {exc}"
    out["driver"] = str(n.nvmlSystemGetDriverVersion())
    n.nvmlShutdown()
    return out


def _proc_figures(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = int(next(line.split()[1] for line in status.splitlines()
                      if line.startswith("VmRSS:")))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {"rss_bytes": rss_kb * 1024, "cpu_s": (int(fields[11]) + int(fields[12])) / ticks}


def _start_collector(run_dir: Path, interval: float) -> tuple[subprocess.Popen, float]:
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "collectors.standalone", "--run-dir",
                             str(run_dir), "--run-id", "h200-proof", "--gpu-interval",
                             str(interval), "--host-interval", "0"])
    status = run_dir / f"telemetry-{socket.gethostname()}.json"
    while time.monotonic() - t0 < 30:
        if status.exists() and json.loads(status.read_text()).get("status") == "running":
            break
        time.sleep(0.02)
    return proc, time.monotonic() - t0


def _summary(path: Path, load: dict) -> dict:
    import pyarrow.parquet as pq

    df = pq.read_table(path).to_pandas()
    ok = df[df["error"].isna()]
    start, end = load["load_start_wall_ns"], load["load_end_wall_ns"]
    phases = {
        "before": ok[ok.wall_ns < start - 1_000_000_000],
        "during": ok[(ok.wall_ns > start + 1_000_000_000) & (ok.wall_ns < end - 1_000_000_000)],
        "after": ok[ok.wall_ns > end + 3_000_000_000],
    }
    out = {"rows": len(df), "error_rows": int(df["error"].notna().sum())}
    for name, part in phases.items():
        out[name] = {"rows": len(part), "util_gpu_pct_mean": round(part.util_gpu_pct.mean(), 1),
                     "util_gpu_pct_min": float(part.util_gpu_pct.min()),
                     "power_w_mean": round(part.power_w.mean(), 1),
                     "mem_used_gb_max": round(part.mem_used_bytes.max() / 1e9, 2),
                     "sm_clock_mhz_mean": round(part.sm_clock_mhz.mean()),
                     "temperature_c_max": float(part.temperature_c.max())}
    gaps = df.wall_ns.sort_values().diff().dropna() / 1e9
    out["interval_s"] = {"median": round(gaps.median(), 4), "p99": round(gaps.quantile(0.99), 4),
                         "max": round(gaps.max(), 4)}
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", nargs="?", default="proof")
    p.add_argument("--out", type=Path, default=Path("/tmp/proof-out"))
    p.add_argument("--idle-before", type=float, default=15)
    p.add_argument("--load-s", type=float, default=30)
    p.add_argument("--hog-gb", type=float, default=40)
    p.add_argument("--total-s", type=float, default=240)
    args = p.parse_args()
    if args.mode == "load":
        _load(args.load_s, args.hog_gb)
        return 0

    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    args.out.mkdir(parents=True, exist_ok=True)
    try:
        costs = _nvml_call_costs()
    except Exception as exc:  # noqa: BLE001 - keep going: the collectors' rows say the rest
        costs = {"error": f"{type(exc).__name__}: {exc}"}
    result: dict = {"nvml_call_costs": costs}
    print("nvml call costs:", json.dumps(result["nvml_call_costs"]), flush=True)
    work = Path("/tmp/h200-proof")
    dirs = {"10hz": work / "c10", "1hz": work / "c1"}
    t_start = time.monotonic()
    collectors = {}
    for name, interval in (("10hz", 0.1), ("1hz", 1.0)):
        proc, ready_s = _start_collector(dirs[name], interval)
        collectors[name] = proc
        result[f"collector_{name}_ready_s"] = round(ready_s, 3)
    series: dict[str, list] = {name: [] for name in collectors}
    load_proc = None
    load_out = None
    next_probe = time.monotonic()
    while time.monotonic() - t_start < args.total_s:
        now = time.monotonic()
        if load_proc is None and now - t_start >= args.idle_before:
            load_proc = subprocess.Popen([sys.executable, __file__, "load", "--load-s",
                                          str(args.load_s), "--hog-gb", str(args.hog_gb)],
                                         stdout=subprocess.PIPE, text=True)
        if load_proc is not None and load_out is None and load_proc.poll() is not None:
            lines = load_proc.stdout.read().strip().splitlines()
            load_out = json.loads(lines[-1]) if load_proc.returncode == 0 else {"failed": lines}
            print("load:", load_out, flush=True)
        if now >= next_probe:
            next_probe += 5
            for name, proc in collectors.items():
                series[name].append({"t_s": round(now - t_start, 1), **_proc_figures(proc.pid)})
        time.sleep(0.2)
    for name, proc in collectors.items():
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        result[f"collector_{name}_stop"] = {"rc": rc, "stop_s": round(time.monotonic() - t0, 3)}
    result["load"] = load_out
    result["rss_cpu_series"] = series
    for name, run_dir in dirs.items():
        result[f"telemetry_{name}"] = json.loads(
            next(run_dir.glob("telemetry-*.json")).read_text())
        table = ds.dataset(run_dir / "gpu", format="parquet").to_table()
        pq.write_table(table, args.out / f"gpu_{name}.parquet", compression="zstd")
        if load_out and "load_start_wall_ns" in load_out:
            result[f"summary_{name}"] = _summary(args.out / f"gpu_{name}.parquet", load_out)
    procs = ds.dataset(dirs["10hz"] / "gpu_processes", format="parquet").to_table()
    pq.write_table(procs, args.out / "gpu_processes_10hz.parquet", compression="zstd")
    (args.out / "proof.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: v for k, v in result.items() if k.startswith(("summary", "collector"))},
                     indent=1), flush=True)
    for name, points in series.items():
        # From the second reading on: start-up (imports, NVML init) is not per-sample cost.
        first, last = points[1], points[-1]
        interval = 0.1 if name == "10hz" else 1.0
        samples = (last["t_s"] - first["t_s"]) / interval
        per_sample_ms = (last["cpu_s"] - first["cpu_s"]) / samples * 1e3
        result[f"cost_{name}"] = {"process_cpu_ms_per_sample": round(per_sample_ms, 3),
                                  "rss_mib_first": round(first["rss_bytes"] / 2**20, 1),
                                  "rss_mib_last": round(last["rss_bytes"] / 2**20, 1),
                                  "from_s": first["t_s"], "to_s": last["t_s"]}
        print(f"{name}: rss {first['rss_bytes'] / 2**20:.1f} MiB at {first['t_s']} s -> "
              f"{last['rss_bytes'] / 2**20:.1f} MiB at {last['t_s']} s; process cpu "
              f"{per_sample_ms:.3f} ms per sample (whole process, /proc)", flush=True)
    (args.out / "proof.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
