"""GPU sampler: the no-GPU path on this machine, and NVML failures through a fake NVML module."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

from collectors.gpu import GpuSampler, probe_gpus
from collectors.schemas import GPU_PROCESSES_TABLE, GPU_SCHEMA, GPU_TABLE

FAKE_NVML = Path(__file__).parent / "fakes" / "pynvml.py"


def load_fake_nvml(**config) -> ModuleType:
    """A fresh fake pynvml module (its own state), configured like ``configure(**config)``."""
    spec = importlib.util.spec_from_file_location(f"fake_pynvml_{time.monotonic_ns()}", FAKE_NVML)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.configure(**{"gpus": 2, "missing": False, "lose": "", **config})
    return module


def read_table(run_dir: Path, table: str = GPU_TABLE) -> pd.DataFrame:
    return pd.read_parquet(run_dir / table)


def run_sampler(sampler: GpuSampler, seconds: float, during=None) -> None:
    assert sampler.start(), sampler.reason
    try:
        if during is not None:
            during()
        time.sleep(seconds)
    finally:
        sampler.stop()


def test_no_gpu_here_probe_says_why_and_sampler_writes_nothing(tmp_path):
    probe = probe_gpus()
    if probe["available"]:
        pytest.skip("this machine has a GPU; the no-GPU path is covered by the fake below")
    assert probe["gpus"] == [] and probe["reason"], probe
    sampler = GpuSampler(tmp_path, "run-1", interval_s=0.05)
    assert sampler.start() is False
    assert sampler.reason == probe["reason"]
    sampler.stop()  # must be harmless after a start that did nothing
    assert list(tmp_path.iterdir()) == []
    assert sampler.stats()["samples"] == 0


def test_missing_driver_library_is_reported_not_raised(tmp_path):
    nvml = load_fake_nvml(missing=True)
    probe = probe_gpus(nvml)
    assert probe == {"available": False, "reason": "NVML init failed: NVML Shared Library "
                     "Not Found", "driver": None, "gpus": []}
    sampler = GpuSampler(tmp_path, "run-1", nvml=nvml)
    assert not sampler.start()
    assert "Library Not Found" in sampler.reason
    assert not (tmp_path / GPU_TABLE).exists()


def test_probe_lists_gpus_and_releases_nvml():
    nvml = load_fake_nvml(gpus=2)
    probe = probe_gpus(nvml)
    assert probe["available"] and probe["reason"] is None and probe["driver"] == "580.00-fake"
    assert [g["uuid"] for g in probe["gpus"]] == ["GPU-fake-0", "GPU-fake-1"]
    assert probe["gpus"][0]["name"] == "Fake H200"  # bytes from old pynvml decoded
    assert probe["gpus"][0]["mem_total_bytes"] == 143_771_287_552
    assert nvml._state["inits"] == 0  # nvmlShutdown matched nvmlInit


def test_rows_carry_the_schema_fields(tmp_path):
    nvml = load_fake_nvml(gpus=2)
    nvml.set_util(0, 97)
    sampler = GpuSampler(tmp_path, "run-7", interval_s=0.05, host="gpu-host", nvml=nvml,
                         slow_interval_s=5.0)
    run_sampler(sampler, 0.8)
    df = read_table(tmp_path)
    assert set(df.columns) == set(GPU_SCHEMA.names)
    assert (df["run_id"] == "run-7").all() and (df["host"] == "gpu-host").all()
    assert df["error"].isna().all()
    gpu0 = df[df["gpu_index"] == 0]
    assert len(gpu0) >= 3  # 16 ticks; a loaded 2-core machine misses some
    assert (gpu0["util_gpu_pct"] == 97).all() and (gpu0["power_w"] > 600).all()
    # both GPUs of one tick share its timestamp, so they join on one axis
    assert set(df.groupby("wall_ns")["gpu_index"].nunique()) == {2}
    # slow fields: read on the first tick only (slow interval 5 s); PCIe is NotSupported on the
    # fake, so null, not an error
    assert df["ecc_corrected_volatile"].notna().sum() == 2
    assert df["energy_mj"].notna().sum() == 2
    assert df["pcie_tx_kb_s"].isna().all()
    assert sampler.stats()["unsupported"] == {0: ["pcie"], 1: ["pcie"]}
    procs = read_table(tmp_path, GPU_PROCESSES_TABLE)
    procs = procs[procs["gpu_index"] == 0]
    first = procs[procs["wall_ns"] == procs["wall_ns"].min()].set_index("pid")
    assert first.loc[4242, "process_name"] == "vllm-engine"
    assert first.loc[4242, "used_mem_bytes"] == 2**30
    assert pd.isna(first.loc[4343, "used_mem_bytes"])  # NVML's "not available" sentinel


def test_gpu_lost_mid_run_gets_error_rows_and_the_other_goes_on(tmp_path):
    nvml = load_fake_nvml(gpus=2, lose="1@0.3")
    sampler = GpuSampler(tmp_path, "run-1", interval_s=0.05, nvml=nvml, max_retry_s=0.4)
    run_sampler(sampler, 1.5)
    df = read_table(tmp_path)
    lost = df[df["gpu_index"] == 1]
    errors = lost[lost["error"].notna()]
    assert len(errors) >= 2
    assert errors["error"].str.contains("GPU is lost").all()
    assert lost[lost["error"].isna()]["wall_ns"].max() < errors["wall_ns"].min()  # good, then lost
    # back-off: far fewer error rows than ticks after the loss (~24 ticks at 20 Hz)
    assert len(errors) <= 8
    assert errors["gpu_uuid"].eq("GPU-fake-1").all()  # the row still says which GPU
    healthy = df[df["gpu_index"] == 0]
    assert healthy["error"].isna().all()
    after_loss = healthy[healthy["wall_ns"] > errors["wall_ns"].min()]
    assert len(after_loss) >= 5  # ~24 ticks at 20 Hz; a loaded machine misses some
    stats = sampler.stats()
    assert stats["error_rows"] == len(errors) and stats["sample_errors"] == 0


def test_gpu_lost_from_the_start_does_not_stop_sampling(tmp_path):
    nvml = load_fake_nvml(gpus=2)
    nvml.lose(0)
    sampler = GpuSampler(tmp_path, "run-1", interval_s=0.05, nvml=nvml)
    run_sampler(sampler, 0.4)
    df = read_table(tmp_path)
    assert df[df["gpu_index"] == 0]["error"].notna().all()
    assert df[df["gpu_index"] == 0]["gpu_uuid"].isna().all()  # identity was never readable
    assert df[df["gpu_index"] == 1]["error"].isna().sum() >= 3


def test_xid_events_land_on_the_gpu_that_raised_them(tmp_path):
    nvml = load_fake_nvml(gpus=2)
    sampler = GpuSampler(tmp_path, "run-1", interval_s=0.05, nvml=nvml)
    run_sampler(sampler, 0.4, during=lambda: (time.sleep(0.1), nvml.inject_xid(1, 79)))
    df = read_table(tmp_path)
    with_xid = df[df["xid_events"].map(lambda v: v is not None and len(v) > 0)]
    assert list(with_xid["gpu_index"]) == [1]
    assert list(with_xid["xid_events"].iloc[0]) == [79]
    assert sampler.stats()["xid_events"] == 1


def test_stop_flushes_and_costs_are_counted(tmp_path):
    nvml = load_fake_nvml(gpus=1)
    sampler = GpuSampler(tmp_path, "run-1", interval_s=0.02, nvml=nvml, flush_interval_s=60)
    run_sampler(sampler, 0.3)
    # nothing would have been flushed within 60 s: rows on disk come from stop()
    stats = sampler.stats()
    assert len(read_table(tmp_path)) == stats["gpu_rows"] == stats["samples"] >= 3
    assert stats["cpu_s_per_sample"] > 0
    assert nvml._state["inits"] == 0
