"""--workers auto: the count from the load's streamed events, capped by the cores, said in one
line; the flag and the study key take the word."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from infra.orchestrate import parse_args
from infra.workers_auto import WORKER_EVENTS_PER_S, size_workers
from locustfiles.config import AUTO_WORKERS, ConfigError, RunConfig
from workloads.arrivals import parse_plan_spec, save_plan
from workloads.schema import PLAN_FILE, workload_table, write_workload


def test_closed_loop_users_are_sized_by_a_fast_servers_pace_and_capped_by_the_cores() -> None:
    auto = replace(RunConfig(), workers=AUTO_WORKERS, users=32)
    config, line = size_workers(auto, cores=2)  # the demo: 3,200 events/s on 2 cores
    assert config.workers == 2
    assert line.startswith("--workers auto: 2 (32 users x 100 tok/s per stream = 3,200 "
                           "events/s; one worker times 2,000 events/s exactly)")
    config, line = size_workers(replace(auto, users=8), cores=16)
    assert config.workers == 1 and "800 events/s" in line
    config, line = size_workers(replace(auto, users=1000), cores=16)
    assert config.workers == 16 and "capped at 16 by the host's 16 cores" in line
    config, line = size_workers(replace(auto, users=1000, pin_workers=True), cores=16)
    assert config.workers == 15  # a core kept for the master, the collectors, the target
    given = replace(auto, workers=3)
    assert size_workers(given, cores=2) == (given, "")


def test_an_open_loop_plan_is_sized_by_its_busiest_window(tmp_path: Path) -> None:
    folder = tmp_path / "wl"
    write_workload(workload_table(["short"] * 4, [10] * 4, [100, 200, 300, 400]), folder, {})
    save_plan(parse_plan_spec("poisson:rate_rps=50"), folder / PLAN_FILE)
    auto = replace(RunConfig(), workers=AUTO_WORKERS, workload=str(folder), duration=20.0)
    config, line = size_workers(auto, cores=64)
    # about 50 req/s x 250 tokens = 12,500 events/s at the peak: 7 workers of 2,000 or so
    assert 6 <= config.workers <= 8, line
    assert "req/s over 5 s x 250 output tokens" in line
    events = float(line.split(" = ")[1].split(" events/s")[0].replace(",", ""))
    assert config.workers == -(-events // WORKER_EVENTS_PER_S)


def test_the_flag_takes_auto_and_says_so_when_it_is_neither(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["--workers", "auto"]).workers == AUTO_WORKERS
    assert parse_args(["--workers", "3"]).workers == 3
    with pytest.raises(SystemExit):
        parse_args(["--workers", "many"])
    assert capsys.readouterr().err.strip().endswith(
        "--workers: got 'many'; allowed: an integer from 1 to 512, or auto")
    with pytest.raises(ConfigError, match="other hosts"):
        replace(RunConfig(), workers=AUTO_WORKERS, local_workers=1)



def test_a_study_sizes_its_workers_unless_its_file_gives_a_count() -> None:
    from infra.study.spec import study_from_dict

    base = {"name": "s", "configurations": [{"name": "a", "target": "sim"}],
            "load": {"kind": "rate", "steps": [2, 4]}}
    assert study_from_dict(base).run.workers == AUTO_WORKERS  # the study default
    assert study_from_dict({**base, "workers": "auto"}).run.workers == AUTO_WORKERS
    assert study_from_dict({**base, "workers": 3}).run.workers == 3
