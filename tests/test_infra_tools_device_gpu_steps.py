"""GPU figures per study step (infra.tools.device.gpu_steps) on a small hand-made study folder:
only samples inside a step's measured window count, power and memory add up over GPUs,
utilisation averages over them, and energy per token follows from power and throughput."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from collectors.schemas import GPU_SCHEMA, GPU_TABLE
from infra.tools.device.gpu_steps import format_step_table, gpu_step_table, utilisation_chart

NS = 1_000_000_000


def _gpu_rows(start_ns: int, seconds: int, util: float, power: float) -> list[dict]:
    rows = []
    for tick in range(seconds * 10):  # 10 Hz, two GPUs
        for index in (0, 1):
            rows.append({"run_id": "r", "host": "h", "wall_ns": start_ns + tick * NS // 10,
                         "gpu_index": index, "util_gpu_pct": util, "power_w": power,
                         "mem_used_bytes": 40 * 10**9, "sm_clock_mhz": 1980})
    return rows


def _study(tmp_path: Path) -> Path:
    steps = []
    for step, (users, util, tok_s) in enumerate([(8, 40.0, 1000.0), (64, 90.0, 8000.0)], 1):
        run = tmp_path / "cfg" / f"step-{step}"
        (run / GPU_TABLE).mkdir(parents=True)
        start = 1_000 * NS * step
        # Idle samples before and after the window must not count.
        rows = (_gpu_rows(start - 5 * NS, 5, 0.0, 100.0) + _gpu_rows(start, 10, util, 300.0)
                + _gpu_rows(start + 10 * NS, 5, 0.0, 100.0))
        pq.write_table(pa.Table.from_pylist(rows, schema=GPU_SCHEMA),
                       run / GPU_TABLE / "h-1-000001.parquet")
        steps.append({"config": "cfg", "step": step, "bucket": "all", "offered_load": users,
                      "achieved_req_per_s": tok_s / 100, "output_tok_per_s": tok_s,
                      "ttft_p50_s": 0.05, "ttft_p95_s": 0.08, "tpot_p95_s": 0.004,
                      "error_rate": 0.0, "sustainable": step == 1,
                      "kv_cache_usage_mean": 0.01, "num_requests_running_mean": users,
                      "num_requests_waiting_mean": 0.0, "window_start_ns": start,
                      "window_end_ns": start + 10 * NS, "run_dir": f"cfg/step-{step}"})
    (tmp_path / "rollup").mkdir()
    pd.DataFrame(steps).to_parquet(tmp_path / "rollup" / "steps.parquet")
    return tmp_path


def test_gpu_figures_come_from_the_window_only(tmp_path):
    table = gpu_step_table(_study(tmp_path))
    assert list(table["offered_load"]) == [8, 64]
    assert list(table["gpu_samples"]) == [100, 100]
    assert list(table["gpu_util_mean_pct"]) == [40.0, 90.0]
    assert list(table["power_mean_w"]) == [600.0, 600.0]  # two GPUs at 300 W
    assert list(table["mem_used_gb"]) == [80.0, 80.0]
    assert list(table["joules_per_output_token"]) == [0.6, 0.075]
    text = format_step_table(table)
    assert "| cfg | 64 |" in text and "**missed**" in text
    spec = utilisation_chart(table).to_dict()
    assert spec["hconcat"][0]["title"].startswith("GPU utilisation")
