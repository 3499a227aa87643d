"""Prompt synthesis: text of EXACTLY a logged token length, in the target's own tokenizer.

Usage::

    counter = LocalTokenizer("path/to/model")               # tokenizer.json (+ chat template)
    counter = RemoteTokenizer("http://127.0.0.1:8000")      # the target's vLLM /tokenize
    synth = PromptSynthesizer(counter, endpoint="chat", seed=0)
    built = synth.build("r000007", target_tokens=812, prefix_block_ids=[11, 12])
    built.messages, built.prompt_tokens, built.exact

How: a per-request nonce (request id + random hex) opens the text so that no two prompts share a
prefix by accident; words, chosen from a list filtered to those the tokenizer encodes as one
token after a space, follow; the text is counted the way the server counts it (special tokens for
completions, the chat template for chat) and words are added or removed until the count is
exact, with one-token fillers for the last step where a word would overshoot. With prefix block
ids (Mooncake ``hash_ids``), every id but the last becomes a fixed 512-word block of text that is
the same wherever the id appears, and the nonce moves after the shared blocks.

Token counters implement ``count_prompt`` (a completions prompt, special tokens included),
``count_chat`` (messages with the chat template and generation prompt) and ``count_text`` (plain
text, no special tokens: for output lengths).
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from workloads.errors import SynthesisError

ENDPOINTS = ("completions", "chat")
PREFIX_BLOCK_TOKENS = 512

Messages = list[dict[str, str]]


class TokenCounter(Protocol):
    name: str

    def count_prompt(self, text: str) -> int: ...

    def count_chat(self, messages: Messages) -> int: ...

    def count_text(self, text: str) -> int: ...


class WordCounter:
    """One token per whitespace-separated word (for a simulator that counts words)."""

    name = "words"

    def count_prompt(self, text: str) -> int:
        return len(text.split())

    def count_chat(self, messages: Messages) -> int:
        return sum(len(m["content"].split()) for m in messages)

    def count_text(self, text: str) -> int:
        return len(text.split())


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class LocalTokenizer:
    """A Hugging Face tokenizer folder: ``tokenizer.json`` plus, for chat, a chat template in
    ``tokenizer_config.json`` (``chat_template``) or ``chat_template.jinja``. Counts as
    transformers and vLLM do: completions with special tokens, chat via the template rendered
    with ``add_generation_prompt=True`` and encoded without adding special tokens."""

    def __init__(self, folder: str | Path):
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # a declared dependency; this names the fix if it is missing
            raise SynthesisError("the 'tokenizers' package is needed for --tokenizer DIR") from exc
        self.folder = Path(folder)
        path = self.folder / "tokenizer.json"
        if not path.is_file():
            found = sorted(p.name for p in self.folder.iterdir()) if self.folder.is_dir() else []
            raise SynthesisError(f"{self.folder}: no tokenizer.json (found {found})")
        self.name = f"local:{self.folder}"
        self._tok = Tokenizer.from_file(str(path))
        config_path = self.folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self._special = {
            key: _token_text(config.get(key))
            for key in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: use "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja_path = self.folder / "chat_template.jinja"
        if template is None and jinja_path.is_file():
            template = jinja_path.read_text()
        self._template_source: str | None = template
        self._template: Any = None

    def count_prompt(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=True).ids)

    def count_text(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_prompt(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=True).ids)

    def render_chat(self, messages: Messages) -> str:
        if self._template is None:
            if self._template_source is None:
                raise SynthesisError(
                    f"{self.folder}: no chat template (tokenizer_config.json chat_template or "
                    "chat_template.jinja); use --endpoint completions"
                )
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise SynthesisError(f"chat template: {message}")

            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
            )
            env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(
                x, ensure_ascii=False, indent=indent)
            env.globals["raise_exception"] = raise_exception
            self._template = env.from_string(self._template_source)
        return self._template.render(messages=messages, add_generation_prompt=True, tools=None,
                                     documents=None, **self._special)

    def count_chat(self, messages: Messages) -> int:
        return len(self._tok.encode(self.render_chat(messages), add_special_tokens=False).ids)


class RemoteTokenizer:
    """The target's own ``/tokenize`` endpoint (vLLM): {"model", "prompt"} or {"model",
    "messages"} -> {"count", "tokens"}. ``model`` defaults to the first of ``/v1/models``."""

    def __init__(self, base_url: str, model: str | None = None, timeout_s: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.name = f"remote:{self.base_url}/tokenize"
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout_s)
        self._errors: tuple[type[Exception], ...] = (httpx.HTTPError, ValueError, KeyError)
        try:
            if model is None:
                models = self._client.get("/v1/models")
                models.raise_for_status()
                model = str(models.json()["data"][0]["id"])
        except (*self._errors, IndexError) as exc:
            raise SynthesisError(f"{self.base_url}/v1/models: no model found: {exc}") from exc
        self.model = model

    def _count(self, body: dict[str, Any]) -> int:
        try:
            response = self._client.post("/tokenize", json={"model": self.model, **body})
            response.raise_for_status()
            return int(response.json()["count"])
        except self._errors as exc:
            raise SynthesisError(f"{self.base_url}/tokenize failed: {exc}") from exc

    def count_prompt(self, text: str) -> int:
        return self._count({"prompt": text})

    def count_text(self, text: str) -> int:
        return self._count({"prompt": text, "add_special_tokens": False})

    def count_chat(self, messages: Messages) -> int:
        return self._count({"messages": messages, "add_generation_prompt": True})

    def close(self) -> None:
        self._client.close()


def make_counter(
    tokenizer: str | None = None, tokenize_url: str | None = None, model: str | None = None
) -> TokenCounter | None:
    """The counter for ``--tokenizer DIR|words`` or ``--tokenize-url URL`` (None if neither)."""
    if tokenizer and tokenize_url:
        raise SynthesisError("give --tokenizer or --tokenize-url, not both")
    if tokenize_url:
        return RemoteTokenizer(tokenize_url, model=model)
    if tokenizer == "words":
        return WordCounter()
    if tokenizer:
        return LocalTokenizer(tokenizer)
    return None


# Common English words; those the target encodes as one token after a space are kept.
_CANDIDATE_WORDS = (
    "the of and to in is was that for on as with by he at from his an were are which this be "
    "or has had not but one their they new all been its also more first two time who after "
    "would other when into can there may only over most some years city such made later well "
    "these many where used under during part then up about state both between three world "
    "while out than since them system each known people number school around through being "
    "because work high small large water light house story river music game team road day "
    "year way man men life long little good great old right big place home hand head side "
    "end point fact week case group company area book word line name night room mother "
    "country question money month lot study program business issue problem service power "
    "war party history art law field family air food land sea tree stone fire star"
).split()

_DIGITS_AS_LETTERS = str.maketrans("0123456789", "abcdefghij")

# One-token fillers for the last step when a whole word would overshoot.
_FILLERS = (" a", ".", ",", " I", "!", "?", ";", ":", "-", " 1", " x", "s", "e", "a")


@dataclass(frozen=True)
class SynthesizedPrompt:
    """A built prompt: ``prompt`` for completions or ``messages`` for chat; ``prompt_tokens`` is
    the count the tokenizer gives; ``exact`` whether it equals the target; ``has_nonce`` whether
    the unique opening fit (very short targets leave no room for it)."""

    prompt: str | None
    messages: Messages | None
    prompt_tokens: int
    target_tokens: int
    exact: bool
    has_nonce: bool


class PromptSynthesizer:
    def __init__(self, counter: TokenCounter, endpoint: str = "completions", seed: int = 0):
        if endpoint not in ENDPOINTS:
            raise SynthesisError(f"unknown endpoint {endpoint!r}; valid: {list(ENDPOINTS)}")
        self.counter = counter
        self.endpoint = endpoint
        self.seed = seed
        self.words = self._single_token_words()
        self._blocks: dict[int, str] = {}

    def _single_token_words(self) -> list[str]:
        base = self.counter.count_text("x")
        words = [w for w in _CANDIDATE_WORDS if self.counter.count_text("x " + w) - base == 1]
        return words if len(words) >= 16 else list(_CANDIDATE_WORDS)

    def measure(self, content: str) -> int:
        """Tokens the server will count for ``content`` sent to this endpoint."""
        if self.endpoint == "chat":
            return self.counter.count_chat([{"role": "user", "content": content}])
        return self.counter.count_prompt(content)

    def block_text(self, block_id: int) -> str:
        """The fixed text of a shared prefix block: 512 words, the same for the same id."""
        text = self._blocks.get(block_id)
        if text is None:
            rng = random.Random(f"{self.seed}:block:{block_id}")
            text = "".join(" " + w for w in rng.choices(self.words, k=PREFIX_BLOCK_TOKENS))
            self._blocks[block_id] = text
        return text

    def build(
        self,
        request_id: str,
        target_tokens: int,
        prefix_block_ids: Sequence[int] | None = None,
    ) -> SynthesizedPrompt:
        rng = random.Random(f"{self.seed}:prompt:{request_id}")
        # Letters only: digit runs would look like identifiers to the scrubber's guard. The id
        # part keeps prompts of one workload apart, the random part those of different seeds.
        id_part = request_id.translate(_DIGITS_AS_LETTERS)
        salt = "".join(rng.choices(string.ascii_lowercase, k=6))
        nonces = (f"req {id_part} {salt}", f"{id_part} {salt}", id_part, "")
        shared = list(prefix_block_ids or [])[:-1]
        while True:
            prefix = "".join(self.block_text(b) for b in shared)
            sep = " " if prefix else ""
            for nonce in nonces:
                head = prefix + (sep + nonce if nonce else "")
                if self.measure(head) <= target_tokens:
                    return self._finish(self._fit(head, rng, target_tokens), target_tokens,
                                        has_nonce=bool(nonce))
            if not shared:
                break
            shared.pop()  # the shared blocks alone are too long in this tokenizer: drop one
        content = rng.choice(self.words)  # even one word overshoots (template overhead)
        return self._finish((content, self.measure(content)), target_tokens, has_nonce=False)

    def _finish(self, fitted: tuple[str, int], target: int, has_nonce: bool) -> SynthesizedPrompt:
        content, count = fitted
        if self.endpoint == "chat":
            return SynthesizedPrompt(None, [{"role": "user", "content": content}], count, target,
                                     count == target, has_nonce)
        return SynthesizedPrompt(content, None, count, target, count == target, has_nonce)

    def _fit(self, head: str, rng: random.Random, target: int) -> tuple[str, int]:
        """Append words to ``head`` until the count is ``target`` (head's count <= target)."""
        pool: list[str] = []

        def text(k: int) -> str:
            while len(pool) < k:
                pool.extend(rng.choices(self.words, k=max(64, k - len(pool))))
            body = "".join(" " + w for w in pool[:k])
            return head + body  # a leading space is kept: " word" is the one-token form

        counts: dict[int, int] = {0: self.measure(head) if head else self.measure("")}
        if counts[0] == target and head:
            return text(0), target
        lo, hi = 0, None  # bracket: counts[lo] < target < counts[hi]
        k = max(1, target - counts[0])
        for _ in range(40):
            c = counts[k] if k in counts else counts.setdefault(k, self.measure(text(k)))
            if c == target:
                return text(k), c
            if c < target:
                lo = k
            else:
                hi = k
            if hi is not None and hi - lo <= 1:
                break
            # step by the token gap, kept strictly inside the bracket; bisect if already tried
            k = max(k + (target - c), lo + 1)
            if hi is not None:
                k = min(k, hi - 1)
                if k in counts:
                    k = (lo + hi) // 2
        if lo == 0 and not head:  # never send an empty prompt: one word, even if too long
            return text(1), counts[1] if 1 in counts else self.measure(text(1))
        return self._fill(text(lo), counts.get(lo, self.measure(text(lo))), target)

    def _fill(self, content: str, count: int, target: int) -> tuple[str, int]:
        """Close the last gap with one-token fillers."""
        while count < target:
            for filler in _FILLERS:
                c = self.measure(content + filler)
                if c == count + 1:
                    content, count = content + filler, c
                    break
            else:
                return content, count
        return content, count
