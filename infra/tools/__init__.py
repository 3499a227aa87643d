"""swarmload's tooling, apart from the product: what measures, shows and documents it.

``bench/`` (``swarmload bench`` and the benchmarks of docs/BENCHMARKS.md), ``device/`` (the GPU
machine's scripts and write-ups), ``browser`` (headless Chromium on the dashboard),
``screenshots``, ``prometheus`` (a real Prometheus for tests and screenshots), ``bad_inputs``
(the bad-input table), ``docs_reference`` (the docs site's generated reference pages). Nothing
outside ``infra/tools`` and ``tests/`` imports it (an import-linter contract).
"""
