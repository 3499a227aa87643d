"""The stages of ``swarmload run`` (infra/orchestrate.py) on their own: what the plan decides
before anything starts, and what a failed preflight leaves behind."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from infra.orchestrate import (
    InputError,
    RunHooks,
    Target,
    TargetError,
    _check_target,
    _plan,
)
from locustfiles.config import RunConfig


def _config(tmp_path: Path, **fields: object) -> RunConfig:
    return RunConfig(results=str(tmp_path), run_id="r1", quiet=True, **fields)


def test_the_plan_makes_the_run_folder_and_sizes_a_closed_loop_run(tmp_path: Path) -> None:
    session = _plan(_config(tmp_path, users=12, duration=30.0), RunHooks())
    assert session.run_dir == (tmp_path / "r1").resolve() and session.run_dir.is_dir()
    assert (session.users, session.run_time, session.spawn_rate) == (12, 30.0, 12.0)
    assert session.config.prompt_salt  # a fresh salt when none was given, in the config too
    assert (session.launch.kind, session.launch.args, session.launch.traces_endpoint) == (
        "sim", (), None)  # the target is started from the run's one launch spec
    assert session.status == "failed" and not session.interrupted  # until a stage says more
    assert session.config.workers == 2 and session.sized == ""  # a count given: no sizing
    sized = _plan(_config(tmp_path / "auto", users=12, workers=0), RunHooks())  # --workers auto
    assert sized.config.workers == 1 and sized.sized.startswith("--workers auto: 1 (12 users")


def test_the_plan_refuses_a_run_folder_that_exists_and_keeps_it(tmp_path: Path) -> None:
    kept = tmp_path / "r1" / "manifest.json"
    kept.parent.mkdir()
    kept.write_text("{}")
    with pytest.raises(InputError, match="already exists; pick another --run-id"):
        _plan(_config(tmp_path), RunHooks())
    assert kept.read_text() == "{}"
    assert _plan(_config(tmp_path), RunHooks(resume=True)).run_dir == kept.parent.resolve()


@pytest.mark.parametrize("resume", [False, True])
def test_a_target_that_refuses_ends_the_run_before_any_load(tmp_path: Path,
                                                            resume: bool) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: refused
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        session = _plan(_config(tmp_path, target=url), RunHooks(resume=resume))
        with pytest.raises(TargetError):
            _check_target(session, Target(kind="endpoint", base_url=url))
    # a folder made just now goes again (nothing ran); a resumed one keeps what it holds
    assert session.run_dir.exists() == resume


def test_users_on_a_workload_without_a_plan_are_closed_loop_users_replaying_it(
        tmp_path: Path) -> None:
    from workloads.schema import workload_table, write_workload

    folder = tmp_path / "wl"
    write_workload(workload_table(["short"] * 3, [10] * 3, [8] * 3, prompt=["a", "b", "c"]),
                   folder, {})
    session = _plan(_config(tmp_path, workload=str(folder), users=8), RunHooks())
    assert session.open_loop is None and session.users == 8  # 8 Locust users
    assert session.config.closed_replay  # ... sending the workload's requests in turn
    assert session.run_time == session.config.duration  # no drain: nothing scheduled
    with pytest.raises(InputError, match="--plan .*nothing.yaml: no such file"):
        _plan(_config(tmp_path / "other", workload=str(folder),
                      plan=str(tmp_path / "nothing.yaml")), RunHooks())
