"""The built-in prompt mix: short/medium/long requests with unique text, no logs needed.

Each request gets a prompt of a target length drawn from its bucket's range (in words; the
simulator counts one token per word, real tokenizers come close for this vocabulary), led by a
per-request nonce so no two prompts share a prefix and nothing hits a prefix cache by accident.
Deterministic for a given seed, salt and request index, so every worker can draw its own requests
without coordination. The *salt* (a fresh one per run, see :func:`new_prompt_salt`) goes into
every nonce, so a second run against the same server finds none of the first run's prompts in
its prefix cache; the seed alone fixes buckets and lengths, so runs stay comparable.
"""

from __future__ import annotations

import random
import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workloads.buckets import BUCKETS, BucketSpec

# Common English words: real BPE tokenizers (including the project's tiny one) encode most of
# them as a single token, so word counts track token counts closely.
_WORDS = (
    "the of and to in is was that for on as with by he at from his an were are which this be "
    "or has had not but one their they new all been its also more first two time who after "
    "would other when into can there may only over most some years city such made later well "
    "these many where used under during part then up about state both between three world "
    "while out than since them system each known people number school around through being "
    "because work high each small large water light house story river music game team road"
).split()


# Defaults of the built-in mix, written once (locustfiles.config and studies take them from here).
DEFAULT_MAX_TOKENS = 64  # output tokens of every request
DEFAULT_LONG_MAX_TOKENS = 1500  # longest prompt of the long bucket, in tokens

PROMPT_SALT_LETTERS = 8
NO_SALT = "none"  # --prompt-salt none: prompts as in earlier versions, the same on every run


def new_prompt_salt() -> str:
    """A fresh salt: 8 random lowercase letters (one word; a few tokens in real tokenizers)."""
    return "".join(secrets.choice(string.ascii_lowercase) for _ in range(PROMPT_SALT_LETTERS))


def salt_text(text: str, salt: str, repeat: int = 0) -> str:
    """``text`` led by the run's salt (and which pass over the workload this is, from the second
    on), so that the prompt's first prefix-cache block differs from every other run's."""
    if not salt or salt == NO_SALT:
        return text if not repeat else f"{repeat} {text}"
    return f"{salt}{repeat if repeat else ''} {text}"


def with_answers(content: str, answers: Sequence[str]) -> str:
    """A task call's first user message with its other dependencies' answers after it, in
    ``depends_on`` order, a blank line before each: what the load generator sends and what a
    task build counts in ``prompt_tokens`` (here, not in ``workloads.schema``: the worker's
    locustfile loads no pandas)."""
    return "\n\n".join([content, *answers])


def call_messages(context: Sequence[dict[str, Any]] | None, own: Sequence[dict[str, Any]],
                  answers: Sequence[str]) -> list[dict[str, Any]]:
    """A call's prompt as the load generator builds it: ``context`` (its context call's prompt
    and answer; None: none), then its ``own`` messages, the ``answers`` of its other
    dependencies (in ``depends_on`` order) added to its first user message
    (:func:`with_answers`)."""
    msgs = [dict(m) for m in own]
    if answers:
        first = next(i for i, m in enumerate(msgs) if m["role"] == "user")
        msgs[first]["content"] = with_answers(str(msgs[first]["content"]), answers)
    return [*(context or []), *msgs]


@dataclass(frozen=True)
class PromptRequest:
    """One request to send: what the load generator needs, nothing about pacing."""

    request_id: str
    bucket: str
    prompt: str
    target_prompt_tokens: int
    max_tokens: int


@dataclass
class BuiltinMix:
    buckets: BucketSpec = BucketSpec()
    max_tokens: int = DEFAULT_MAX_TOKENS
    seed: int = 0
    long_max_tokens: int = DEFAULT_LONG_MAX_TOKENS
    salt: str = ""  # "" or "none": no salt

    def length_range(self, bucket: str) -> tuple[int, int]:
        if bucket == "short":
            return 1, self.buckets.short_max - 1
        if bucket == "medium":
            return self.buckets.short_max, self.buckets.long_min
        return self.buckets.long_min + 1, max(self.long_max_tokens, self.buckets.long_min + 1)

    def text_of_length(self, n_tokens: int, nonce: str) -> str:
        """About ``n_tokens`` words of text led by a unique nonce (one token per word on the
        simulator; close on real tokenizers for this vocabulary)."""
        rng = random.Random(f"{self.seed}:text:{nonce}")
        body = " ".join(rng.choices(_WORDS, k=max(n_tokens - 2, 1)))
        return f"req {nonce} {body}"

    def request(self, index: int, stream_tag: str = "") -> PromptRequest:
        """The ``index``-th request of this mix; ``stream_tag`` keeps ids unique per worker."""
        rng = random.Random(f"{self.seed}:{stream_tag}:{index}")
        bucket = rng.choices(BUCKETS, weights=[self.buckets.shares.get(b, 0.0) for b in BUCKETS])[0]
        low, high = self.length_range(bucket)
        if bucket == "short":
            low = max(low, 8)  # room for the nonce words
        n_tokens = rng.randint(low, high)
        request_id = f"{stream_tag}{index:x}" if stream_tag else f"{index:x}"
        opening = rng.getrandbits(32)  # drawn always, so the salt leaves the body unchanged
        salted = self.salt and self.salt != NO_SALT
        nonce = f"req {request_id} {self.salt if salted else f'{opening:08x}'}"
        body = " ".join(rng.choices(_WORDS, k=max(n_tokens - 3, 1)))
        return PromptRequest(
            request_id=request_id,
            bucket=bucket,
            prompt=f"{nonce} {body}",
            target_prompt_tokens=n_tokens,
            max_tokens=self.max_tokens,
        )
