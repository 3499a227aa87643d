"""The docs site: reference pages generated from the code, and `mkdocs build --strict` of the
real docs folder (the navigation picks up a new guide page without an edit of mkdocs.yml)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from collectors import schema_docs
from infra import cli, orchestrate
from infra.tools import docs_reference
from locustfiles.config import RunConfig, cli_flag

REPO = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).with_name("mkdocs")


def test_run_options_lists_every_field_with_its_default_and_range() -> None:
    text = docs_reference.run_options()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    names = [f for _, f, _ in docs_reference._option_fields(RunConfig)]
    assert len(rows) == len(names) >= len([f for f in dataclasses.fields(RunConfig)
                                            if "option" in f.metadata])
    assert "| `--users` | `16` | an integer from 1 to 100000 |" in text
    assert f"`{cli_flag('max_tokens')}`" in text and "`--swarmload-max-tokens`" in text
    assert "`SWARMLOAD_MAX_TOKENS`" in text and "study `workload.max_tokens`" in text
    assert "| `targets` | (none) |" in text  # no flag: named by its field


def test_commands_hold_each_subcommands_help() -> None:
    text = docs_reference.commands()
    for words in cli.COMMANDS:
        assert f"### `swarmload {' '.join(words)}`" in text
    assert "usage: swarmload run" in text and "--users USERS" in text
    assert "usage: swarmload dashboard" in text


def test_study_keys_list_every_key_of_every_section_with_its_default() -> None:
    from infra.study.spec import SECTIONS, study_keys

    text = docs_reference.study_keys()
    keys = list(study_keys())
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == len(keys) and {k.section for k in keys} == set(SECTIONS)
    assert "### `precision`" in text and "### `configurations[]`" in text
    assert "| `repeat_order` | `alternate` | one of alternate, shuffle, up |" in text
    assert "| `min_e2e_multiple` | `10` | a number >= 1 |" in text
    assert "| `step_duration_s` | `30` |" in text  # the study's own default, not the run's 60
    assert "| `kind` | (required) | one of concurrency, rate |" in text


def test_tables_list_every_column_with_type_and_unit() -> None:
    text = docs_reference.tables()
    for name, (schema, _, _) in schema_docs.TABLES.items():
        assert f"### `{name}/`" in text
        for column in schema.names:
            assert f"| `{column}` |" in text
    assert "| `ttft_s` | double | s |" in text
    assert "| `sent_wall_ns` | int64, not null | ns, wall clock |" in text


def test_exit_codes_come_from_the_orchestrator() -> None:
    text = docs_reference.exit_codes()
    for name in ("EXIT_OK", "EXIT_FAILED", "EXIT_BAD_INPUT", "EXIT_UNREACHABLE",
                 "EXIT_INTERRUPTED"):
        assert f"| {getattr(orchestrate, name)} | `{name}` |" in text


def test_unknown_marker_fails_and_repository_links_become_text(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="unknown reference section 'nope'"):
        docs_reference.render("<!-- swarmload-reference: nope -->\n")
    docs = tmp_path / "docs"
    (docs / "guides").mkdir(parents=True)
    (tmp_path / "infra").mkdir()
    (tmp_path / "infra" / "procs.py").write_text("")
    page = ("[the helper](../../infra/procs.py), [gone](../../infra/gone.py), "
            "[metrics](../METRICS.md), [site](https://example.org/x)")
    out = docs_reference.unlink_repository_files(page, docs / "guides", docs, tmp_path)
    assert out == ("the helper, [gone](../../infra/gone.py), [metrics](../METRICS.md), "
                   "[site](https://example.org/x)")


@pytest.mark.skipif(not MKDOCS.exists(), reason="mkdocs is a dev extra: make setup")
def test_docs_site_builds_strict_and_a_new_guide_joins_the_nav(tmp_path: Path) -> None:
    """The real docs folder, copied with a guide page nobody listed anywhere."""
    work = tmp_path / "repo"
    shutil.copytree(REPO / "docs", work / "docs")
    shutil.copy(REPO / "mkdocs.yml", work / "mkdocs.yml")
    for name in ("CONTRIBUTING.md", "CHANGELOG.md"):
        shutil.copy(REPO / name, work / name)
    (work / "infra" / "tools").mkdir(parents=True)
    shutil.copy(REPO / "infra" / "tools" / "docs_reference.py",
                work / "infra" / "tools" / "docs_reference.py")
    (work / "docs" / "guides" / "zz-new-topic.md").write_text("# A new topic\n\nText.\n")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([str(MKDOCS), "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    home = (tmp_path / "site" / "index.html").read_text()
    assert 'href="guides/zz-new-topic/"' in home and "A new topic" in home
    cli_page = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "swarmload-reference" not in cli_page and "--max-tokens" in cli_page
    folder = (tmp_path / "site" / "reference" / "run-folder" / "index.html").read_text()
    assert "server_request_id" in folder and "timeout_mid_stream" in folder
