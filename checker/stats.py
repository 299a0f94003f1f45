"""Small numeric helpers tuned for short arrays on a hot path (one tick, many jobs)."""

from __future__ import annotations

import numpy as np

from checker.model import FloatArray


def quantile(x: FloatArray, q: float) -> float:
    """Linear-interpolated quantile (numpy's default method) via partition: several
    times faster than ``np.percentile`` on the few thousand points a series holds."""
    n = len(x)
    if n == 0:
        raise ValueError("quantile of an empty array")
    pos = q * (n - 1)
    lo = int(np.floor(pos))
    hi = min(lo + 1, n - 1)
    part = np.partition(x, (lo, hi))
    return float(part[lo] + (part[hi] - part[lo]) * (pos - lo))


def median(x: FloatArray) -> float:
    return quantile(x, 0.5)
