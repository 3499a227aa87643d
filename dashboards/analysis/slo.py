"""Per-request SLOs (a study's ``slo:``): the thresholds and the test of each request."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from collectors.schemas import OUTCOME_OK

LATENCY_TAGS = ("ttft", "itl", "tpot", "e2e")


def _slo_thresholds_s(slo: Mapping[str, Any]) -> dict[str, float]:
    return {tag: float(slo[f"{tag}_ms"]) / 1e3 for tag in LATENCY_TAGS
            if slo.get(f"{tag}_ms") is not None}


def meets_request_slos(cohort: pd.DataFrame, slo: Mapping[str, Any]) -> np.ndarray:
    """Per request: ok and within every per-request SLO (TTFT, TPOT, E2E; NaN TPOT passes)."""
    good = (cohort["outcome"] == OUTCOME_OK).to_numpy().copy()
    for tag, limit in _slo_thresholds_s(slo).items():
        if tag == "itl":
            continue  # judged over all gaps at the percentile, not per request
        values = cohort[f"{tag}_s"].to_numpy(dtype=np.float64, na_value=np.nan)
        within = values <= limit
        if tag == "tpot":
            within |= np.isnan(values)  # one-token outputs have no TPOT
        good &= within
    return good
