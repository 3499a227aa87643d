"""The device rehearsal of vLLM's common options (infra/tools/device/options_rehearsal.py) and the
carried dependency set agree: a quantized configuration once stopped a study on the GPU machine
because compressed_tensors' loguru was not carried."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

from infra.tools.device import options_rehearsal as rehearsal

REPO = Path(__file__).resolve().parents[1]
DEPS = REPO / rehearsal.DEPS_FILE


def _carried() -> dict[str, str]:
    """name -> the requirement line of vllm-deps-py312.txt."""
    lines = [line.strip() for line in DEPS.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return {re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower().replace("_", "-"): line
            for line in lines}


def test_every_distribution_an_option_needs_is_carried_pinned_or_in_the_image() -> None:
    carried = _carried()
    needed = {n for option in rehearsal.OPTIONS for n in option.needs}
    needed |= set(rehearsal.DISTRIBUTION.values())
    missing = sorted(n for n in needed if n not in carried and n not in rehearsal.IN_IMAGE)
    assert not missing, f"add to {DEPS.name}: {missing}"
    assert all("==" in carried[n] for n in needed if n in carried)
    # what the image has is not carried as well: two versions stop the whole install there
    assert not set(rehearsal.IN_IMAGE) & set(carried)


def test_the_option_classes_cover_what_issue_38_names() -> None:
    names = " ".join(o.name for o in rehearsal.OPTIONS)
    for wanted in ("quantization", "speculative-ngram", "eagle", "medusa", "prefix-caching",
                   "chunked-prefill"):
        assert wanted in names
    quant = next(o for o in rehearsal.OPTIONS if o.name == "quantization")
    assert {"fp8", "compressed-tensors", "awq_marlin", "gptq_marlin"} <= set(quant.quantization)
    assert all(m.startswith("vllm.") for o in rehearsal.OPTIONS for m in o.modules)


def _importer(missing_under: str | None = None, missing: str = "loguru"):  # noqa: ANN202
    """A stand-in for importlib.import_module: every module imports, but ``missing_under``
    (and then get_quantization_config) fail as a wheel not carried would make them."""
    def fail(_method: str = "") -> None:
        if missing_under is not None:
            raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)

    def import_module(name: str) -> types.ModuleType:
        if name == missing_under:
            fail()
        module = types.ModuleType(name)
        module.get_quantization_config = fail  # type: ignore[attr-defined]
        return module
    return import_module


def test_a_missing_module_fails_loudly_naming_it_and_what_to_carry(capsys) -> None:
    code = rehearsal.main(["--only", "quantization"], importer=_importer(
        f"{rehearsal.QUANT}.compressed_tensors.compressed_tensors", "loguru"))
    out = capsys.readouterr().out
    assert code == 1
    assert (f"FAILED quantization: MISSING module 'loguru' (imported by {rehearsal.QUANT}."
            f"compressed_tensors.compressed_tensors); carry loguru in {rehearsal.DEPS_FILE}"
            ) in out
    assert "get_quantization_config('fp8')" in out
    assert out.rstrip().splitlines()[-1].startswith("OPTIONS REHEARSAL FAILED: 1 of 1")
    rehearsal.main(["--only", "speculative-ngram"], importer=_importer(
        f"{rehearsal.SPEC}.ngram_proposer", "numba"))
    assert "MISSING module 'numba'" in capsys.readouterr().out


def test_every_class_passes_when_its_modules_import(monkeypatch, capsys) -> None:
    parsed = []
    monkeypatch.setattr(rehearsal, "parse", lambda flags, model: parsed.append(flags))
    assert rehearsal.main([], importer=_importer()) == 0
    out = capsys.readouterr().out
    assert [line.split(":")[0] for line in out.splitlines()[1:-1]] == [
        f"ok {o.name}" for o in rehearsal.OPTIONS]
    assert out.splitlines()[-1].startswith("options rehearsal: all 5 option classes import")
    assert ("--speculative-config", rehearsal.NGRAM) in parsed


@pytest.mark.parametrize("option", rehearsal.OPTIONS, ids=lambda o: o.name)
def test_flags_are_vllm_serve_flags(option: rehearsal.OptionClass) -> None:
    for flags in option.flags:
        assert flags[0].startswith("--"), flags
    assert all(0 <= i < len(option.flags) for i in option.build)
