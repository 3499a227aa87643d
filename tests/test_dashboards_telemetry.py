"""Reading telemetry and joining it with requests, on real H200 samples (tests/fixtures).

The fixture is NVML at 10 Hz on the lent H200 while a torch matmul loop ran for 30 s
(tests/fixtures/h200_gpu_samples.json says how it was taken): idle, ~100% busy, idle.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collectors import run_folder
from collectors.schemas import GPU_SCHEMA, OUTCOME_HTTP_5XX, OUTCOME_OK
from dashboards.analysis import telemetry

FIXTURES = Path(__file__).parent / "fixtures"
NS = 1_000_000_000


@pytest.fixture(scope="module")
def h200() -> dict:
    meta = json.loads((FIXTURES / "h200_gpu_samples.json").read_text())
    return {"start": meta["load_start_wall_ns"], "end": meta["load_end_wall_ns"], "meta": meta}


@pytest.fixture()
def run_dir(tmp_path) -> Path:
    (tmp_path / "gpu").mkdir()
    shutil.copy(FIXTURES / "h200_gpu_samples.parquet", tmp_path / "gpu" / "h200-000001.parquet")
    return tmp_path


def _requests(times_ns, ttft_s, host="loadgen", outcome=OUTCOME_OK) -> pd.DataFrame:
    n = len(times_ns)
    return pd.DataFrame({
        "worker_id": [f"{host}:100:0"] * n, "outcome": [outcome] * n,
        "sent_wall_ns": np.asarray(times_ns, dtype=np.int64),
        "ttft_s": np.asarray(ttft_s, dtype=float), "e2e_s": np.asarray(ttft_s, dtype=float) * 4,
    })


def test_reader_loads_the_real_h200_samples(run_dir, h200):
    gpu = run_folder.load_gpu(run_dir)
    assert list(gpu.columns) == GPU_SCHEMA.names
    assert len(gpu) == h200["meta"]["rows"] and gpu["error"].isna().all()
    assert set(gpu["gpu_name"]) == {"NVIDIA H200"}
    assert gpu["mem_total_bytes"].iloc[0] > 140e9
    gaps = np.diff(np.sort(gpu["wall_ns"].to_numpy())) / NS
    assert np.median(gaps) == pytest.approx(0.1, abs=0.005)  # sampled at 10 Hz
    assert run_folder.load_server_metrics(run_dir).empty  # absent table: empty, not an error


def test_per_window_shows_the_load_and_the_idle_around_it(run_dir, h200):
    view = telemetry.per_window(None, run_folder.load_gpu(run_dir), freq="5s")
    starts = view.index.asi8
    ends = starts + 5 * NS
    during = view[(starts >= h200["start"] + NS) & (ends <= h200["end"])]
    before = view[ends <= h200["start"]]
    after = view[starts >= h200["end"] + 2 * NS]
    assert len(during) >= 4 and len(before) >= 1 and len(after) >= 2
    assert (during["gpu_util_pct"] > 95).all()
    assert (during["gpu_power_w"] > 500).all() and (during["gpu_mem_used_bytes"] > 40e9).all()
    assert (before["gpu_util_pct"] < 5).all() and (after["gpu_util_pct"] < 5).all()
    assert (before["gpu_power_w"] < 150).all() and (after["gpu_power_w"] < 150).all()
    assert (after["gpu_mem_used_bytes"] < 2e9).all()  # memory followed the load back down


def _steps(h200) -> list[dict]:
    s, e = h200["start"], h200["end"]
    return [{"step": "idle", "start_wall_ns": s - 10 * NS, "end_wall_ns": s},
            {"step": "load", "start_wall_ns": s, "end_wall_ns": e},
            {"step": "cool", "start_wall_ns": e + 2 * NS, "end_wall_ns": e + 18 * NS},
            {"step": "later", "start_wall_ns": e + 60 * NS, "end_wall_ns": e + 70 * NS}]


def test_per_step_puts_p95_ttft_next_to_gpu_figures(run_dir, h200):
    s, e = h200["start"], h200["end"]
    rng = np.random.default_rng(7)
    load_times = rng.integers(s, e, 200)
    load_ttft = rng.uniform(0.2, 0.4, 200)
    idle_times = rng.integers(s - 10 * NS, s, 20)
    requests = pd.concat([
        _requests(load_times, load_ttft), _requests(idle_times, np.full(20, 0.05)),
        # failed requests count as requests and errors, never in the percentiles
        _requests(rng.integers(s, e, 10), np.full(10, 99.0), outcome=OUTCOME_HTTP_5XX),
    ], ignore_index=True)
    view = telemetry.per_step(requests, _steps(h200), run_folder.load_gpu(run_dir))
    assert list(view.index) == ["idle", "load", "cool", "later"]
    load, idle = view.loc["load"], view.loc["idle"]
    assert (load["requests"], load["ok"], load["errors"]) == (210, 200, 10)
    assert load["ttft_p95_s"] == pytest.approx(np.percentile(load_ttft, 95))
    assert idle["requests"] == 20 and idle["ttft_p95_s"] == pytest.approx(0.05)
    assert load["gpu_util_pct"] > 95 and idle["gpu_util_pct"] < 5
    assert view.loc["cool", "gpu_util_pct"] < 5 and view.loc["cool", "requests"] == 0
    assert view.loc["later", "gpu_count"] == 0 and np.isnan(view.loc["later", "gpu_util_pct"])


def _server_rows(times_ns, running_per_engine, kv, preemptions) -> pd.DataFrame:
    rows = []
    for t, running, usage, preempt in zip(times_ns, running_per_engine, kv, preemptions,
                                          strict=True):
        base = {"run_id": "r", "host": "loadgen", "wall_ns": int(t),
                "target": "http://127.0.0.1:8000/metrics", "error": None}
        for engine in ("0", "1"):
            labels = json.dumps({"engine": engine, "model_name": "m"}, sort_keys=True)
            rows.append({**base, "sample": "vllm:num_requests_running", "labels": labels,
                         "value": float(running)})
            rows.append({**base, "sample": "vllm:kv_cache_usage_perc", "labels": labels,
                         "value": usage})
            rows.append({**base, "sample": "vllm:num_preemptions_total", "labels": labels,
                         "value": float(preempt)})
    rows.append({"run_id": "r", "host": "loadgen", "wall_ns": int(times_ns[0]) + 1,
                 "target": "http://127.0.0.1:8000/metrics", "error": "ConnectError: refused"})
    return pd.DataFrame(rows)


def test_server_metrics_join_per_step(run_dir, h200):
    s, e = h200["start"], h200["end"]
    times = np.arange(s - 10 * NS, e + 18 * NS, NS // 2)
    in_load = (times >= s) & (times < e)
    running = np.where(in_load, 6, 0)  # per engine: 12 in all
    kv = np.where(in_load, 0.5, 0.0)
    preempt = np.cumsum(in_load)  # one more preemption per scrape during load, per engine
    server = _server_rows(times, running, kv, preempt)
    view = telemetry.per_step(None, _steps(h200), run_folder.load_gpu(run_dir), server)
    assert view.loc["load", "num_requests_running"] == pytest.approx(12)
    assert view.loc["load", "num_requests_running_max"] == 12
    assert view.loc["idle", "num_requests_running"] == 0
    assert view.loc["cool", "num_requests_running"] == 0
    assert view.loc["load", "kv_cache_usage"] == pytest.approx(0.5)
    assert view.loc["idle", "kv_cache_usage"] == 0
    # 60 scrapes in the 30 s step: increase within the step, both engines summed
    assert view.loc["load", "preemptions"] == pytest.approx(2 * (in_load.sum() - 1), abs=2)
    assert view.loc["cool", "preemptions"] == 0


def test_clock_offsets_from_the_manifest_move_rows_onto_the_reference_axis(h200):
    s = h200["start"]
    # Host "w2" runs 5 s fast: a request it stamped s + 5 s was really sent at s.
    requests = pd.concat([_requests([s + 5 * NS], [0.1], host="w2"),
                          _requests([s + 1], [0.3], host="w1")], ignore_index=True)
    manifest = {"hosts": [{"host": "w2", "role": "worker", "clock_offset_s": 5.0},
                          {"host": "w1", "role": "worker"}]}
    assert telemetry.clock_offsets(manifest) == {"w2": 5.0}
    steps = [{"step": "a", "start_wall_ns": s, "end_wall_ns": s + NS},
             {"step": "b", "start_wall_ns": s + 5 * NS, "end_wall_ns": s + 6 * NS}]
    aligned = telemetry.per_step(requests, steps, manifest=manifest)
    assert list(aligned["requests"]) == [2, 0]
    naive = telemetry.per_step(requests, steps)
    assert list(naive["requests"]) == [1, 1]


def test_gpu_error_rows_are_left_out_of_the_figures():
    gpu = pd.DataFrame({
        "host": ["h", "h", "h"], "gpu_index": [0, 1, 1], "wall_ns": [10 * NS] * 3,
        "util_gpu_pct": [80.0, None, 40.0], "power_w": [300.0, None, 200.0],
        "mem_used_bytes": [1e9, None, 2e9], "error": [None, "NVMLError: GPU is lost", None]})
    view = telemetry.per_window(None, gpu, freq="10s")
    assert view["gpu_util_pct"].iloc[0] == pytest.approx(60)
    assert view["gpu_power_w"].iloc[0] == pytest.approx(500)
    assert view["gpu_count"].iloc[0] == 2


def test_nothing_to_join_gives_an_empty_frame():
    assert telemetry.per_window(None, None, None).empty
    empty_requests = pd.DataFrame(columns=["worker_id", "outcome", "sent_wall_ns", "ttft_s",
                                           "e2e_s"])
    assert telemetry.per_window(empty_requests, freq="1min").empty


def test_windows_since_puts_requests_and_telemetry_on_the_run_time_axis(run_dir, h200):
    from collectors.parquet_sink import RollingParquetWriter
    from collectors.schemas import REQUEST_SCHEMA, SERVER_METRICS_SCHEMA

    s, e = h200["start"], h200["end"]
    times = np.arange(s, e, NS // 4)
    requests = _requests(times, np.full(len(times), 0.05))
    sink = RollingParquetWriter(run_dir / "requests", REQUEST_SCHEMA)
    sink.append_rows([{**row, "run_id": "r", "request_id": str(i)}
                      for i, row in enumerate(requests.to_dict("records"))])
    sink.close()
    scrapes = np.arange(s - 10 * NS, e + 10 * NS, NS // 2)
    server = _server_rows(scrapes, np.where((scrapes >= s) & (scrapes < e), 3, 0),
                          np.zeros(len(scrapes)), np.zeros(len(scrapes)))
    server_sink = RollingParquetWriter(run_dir / "server_metrics", SERVER_METRICS_SCHEMA)
    server_sink.append_rows(server.astype(object).where(server.notna(), None).to_dict("records"))
    server_sink.close()

    view = telemetry.windows_since(run_dir, s, freq="5s")
    during = view[(view["t_s"] >= 0) & (view["t_s"] + 5 <= (e - s) / NS)]
    after = view[view["t_s"] >= (e - s) / NS + 1]
    assert len(during) >= 3
    assert np.allclose(during["ttft_p95_ms"], 50.0)
    assert np.allclose(during["num_requests_running"], 6)  # two engines x 3
    running_after = after["num_requests_running"].dropna()
    assert len(running_after) >= 1 and (running_after == 0).all()
    assert (during["gpu_util_pct"] > 90).all()


def _spec_rows(engine_rows: list[tuple[str, float]], wall_ns: int) -> list[dict]:
    return [{"run_id": "r", "host": "h", "wall_ns": wall_ns, "target": "t", "sample": sample,
             "labels": "{}", "value": value, "error": None} for sample, value in engine_rows]


def test_draft_acceptance_per_step_from_each_engines_own_figures() -> None:
    """vLLM counts accepted and drafted tokens (the step's growth of one over the other);
    SGLang reports the rate itself; an engine that drafted nothing has no rate."""
    steps = [{"step": "a", "start_wall_ns": 0, "end_wall_ns": 10 * NS}]
    vllm = pd.DataFrame([row for k in range(10) for row in _spec_rows(
        [("vllm:spec_decode_num_accepted_tokens_total", 30.0 * k),
         ("vllm:spec_decode_num_draft_tokens_total", 40.0 * k)], k * NS)])
    assert telemetry.per_step(None, steps, None, vllm).loc["a", "spec_accept_rate"] == 0.75
    sglang = pd.DataFrame([row for k in range(10) for row in _spec_rows(
        [("sglang:spec_accept_rate", 0.6)], k * NS)])
    assert telemetry.per_step(None, steps, None, sglang).loc["a", "spec_accept_rate"] == (
        pytest.approx(0.6))
    idle = pd.DataFrame([row for k in range(10) for row in _spec_rows(
        [("llamacpp:spec_decode_num_accepted_tokens_total", 0.0),
         ("llamacpp:spec_decode_num_draft_tokens_total", 0.0),
         ("llamacpp:requests_processing", 1.0)], k * NS)])
    assert "spec_accept_rate" not in telemetry.per_step(None, steps, None, idle)
