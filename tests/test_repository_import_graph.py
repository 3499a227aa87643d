"""The analysis modules import each other without a circle, imports inside functions counted.

grimp (import-linter's graph library) reads every import statement of a module, those inside a
function included, so a circle closed by a "late" import is a circle here too. The run-folder
and study-folder readers live below analysis (``collectors/run_folder.py``); nothing in
``dashboards/analysis`` needs a late first-party import any more, and none may hide a circle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
ROOTS = ("workloads", "collectors", "locustfiles", "dashboards", "infra")
ANALYSIS = "dashboards.analysis"


def circle_breakers(graph: grimp.ImportGraph, package: str) -> set[tuple[str, str]]:
    """The imports between ``package``'s children that would have to go for no circle to be
    left (grimp's nomination); empty when its children import each other in one direction."""
    return set(graph.nominate_cycle_breakers(package))


def function_local_imports(folder: Path, roots: tuple[str, ...]) -> list[str]:
    """``path:line module`` of every import of a first-party module made inside a function or
    class body under ``folder``."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for scope in ast.walk(tree):
            if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for node in ast.walk(scope):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                found += [f"{path.name}:{node.lineno} {name}" for name in names
                          if name.split(".")[0] in roots]
    return sorted(set(found))


def test_the_analysis_modules_import_each_other_without_a_circle() -> None:
    graph = grimp.build_graph(*ROOTS, cache_dir=None)
    assert circle_breakers(graph, ANALYSIS) == set()


def test_no_first_party_import_inside_an_analysis_function() -> None:
    assert function_local_imports(REPO_ROOT / "dashboards" / "analysis", ROOTS) == []


def test_a_circle_closed_inside_a_function_is_found(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # what the two checks above would say of the tree before the run-folder layer: runs.py
    # imported burst inside main(), burst imported runs at the top
    package = tmp_path / "circlepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "runs.py").write_text(
        "def main():\n    from circlepkg.burst import report\n    return report()\n")
    (package / "burst.py").write_text("from circlepkg import runs\n\n\ndef report():\n"
                                      "    return runs\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "circlepkg", raising=False)
    graph = grimp.build_graph("circlepkg", cache_dir=None)
    assert circle_breakers(graph, "circlepkg")
    assert function_local_imports(package, ("circlepkg",)) == ["runs.py:2 circlepkg.burst"]
