"""Figures of the code's shape: the longest functions and the imports made inside functions.

    python -m infra.tools.code_figures                  # this checkout
    python infra/tools/code_figures.py --root DIR       # another (an older commit's worktree)

Product code only: the five top-level packages, without the tooling (``infra/tools/``, and
where it lived before: ``infra/bench/``, ``infra/device/`` and the loose tool modules) for the
import count, whose figure also leaves out ``dashboards/analysis`` (its modules import each
other late by design: an import-linter contract sees those imports). A function's length is
its ``def`` line to its last line (``ast``: ``end_lineno - lineno + 1``).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGES = ("workloads", "locustfiles", "collectors", "dashboards", "infra")
TOOLING = ("infra/tools/", "infra/bench/", "infra/device/", "infra/screenshots.py",
           "infra/bad_inputs.py", "infra/docs_reference.py", "infra/browser.py",
           "infra/prometheus.py")
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _modules(root: Path) -> list[tuple[str, ast.Module]]:
    out = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            out.append((name, ast.parse(path.read_text(encoding="utf-8"))))
    return out


def function_lengths(root: Path) -> list[tuple[int, str]]:
    """(lines, ``file:line name``) of every function, the longest first."""
    rows = [(node.end_lineno - node.lineno + 1, f"{name}:{node.lineno} {node.name}")
            for name, tree in _modules(root) for node in ast.walk(tree)
            if isinstance(node, FUNCTIONS) and node.end_lineno is not None]
    return sorted(rows, reverse=True)


def local_imports(root: Path) -> list[str]:
    """``file:line module`` of every import statement inside a function (product code, not
    the tooling, not dashboards/analysis)."""
    found: dict[tuple[str, int], str] = {}
    for name, tree in _modules(root):
        if name.startswith(TOOLING) or name.startswith("dashboards/analysis/"):
            continue
        for function in ast.walk(tree):
            if not isinstance(function, FUNCTIONS):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    found[(name, node.lineno)] = node.names[0].name
                elif isinstance(node, ast.ImportFrom):
                    found[(name, node.lineno)] = node.module or "."
    return [f"{name}:{line} {module}" for (name, line), module in sorted(found.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.tools.code_figures",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2],
                        help="the checkout to measure (default: this one)")
    parser.add_argument("--top", type=int, default=5, help="how many longest functions")
    parser.add_argument("--list", action="store_true", help="every function-local import")
    args = parser.parse_args(argv)
    lengths = function_lengths(args.root)
    imports = local_imports(args.root)
    for lines, where in lengths[: args.top]:
        print(f"{lines:5d}  {where}")
    print(f"functions over 50 lines: {sum(1 for n, _ in lengths if n > 50)} of {len(lengths)}")
    if args.list:
        print("\n".join(imports))
    print(f"function-local imports (product code, not dashboards/analysis): {len(imports)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
