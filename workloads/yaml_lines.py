"""Line numbers for errors in YAML files (study files, arrival plans): ``file:line: message``.

PyYAML's composer keeps a start mark (line, column) on every node; :func:`key_lines` walks the
node tree once and maps each key path (``load.steps[2]``, ``configurations[0].name``) to its line,
and :func:`locate` finds the line of the path an error message starts with (or, for flat files,
the first key it names).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\])*")


def key_lines(text: str) -> dict[str, int]:
    """Key path -> 1-based line of every mapping key and list item of a YAML document."""
    lines: dict[str, int] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                sub = f"{path}.{key_node.value}" if path else str(key_node.value)
                lines.setdefault(sub, key_node.start_mark.line + 1)
                walk(value_node, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                sub = f"{path}[{i}]"
                lines[sub] = item.start_mark.line + 1
                walk(item, sub)

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return lines
    if root is not None:
        walk(root, "")
    return lines


def locate(message: str, lines: dict[str, int]) -> int | None:
    """The line of the key path ``message`` starts with (its nearest known parent when the key
    itself is missing), else of the first top-level key named anywhere in it; None if neither."""
    match = _PATH.match(message)
    if match:
        path = match.group(0)
        while path:
            if path in lines:
                return lines[path]
            path = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", path) if re.search(
                r"(\.[^.\[]*|\[\d+\])$", path) else ""
    for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message):
        if word in lines and "." not in word:
            return lines[word]
    return None


def yaml_error_line(path: object, exc: yaml.YAMLError) -> str:
    """One line for a YAML syntax error: ``file:line: not valid YAML: problem``."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}: not valid YAML: {problem}"
