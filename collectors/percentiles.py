"""Percentiles as every swarmload figure reports them (METRICS.md in docs/).

Linear interpolation between closest ranks (numpy's default ``method="linear"``) over the finite
values only; no values gives NaN (or ``empty``). The per-request ITL percentiles that workers
compute while streaming use :func:`locustfiles.timing.percentile_sorted`, the same definition in
pure Python for short sorted lists.

    percentile(df["ttft_s"], 95)               # NaN when there is no finite value
    percentile(values, 99, empty=None)         # None instead, for JSON output
    percentiles(values, [50, 90, 95, 99, 99.9])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, overload

import numpy as np


def finite(values: Any) -> np.ndarray:
    """``values`` (list, array, Series) as float64, NaN and infinities left out."""
    if hasattr(values, "to_numpy"):  # a Series, nullable dtypes included
        array = values.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        array = np.asarray(values, dtype=np.float64)
    return array[np.isfinite(array)]


@overload
def percentile(values: Any, q: float) -> float: ...
@overload
def percentile(values: Any, q: float, empty: None) -> float | None: ...
def percentile(values: Any, q: float, empty: float | None = math.nan) -> float | None:
    """The ``q``-th percentile (0-100) of the finite ``values``; ``empty`` when there are none."""
    array = finite(values)
    return float(np.percentile(array, q, method="linear")) if array.size else empty


def percentiles(values: Any, qs: Sequence[float]) -> list[float]:
    """:func:`percentile` at each of ``qs`` in one pass; NaNs when there are no finite values."""
    array = finite(values)
    if array.size == 0:
        return [math.nan] * len(qs)
    return [float(v) for v in np.percentile(array, list(qs), method="linear")]
