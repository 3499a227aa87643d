"""The docs stay pages a reader can take in (issue 41): results are one page per result, and
working logs do not land under docs/. No page is over 300 lines; the reference pages' tables are
generated at build time (infra/tools/docs_reference.py), so their sources are short too."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_PAGE_LINES = 300
# generated at build time: none of the hand-written pages is held to more than MAX_PAGE_LINES
REFERENCE_PAGES: dict[str, int] = {}


def test_no_page_under_docs_is_over_300_lines() -> None:
    pages = sorted((REPO / "docs").rglob("*.md"))
    assert len(pages) > 20, "docs/ pages not found"
    long = {}
    for page in pages:
        name = str(page.relative_to(REPO))
        lines = len(page.read_text(encoding="utf-8").splitlines())
        if lines > REFERENCE_PAGES.get(name, MAX_PAGE_LINES):
            long[name] = lines
    assert long == {}, (f"pages over {MAX_PAGE_LINES} lines: keep results to a table and the "
                        "command, put the data beside the page and the log in git history")
