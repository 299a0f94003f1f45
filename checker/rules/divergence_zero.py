"""The ``divergence`` rule's test for a training loss that drops to exactly zero from a
level it was learning at, and stays there: a fine-tune logging ``loss 0.0`` with
``grad_norm nan`` from some step on (an fp16 overflow, a model whose outputs went
non-finite inside a loss that masks them, every label of the batches masked). Nothing
is learnt after it, and no NaN ever reaches the loss for the NaN test to see.

A loss that reaches zero by learning is told apart by where it came from: it passes
through values far below its first level (under ``collapse_fraction`` of it) and, when
logged to a few decimals, comes down to within a few units of its last digit before its
first 0.0. A triplet or hinge loss at zero meets its margins a batch at a time, so zeros
appear among its points before any long run of them: only a first run of zeros is
judged. It is a divergence once ``recover_points`` points in a row are exactly zero; it
has recovered once ``recover_points`` points after it are not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Protocol

import numpy as np

from trainguard.checker.model import FloatArray

#: Values kept to tell the logging resolution by (4 decimals in Hugging Face's logs).
_RECENT = 64
#: A drop to zero from fewer than this many units of the last logged digit is rounding.
_UNITS = 100


class ZeroParams(Protocol):
    """The ``divergence`` parameters of this test (``DivergenceParams``)."""

    recover_points: int
    collapse_fraction: float


@dataclass
class Collapse:
    """A run of consecutive exact zeros of the objective, the first of the series."""

    start: int  # its first point, counted among the finite points
    at: int  # the record of its first point
    level: float  # the median of the (up to) three points before it
    judged: bool  # it came from a level learning does not drop to zero from
    length: int = 0
    back: int | None = None  # the record of the point that ended it

    @property
    def end(self) -> int:
        return self.start + self.length


def resolution(values: list[float]) -> float:
    """The logging resolution of ``values``: the largest power of ten (down to 1e-12)
    that every one of them is a whole multiple of."""
    if not values:
        return 0.0
    v = np.abs(np.asarray(values, dtype=float))
    for d in range(13):
        scaled = v * 10.0 ** d
        if np.all(np.abs(scaled - np.round(scaled)) <= 1e-6 * np.maximum(scaled, 1.0)):
            return 10.0 ** -d
    return 0.0


class Zeros:
    """The first run of exact zeros of one objective, fed by ``Climbs`` point by point or
    a chunk at a time (the same result either way)."""

    def __init__(self) -> None:
        self.recent: list[float] = []  # the last _RECENT finite points
        self.seen = False  # an exact zero has been read
        self.negative = False  # a point below zero has been read: not a loss this judges
        self.run: Collapse | None = None  # the first run of zeros, once there is one

    def point(self, x: float, at: int, nf: int, first: float, p: ZeroParams) -> None:
        """The next finite point, record ``at``, the ``nf``-th finite point read."""
        run = self.run
        if x > 0.0 and (run is None or run.back is not None):  # the usual case, at once
            recent = self.recent
            recent.append(x)
            if len(recent) > _RECENT:
                del recent[0]
            return
        self.many(np.array([x]), np.array([at]), nf, first, p)

    def many(self, v: FloatArray, at: np.ndarray, nf: int, first: float,
             p: ZeroParams) -> None:
        """The next finite points ``v`` (records ``at``; the first is the ``nf``-th finite
        point read). Only the zeros are looked at one by one."""
        run = self.run
        if run is not None and run.back is None:
            # going on: zeros extend it; the first other point ends it
            other = np.flatnonzero(v != 0.0)
            if len(other):
                run.length += int(other[0])
                run.back = int(at[other[0]])
            else:
                run.length += len(v)
        if not self.seen:
            zeros = np.flatnonzero(v == 0.0)
            if len(zeros):
                i = int(zeros[0])
                self.negative = self.negative or bool((v[:i] < 0).any())
                recent = (self.recent + v[max(0, i - _RECENT):i].tolist())[-_RECENT:]
                run = self.run = self._open(recent, nf + i, int(at[i]), first,
                                            self.negative, p)
                self.seen = True
                rest = v[i + 1:]
                stop = np.flatnonzero(rest != 0.0)
                run.length += int(stop[0]) if len(stop) else len(rest)
                if len(stop):
                    run.back = int(at[i + 1 + int(stop[0])])
        self.negative = self.negative or bool((v < 0).any())
        self.recent = (self.recent + v[-_RECENT:].tolist())[-_RECENT:]

    @staticmethod
    def _open(recent: list[float], nf: int, at: int, first: float, negative: bool,
              p: ZeroParams) -> Collapse:
        level = median(recent[-3:]) if recent else math.nan
        judged = (nf >= 3 and not negative and math.isfinite(first) and level > 0
                  and level >= p.collapse_fraction * first
                  and level >= _UNITS * resolution(recent))
        return Collapse(nf, at, level, judged, length=1)

    def verdict(self, p: ZeroParams) -> Collapse | None:
        """The run of zeros to report: one that lasted ``recover_points`` (going on, or
        ended since; the caller tells which by ``back``), else None."""
        run = self.run
        if run is None or not run.judged or run.length < p.recover_points:
            return None
        return run

    def band(self, n: int, nf: int, p: ZeroParams) -> tuple[float, float, float, bool]:
        """(until, lo, hi, nonfinite) of the records that change nothing here, for a series
        of ``n`` records, ``nf`` of them finite, that has gone down to zero or below."""
        run = self.run
        if self.negative or run is None or not run.judged:
            return math.inf, -math.inf, math.inf, True  # never judged again
        if run.back is None:  # more zeros: the same, once it is long enough
            until = math.inf if run.length >= p.recover_points else (
                n + p.recover_points - run.length)
            return until, 0.0, 0.0, False
        left = p.recover_points - (nf - run.end)  # points until it has recovered
        if run.length < p.recover_points or left <= 0:
            return math.inf, -math.inf, math.inf, True
        return n + left, -math.inf, math.inf, True
