"""Run ``vllm bench serve`` once per request rate in one interpreter (the vLLM venv's).

    .venv-vllm/bin/python infra/tools/bench/vllm_sweep_entry.py CONFIG.json OUT.json

CONFIG: ``{"argv": [...vllm bench serve flags...], "rates": [r1, ...], "duration_s": D}``.
For each rate it sets ``--request-rate r`` and ``--num-prompts r*D`` and calls vLLM's own
``vllm.benchmarks.serve.main`` (the code behind ``vllm bench serve``), so vLLM's start-up cost is
paid once, not once per step. Writes the list of vLLM result dicts (per-request arrays dropped).
Runs only in the vLLM interpreter: the standard library and vLLM, nothing from the project.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "targets"))  # for vllm_entry

import vllm_entry  # noqa: E402

_PER_REQUEST = ("ttfts", "itls", "input_lens", "output_lens", "generated_texts", "errors",
                "start_times")


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[0]).read_text())
    vllm_entry._answer_vllm_version(vllm_entry._installed_vllm_version())
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as serve_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    results = []
    for rate in config["rates"]:
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        num = max(int(round(rate * config["duration_s"])), 1)
        args = parser.parse_args([*config["argv"], "--request-rate", str(rate),
                                  "--num-prompts", str(num)])
        result = serve_main(args)
        kept = {k: v for k, v in result.items() if k not in _PER_REQUEST}
        if config.get("keep_ttfts"):
            kept["ttfts"] = result.get("ttfts")
        results.append({"rate": rate, "num_prompts": num, **kept})
        Path(argv[1]).write_text(json.dumps(results, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
