"""locustfiles.config: one RunConfig from which the CLI, the Locust options and the study's
workload section are derived, so they agree by construction (no processes: milliseconds)."""

from __future__ import annotations

from dataclasses import fields, replace

import configargparse
import pytest

from infra.orchestrate import build_parser, locust_common_args, parse_args
from infra.study.spec import StudySpecError, study_from_dict
from locustfiles.config import (
    ConfigError,
    RunConfig,
    add_locust_arguments,
    cli_flag,
    locust_flag,
    study_fields,
)
from locustfiles.context import SettingsError, settings_from_options
from workloads.buckets import DEFAULT_MIX, DEFAULT_THRESHOLDS, BucketSpec
from workloads.builtin_mix import BuiltinMix


def _locust_parser():
    parser = configargparse.ArgumentParser()  # what Locust's parser is
    add_locust_arguments(parser)
    return parser


def test_defaults_come_from_one_place() -> None:
    config = RunConfig()
    assert (config.mix, config.thresholds) == (DEFAULT_MIX, DEFAULT_THRESHOLDS)
    assert config.bucket_spec == BucketSpec()
    assert (config.max_tokens, config.long_max_tokens) == (BuiltinMix().max_tokens,
                                                           BuiltinMix().long_max_tokens)
    assert parse_args([]) == config  # no flag given: every default is RunConfig's
    assert RunConfig.from_locust_options(_locust_parser().parse_args([])) == config


def test_every_cli_field_is_a_flag_and_parses_back() -> None:
    argv = ["--target", "http://127.0.0.1:9", "--users", "7", "--duration", "2m",
            "--mix", "short=0.5,medium=0.5,long=0", "--thresholds", "32,256",
            "--ignore-eos", "false", "--endpoint", "chat", "--quiet", "--spawn-rate", "2.5"]
    config = parse_args(argv)
    assert (config.users, config.duration, config.ignore_eos, config.quiet) == (7, 120.0,
                                                                                False, True)
    assert config.bucket_spec.shares == {"short": 0.5, "medium": 0.5, "long": 0.0}
    flags = {a.dest for a in build_parser()._actions} - {"help"}
    assert flags == {f.name for f in fields(RunConfig) if "run" in f.metadata["option"].cli}


def test_a_renamed_flag_keeps_its_former_name() -> None:
    """--vllm-model / --vllm-python became --target-model / --target-python (llama.cpp takes
    them too); commands written with the former names still run, and mean the same."""
    new = parse_args(["--target", "llama-cpp", "--target-model", "/m/tiny.gguf",
                      "--target-python", "/opt/llama-server"])
    old = parse_args(["--target", "llama-cpp", "--vllm-model", "/m/tiny.gguf",
                      "--vllm-python", "/opt/llama-server"])
    assert new == old and (new.target_model, new.target_python) == ("/m/tiny.gguf",
                                                                    "/opt/llama-server")


def test_workers_read_back_what_the_orchestrator_passed(tmp_path) -> None:
    config = parse_args(["--max-tokens", "9", "--ignore-eos", "false", "--mix", "10/80/10",
                         "--seed", "3", "--model", "m", "--endpoint", "chat"])
    argv = locust_common_args(config, "run-x", tmp_path / "run-x")
    options = _locust_parser().parse_args(argv[argv.index("-f") + 2:])
    worker = settings_from_options(options)
    assert worker == replace(config, run_id="run-x", run_dir=str(tmp_path / "run-x"),
                             # flags only the orchestrator reads stay at their defaults
                             **{f.name: f.default for f in fields(RunConfig)
                                if not f.metadata["option"].locust})


def test_worker_settings_name_the_locust_option() -> None:
    options = _locust_parser().parse_args(["--swarmload-thresholds", "600,64"])
    with pytest.raises(SettingsError, match="--swarmload-thresholds"):
        settings_from_options(options)


def test_study_workload_section_is_derived() -> None:
    keys = {key for _, key in study_fields()}
    assert keys == {"endpoint", "max_tokens", "ignore_eos", "mix", "thresholds",
                    "long_max_tokens", "seed", "folder", "session_history"}
    base = {"name": "s", "configurations": [{"name": "a", "target": "sim"}],
            "load": {"kind": "concurrency", "steps": [1, 2]}}
    spec = study_from_dict({**base, "workload": {"max_tokens": 16, "mix": "20/60/20"}})
    assert spec.workload.run == RunConfig(max_tokens=16, mix="20/60/20")
    with pytest.raises(StudySpecError, match=r"workload.max_tokens: got '16'"):
        study_from_dict({**base, "workload": {"max_tokens": "16"}})  # YAML text, not a number
    with pytest.raises(StudySpecError, match=r"^workers: got 1000"):
        study_from_dict({**base, "workers": 1000})


def test_every_field_has_help_and_names() -> None:
    for f in fields(RunConfig):
        spec = f.metadata["option"]
        assert spec.help and spec.allowed()
        assert cli_flag(f.name).startswith("--") and locust_flag(f.name).startswith(
            "--swarmload-")


def test_replace_validates_too() -> None:
    with pytest.raises(ConfigError) as caught:
        replace(RunConfig(), users=0)
    assert caught.value.field == "users" and "allowed: an integer" in caught.value.problem


def test_header_values_travel_in_the_environment_only(tmp_path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_args(["--header", "X-Tenant: blue-7", "--header", "X-B: 2"])
    argv = locust_common_args(config, "run-x", tmp_path)
    assert not any("blue-7" in a for a in argv)
    env = config.locust_env()
    assert env == {"SWARMLOAD_HEADERS": "X-Tenant: blue-7\nX-B: 2"}
    monkeypatch.setenv("SWARMLOAD_HEADERS", env["SWARMLOAD_HEADERS"])
    options = _locust_parser().parse_args(argv[argv.index("-f") + 2:])
    assert settings_from_options(options).headers == ("X-Tenant: blue-7", "X-B: 2")
