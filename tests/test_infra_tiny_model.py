"""infra.targets.tiny_model: built with the vLLM interpreter (it needs tokenizers, transformers)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path

import pytest

from infra.paths import PACKAGE_ROOT
from infra.targets import tiny_model
from infra.targets.vllm_venv import vllm_python
from workloads.sessions import build_sessions
from workloads.synth import LocalTokenizer

needs_vllm_venv = pytest.mark.skipif(
    not vllm_python().exists(), reason=f"no vLLM interpreter at {vllm_python()} (make vllm-venv)")


def _build(out_dir: Path) -> float:
    started = time.monotonic()
    subprocess.run([str(vllm_python()), "-m", "infra.targets.tiny_model", str(out_dir)],
                   cwd=PACKAGE_ROOT, check=True, capture_output=True, timeout=300)
    return time.monotonic() - started


@pytest.fixture(scope="module")
def built_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build, looked at by both tests below (a build takes seconds of the vLLM venv)."""
    folder = tmp_path_factory.mktemp("tiny-model") / "model"
    _build(folder)
    return folder


def _digests(folder: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.iterdir()) if path.is_file()}


def test_recipe_hash_is_stable_and_an_empty_folder_is_not_prepared(tmp_path):
    assert tiny_model.recipe_hash() == tiny_model.recipe_hash()
    assert not tiny_model.is_prepared(tmp_path)
    (tmp_path / tiny_model.MARKER_NAME).write_text('{"recipe_hash": "an older recipe"}')
    assert not tiny_model.is_prepared(tmp_path)


@pytest.mark.vllm
@needs_vllm_venv
def test_build_is_deterministic_and_second_call_is_skipped(built_model, tmp_path):
    first, second = built_model, tmp_path / "b"
    _build(second)
    assert _digests(first) == _digests(second)
    assert tiny_model.is_prepared(first)
    before = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    _build(first)
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == before


@pytest.mark.vllm
@needs_vllm_venv
def test_folder_is_a_small_llama_with_a_chat_template_and_word_level_tokens(built_model):
    folder = built_model
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["max_position_embeddings"] >= 4096
    assert (config["hidden_size"], config["num_hidden_layers"]) == (128, 2)
    assert 1900 <= config["vocab_size"] <= 2100
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert "add_generation_prompt" in tokenizer_config["chat_template"]
    # Token-level checks need the tokenizer, which lives in the vLLM venv.
    check = (
        "import json, sys\n"
        "from transformers import AutoTokenizer\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "text = 'The server will answer every question about the water in the city.'\n"
        "chat = tok.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False,\n"
        "                               add_generation_prompt=True)\n"
        "print(json.dumps({'words': len(text.split()), 'tokens': len(tok(text)['input_ids']),\n"
        "                  'chat': chat, 'eos': tok.eos_token_id}))\n"
    )
    result = subprocess.run([str(vllm_python()), "-c", check, str(folder)], check=True,
                            capture_output=True, text=True, timeout=120)
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["tokens"] == answer["words"] + 1  # one token a word, plus the final "."
    assert answer["chat"].endswith("<|assistant|>\n")
    assert answer["eos"] == config["eos_token_id"]


@pytest.mark.vllm
@needs_vllm_venv
def test_synthetic_user_messages_are_exact_in_the_target_tokenizer(built_model):
    counter = LocalTokenizer(built_model)
    built = build_sessions("synthetic:sessions=3,turns=3,system_tokens=120,user_tokens=37,"
                           "output_tokens=9", counter)
    frame = built.frame
    for messages in frame["messages"]:
        assert counter.count_text(json.loads(messages)[-1]["content"]) == 37
    system = json.loads(frame["messages"].iloc[0])[0]["content"]
    assert counter.count_text(system) == 120
    assert all(counter.count_text(a) == 9 for a in frame["answer"])
