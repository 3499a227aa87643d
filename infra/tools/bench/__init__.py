"""``swarmload bench``: prove the measurements and the generator's speed (docs/BENCHMARKS.md).

    swarmload bench                      # ceiling + ratio, accuracy, agreement on real vLLM
    swarmload bench ceiling|accuracy|agreement|scaling [flags]
    swarmload bench hotpath              # compare the SSE clients (CPU per streamed event)
    swarmload bench guard                # one worker's CPU per request vs a bare client's
    swarmload bench prefix-cache --target URL   # prefix-cache hits per run on a vLLM server
    swarmload bench compare              # compare's verdicts: noise vs a known +8% change
    swarmload bench search start|wait|report DIR   # the study's search vs bisection, known answers

Modules: ``target`` (lean streaming target with a server-side truth log), ``steps`` (load steps of
swarmload and of ``vllm bench serve``, ceiling criteria), ``suite`` (the parts above, tables),
``hotpath`` (client comparison), ``guard`` (the hot path's guard, a test runs it),
``procs`` (subprocesses), ``vllm_sweep_entry`` (runs in the vLLM
venv). Nothing runs at import.
"""

from __future__ import annotations


def main(argv: list[str]) -> int:
    if argv[:1] == ["hotpath"]:
        from infra.tools.bench.hotpath import main as hotpath_main

        return hotpath_main(argv[1:])
    if argv[:1] == ["guard"]:
        from infra.tools.bench.guard import main as guard_main

        return guard_main(argv[1:])
    if argv[:1] == ["compare"]:
        from infra.tools.bench.compare_noise import main as compare_main

        return compare_main(argv[1:])
    if argv[:1] == ["search"]:
        from infra.tools.bench.study_search import main as search_main

        return search_main(argv[1:])
    if argv[:1] == ["prefix-cache"]:
        from infra.tools.bench.prefix_cache import main as prefix_cache_main

        return prefix_cache_main(argv[1:])
    from infra.tools.bench.suite import main as suite_main

    return suite_main(argv)
