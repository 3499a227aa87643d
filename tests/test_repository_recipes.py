"""ARCHITECTURE.md's recipes ("Where a newcomer adds ...") stay true to the code (issue 41).

Each recipe's steps name files in backticks (`path`, or `path: symbol`); a placeholder such as
`<name>` stands for the file the newcomer creates, so its folder must exist. A bare constant or
class in backticks (`LOG_KINDS`, `RunConfig`) is named beside its file: it must be defined at the
top of one of the Python files its step names (or, where the step names none, of its recipe's).
A rename or a move that leaves a recipe behind fails here, naming the recipe and what it lost.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"
SECTION = "## Where a newcomer adds"

# `path` or `path: symbol` (also `path:symbol`): a folder ending in a slash, or a file
_PATH = re.compile(r"^(?P<path>[\w.<>/-]+?(?:/|\.(?:py|md|toml|yaml|yml|json|txt|cfg)))"
                   r"(?:\s*:\s*(?P<symbol>[\w.]+))?$")
# a constant or a class named alone: `LOG_KINDS`, `_READERS`, `RunConfig`
_NAME = re.compile(r"^_?[A-Z][A-Za-z0-9_]*$")
_STEP = re.compile(r"^\d+\.\s")


@dataclass
class Step:
    text: str
    paths: list[tuple[str, str | None]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)


@dataclass
class Recipe:
    title: str
    steps: list[Step] = field(default_factory=list)


def parse_recipes(markdown: str, repo: Path = REPO) -> list[Recipe]:
    """The recipes of the section, each with its numbered steps and what they name (a path
    has a folder in it, or is a file at the top of ``repo``)."""
    start = markdown.index(SECTION)
    end = markdown.find("\n## ", start + len(SECTION))
    recipes: list[Recipe] = []
    for line in markdown[start:end if end != -1 else None].splitlines():
        title = re.match(r"^\*\*(.+?)\*\*", line)
        if title:
            recipes.append(Recipe(title.group(1)))
        elif recipes and _STEP.match(line):
            recipes[-1].steps.append(Step(line))
        elif recipes and recipes[-1].steps and line.startswith("   "):
            recipes[-1].steps[-1].text += " " + line.strip()
    for recipe in recipes:
        for step in recipe.steps:
            for span in re.findall(r"`([^`]+)`", step.text):
                span = span.strip()
                path = _PATH.match(span)
                if path and ("/" in path.group("path") or (repo / path.group("path")).exists()):
                    step.paths.append((path.group("path"), path.group("symbol")))
                elif _NAME.match(span):
                    step.names.append(span)
    return recipes


@cache
def defined_names(path: Path) -> frozenset[str]:
    """Names a module defines at its top (functions, classes, assignments), and each class's
    members as ``Class.member``; imported names do not count."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()

    def targets(node: ast.stmt) -> list[str]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return [node.name]
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        return []

    for node in tree.body:
        names.update(targets(node))
        if isinstance(node, ast.ClassDef):
            names.update(f"{node.name}.{member}" for child in node.body
                         for member in targets(child))
    return frozenset(names)


def problems(recipes: list[Recipe], repo: Path = REPO) -> list[str]:
    """One line per file or symbol a recipe names that the code does not have."""
    found: list[str] = []
    for recipe in recipes:
        recipe_files = list(dict.fromkeys(repo / p for step in recipe.steps for p, _ in step.paths
                                          if p.endswith(".py") and "<" not in p))
        for step in recipe.steps:
            for path, symbol in step.paths:
                if "<" in path:  # a file the newcomer creates: its folder must be there
                    folder = repo / path[:path.index("<")].rpartition("/")[0]
                    if not folder.is_dir():
                        found.append(f"{recipe.title}: no folder {folder.relative_to(repo)}/ "
                                     f"for {path}")
                    continue
                if not (repo / path).exists():
                    found.append(f"{recipe.title}: no file {path}")
                elif symbol and symbol not in defined_names(repo / path):
                    found.append(f"{recipe.title}: {path} defines no {symbol}")
            step_files = [repo / p for p, _ in step.paths
                          if p.endswith(".py") and "<" not in p and (repo / p).exists()]
            where = step_files or [f for f in recipe_files if f.exists()]
            for name in step.names:
                if not any(name in defined_names(f) for f in where):
                    files = ", ".join(str(f.relative_to(repo)) for f in where) or "no Python file"
                    found.append(f"{recipe.title}: {name} is defined in none of {files}")
    return found


def test_every_file_and_symbol_a_recipe_names_is_in_the_code() -> None:
    recipes = parse_recipes(ARCHITECTURE.read_text(encoding="utf-8"))
    assert len(recipes) >= 5, f"{SECTION} ...: recipes not found in {ARCHITECTURE}"
    for recipe in recipes:
        assert recipe.steps, f"recipe {recipe.title!r} has no numbered steps"
        assert any(step.paths for step in recipe.steps), f"recipe {recipe.title!r} names no file"
    assert problems(recipes) == [], "docs/ARCHITECTURE.md's recipes drifted from the code"


def test_a_recipe_that_drifted_is_reported(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("KNOWN = 1\n\nclass Thing:\n    attr = 2\n")
    markdown = f"""{SECTION} ...

**A change**
1. `pkg/mod.py: KNOWN`, `pkg/mod.py: Thing.attr` and `pkg/mod.py: GONE`; `pkg/new_<name>.py`.
2. `pkg/moved.py`, `other/<name>.py`; beside them `KNOWN`, `Thing` and `Renamed`.

## Next
"""
    recipes = parse_recipes(markdown, tmp_path)
    assert [len(step.paths) for step in recipes[0].steps] == [4, 2]
    assert problems(recipes, tmp_path) == [
        "A change: pkg/mod.py defines no GONE",
        "A change: no file pkg/moved.py",
        "A change: no folder other/ for other/<name>.py",
        "A change: Renamed is defined in none of pkg/mod.py",
    ]
