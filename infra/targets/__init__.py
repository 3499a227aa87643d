"""Targets swarmload loads: the built-in simulator, vLLM on the CPU with its tiny model, and the
interpreter that has vLLM installed. Imports nothing heavy: ``tiny_model`` runs in the vLLM venv.
"""
