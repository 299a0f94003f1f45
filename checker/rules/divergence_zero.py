"""The ``divergence`` rule's test for a training loss that drops to exactly zero from a
level it was learning at, and stays there: a fine-tune logging ``loss 0.0`` with
``grad_norm nan`` from some step on (an fp16 overflow, a model whose outputs went
non-finite inside a loss that masks them, every label of the batches masked). Nothing
is learnt after it, and no NaN ever reaches the loss for the NaN test to see.

A loss that reaches zero by learning is told apart by where it came from: it passes
through values far below its first level (under ``collapse_fraction`` of it) and, when
logged to a few decimals, comes down to within a few units of its last digit before its
first 0.0. A triplet or hinge loss at zero meets its margins a batch at a time, so zeros
appear among its points before any long run of them: a run of zeros is judged only where
none of the ``_RECENT`` points before it was zero (a lone 0.0 logged long before, a
rounding or a glitch, hides nothing), from the second point on (one point logged before
the zeros is their level). It is a divergence once ``recover_points`` points
in a row are exactly zero; it has recovered once ``recover_points`` points after it are
not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from trainguard.checker.model import FloatArray
from trainguard.checker.stats import resolution, runs

#: Values kept to tell the logging resolution by (4 decimals in Hugging Face's logs).
_RECENT = 64
#: A drop to zero from fewer than this many units of the last logged digit is rounding.
_UNITS = 100
#: The least positive float: a band from it keeps every point above zero, no zero.
_TINY = 5e-324


class ZeroParams(Protocol):
    """The ``divergence`` parameters of this test (``DivergenceParams``)."""

    recover_points: int
    collapse_fraction: float


@dataclass
class Collapse:
    """A run of consecutive exact zeros of the objective."""

    start: int  # its first point, counted among the finite points
    at: int  # the record of its first point
    level: float  # the median of the (up to) three points before it
    judged: bool  # it came from a level learning does not drop to zero from
    length: int = 0
    back: int | None = None  # the record of the point that ended it

    @property
    def end(self) -> int:
        return self.start + self.length


class Zeros:
    """The runs of exact zeros of one objective, fed by ``Climbs`` point by point or a
    chunk at a time (the same result either way)."""

    def __init__(self) -> None:
        self.recent: list[float] = []  # the last _RECENT finite points
        self.negative = False  # a point below zero has been read: not a loss this judges
        self.run: Collapse | None = None  # the latest run of zeros
        self.lasted: Collapse | None = None  # the latest judged one that lasted

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
        point read). Only where runs of zeros begin and end is looked at one by one."""
        zeros = runs(v == 0.0)
        run = self.run
        if run is not None and run.back is None:  # going on: zeros extend it
            k = zeros[0][1] if zeros and zeros[0][0] == 0 else 0
            self._grow(run, k, at, len(v), p)
            if k:
                zeros = zeros[1:]
        below = np.logical_or.accumulate(v < 0)  # a point below zero by then
        for a, length in zeros:
            before = (self.recent + v[max(0, a - _RECENT):a].tolist())[-_RECENT:]
            negative = self.negative or (a > 0 and bool(below[a - 1]))
            run = self.run = self._open(before, nf + a, int(at[a]), first, negative, p)
            self._grow(run, length - 1, at, len(v), p, a + length)
        self.negative = self.negative or bool(below[-1])
        self.recent = (self.recent + v[-_RECENT:].tolist())[-_RECENT:]

    def _grow(self, run: Collapse, zeros: int, at: np.ndarray, m: int, p: ZeroParams,
              end: int | None = None) -> None:
        """``run`` gains ``zeros`` more; it ends at index ``end`` (default: ``zeros``) of
        the chunk of ``m`` points, unless that is past the chunk."""
        run.length += zeros
        end = zeros if end is None else end
        if end < m:
            run.back = int(at[end])
        if run.judged and run.length >= p.recover_points:
            self.lasted = run

    @staticmethod
    def _open(recent: list[float], nf: int, at: int, first: float, negative: bool,
              p: ZeroParams) -> Collapse:
        level = float(np.median(recent[-3:])) if recent else math.nan
        # the first level, or the first point where zeros come before the first level is
        # known (a fine-tune logging 1.0778, then 0.0 with grad_norm nan from its second
        # record on); the recent points then are all the points read
        start = first if math.isfinite(first) else recent[0] if recent else math.nan
        judged = (nf >= 1 and not negative and math.isfinite(start) and level > 0
                  and 0.0 not in recent
                  and level >= p.collapse_fraction * start
                  and level >= _UNITS * resolution(recent))
        return Collapse(nf, at, level, judged, length=1)

    def verdict(self) -> Collapse | None:
        """The run of zeros to report: the latest judged one that lasted
        ``recover_points`` (going on, or ended since; the caller tells which by ``back``),
        else None."""
        return self.lasted

    def band(self, n: int, nf: int, p: ZeroParams) -> tuple[float, float, float, bool]:
        """(until, lo, hi, nonfinite) of the records that change nothing here, for a series
        of ``n`` records, ``nf`` of them finite, that has gone down to zero or below."""
        if self.negative:
            return math.inf, -math.inf, math.inf, True  # never judged again
        run, lasted = self.run, self.lasted
        until = math.inf
        if lasted is not None and lasted.back is not None:
            left = p.recover_points - (nf - lasted.end)  # points until it has recovered
            if left > 0:
                until = n + left
        if run is not None and run.back is None:
            if not run.judged:  # no run is judged until _RECENT points after its last zero
                return min(until, n + _RECENT), 0.0, math.inf, True
            if run.length < p.recover_points:
                until = min(until, n + p.recover_points - run.length)
            return until, 0.0, 0.0, False  # more zeros: the same; any other ends it
        recent = self.recent
        if 0.0 in recent:  # a zero before then has that zero among the points before it
            last = len(recent) - 1 - recent[::-1].index(0.0)
            return min(until, n + last + 1), 0.0, math.inf, True
        # a zero begins a run, which may be judged: the rule must see it
        return until, _TINY, math.inf, True
