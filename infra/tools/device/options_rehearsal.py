"""On the GPU machine: every common vLLM option's imports, checked before a study needs them.

    bash /root/sl/infra/tools/device/h200.sh run \
        python3 infra/tools/device/options_rehearsal.py --model /root/models/qwen2.5-7b

For each option class of :data:`OPTIONS` (quantization, speculative decoding, prefix caching,
chunked prefill) it imports the modules vLLM 0.26.0 loads when a server starts with that option
(found by reading its source: ``get_quantization_config`` imports every quantization config,
``GPUModelRunner`` imports ``NgramProposer`` for ``method: ngram`` ...), parses the option's
flags with vLLM's own parser, and with ``--model`` builds the engine configuration
(``EngineArgs.create_engine_config``) of the flags that need no checkpoint of their own: no
engine starts and no weights load. One line per class; a module that is not there fails loudly,
naming it and the distribution to carry in ``vllm-deps-py312.txt``, and the exit code is 1.
Under a minute (most of it the first ``import vllm``).

Not covered (not carried): ``--quantization bitsandbytes`` (the bitsandbytes wheel), speculative
``method: suffix`` (arctic-inference), MXFP4 MoE (triton_kernels), ROCm's aiter.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

QUANT = "vllm.model_executor.layers.quantization"
SPEC = "vllm.v1.spec_decode"
DEPS_FILE = "infra/tools/device/vllm-deps-py312.txt"
# a module missing -> the distribution that carries it
DISTRIBUTION = {"compressed_tensors": "compressed-tensors", "loguru": "loguru",
                "numba": "numba", "llvmlite": "llvmlite"}
# what the GPU machine's image has of what the options need: not carried (numba there is newer
# than the 0.65.0 vLLM pins, which would refuse the image's numpy 2.5)
IN_IMAGE = ("numba", "llvmlite")


@dataclass(frozen=True)
class OptionClass:
    name: str
    flags: tuple[tuple[str, ...], ...]  # each a `vllm serve` flag set of this class
    modules: tuple[str, ...]  # what vLLM imports when a server starts with it
    # distributions beyond a dense model's: carried (vllm-deps-py312.txt) or IN_IMAGE
    needs: tuple[str, ...] = ()
    build: tuple[int, ...] = ()  # the flag sets whose engine config builds on a dense folder
    quantization: tuple[str, ...] = ()  # --quantization methods: get_quantization_config


# what every configuration of the GPU studies has (a model folder of config and tokenizer only)
BASE_FLAGS = ("--load-format=dummy", "--dtype=bfloat16", "--max-model-len=4096")
NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
OPTIONS: tuple[OptionClass, ...] = (
    OptionClass(
        "quantization",
        (("--quantization=fp8",), ("--quantization=compressed-tensors",),
         ("--quantization=awq_marlin",), ("--quantization=gptq_marlin",)),
        (QUANT, f"{QUANT}.fp8", f"{QUANT}.compressed_tensors.compressed_tensors",
         f"{QUANT}.auto_awq", f"{QUANT}.auto_gptq", "vllm.model_executor.kernels.linear"),
        needs=("compressed-tensors", "loguru"), build=(0,),
        quantization=("fp8", "compressed-tensors", "awq_marlin", "gptq_marlin")),
    OptionClass(
        "speculative-ngram", (("--speculative-config", NGRAM),),
        (f"{SPEC}.ngram_proposer", f"{SPEC}.ngram_proposer_gpu", "vllm.config.speculative"),
        needs=("numba", "llvmlite"), build=(0,)),
    OptionClass(
        "speculative-eagle-medusa-draft",
        (("--speculative-config", '{"method": "eagle3", "model": "DRAFT", '
          '"num_speculative_tokens": 3}'),
         ("--speculative-config", '{"method": "medusa", "model": "DRAFT", '
          '"num_speculative_tokens": 3}')),
        (f"{SPEC}.eagle", f"{SPEC}.medusa", f"{SPEC}.draft_model",
         "vllm.model_executor.models.llama_eagle", "vllm.model_executor.models.llama_eagle3",
         "vllm.model_executor.models.medusa")),
    OptionClass(
        "prefix-caching", (("--enable-prefix-caching",), ("--no-enable-prefix-caching",)),
        ("vllm.v1.core.kv_cache_manager", "vllm.v1.core.kv_cache_utils"), build=(0, 1)),
    OptionClass(
        "chunked-prefill",
        (("--enable-chunked-prefill", "--max-num-batched-tokens=2048"),
         ("--no-enable-chunked-prefill",)),
        ("vllm.v1.core.sched.scheduler",), build=(0,)),
)


def missing_line(option: str, module: str, exc: BaseException) -> str:
    """The loud line for a module that did not import."""
    if isinstance(exc, ModuleNotFoundError) and exc.name and not exc.name.startswith("vllm"):
        top = exc.name.split(".")[0]
        carry = DISTRIBUTION.get(top, top.replace("_", "-"))
        where = ("the image had it; carry a wheel of it that works with the image's numpy"
                 if carry in IN_IMAGE else f"carry {carry} in {DEPS_FILE}")
        return f"FAILED {option}: MISSING module {top!r} (imported by {module}); {where}"
    return f"FAILED {option}: importing {module}: {type(exc).__name__}: {exc}"


def check(option: OptionClass, model: str | None,
          importer: Callable[[str], Any] = importlib.import_module) -> list[str]:
    """The failures of one option class (empty: it would start)."""
    failures = []
    for module in option.modules:
        try:
            importer(module)
        except Exception as exc:  # noqa: BLE001 - every failure is named, none stops the rest
            failures.append(missing_line(option.name, module, exc))
    for method in option.quantization:
        try:
            importer(QUANT).get_quantization_config(method)
        except Exception as exc:  # noqa: BLE001
            failures.append(missing_line(option.name, f"get_quantization_config({method!r})",
                                         exc))
    if failures:
        return failures
    for index, flags in enumerate(option.flags):
        try:
            engine_args = parse(flags, model or "/nonexistent-model")
            if model and index in option.build:
                engine_args.create_engine_config()
        except SystemExit as exc:  # vLLM's parser refused the flags
            failures.append(f"FAILED {option.name}: vLLM's parser refused {' '.join(flags)} "
                            f"(exit {exc.code})")
        except Exception as exc:  # noqa: BLE001
            where = "building the engine config of" if model and index in option.build \
                else "parsing"
            failures.append(missing_line(option.name, f"{where} {' '.join(flags)}", exc))
    return failures


def parse(flags: tuple[str, ...], model: str) -> Any:
    """``vllm serve``'s EngineArgs for ``flags`` on :data:`BASE_FLAGS` (vLLM's own parser)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    return EngineArgs.from_cli_args(parser.parse_args(["--model", model, *BASE_FLAGS, *flags]))


def main(argv: list[str] | None = None,
         importer: Callable[[str], Any] = importlib.import_module) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None,
                        help="a model folder (config and tokenizer): also build each option's "
                        "engine config on it")
    parser.add_argument("--only", default=None, help="comma-separated option classes")
    args = parser.parse_args(argv)
    chosen = [o for o in OPTIONS if args.only is None or o.name in args.only.split(",")]
    started = time.monotonic()
    try:
        vllm = importer("vllm")
        print(f"vllm {getattr(vllm, '__version__', '?')} imported in "
              f"{time.monotonic() - started:.1f} s", flush=True)
    except Exception as exc:  # noqa: BLE001
        print(missing_line("every option", "vllm", exc), flush=True)
        return 1
    failed = 0
    for option in chosen:
        t0 = time.monotonic()
        failures = check(option, args.model, importer)
        took = time.monotonic() - t0
        if failures:
            failed += 1
            for line in failures:
                print(line, flush=True)
        else:
            built = f", {len(option.build)} engine config(s) built" if args.model and \
                option.build else ""
            print(f"ok {option.name}: {len(option.modules)} module(s), "
                  f"{len(option.flags)} flag set(s) parsed{built} ({took:.1f} s)", flush=True)
    total = time.monotonic() - started
    if failed:
        print(f"OPTIONS REHEARSAL FAILED: {failed} of {len(chosen)} option classes would not "
              f"start ({total:.0f} s)", flush=True)
        return 1
    print(f"options rehearsal: all {len(chosen)} option classes import ({total:.0f} s)",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
