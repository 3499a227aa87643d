"""infra.tools.bench.lag_steps: each step of a bench run, told apart by the gaps in the planned
times, with its late sends counted."""

from __future__ import annotations

from pathlib import Path

from collectors.parquet_sink import RollingParquetWriter
from collectors.schemas import REQUEST_SCHEMA
from infra.tools.bench.lag_steps import describe


def test_each_step_counts_its_late_sends(tmp_path: Path) -> None:
    base = 1_800_000_000_000_000_000
    records = []
    # two steps of 100 sends 10 ms apart, 2 s between them; the second has 3 late sends
    for step, late_ms in ((0, []), (1, [0.3, 0.7, 2.5])):
        for i in range(100):
            planned = base + step * 3_000_000_000 + i * 10_000_000
            lag_s = (late_ms[i] if i < len(late_ms) else 0.01) / 1e3
            records.append({"run_id": "r", "worker_id": "w", "request_id": f"{step}-{i}",
                            "outcome": "ok", "scheduled_wall_ns": planned,
                            "sent_wall_ns": planned + int(lag_s * 1e9),
                            "schedule_lag_s": lag_s})
    run_dir = tmp_path / "swarmload-x"
    writer = RollingParquetWriter(run_dir / "requests", REQUEST_SCHEMA, prefix="master")
    writer.append_rows(records)
    writer.close()
    first, second = describe(run_dir)
    assert "n=100" in first and ">0.2ms 0 >0.5ms 0 >2ms 0;" in first
    assert "step at   3.00 s" in second and ">0.2ms 3 >0.5ms 2 >2ms 1;" in second
    assert "max 2.50 ms" in second
