"""Thin a line to what a chart of a given width can show: its envelope per pixel column.

A 72-hour soak has 4,320 one-minute windows a series; a chart 440 px wide draws about ten of them
in each pixel column, so all but the lowest and highest of each column are hidden under the line.
:func:`envelope_positions` keeps, per bucket of the x range, the first, last, lowest and highest
point: the same picture (every spike and dip stays, the line's extremes are the original's) from
at most four points a bucket. Used for the charts drawn on the server as images, whose size is
what the browser pays for on a first view. :func:`even_positions` thins a scatter by an even
stride (its points are not a line: there is no envelope to keep).
"""

from __future__ import annotations

import numpy as np


def envelope_positions(x: np.ndarray, y: np.ndarray, buckets: int) -> np.ndarray:
    """Sorted positions into ``x``/``y`` to keep: per bucket of equal width over ``x``'s range,
    the first and last finite point and those of the lowest and highest ``y``. ``x`` must be
    sorted ascending. NaN ``y`` values are dropped (a chart draws nothing there); all finite
    positions come back when there are no more than ``4 * buckets`` of them."""
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, got {buckets}")
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    finite = np.flatnonzero(np.isfinite(y) & np.isfinite(x))
    if finite.size <= 4 * buckets:
        return finite
    xs, ys = x[finite], y[finite]
    span = xs[-1] - xs[0]
    if span <= 0:
        which = np.array([0, int(np.argmin(ys)), int(np.argmax(ys)), xs.size - 1])
        return np.unique(finite[which])
    bucket = np.minimum(((xs - xs[0]) / span * buckets).astype(np.int64), buckets - 1)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])  # x sorted: runs
    ends = np.r_[starts[1:], xs.size] - 1
    # sorted by bucket, then y: each bucket's run starts at its lowest point, ends at its highest
    by_value = np.lexsort((ys, bucket))
    lowest, highest = by_value[starts], by_value[ends]
    return np.unique(finite[np.concatenate([starts, ends, lowest, highest])])


def even_positions(n: int, max_points: int) -> np.ndarray:
    """Positions of at most ``max_points`` of ``n`` rows, evenly spread, first and last kept."""
    if n <= max_points:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))
