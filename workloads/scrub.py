"""Anonymization guard: replace identifiers in logged text before anything is stored.

Usage::

    scrubber = Scrubber()
    clean = scrubber.scrub("mail me at ann@example.com")   # "mail me at <EMAIL>"
    scrubber.report.to_dict()   # {"replaced": {"email": 1}, "texts_seen": 1, "texts_changed": 1}

Kinds replaced, in this order (earlier kinds win where patterns overlap): URLs carrying
credentials, API keys and bearer tokens, e-mail addresses, IPv4 and IPv6 addresses, payment card
numbers, US social security numbers, phone numbers, and any run of 7 or more digits. The
placeholders (``<EMAIL>`` ...) match no pattern, so scrubbing is idempotent and
``assert_clean`` can check stored text by scrubbing it again.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from workloads.errors import ScrubError

_HEX = r"[0-9A-Fa-f]{1,4}"

# (kind, pattern, replacement); order matters, see the module docstring.
_RULES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    (
        "url_credentials",
        re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^\s/:@]+:[^\s/@]+@"),
        r"\1<CREDENTIALS>@",
    ),
    (
        "secret",
        re.compile(
            r"\b(?:sk-[A-Za-z0-9_-]{16,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{20,}"
            r"|xox[abprs]-[A-Za-z0-9-]{10,})"
            r"|\b[Bb]earer\s+[A-Za-z0-9._~+/-]{16,}=*"
        ),
        "<SECRET>",
    ),
    ("email", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
     "<EMAIL>"),
    (
        "ipv4",
        re.compile(r"(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)"
                   r"(?![\d.])"),
        "<IP>",
    ),
    (
        "ipv6",
        re.compile(
            rf"(?<![\w:])(?:(?:{_HEX}:){{7}}{_HEX}"
            rf"|(?:{_HEX}:){{1,6}}:(?:{_HEX}(?::{_HEX}){{0,5}})?)(?![\w:])"
        ),
        "<IP>",
    ),
    ("card", re.compile(r"(?<![\d-])(?:\d{4}[ -]){3}\d{1,7}(?![\d-])"), "<CARD>"),
    ("ssn", re.compile(r"(?<![\d-])\d{3}-\d{2}-\d{4}(?![\d-])"), "<ID>"),
    (
        "phone",
        re.compile(
            r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?"
            r"(?:\(\d{1,4}\)[\s.-]?\d{2,4}[\s.-]?\d{3,4}|\d{2,4}[\s.-]\d{3,4}[\s.-]?\d{3,4})(?!\w)"
        ),
        "<PHONE>",
    ),
    ("digits", re.compile(r"\d{7,}"), "<NUMBER>"),
)

KINDS = tuple(kind for kind, _, _ in _RULES)


@dataclass
class ScrubReport:
    """What a scrubber replaced: counts per kind, and how many texts it saw and changed."""

    replaced: Counter[str] = field(default_factory=Counter)
    texts_seen: int = 0
    texts_changed: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "replaced": {k: self.replaced[k] for k in KINDS if self.replaced[k]},
            "texts_seen": self.texts_seen,
            "texts_changed": self.texts_changed,
        }


def scrub_text(text: str) -> tuple[str, Counter[str]]:
    """Return ``text`` with identifiers replaced, and the count of replacements per kind."""
    counts: Counter[str] = Counter()
    for kind, pattern, replacement in _RULES:
        text, n = pattern.subn(replacement, text)
        if n:
            counts[kind] += n
    return text, counts


@dataclass
class Scrubber:
    """Scrubs texts one by one and accumulates a ``ScrubReport``."""

    report: ScrubReport = field(default_factory=ScrubReport)

    def scrub(self, text: str) -> str:
        clean, counts = scrub_text(text)
        self.report.texts_seen += 1
        if counts:
            self.report.texts_changed += 1
            self.report.replaced.update(counts)
        return clean

    def scrub_messages(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        return [{**m, "content": self.scrub(str(m.get("content", "")))} for m in messages]


def assert_clean(texts: Iterable[str], what: str) -> None:
    """Raise ScrubError if any text still holds an identifier (i.e. was not scrubbed)."""
    for i, text in enumerate(texts):
        _, counts = scrub_text(text)
        if counts:
            raise ScrubError(
                f"{what}: entry {i} still holds identifiers ({dict(counts)}); "
                "scrub text with workloads.scrub.Scrubber before storing it"
            )


def letters_id(index: int, width: int = 6) -> str:
    """``index`` written in base 26 with the letters a-z, ``width`` letters (``a`` pads), e.g.
    ``letters_id(27) == "aaaabb"``. A unique word that no identifier pattern here matches, where
    digits could read as a phone number or a card number: prompt nonces and request keys."""
    out = ""
    for _ in range(width):
        index, digit = divmod(index, 26)
        out = chr(ord("a") + digit) + out
    if index:
        raise ValueError(f"index does not fit in {width} letters")
    return out
