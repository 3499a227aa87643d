"""A tiny Llama-shaped model folder for vLLM to serve with random weights (``--load-format dummy``).

No model can be downloaded on the machines this project runs on, so the target is made here: a
``config.json`` for a 2-layer Llama (hidden 128, 4 heads, 2 KV heads), a byte-level BPE tokenizer
trained offline on a built-in English-ish corpus (so common English words are single tokens and
token counts of synthetic prompts look like real ones), a chat template and a generation config.

Usage, with the vLLM interpreter (this module imports only the standard library at module level,
and ``tokenizers`` + ``transformers`` inside :func:`prepare_tiny_model`, so it also runs where the
project is not installed)::

    .venv-vllm/bin/python -m infra.targets.tiny_model OUT_DIR

The folder is built deterministically and carries a marker holding the recipe's hash: a second call
with the same recipe returns at once; a changed recipe rebuilds it. :func:`is_prepared` answers
without importing either library, so the project's own interpreter can check the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

MARKER_NAME = ".swarmload-tiny-model.json"
RECIPE_VERSION = 1
VOCAB_SIZE = 2000
CORPUS_SEED = 20240611
CORPUS_PARAGRAPHS = 4_000

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, "<|system|>", "<|user|>", "<|assistant|>")
# the special tokens a model's config names by id (``bos_token_id``, ...), by that name
NAMED_TOKENS = {"bos": BOS_TOKEN, "eos": EOS_TOKEN, "pad": PAD_TOKEN}

# Role markers written as plain text between special tokens; ends each turn with EOS so that a
# chat completion stops the way it would with a real instruction-tuned model.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + '\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' + '\\n' }}{% endif %}"
)

MODEL_CONFIG: dict[str, object] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    # Longer than any --max-model-len we serve, so the server's limit (not the model's) decides.
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
    "use_cache": True,
}

# Frequent English words; the corpus repeats them often enough that each becomes one token.
_WORDS = """
the of and to a in is it you that he was for on are with as I his they be at one have this from
or had by hot word but what some we can out other were all there when up use your how said an
each she which do their time if will way about many then them write would like so these her long
make thing see him two has look more day could go come did number sound no most people my over
know water than call first who may down side been now find any new work part take get place made
live where after back little only round man year came show every good me give our under name
very through just form sentence great think say help low line differ turn cause much mean before
move right boy old too same tell does set three want air well also play small end put home read
hand port large spell add even land here must big high such follow act why ask men change went
light kind off need house picture try us again animal point mother world near build self earth
father head stand own page should country found answer school grow study still learn plant cover
food sun four between state keep eye never last let thought city tree cross farm hard start might
story saw far sea draw left late run while press close night real life few north open seem
together next white children begin got walk example ease paper group always music those both mark
often letter until mile river car feet care second book carry took science eat room friend began
idea fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl
usual young ready above ever red list though feel talk bird soon body dog family direct pose leave
song measure door product black short numeral class wind question happen complete ship area half
rock order fire south problem piece told knew pass since top whole king space heard best hour
better true during hundred five remember step early hold west ground interest reach fast verb sing
listen six table travel less morning ten simple several vowel toward war lay against pattern slow
center love person money serve appear road map rain rule govern pull cold notice voice unit power
town fine certain fly fall lead cry dark machine note wait plan figure star box noun field rest
correct able pound done beauty drive stood contain front teach week final gave green oh quick
develop ocean warm free minute strong special mind behind clear tail produce fact street inch
multiply nothing course stay wheel full force blue object decide surface deep moon island foot
system busy test record boat common gold possible plane stead dry wonder laugh thousand ago ran
check game shape equate miss brought heat snow tire bring yes distant fill east paint language
among model server request token latency stream answer please explain summary data code user
""".split()

_TEMPLATES = (
    "{A} {b} {c} {d} {e}.",
    "{A} {b} {c}, {d} {e} {f}.",
    "Why does the {b} {c} {d}?",
    "Please {b} the {c} and {d} {e}.",
    "In {n}, {b} {c} {d} {e} {f} {g}.",
    "{A} {b}: {c} {d}, {e} {f} and {g}.",
    '"{A} {b} {c}," said the {d}.',
    "There are {n} {b} in the {c} {d}.",
    "Can you {b} {c} {d} for me?",
    "{A} {b} {c} {d} {e} {f} {g} {h}.",
)


def build_corpus() -> list[str]:
    """The training text: deterministic sentences over ``_WORDS``, Zipf-like word frequencies."""
    rng = random.Random(CORPUS_SEED)
    # Zipf-ish weights keep frequent words frequent but give every word hundreds of occurrences.
    weights = [1.0 / (rank + 10) for rank in range(len(_WORDS))]
    lines = []
    for _ in range(CORPUS_PARAGRAPHS):
        # Several sentences a line, so capitalised words are also learned after a space.
        sentences = []
        for _ in range(rng.randint(1, 5)):
            template = rng.choice(_TEMPLATES)
            picks = rng.choices(_WORDS, weights=weights, k=8)
            fields = dict(zip("bcdefgh", picks[1:], strict=True))
            number = str(rng.choice((rng.randint(0, 99), rng.randint(100, 9999))))
            sentences.append(template.format(A=picks[0].capitalize(), n=number, **fields))
        lines.append(" ".join(sentences))
    # Every word at least once in lower and capitalised form, in a fixed order.
    lines.append(" ".join(_WORDS))
    lines.append(" ".join(word.capitalize() for word in _WORDS))
    return lines


def recipe_hash() -> str:
    """Hash of everything that decides the folder's content; the idempotency marker stores it."""
    recipe = {
        "version": RECIPE_VERSION,
        "vocab_size": VOCAB_SIZE,
        "special_tokens": SPECIAL_TOKENS,
        "chat_template": CHAT_TEMPLATE,
        "config": MODEL_CONFIG,
        "corpus": hashlib.sha256("\n".join(build_corpus()).encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def is_prepared(out_dir: str | os.PathLike[str]) -> bool:
    """True when ``out_dir`` holds a model folder built from the current recipe."""
    marker = Path(out_dir) / MARKER_NAME
    try:
        return json.loads(marker.read_text()).get("recipe_hash") == recipe_hash()
    except (OSError, ValueError):
        return False


def _train_tokenizer(corpus: list[str]):  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer, length=len(corpus))
    return tokenizer


def write_model_files(folder: Path, trained: Any, config: dict[str, object]) -> int:
    """Write a model folder's files but its weights: the tokenizer ``trained`` (a
    ``tokenizers.Tokenizer``) with the chat template, ``config.json`` (``config`` with the
    vocabulary's size and the special tokens' ids) and ``generation_config.json``; returns the
    vocabulary's size, added tokens included."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=trained,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=int(config["max_position_embeddings"]),  # type: ignore[call-overload]
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    # Name the class every transformers release knows (5.x writes "TokenizersBackend") and keep
    # the template inside tokenizer_config.json too, where releases before 4.43 look for it.
    config_path = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE)
    config_path.write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")

    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in NAMED_TOKENS.items()}
    full = {**config, "vocab_size": len(tokenizer),
            **{f"{name}_token_id": token_id for name, token_id in ids.items()}}
    (folder / "config.json").write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
    generation = {f"{name}_token_id": token_id for name, token_id in ids.items()}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return len(tokenizer)


def _write_folder(folder: Path) -> None:
    write_model_files(folder, _train_tokenizer(build_corpus()), MODEL_CONFIG)


def prepare_tiny_model(out_dir: str | os.PathLike[str]) -> Path:
    """Build the tiny model folder at ``out_dir`` (skipped when already built) and return its path.

    The folder is assembled next to ``out_dir`` and renamed into place, so a crash never leaves a
    half-written folder that looks prepared.
    """
    out = Path(out_dir).resolve()
    if is_prepared(out):
        return out
    marker = {"recipe_hash": recipe_hash(), "recipe_version": RECIPE_VERSION}
    return replace_folder(out, _write_folder, MARKER_NAME, marker)


def replace_folder(out: Path, fill: Callable[[Path], None], marker_name: str,
                   marker: dict[str, Any]) -> Path:
    """Call ``fill(staging)`` on a fresh folder next to ``out``, write ``marker`` as JSON to its
    file ``marker_name``, and rename the folder into place (replacing an older ``out``); a crash
    leaves no half-written folder."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        fill(staging)
        (staging / marker_name).write_text(json.dumps(marker, indent=2) + "\n")
        staging.chmod(0o755)  # mkdtemp made it private; the folder is shared like any cache
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out


def prepare_main(argv: list[str] | None, usage: str, counts: tuple[int, ...],
                 prepare: Callable[..., Path]) -> int:
    """A model-writing module's ``main``: ``prepare(*args)``, its path printed; ``usage`` (and
    exit status 2) for a count of arguments not in ``counts`` or an option."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in counts or (args and args[0].startswith("-")):
        print(f"usage: {usage}", file=sys.stderr)
        return 2
    # Single-threaded training: the merge order must not depend on thread scheduling.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    print(prepare(*args))
    return 0


def main(argv: list[str] | None = None) -> int:
    return prepare_main(argv, "python -m infra.targets.tiny_model OUT_DIR", (1,),
                        prepare_tiny_model)


if __name__ == "__main__":
    sys.exit(main())
