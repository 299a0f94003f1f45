"""The ``divergence`` rule's test for a training loss stuck on one exact value far above
where it has been: a model collapsed to a constant output. A QLoRA fine-tune logged 1.637
at its first record, then 11.8, then exactly 10.3735 (ln 32,000: a uniform guess over its
vocabulary) at every record after; no NaN reaches the loss, and its best level, a median
of three points, is the collapsed level itself, so the ratio test never sees it.

A loss that learns never repeats one value to all its logged digits for
``recover_points`` records in a row, and one that has converged repeats it near its best,
not many times above it. Only values of at least ``_UNITS`` units of their last logged
digit count: a 4-decimal loss at 0.0005 after touching 0.0001 repeats by rounding. The
stretch lasts while the loss stays above the threshold it was judged at; it has recovered
once ``recover_points`` points after it are not.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from trainguard.checker.model import FloatArray
from trainguard.checker.rules.divergence_zero import Collapse
from trainguard.checker.stats import resolution

#: A repeat of fewer than this many units of the last logged digit may be rounding.
_UNITS = 100


class StuckParams(Protocol):
    """The ``divergence`` parameters of this test (``DivergenceParams``)."""

    recover_points: int
    regress_factor: float
    regress_lost: float


class Stuck:
    """The latest stretch of an objective stuck on one value far above its lowest, fed
    point by point or a chunk at a time (the same result either way)."""

    def __init__(self) -> None:
        self.low = math.inf  # the lowest finite point read
        self.last = math.nan  # the last finite point read
        self.repeats = 0  # how many points in a row have been exactly ``last``
        self.since = (0, 0)  # (finite point, record) where that run of repeats began
        self.run: Collapse | None = None  # the latest stuck stretch
        self.threshold = math.inf  # the value the open stretch stays at or above
        self.value = math.nan  # the value it was stuck at

    def point(self, x: float, at: int, nf: int, first: float, p: StuckParams) -> None:
        """The next finite point, record ``at``, the ``nf``-th finite point read."""
        if x == self.last:
            self.repeats += 1
        else:
            self.repeats, self.since = 1, (nf, at)
        run = self.run
        if run is not None and run.back is None:  # going on: high points extend it
            if x >= self.threshold:
                run.length += 1
            else:
                run.back = at
        elif self.repeats >= p.recover_points and self.low > 0:
            lost = first - self.low if math.isfinite(first) else 0.0
            threshold = max(p.regress_factor * self.low,
                            self.low + p.regress_lost * max(lost, 0.0))
            if x >= threshold and x >= _UNITS * resolution([x]):
                start, where = self.since
                self.run = Collapse(start, where, self.low, True, length=self.repeats)
                self.threshold, self.value = threshold, x
        self.low = min(self.low, x)
        self.last = x

    def many(self, v: FloatArray, at: np.ndarray, nf: int, first: float,
             p: StuckParams) -> None:
        """The next finite points ``v`` (records ``at``; the first is the ``nf``-th finite
        point read). Without a stretch going on, the points before the first repeat are
        read at once: only repeats can begin one."""
        if not len(v):
            return
        k = 0
        if self.run is None or self.run.back is not None:
            prev = np.concatenate(([self.last], v[:-1]))
            repeated = np.flatnonzero(v == prev)
            k = int(repeated[0]) if len(repeated) else len(v)
            if k:
                self.repeats, self.since = 1, (nf + k - 1, int(at[k - 1]))
                self.low = min(self.low, float(v[:k].min()))
                self.last = float(v[k - 1])
        for i in range(k, len(v)):
            self.point(float(v[i]), int(at[i]), nf + i, first, p)

    def verdict(self) -> Collapse | None:
        """The latest stretch that was stuck ``recover_points`` points (going on, or ended
        since; the caller tells which by ``back``), else None."""
        return self.run
