"""The GPU machine gets swarmload's dependencies as carried wheels (infra/tools/device/prepare.sh):
a runtime dependency that is neither carried nor in the machine's image breaks the device run late
(a soak's drift report once failed there after 15 minutes: pymannkendall was missing)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / "infra" / "tools" / "device" / "swarmload-py312.txt"


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def test_every_runtime_dependency_is_carried_in_the_image_or_named_not_needed():
    deps = {_name(r) for r in tomllib.loads((REPO / "pyproject.toml").read_text())[
        "project"]["dependencies"]}
    text = WHEELS.read_text()
    carried = {_name(line) for line in text.splitlines() if line and not line.startswith("#")}
    header = " ".join(line for line in text.splitlines() if line.startswith("#")).lower()
    image = set(re.search(r"image lacks \(it has ([^)]*)\)", header).group(1)
                .replace("#", " ").replace(" ", "").split(","))
    not_needed = set(re.search(r"not needed there: ([^(]*)\(", header).group(1)
                     .replace(" ", "").split(","))
    missing = sorted(deps - carried - image - not_needed)
    assert not missing, f"add to {WHEELS.name} (or name them as in the image): {missing}"
