"""The README stays a front page: at most ~10 KB, the two set-up commands first and exactly as
`.ci/run` and a newcomer use them, and every link in it pointing at a file that exists (the guides
live on the docs site, under docs/)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def test_readme_is_short_and_opens_with_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.encode()) <= 10 * 1024, "the README is a front page: put guides in docs/"
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split("#")[0].strip() for line in block] == ["make demo", "make test"]
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_every_relative_link_of_the_readme_exists() -> None:
    links = re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", README.read_text())
    relative = [link for link in links if "://" not in link]
    assert relative, "the README links into the docs"
    missing = [link for link in relative if not (REPO / link).exists()]
    assert not missing, missing
