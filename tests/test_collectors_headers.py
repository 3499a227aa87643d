"""Request headers ('Name: value' lines): the one parser every reader goes through."""

from __future__ import annotations

import pytest

from collectors.headers import HeaderError, header_name, parse_headers, redact_header
from collectors.manifest import redacted_command
from locustfiles.config import ConfigError, RunConfig


def test_lines_become_stripped_pairs_and_blank_lines_are_skipped() -> None:
    lines = ["X-Tenant:  blue-7 ", "", "Authorization: Bearer a:b"]
    assert parse_headers(lines) == (("X-Tenant", "blue-7"), ("Authorization", "Bearer a:b"))


@pytest.mark.parametrize("line", ["Authorization Bearer sk-secret", "X Tenant: a", ": value"])
def test_a_bad_line_is_refused_showing_its_first_word_only(line: str) -> None:
    with pytest.raises(HeaderError, match="not 'Name: value'") as caught:
        parse_headers([line])
    assert "sk-secret" not in str(caught.value)


def test_the_run_configuration_refuses_the_same_lines_with_the_flag_named() -> None:
    with pytest.raises(ConfigError) as caught:
        RunConfig(headers=("Authorization Bearer sk-secret",))
    assert caught.value.field == "headers" and "sk-secret" not in caught.value.problem


def test_what_a_folder_keeps_is_the_name_only() -> None:
    assert header_name(" X-Tenant : blue-7") == "X-Tenant"
    assert redact_header("Authorization: Bearer k") == "Authorization: <redacted>"
    command = redacted_command(["swarmload", "run", "--header", "Authorization: Bearer k"])
    assert "Bearer k" not in " ".join(command) and "Authorization: <redacted>" in command
