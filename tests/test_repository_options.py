"""Every option of a swarmload run is defined once, in RunConfig: the parsers of ``run``,
``master``, ``soak``, ``worker`` and ``study run`` and the study file's RunConfig keys are
derived from it.

The count below is of option definitions (argparse ``add_argument`` calls) in the modules that
build those parsers and the study file, outside locustfiles/config.py's derivation: zero. A
flag added by hand to one of them fails here; add a RunConfig field instead (``cli=`` names
the commands).
"""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

from infra.orchestrate import build_parser
from infra.study.spec import StudySpec, WorkloadSpec
from locustfiles.config import COMMANDS, RunConfig, add_cli_arguments, study_fields

REPO_ROOT = Path(__file__).resolve().parent.parent
# the modules of the run, master, soak, worker and study run commands and of the study file
RUN_MODULES = ("infra/orchestrate.py", "infra/roles.py", "infra/soak.py", "infra/study/spec.py",
               "infra/study/runner.py", "locustfiles/config.py", "locustfiles/context.py",
               "locustfiles/llm_user.py")
DERIVING = {"add_cli_arguments", "add_locust_arguments"}  # config.py: the derivation itself


def option_definitions(path: Path, root: Path = REPO_ROOT) -> list[str]:
    """``file:line`` of every ``add_argument`` call outside :data:`DERIVING`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in DERIVING:
            inside |= {id(n) for n in ast.walk(node)}
    return [f"{path.relative_to(root)}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument" and id(node) not in inside]


def test_no_option_is_defined_outside_runconfig() -> None:
    found = [where for name in RUN_MODULES for where in option_definitions(REPO_ROOT / name)]
    assert found == []


def test_the_count_sees_a_flag_added_by_hand(tmp_path: Path) -> None:
    source = (REPO_ROOT / "infra" / "soak.py").read_text(encoding="utf-8")
    copy = tmp_path / "soak.py"
    copy.write_text(source + "\n\ndef _p(g):\n    g.add_argument('--window')\n")
    assert option_definitions(copy, tmp_path) == [f"soak.py:{len(source.splitlines()) + 4}"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_of_a_command_is_a_runconfig_field(command: str) -> None:
    parser = build_parser(command)
    dests = {a.dest for a in parser._actions} - {"help"}
    assert dests == {f.name for f in fields(RunConfig) if command in f.metadata["option"].cli}
    assert dests  # each command has flags


def test_a_commands_own_default_comes_from_the_field() -> None:
    master = build_parser("master").parse_args([])
    run = build_parser("run").parse_args([])
    soak = build_parser("soak").parse_args([])
    assert (master.master_bind, master.master_port, master.worker_wait_s) == (
        "0.0.0.0", 5557, 120.0)
    assert not hasattr(run, "master_bind") and run.duration == RunConfig().duration
    assert soak.duration == 3600.0 and soak.window == RunConfig().window


def test_the_study_file_repeats_no_runconfig_field() -> None:
    top = {key for _, key in study_fields("study")}
    assert top & {f.name for f in fields(StudySpec)} == set()  # the top level
    assert {key for _, key in study_fields()} & {f.name for f in fields(WorkloadSpec)} == set()
    assert top == {"workers", "pin_workers", "drain_s", "gpu_interval_s", "server_traces",
                   "step_duration_s"}
    assert {key for _, key in study_fields("endpoint")} == {
        "api_key_env", "api_key_file", "ca_bundle", "insecure", "headers", "stream"}


def test_add_cli_arguments_refuses_an_unknown_command() -> None:
    import argparse

    with pytest.raises(ValueError, match="unknown command"):
        add_cli_arguments(argparse.ArgumentParser(), "serve")
