"""Studies: a study file (:mod:`infra.study.spec`) run as configurations x load steps
(:mod:`infra.study.runner`); example study files in ``infra/study/examples/``, shipped with the
package: ``swarmload study run sim-two-configs`` finds one by name from any folder.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

EXAMPLES_DIR = Path(str(files(__name__) / "examples"))


def example_names() -> list[str]:
    """The packaged example studies, by name (file name without ``.yaml``)."""
    return sorted(p.stem for p in EXAMPLES_DIR.glob("*.yaml"))


def study_file(path: str | Path) -> Path:
    """``path`` itself when it exists, else the packaged example of that name (``sim-two-configs``
    or ``sim-two-configs.yaml``), else ``path`` (whose read then fails, naming the examples)."""
    given = Path(path)
    if given.exists() or given.name != str(path):  # a path with folders is never an example
        return given
    example = EXAMPLES_DIR / (given.name if given.suffix == ".yaml" else f"{given.name}.yaml")
    return example if example.is_file() else given
