"""Bad input fails fast and loud: one line naming the flag (or file:line) and what is allowed,
the documented exit code, and nothing started: no process, no load (issue 10, item 4).

The cases are ``infra.tools.bad_inputs.CASES``, the same ones that make the table in
docs/BENCHMARKS.md (``python -m infra.tools.bad_inputs``); they run in this process, so the whole
set takes about a second.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from infra.tools.bad_inputs import CASES, Case, case_world, run_case


@pytest.fixture(scope="module")
def world() -> Iterator[dict[str, str]]:
    with case_world() as world:
        yield world


@pytest.mark.parametrize("case", CASES, ids=[c.what for c in CASES])
def test_bad_input_fails_before_anything_starts(case: Case, world: dict[str, str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []

    def no_process(*args: object, **_kwargs: object) -> None:
        started.append(args)
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    code, message = run_case(case, world)
    assert started == []
    assert code == case.code, message
    assert len(message.splitlines()) == 1, message
    assert message.startswith(("swarmload run: ", "swarmload study run: ", "swarmload soak: ",
                               "swarmload master: ", "swarmload worker: "))
    if case.argv[0] == "study" and case.code == 2:
        assert "study.yaml:" in message  # file:line
    assert "Traceback" not in message


def test_there_are_at_least_twenty_cases() -> None:
    assert len(CASES) >= 20 and len({c.what for c in CASES}) == len(CASES)
