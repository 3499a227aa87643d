"""A model folder of a real model's shape (Qwen2-1.5B) for vLLM to serve with random weights.

No model can be downloaded where swarmload runs (the lent GPU machine included), yet a GPU study
needs the arithmetic of a real model: the same layers, widths, attention heads and vocabulary, so
that prefill, decode and the LM head cost what they would with real weights. This writes the
``config.json`` of Qwen2-1.5B (28 layers, hidden 1536, 12 query / 2 KV heads of 128, vocabulary
151,936) and a tokenizer whose vocabulary is exactly that size, for ``--load-format dummy``::

    python -m infra.targets.shaped_model OUT_DIR            # needs tokenizers + transformers

The tokenizer is the tiny model's (:mod:`infra.targets.tiny_model`: byte-level BPE trained on a
built-in English-ish corpus, so prompts tokenize like English) padded with synthetic merges of its
own tokens up to the config's vocabulary. Random weights sample token ids uniformly over the whole
vocabulary; with a smaller tokenizer most of them would decode to nothing, and a stream would carry
empty deltas. Padded this way every id decodes to a few characters, as a real model's would.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

from infra.targets import tiny_model

# Qwen/Qwen2-1.5B's config.json (architecture fields), as published with the model.
QWEN2_1_5B: dict[str, object] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
    "use_cache": True,
}
# Qwen/Qwen2.5-7B's config.json (architecture fields), as published: a dense 7B that keeps an H200
# busy (FINDINGS: utilisation 96-100% from 16 users up), where the 1.5B shape is API-server-bound.
QWEN2_5_7B: dict[str, object] = {
    **QWEN2_1_5B,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_window_layers": 28,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "vocab_size": 152064,
}
SHAPES = {"qwen2-1.5b": QWEN2_1_5B, "qwen2.5-7b": QWEN2_5_7B}
MARKER_NAME = ".swarmload-shaped-model.json"


def parameter_count(config: dict[str, object]) -> int:
    """The dense decoder's weights implied by ``config`` (embeddings, attention with biased q/k/v as
    Qwen2 has them, SwiGLU MLP, RMSNorms, the LM head unless tied): what a GPU reads per token."""
    def field(name: str) -> int:
        return int(config[name])  # type: ignore[call-overload]

    hidden, inter = field("hidden_size"), field("intermediate_size")
    layers = field("num_hidden_layers")
    head_dim = hidden // field("num_attention_heads")
    kv = field("num_key_value_heads") * head_dim
    attention = hidden * hidden + 2 * hidden * kv + hidden + 2 * kv + hidden * hidden
    per_layer = attention + 3 * hidden * inter + 2 * hidden
    embeddings = field("vocab_size") * hidden
    head = 0 if config.get("tie_word_embeddings") else embeddings
    return layers * per_layer + embeddings + head + hidden


def pad_vocabulary(tokenizer_json: str, vocab_size: int) -> str:
    """The tokenizer (``Tokenizer.to_str()``) with merges of existing tokens appended until the
    vocabulary, added (special) tokens included, holds exactly ``vocab_size`` entries."""
    data = json.loads(tokenizer_json)
    model = data["model"]
    vocab: dict[str, int] = model["vocab"]
    merges: list = model["merges"]
    added = {token["content"] for token in data.get("added_tokens", [])}
    missing = vocab_size - len(vocab) - len(added - set(vocab))
    if missing < 0:
        raise ValueError(f"the tokenizer already has {vocab_size - missing} tokens, "
                         f"more than {vocab_size}")
    # Merges of two trained tokens (a valid BPE: both halves exist before the new token), only of
    # printable ASCII pieces ("Ġ" is byte-level's space): arbitrary byte pairs would decode to
    # broken UTF-8, which a streaming detokenizer holds back, leaving empty deltas.
    base = [token for token, _ in sorted(vocab.items(), key=lambda kv: kv[1])
            if token not in added and all(c == "Ġ" or (c.isascii() and c.isprintable())
                                          for c in token)]
    as_strings = bool(merges) and isinstance(merges[0], str)
    next_id = max([*vocab.values(), *(t["id"] for t in data.get("added_tokens", []))]) + 1
    if len(base) ** 2 < missing:
        raise ValueError(f"{len(base)} printable tokens cannot make {missing} more")
    pairs = itertools.product(base, base)
    while missing:
        left, right = next(pairs)
        token = left + right
        if token in vocab or token in added:
            continue
        vocab[token] = next_id
        merges.append(f"{left} {right}" if as_strings else [left, right])
        next_id += 1
        missing -= 1
    # Special tokens were given the lowest ids by the trainer; the padded ids follow the rest.
    return json.dumps(data, ensure_ascii=False)


def _write_folder(folder: Path, config: dict[str, object]) -> None:
    from tokenizers import Tokenizer

    vocab_size = int(config["vocab_size"])  # type: ignore[call-overload]
    trained = tiny_model._train_tokenizer(tiny_model.build_corpus())
    padded = Tokenizer.from_str(pad_vocabulary(trained.to_str(), vocab_size))
    # a wrong size fails here, in the staging folder: nothing is renamed into place
    written = tiny_model.write_model_files(folder, padded, config)
    if written != vocab_size:
        raise RuntimeError(f"padded tokenizer has {written} tokens, not {vocab_size}")


def prepare_shaped_model(out_dir: str | os.PathLike[str], shape: str = "qwen2-1.5b") -> Path:
    """Write the model folder for ``shape`` at ``out_dir`` (assembled aside, renamed in place)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; have {sorted(SHAPES)}")
    return tiny_model.replace_folder(Path(out_dir).resolve(),
                                     lambda staging: _write_folder(staging, SHAPES[shape]),
                                     MARKER_NAME, {"shape": shape})


def main(argv: list[str] | None = None) -> int:
    return tiny_model.prepare_main(
        argv, f"python -m infra.targets.shaped_model OUT_DIR [{'|'.join(SHAPES)}]", (1, 2),
        prepare_shaped_model)


if __name__ == "__main__":
    sys.exit(main())
