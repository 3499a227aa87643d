"""The target ``llama-cpp`` (infra/targets/llama_cpp.py) against a stand-in for ``llama-server``:
the flags it is given, its start through a run and a study, its stop as a group, where it finds
its program. The real llama-server: test_e2e_llama_cpp.py."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from infra.study.spec import study_from_dict
from infra.targets import llama_cpp
from infra.targets.launched import group_members
from infra.targets.llama_cpp import PROGRAM_ENV_VAR, LlamaCppError, LlamaServer
from infra.targets.tiny_gguf import TINY_GGUF

# `llama-server --model FILE --alias NAME --host H --port P --metrics ...`: the stand-in checks
# the flags swarmload must give, then serves the simulator under the alias; a child stands for
# a helper process that stop() must end with the server.
STAND_IN = """
case " $* " in *" --metrics "*) ;; *) echo "no --metrics: $*"; exit 9 ;; esac
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port=$2 ;;
    --alias) alias=$2 ;;
    --model) echo "model file: $2" ;;
  esac
  shift
done
sleep 300 &
exec {python} -m infra.targets.simulator --port "$port" --model "$alias"
"""


@pytest.fixture()
def program(tmp_path: Path) -> Path:
    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\n" + STAND_IN.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.fixture()
def gguf(tmp_path: Path) -> Path:
    model = tmp_path / "tiny-q8.gguf"
    model.write_bytes(b"GGUF")
    return model


def test_serves_under_its_alias_and_stops_the_whole_group(program, gguf, tmp_path):
    server = LlamaServer(gguf, program=str(program), extra_args=["--parallel=4"],
                         log_path=tmp_path / "s.log")
    with server:
        assert server.model_name == "tiny-q8" and server.ready_after_s is not None
        assert len(group_members(server.pid)) >= 2
        record = server.launch_record()
        # its parser takes a flag's value as the next argument, never after "="
        assert record["args"][-3:] == ["--metrics", "--parallel", "4"]
        assert record["model"] == str(gguf.resolve())
    assert group_members(server.pid) == []
    assert f"model file: {gguf.resolve()}" in (tmp_path / "s.log").read_text()


def test_a_missing_binary_or_model_says_what_to_do(gguf, program, tmp_path, monkeypatch):
    monkeypatch.delenv(PROGRAM_ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(llama_cpp, "BUILT_DIR", tmp_path / "built")
    with pytest.raises(LlamaCppError, match=r"not on the PATH: run `make llama-server`"):
        LlamaServer(gguf).start()
    with pytest.raises(LlamaCppError, match="model file .* does not exist"):
        LlamaServer(tmp_path / "none.gguf")
    # the one `make llama-server` built, the newest of its versions
    for age, version in enumerate(("0.3.9", "0.3.10")):
        built = tmp_path / "built" / version / "llama-server"
        built.parent.mkdir(parents=True)
        shutil.copy(program, built)
        os.utime(built, (1e9 + age, 1e9 + age))
    assert llama_cpp.resolve_program(None) == tmp_path / "built" / "0.3.10" / "llama-server"


def test_a_run_and_a_study_start_it_from_the_launch_spec(program, gguf, tmp_path, run_swarmload,
                                                        monkeypatch):
    monkeypatch.setenv(PROGRAM_ENV_VAR, str(program))
    done = run_swarmload("run", "--target", "llama-cpp", "--target-model", str(gguf),
                         "--target-arg=--parallel=2", "--users", "2", "--workers", "1",
                         "--duration", "3", "--results", str(tmp_path / "runs"), "--quiet")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    target = json.loads((run_dir / "manifest.json").read_text())["target"]
    assert (target["kind"], target["model"]) == ("llama-cpp", "tiny-q8")
    assert target["launch"]["args"][-2:] == ["--parallel", "2"]

    spec = study_from_dict({"name": "s", "configurations": [
        {"name": "a", "target": "llama-cpp", "model": str(gguf), "python": str(program)}],
        "load": {"kind": "concurrency", "steps": [1]}})
    assert spec.configurations[0].launch().python == str(program)
    # without a model: the tiny one, served under its file's name
    tiny = study_from_dict({"name": "s", "configurations": [{"name": "a", "target": "llama-cpp"}],
                            "load": {"kind": "concurrency", "steps": [1]}})
    launch = tiny.configurations[0].launch()
    assert launch.model is None and llama_cpp.ENGINE.model_name(launch) == TINY_GGUF.stem
