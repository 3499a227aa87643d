"""The generator-CPU check: a worker at a full core is reported, an idle one is not."""

from __future__ import annotations

import pandas as pd

from collectors.schemas import HOST_KIND_PROCESS
from dashboards.analysis.generator_cpu import generator_cpu


def _rows(pid: int, selector: str, cpu: list[float]) -> list[dict]:
    return [{"kind": HOST_KIND_PROCESS, "pid": pid, "selector": selector, "cpu_pct": c,
             "wall_ns": i} for i, c in enumerate(cpu)]


def test_busy_worker_is_flagged_and_master_and_server_are_told_apart() -> None:
    host = pd.DataFrame(
        _rows(1, "name:run-x.*--worker", [0.0, 99.0, 98.0, 97.0, 40.0])
        + _rows(2, "name:run-x.*--master(?!-)", [0.0, 5.0, 6.0, 5.0, 5.0])
        + _rows(3, "pid", [0.0, 100.0, 100.0, 100.0, 100.0])  # the server: not the generator
    )
    table = generator_cpu(host).set_index("pid")
    assert set(table.index) == {1, 2}
    assert table.loc[1, "role"] == "worker" and table.loc[1, "busy_share"] == 0.75
    assert table.loc[2, "role"] == "master" and table.loc[2, "busy_share"] == 0.0
