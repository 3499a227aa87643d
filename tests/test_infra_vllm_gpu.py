"""Target `vllm` (infra.targets.vllm_gpu) without a GPU: a stand-in interpreter serves the simulator
on the port and model name `vllm serve` was given, so start, readiness, the launch spec
in the manifests and the stop of the whole process group run on real processes in seconds. Also the
Qwen2-1.5B-shaped tokenizer's padding (infra.targets.shaped_model)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from infra.study.spec import StudySpecError, study_from_dict
from infra.targets.vllm_cpu import VllmStartError, group_members
from infra.targets.vllm_gpu import SERVE_MODULE, VllmTarget

REPO_ROOT = Path(__file__).resolve().parent.parent
# `python -m vllm.entrypoints.cli.main serve MODEL --served-model-name N --port P ...`: the stand-in
# checks the entry point it was given, then serves the simulator; a child process stands for the
# engine core that `stop()` must end with the API server.
STAND_IN = """
[ "$1 $2 $3" = "-m {module} serve" ] || {{ echo "unexpected entry: $*"; exit 9; }}
echo "model folder: $4"
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port=$2 ;;
    --served-model-name) model=$2 ;;
  esac
  shift
done
echo "engine env: VLLM_USE_FLASHINFER_SAMPLER=$VLLM_USE_FLASHINFER_SAMPLER"
sleep 300 &
exec {python} -m infra.targets.simulator --port "$port" --model "$model"
"""


@pytest.fixture()
def stand_in(tmp_path: Path) -> Path:
    script = tmp_path / "python-with-vllm"
    script.write_text("#!/bin/sh\n" + STAND_IN.format(module=SERVE_MODULE, python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "qwen2-1.5b"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def test_serves_streams_and_stops_the_whole_group(stand_in, model_dir, tmp_path):
    target = VllmTarget(model_dir, python=stand_in, extra_args=["--api-server-count=4"],
                        env={"VLLM_USE_FLASHINFER_SAMPLER": "0"}, log_path=tmp_path / "s.log")
    with target:
        assert target.ready_after_s is not None  # a streamed completion came back
        assert len(group_members(target.pid)) >= 2  # server + the stand-in "engine"
        spec = target.launch_spec
        assert spec["command"][:5] == [str(stand_in), "-m", SERVE_MODULE, "serve",
                                       str(model_dir.resolve())]
        assert spec["args"][-1] == "--api-server-count=4"
        assert spec["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
        assert spec["served_model_name"] == "qwen2-1.5b"
        assert "--max-model-len" not in spec["args"]  # left to the flags
    assert group_members(target.pid) == []
    log = (tmp_path / "s.log").read_text()
    assert "engine env: VLLM_USE_FLASHINFER_SAMPLER=0" in log


def test_missing_model_folder_or_interpreter_is_said_plainly(tmp_path, model_dir):
    with pytest.raises(VllmStartError, match="model folder"):
        VllmTarget(tmp_path / "nope")
    target = VllmTarget(model_dir, python="no-such-python-3.12")
    with pytest.raises(VllmStartError, match="not on the PATH"):
        target.start()
    assert target.pid is None


def test_run_records_the_launch_spec_in_the_manifest(stand_in, model_dir, tmp_path):
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "run", "--target", "vllm", "--target-model",
         str(model_dir), "--target-python", str(stand_in), "--target-arg=--api-server-count=4",
         "--workers", "1", "--users", "2", "--duration", "3", "--max-tokens", "4",
         "--no-collectors", "--results", str(results)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = [p for p in results.iterdir() if p.is_dir()]
    target = json.loads((run_dir / "manifest.json").read_text())["target"]
    assert target["kind"] == "vllm" and target["model"] == "qwen2-1.5b"
    assert target["launch"]["command"][1:4] == ["-m", SERVE_MODULE, "serve"]
    assert target["launch"]["args"][-1] == "--api-server-count=4"
    assert target["pid"] and group_members(target["pid"]) == []


def _study(**config):
    return {"name": "s", "configurations": [{"name": "a", **config}],
            "load": {"kind": "concurrency", "steps": [1]}}


def test_study_configuration_of_target_vllm():
    spec = study_from_dict(_study(target="vllm", model="/m", python="python3",
                                  env={"VLLM_USE_FLASHINFER_SAMPLER": 0}, args=["--seed=1"]))
    launch = spec.configurations[0].launch()
    assert (launch.kind, launch.model, launch.python, launch.env_vars, launch.args) == (
        "vllm", "/m", "python3", {"VLLM_USE_FLASHINFER_SAMPLER": "0"}, ("--seed=1",))
    with pytest.raises(StudySpecError, match=r"configurations\[0\]\.model: target vllm needs"):
        study_from_dict(_study(target="vllm"))
    with pytest.raises(StudySpecError, match=r"configurations\[0\]\.model: only .* target: vllm"):
        study_from_dict(_study(target="sim", model="/m"))
    # 0 turns NVML off (RunConfig.gpu_interval, the one definition); below 0 is refused by name
    with pytest.raises(StudySpecError, match="gpu_interval_s"):
        study_from_dict({**_study(target="sim"), "gpu_interval_s": -1})


def test_a_study_of_target_vllm_starts_it_from_its_configuration(stand_in, model_dir, tmp_path,
                                                                   run_swarmload):
    """The launch spec of a study configuration reaches `vllm serve`: model folder, interpreter,
    environment and arguments, recorded in study.json and each step's manifest."""
    (tmp_path / "study.yaml").write_text(
        "name: g\nconfigurations:\n"
        f"  - {{name: a, target: vllm, model: {model_dir}, python: {stand_in},\n"
        "     env: {VLLM_USE_FLASHINFER_SAMPLER: '0'}, args: [--api-server-count=1]}\n"
        "workload: {mix: 100/0/0, max_tokens: 8}\n"
        "load: {kind: concurrency, steps: [1]}\n"
        "step_duration_s: 4\nwarmup_s: 1\ncooldown_s: 1\nworkers: 1\n")
    done = run_swarmload("study", "run", str(tmp_path / "study.yaml"), "--results",
                         str(tmp_path / "results"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (study,) = [p for p in (tmp_path / "results").iterdir() if p.is_dir()]
    config = json.loads((study / "study.json").read_text())["configurations"][0]
    assert (config["model"], config["python"], config["env"]) == (
        str(model_dir), str(stand_in), {"VLLM_USE_FLASHINFER_SAMPLER": "0"})
    (manifest,) = study.glob("a/*/manifest.json")
    launch = json.loads(manifest.read_text())["study"]["launch"]
    assert launch["kind"] == "vllm" and launch["args"][-1] == "--api-server-count=1"
    assert launch["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert launch["command"][1:4] == ["-m", SERVE_MODULE, "serve"]


def test_each_vllm_replica_gets_gpus_of_its_own(model_dir):
    from infra.targets.engine import LaunchSpec
    from infra.targets.vllm_gpu import ENGINE

    spec = LaunchSpec(kind="vllm", model=str(model_dir), replicas=2,
                      args=("--tensor-parallel-size", "2"), env=(("A", "1"),))
    servers = [ENGINE.replica(spec, f"r{i}", i, model_dir).make(None) for i in range(2)]
    assert [s.launch_env["CUDA_VISIBLE_DEVICES"] for s in servers] == ["0,1", "2,3"]
    assert all(s.launch_env["A"] == "1" for s in servers)
    single = ENGINE.replica(LaunchSpec(kind="vllm", model=str(model_dir)), "r0", 0, model_dir)
    # one server alone keeps the machine's own GPUs: nothing set for it
    assert "CUDA_VISIBLE_DEVICES" not in single.make(None).launch_spec["env"] or os.environ.get(
        "CUDA_VISIBLE_DEVICES")


def test_padded_vocabulary_is_a_valid_bpe_whose_every_token_decodes_to_text():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from infra.targets.shaped_model import pad_vocabulary

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50, trainer)
    padded = Tokenizer.from_str(pad_vocabulary(tokenizer.to_str(), 5000))
    assert padded.get_vocab_size() == 5000
    for token_id in range(tokenizer.get_vocab_size(), 5000, 97):
        text = padded.decode([token_id])
        assert len(text) >= 2 and text.isprintable()
    text = "the lazy fox jumps over the quick brown dog"
    assert padded.decode(padded.encode(text).ids) == text


@pytest.mark.parametrize(("shape", "published_billions"),
                         [("qwen2-1.5b", 1.54), ("qwen2.5-7b", 7.62)])
def test_each_shape_has_the_published_models_parameter_count(shape, published_billions):
    # A shape that drifts from its model's config would load the GPU like some other model.
    from infra.targets.shaped_model import SHAPES, parameter_count

    assert parameter_count(SHAPES[shape]) / 1e9 == pytest.approx(published_billions, rel=0.01)


@pytest.mark.skipif(shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists(),
                    reason="haproxy not installed (make test installs it)")
def test_replicas_of_vllm_get_their_own_gpus_behind_haproxy(stand_in, model_dir, tmp_path):
    """--replicas 2 of target vllm with --tensor-parallel-size 2 (2xTP2 on four GPUs): each
    replica's launch spec in the manifest, with its own CUDA_VISIBLE_DEVICES; HAProxy leastconn
    with option httpchk GET /health in front; every record names the replica that answered."""
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "run", "--target", "vllm", "--replicas", "2",
         "--balance", "haproxy-leastconn", "--target-model", str(model_dir), "--target-python",
         str(stand_in), "--target-arg=--tensor-parallel-size=2", "--workers", "1", "--users",
         "4", "--duration", "3", "--max-tokens", "4", "--no-collectors", "--results",
         str(results)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = [p for p in results.iterdir() if p.is_dir()]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    replicas = manifest["target"]["replicas"]
    assert [r["name"] for r in replicas] == ["r0", "r1"]
    assert [r["launch"]["env"]["CUDA_VISIBLE_DEVICES"] for r in replicas] == ["0,1", "2,3"]
    for replica in replicas:
        assert replica["launch"]["command"][1:4] == ["-m", SERVE_MODULE, "serve"]
        assert "--tensor-parallel-size=2" in replica["launch"]["args"]
    assert manifest["balancer"]["balance"] == "leastconn"
    assert manifest["balancer"]["health_check"]["path"] == "/health"
    config = Path(manifest["balancer"]["config"]).read_text()
    assert "option httpchk GET /health" in config and "balance leastconn" in config
    from collectors.run_folder import load_requests

    records = load_requests(run_dir)
    # a closed-loop request in flight at the run's end is cancelled before any answer
    assert set(records[records["outcome"] == "ok"]["replica"]) == {"r0", "r1"}
