"""The tiny model as one GGUF file with random weights, for llama.cpp's ``llama-server``.

The same model vLLM serves on the CPU (:mod:`infra.targets.tiny_model`: a 2-layer Llama, hidden
128, 4 query / 2 KV heads of 32, the byte-level BPE tokenizer trained on the built-in corpus, its
chat template), written in the format llama.cpp loads (``gguf``, ggml's own writer): architecture
``llama``, the tokenizer as GGUF's ``gpt2`` model (byte-level BPE: the vocabulary in id order, its
merges, the special tokens marked as control tokens) with the GPT-2 pre-tokenizer, and weights
drawn from a seeded normal distribution (norms at one), all in F32 (4 MB). A prompt tokenizes to
the same ids under either engine, so the two serve the same requests.

    python -m infra.targets.tiny_gguf OUT.gguf      # needs gguf + tokenizers (both dependencies)

Deterministic; the file carries its recipe's hash (``swarmload.recipe_hash``): a second call with
the same recipe returns at once, a changed recipe rewrites it. The file is written beside ``OUT``
and renamed into place, so a crash never leaves a half-written model that looks prepared.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from infra.paths import CACHE_DIR
from infra.targets import tiny_model

__all__ = ["ARCH", "RECIPE_KEY", "TINY_GGUF", "is_prepared", "prepare_tiny_gguf"]

TINY_GGUF = CACHE_DIR / "tiny-gguf" / "tiny-llama.gguf"
"""Where the suite and ``--target llama-cpp`` keep it (the model name is the file's stem)."""
ARCH = "llama"
RECIPE_VERSION = 1
RECIPE_KEY = "swarmload.recipe_hash"
WEIGHT_SEED = 20261206
WEIGHT_STD = 0.02
# llama.cpp's names for the GPT-2 byte-level BPE (llama-vocab.cpp: tokenizer model "gpt2", pre
# "gpt-2": the regex the tiny tokenizer's ByteLevel pre-tokenizer uses)
TOKENIZER_MODEL = "gpt2"
TOKENIZER_PRE = "gpt-2"


def _shape() -> dict[str, int]:
    config = tiny_model.MODEL_CONFIG
    return {key: int(config[key]) for key in (  # type: ignore[call-overload]
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "max_position_embeddings")}


def recipe_hash() -> str:
    """Hash of what decides the file: the tiny model's recipe and this writer's."""
    recipe = {"tiny_model": tiny_model.recipe_hash(), "version": RECIPE_VERSION, "arch": ARCH,
              "seed": WEIGHT_SEED, "std": WEIGHT_STD, "tokenizer": [TOKENIZER_MODEL, TOKENIZER_PRE]}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def is_prepared(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a GGUF file written from the current recipe."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(path).get_field(RECIPE_KEY)
    except (OSError, ValueError):
        return False
    return field is not None and field.contents() == recipe_hash()


def _vocabulary() -> tuple[list[str], list[int], list[str], dict[str, int]]:
    """Tokens in id order, their GGUF token types, the merges and the special tokens' ids."""
    from gguf import TokenType

    trained = json.loads(tiny_model._train_tokenizer(tiny_model.build_corpus()).to_str())
    vocab: dict[str, int] = trained["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[token] for token in tokens] == list(range(len(tokens))), "vocabulary has gaps"
    special = set(tiny_model.SPECIAL_TOKENS)
    types = [int(TokenType.CONTROL if token in special else TokenType.NORMAL) for token in tokens]
    merges = [" ".join(pair) if isinstance(pair, list) else str(pair)
              for pair in trained["model"]["merges"]]
    ids = {name: vocab[token] for name, token in tiny_model.NAMED_TOKENS.items()}
    return tokens, types, merges, ids


def _weights(vocab_size: int) -> dict[str, Any]:
    """The tensors by llama.cpp's names, numpy shape (out, in): random matrices, norms at one."""
    shape = _shape()
    hidden, ffn = shape["hidden_size"], shape["intermediate_size"]
    q_width = shape["num_attention_heads"] * shape["head_dim"]
    kv_width = shape["num_key_value_heads"] * shape["head_dim"]
    rng = np.random.default_rng(WEIGHT_SEED)

    def matrix(rows: int, cols: int) -> Any:
        return (rng.standard_normal((rows, cols)) * WEIGHT_STD).astype(np.float32)

    def norm() -> Any:
        return np.ones(hidden, dtype=np.float32)

    tensors = {"token_embd.weight": matrix(vocab_size, hidden)}
    for layer in range(shape["num_hidden_layers"]):
        block = f"blk.{layer}"
        tensors.update({
            f"{block}.attn_norm.weight": norm(),
            f"{block}.attn_q.weight": matrix(q_width, hidden),
            f"{block}.attn_k.weight": matrix(kv_width, hidden),
            f"{block}.attn_v.weight": matrix(kv_width, hidden),
            f"{block}.attn_output.weight": matrix(hidden, q_width),
            f"{block}.ffn_norm.weight": norm(),
            f"{block}.ffn_gate.weight": matrix(ffn, hidden),
            f"{block}.ffn_up.weight": matrix(ffn, hidden),
            f"{block}.ffn_down.weight": matrix(hidden, ffn),
        })
    tensors["output_norm.weight"] = norm()
    tensors["output.weight"] = matrix(vocab_size, hidden)
    return tensors


def _write(path: Path) -> None:
    from gguf import GGUFWriter

    config = tiny_model.MODEL_CONFIG
    shape = _shape()
    tokens, types, merges, ids = _vocabulary()
    writer = GGUFWriter(path, ARCH)
    writer.add_name("swarmload tiny llama (random weights)")
    writer.add_string(RECIPE_KEY, recipe_hash())
    writer.add_context_length(shape["max_position_embeddings"])
    writer.add_embedding_length(shape["hidden_size"])
    writer.add_feed_forward_length(shape["intermediate_size"])
    writer.add_block_count(shape["num_hidden_layers"])
    writer.add_head_count(shape["num_attention_heads"])
    writer.add_head_count_kv(shape["num_key_value_heads"])
    writer.add_key_length(shape["head_dim"])
    writer.add_value_length(shape["head_dim"])
    writer.add_rope_dimension_count(shape["head_dim"])
    writer.add_rope_freq_base(float(config["rope_theta"]))  # type: ignore[arg-type]
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))  # type: ignore[arg-type]
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(0)  # all F32
    writer.add_tokenizer_model(TOKENIZER_MODEL)
    writer.add_tokenizer_pre(TOKENIZER_PRE)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(ids["bos"])
    writer.add_eos_token_id(ids["eos"])
    writer.add_eot_token_id(ids["eos"])  # an end of generation (llama.cpp warns otherwise)
    writer.add_pad_token_id(ids["pad"])
    writer.add_add_bos_token(False)  # as the tiny tokenizer: the chat template writes BOS
    writer.add_chat_template(tiny_model.CHAT_TEMPLATE)
    for name, tensor in _weights(len(tokens)).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def prepare_tiny_gguf(path: str | os.PathLike[str] = TINY_GGUF) -> Path:
    """Write the tiny GGUF model to ``path`` (skipped when already written) and return its path."""
    out = Path(path).resolve()
    if out.is_file() and is_prepared(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=f".{out.name}-", dir=out.parent)
    os.close(handle)
    try:
        _write(Path(staging))
        Path(staging).chmod(0o644)
        Path(staging).replace(out)
    finally:
        Path(staging).unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    return tiny_model.prepare_main(argv, "python -m infra.targets.tiny_gguf [OUT.gguf]", (0, 1),
                                   prepare_tiny_gguf)


if __name__ == "__main__":
    sys.exit(main())
