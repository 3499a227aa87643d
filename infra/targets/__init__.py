"""Targets swarmload starts and loads, one module per engine (the built-in simulator, vLLM on the
CPU with its tiny model, vLLM on a GPU), each an ``Engine`` declaration (``engine.py``) gathered in
``registry.py`` and started from one ``LaunchSpec``; launched servers share ``launched.py``.
Imports nothing heavy: ``tiny_model`` runs in the vLLM venv.
"""
