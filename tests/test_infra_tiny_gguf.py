"""infra.targets.tiny_gguf: the tiny model as a GGUF file (that llama-server serves it:
test_e2e_llama_cpp.py)."""

from __future__ import annotations

import hashlib
import json

import pytest
from gguf import GGUFReader

from infra.targets import tiny_gguf, tiny_model


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory):
    return tiny_gguf.prepare_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_file_is_deterministic_and_a_second_call_leaves_it(written, tmp_path, monkeypatch):
    again = tiny_gguf.prepare_tiny_gguf(tmp_path / "again.gguf")
    assert _digest(again) == _digest(written)
    before = written.stat().st_mtime_ns
    assert tiny_gguf.prepare_tiny_gguf(written) == written
    assert written.stat().st_mtime_ns == before
    # a changed recipe rewrites it; a file that is no GGUF is not prepared
    monkeypatch.setattr(tiny_gguf, "RECIPE_VERSION", tiny_gguf.RECIPE_VERSION + 1)
    assert not tiny_gguf.is_prepared(written)
    tiny_gguf.prepare_tiny_gguf(written)
    assert tiny_gguf.is_prepared(written) and written.stat().st_mtime_ns != before
    (tmp_path / "other.gguf").write_bytes(b"not a model")
    assert not tiny_gguf.is_prepared(tmp_path / "other.gguf")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no leftovers


def test_it_carries_the_tiny_models_shape_and_tokenizer(written):
    reader = GGUFReader(written)

    def field(key: str):  # noqa: ANN202
        found = reader.get_field(key)
        assert found is not None, key
        return found.contents()

    config: dict = tiny_model.MODEL_CONFIG
    assert field("general.architecture") == "llama"
    assert (field("llama.embedding_length"), field("llama.block_count"),
            field("llama.attention.head_count"), field("llama.attention.head_count_kv")) == (
        config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
        config["num_key_value_heads"])
    trained = json.loads(tiny_model._train_tokenizer(tiny_model.build_corpus()).to_str())
    vocab = trained["model"]["vocab"]
    tokens = field("tokenizer.ggml.tokens")
    assert len(tokens) == len(vocab) == tiny_model.VOCAB_SIZE
    assert all(vocab[token] == index for index, token in enumerate(tokens))
    control = {tokens[i] for i, kind in enumerate(field("tokenizer.ggml.token_type")) if kind == 3}
    assert control == set(tiny_model.SPECIAL_TOKENS)
    assert tokens[field("tokenizer.ggml.eos_token_id")] == tiny_model.EOS_TOKEN
    assert field("tokenizer.chat_template") == tiny_model.CHAT_TEMPLATE
    shapes = {tensor.name: tuple(int(n) for n in tensor.shape) for tensor in reader.tensors}
    # ggml's order: (in, out)
    assert shapes["token_embd.weight"] == (config["hidden_size"], tiny_model.VOCAB_SIZE)
    assert shapes["blk.1.attn_k.weight"] == (
        config["hidden_size"], config["num_key_value_heads"] * config["head_dim"])
    assert len(shapes) == 2 + 9 * config["num_hidden_layers"] + 1
