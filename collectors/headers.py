"""Request headers as a user gives them: ``'Name: value'`` lines (``--header``, a study file's
``endpoint.headers``, ``SWARMLOAD_HEADERS``), read here only.

The run configuration's check (``locustfiles/config.py``), the workers' client settings, the
preflight, and what a run or study folder records (the header names, never a value: values may
be credentials) all go through these functions.
"""

from __future__ import annotations

from collections.abc import Iterable

REDACTED = "<redacted>"


class HeaderError(ValueError):
    """A line that is not ``'Name: value'``; the message shows its first word only."""


def parse_header(line: str) -> tuple[str, str]:
    """``'Name: value'`` -> ``(name, value)``, both stripped; the name may hold no space."""
    name, sep, value = line.partition(":")
    name = name.strip()
    if not sep or not name or any(c.isspace() for c in name):
        first = (line.split() or [""])[0][:40]  # only the first word: values may be secret
        raise HeaderError(f"got {first!r}..., not 'Name: value'")
    return name, value.strip()


def parse_headers(lines: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """Every line that is not blank, parsed; raises HeaderError at the first bad one."""
    return tuple(parse_header(str(line)) for line in lines if str(line).strip())


def header_name(line: str) -> str:
    """The name of a ``'Name: value'`` line: what a run or study folder keeps of it."""
    return line.split(":", 1)[0].strip()


def redact_header(line: str) -> str:
    """``'Name: <redacted>'``: how a recorded command or study file shows a header."""
    return f"{header_name(line)}: {REDACTED}"
