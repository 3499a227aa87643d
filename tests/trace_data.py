"""The Azure LLM inference trace 2023 (conversation), kept with the tests: the public log the
workload tests sample from (CC-BY-4.0; its licence and attribution are beside it in
``tests/data/azure2023/``)."""

from pathlib import Path

AZURE_CONV = Path(__file__).resolve().parent / "data/azure2023/AzureLLMInferenceTrace_conv.csv"
