"""Reference pages of the docs site, generated from the code when the site is built.

``mkdocs.yml`` names this file as a hook: every page that holds a marker line
``<!-- swarmload-reference: NAME -->`` gets that line replaced by what :data:`SECTIONS` makes of
the code at build time, so the reference cannot fall behind it:

- ``run-options``: every field of ``locustfiles/config.py: RunConfig`` (flag, default, allowed
  values, help, where it appears: ``swarmload run``, the ``--swarmload-*`` Locust option and its
  ``SWARMLOAD_*`` variable, a study file's ``workload:`` key);
- ``study-keys``: every key of a study file, section by section, from its declaration
  (``infra/study/spec.py: study_keys``: the study's own keys and the RunConfig options it takes);
- ``commands``: each ``swarmload`` sub-command's own ``--help`` (``infra/cli.py: COMMANDS``);
- ``tables``: every Parquet table of a run folder, column by column (type, unit, meaning), from
  ``collectors/schemas.py`` and ``collectors/schema_docs.py``;
- ``outcomes``: the outcome classes (``collectors/schemas.py: OUTCOMES``);
- ``exit-codes``: the ``EXIT_*`` constants of ``swarmload run`` with their comments.

``python -m infra.tools.docs_reference NAME`` prints one of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from collectors import request_columns, schema_docs, schemas
from infra import cli, orchestrate
from infra.study import spec as study_spec
from locustfiles import config

MARKER = re.compile(r"^<!-- swarmload-reference: ([a-z-]+) -->$", re.MULTILINE)
HELP_COLUMNS = "100"  # argparse wraps --help to $COLUMNS: the same text on every machine


def _cell(text: Any) -> str:
    """Text for one Markdown table cell: pipes escaped, no line breaks."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _shown_default(value: Any) -> str:
    if value in ("", None, ()):
        return "(none)"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, tuple):
        return "`" + ", ".join(map(str, value)) + "`"
    return f"`{value}`"


def _option_fields(cls: type, group: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(group, field, OptionSpec) of every option of ``cls``, nested dataclasses included (their
    field name is the group)."""
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("option")
        if spec is not None:
            yield group, f, spec
            continue
        if f.default_factory is not dataclasses.MISSING:
            nested = f.default_factory()
            if dataclasses.is_dataclass(nested):
                yield from _option_fields(type(nested), f.name)


def _commands_of(spec: Any) -> tuple[str, ...]:
    """The commands whose parser has the option's flag (``cli``: a tuple of commands, or
    True for ``swarmload run`` and the commands that take its flags)."""
    if isinstance(spec.cli, (tuple, list)):
        return tuple(spec.cli)
    return ("run", "master", "soak") if spec.cli else ()


def _where(f: Any, spec: Any) -> str:
    """Where an option appears: its commands, its Locust option and variable, its study key."""
    where = []
    commands = _commands_of(spec)
    if commands:
        where.append(", ".join(f"`{c}`" for c in commands))
    if spec.locust:
        locust = config.locust_flag(f.name)
        env = "SWARMLOAD_" + locust.removeprefix("--" + config.LOCUST_PREFIX).upper()
        where.append(f"`{locust}`, `{env.replace('-', '_')}`")
    if spec.study is not None:
        key = spec.study or f.name
        where.append(f"study `{key if '.' in key else 'workload.' + key}`")
    return "; ".join(where) or "set by the commands themselves (soak, master)"


def _default(f: Any, spec: Any) -> str:
    """The field's default, and any command's (or the study file's) own."""
    auto = getattr(spec, "auto", None)

    def text(value: Any) -> str:  # an int option's "auto" is shown as the word
        return "`auto`" if auto is not None and value == auto else _shown_default(value)

    shown = text(f.default)
    own = dict(getattr(spec, "defaults", ()) or ())
    if own:
        shown += " (" + ", ".join(f"{scope}: {text(v)}" for scope, v in own.items()) + ")"
    return shown


def run_options() -> str:
    """Every RunConfig field, one table per concern (the field's group, or its nested
    configuration), in the order of the class."""
    groups: dict[str, list[str]] = {}
    for nested, f, spec in _option_fields(config.RunConfig):
        group = getattr(spec, "group", "") or nested
        name = f"`{config.cli_flag(f.name)}`" if _commands_of(spec) else f"`{f.name}`"
        groups.setdefault(group, []).append("| " + " | ".join(_cell(x) for x in (
            name, _default(f, spec), spec.allowed(),
            orchestrate.TARGET_HELP if f.name == "target" else spec.help,
            _where(f, spec))) + " |")
    header = ["| option | default | allowed | help | where |", "|---|---|---|---|---|"]
    if list(groups) == [""]:
        return "\n".join(header + groups[""])
    return "\n\n".join(f"### {group or 'other'}\n\n" + "\n".join(header + rows)
                       for group, rows in groups.items())


def study_keys() -> str:
    """Every key of a study file, one table per section, in the order of the declarations."""
    groups: dict[str, list[str]] = {}
    for key in study_spec.study_keys():
        declared = key.spec
        if declared.required:
            default = "(required)"
        elif dataclasses.is_dataclass(key.default):
            default = "(its keys below)"
        elif declared.auto is not None and key.default == declared.auto:
            default = "`auto`"
        else:
            default = _shown_default(None if key.default in ({}, ()) else key.default)
        allowed = "true or false" if declared.kind in ("bool", "switch") else declared.allowed()
        help_text = (f"false: {declared.help}" if declared.study_negated else declared.help)
        if key.run_option:
            help_text += " (a run option: `swarmload run` has it too)"
        groups.setdefault(key.section, []).append("| " + " | ".join(_cell(x) for x in (
            f"`{key.name}`", default, allowed, help_text)) + " |")
    header = ["| key | default | allowed | meaning |", "|---|---|---|---|"]
    return "\n\n".join(
        ("### Top level" if not section else f"### `{section}`") + "\n\n" + "\n".join(
            header + rows) for section, rows in groups.items())


def command_help(words: tuple[str, ...]) -> str:
    """What ``swarmload WORDS --help`` prints."""
    out = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            cli.main([*words, "--help"])
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return out.getvalue().rstrip()


def commands() -> str:
    parts = []
    for words, (_, summary) in cli.COMMANDS.items():
        name = " ".join(words)
        parts.append(f"### `swarmload {name}`\n\n{summary}.\n\n```text\n"
                     f"{command_help(words)}\n```\n")
    return "\n".join(parts)


_UNITS = (("_wall_ns", "ns, wall clock"), ("_ns", "ns"), ("_kb_s", "KB/s"), ("_s", "s"),
          ("_bytes", "bytes"), ("_pct", "%"), ("_mhz", "MHz"), ("_mj", "mJ"), ("_w", "W"),
          ("_c", "°C"), ("_tokens", "tokens"), ("_per_s", "per s"))


def unit_of(column: str) -> str:
    """The unit a column's name carries (``ttft_s`` -> s), or ''."""
    if column.endswith("_per_s"):
        return "per s"
    for suffix, unit in _UNITS:
        if column.endswith(suffix):
            return unit
    return ""


def tables() -> str:
    parts = []
    for name, (schema, about, columns) in schema_docs.TABLES.items():
        rows = [f"### `{name}/`\n", about.strip(), "",
                "| column | type | unit | meaning |", "|---|---|---|---|"]
        missing = [c for c in schema.names if c not in columns]
        if missing:
            raise LookupError(f"{name}: column(s) {', '.join(missing)} of collectors/schemas.py "
                              "have no line in collectors/schema_docs.py")
        for fld in schema:
            kind = str(fld.type) + ("" if fld.nullable else ", not null")
            declared = request_columns.BY_NAME.get(fld.name) if name == schemas.REQUESTS_TABLE \
                else None
            unit = declared.unit if declared is not None and declared.unit else unit_of(fld.name)
            rows.append("| " + " | ".join(_cell(x) for x in (
                f"`{fld.name}`", kind, unit, columns[fld.name])) + " |")
        parts.append("\n".join(rows) + "\n")
    return "\n".join(parts)


def outcomes() -> str:
    rows = ["| outcome | what happened | counted as |", "|---|---|---|"]
    for outcome in schemas.OUTCOMES:
        counted = ("a success" if outcome == schemas.OUTCOME_OK else
                   "generator-side, apart from errors" if outcome in schemas.GENERATOR_OUTCOMES
                   else "an error")
        rows.append(f"| `{outcome}` | {_cell(schema_docs.OUTCOME_DOCS[outcome])} | {counted} |")
    return "\n".join(rows)


def exit_codes() -> str:
    """``EXIT_*`` of ``swarmload run`` (infra/orchestrate.py), each with the comment beside it."""
    source = inspect.getsource(orchestrate)
    rows = ["| exit code | name | meaning |", "|---|---|---|"]
    for name, code, comment in re.findall(r"^(EXIT_[A-Z_]+) = (\d+)\s*# (.*)$", source,
                                          re.MULTILINE):
        assert getattr(orchestrate, name) == int(code), name
        rows.append(f"| {code} | `{name}` | {_cell(comment)} |")
    if len(rows) == 2:  # the constants moved: fail the build rather than print an empty table
        raise LookupError("no 'EXIT_NAME = CODE  # meaning' lines in infra/orchestrate.py")
    return "\n".join(rows)


SECTIONS: dict[str, Callable[[], str]] = {
    "run-options": run_options,
    "commands": commands,
    "study-keys": study_keys,
    "tables": tables,
    "outcomes": outcomes,
    "exit-codes": exit_codes,
}


def render(markdown: str) -> str:
    """``markdown`` with each marker line replaced by its generated section."""
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in SECTIONS:
            raise KeyError(f"unknown reference section {name!r}; known: {', '.join(SECTIONS)}")
        return SECTIONS[name]()

    return MARKER.sub(replace, markdown)


_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s#]+)(#[^)\s]*)?\)")


def unlink_repository_files(markdown: str, page_dir: Path, docs_dir: Path,
                            repo_root: Path) -> str:
    """Links from a page to files of the repository outside the docs folder (``../../infra/
    procs.py``: they work on a code host, not on the site) become their text; a link to a file
    that does not exist is left for mkdocs' strict check."""
    def replace(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return match.group(0)
        path = (page_dir / target).resolve()
        if path.is_relative_to(docs_dir) or not path.is_relative_to(repo_root):
            return match.group(0)
        return text if path.exists() else match.group(0)

    return _LINK.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, **_: Any) -> str:
    """mkdocs hook (``hooks:`` in mkdocs.yml): generated sections in, repository links out."""
    docs_dir = Path(config["docs_dir"]).resolve()
    repo_root = Path(config["config_file_path"]).resolve().parent
    page_dir = (docs_dir / page.file.src_uri).parent
    return unlink_repository_files(render(markdown), page_dir, docs_dir, repo_root)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in SECTIONS:
        print(f"usage: python -m infra.tools.docs_reference {{{','.join(SECTIONS)}}}",
              file=sys.stderr)
        return 2
    print(SECTIONS[args[0]]())
    return 0


if __name__ == "__main__":
    sys.exit(main())
