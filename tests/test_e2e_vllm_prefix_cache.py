"""Real vLLM keeps its prefix cache between runs: a fresh prompt salt per run keeps a second run
of the same seed from being served out of it, and the first run's salt given again repeats it on
purpose (``vllm:prefix_cache_hits_total`` / ``_queries_total`` read around each run)."""

from __future__ import annotations

import json
from pathlib import Path

from e2e_checks import VLLM_E2E, swarmload_run

from infra.tools.bench.prefix_cache import cache_counters

pytestmark = VLLM_E2E


def _run(shared_vllm, results: Path, *extra: str) -> tuple[dict[str, float], dict]:
    before = cache_counters(shared_vllm.base_url)
    run_dir, _ = swarmload_run(
        results, "--target", shared_vllm.base_url,
        "--model", shared_vllm.model_name, "--workers", "1", "--users", "4", "--duration", "6",
        "--max-tokens", "8", "--long-max-tokens", "1200", "--no-collectors", "--quiet", *extra,
        timeout=300)
    after = cache_counters(shared_vllm.base_url)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    return {k: after[k] - before[k] for k in after}, manifest


def test_consecutive_runs_meet_a_cold_prefix_cache(shared_vllm, tmp_path: Path) -> None:
    first, manifest = _run(shared_vllm, tmp_path / "one")
    second, _ = _run(shared_vllm, tmp_path / "two")  # same seed, fresh salt
    assert first["queries"] > 5000 and second["queries"] > 5000
    # the built-in mix shares nothing between its own requests: every hit would be a prompt of
    # an earlier run
    assert first["hits"] == 0 and second["hits"] == 0, (first, second)
    salt = manifest["prompt_salt"]
    repeat, repeated = _run(shared_vllm, tmp_path / "three", "--prompt-salt", salt)
    assert repeated["prompt_salt"] == salt
    assert repeat["hits"] > 0.3 * min(repeat["queries"], first["queries"]), (first, repeat)
