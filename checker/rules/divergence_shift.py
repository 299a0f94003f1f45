"""The ``divergence`` rule's test for a loss that moved to a higher level and stays there
without coming back down: a language model collapsing from 3.3 to its unigram entropy
(7.5 nats) or doubling, well short of the ratio test's 5 x its best and of the undo
test's 80 % back to where it started, which a run that learnt a lot (first level at
least ``undo_learnt`` x its best) does not do while healthy.

A point is *shifted* when it stands ``shift_factor`` x the best level of 9 points before
it and ``shift_noise`` x the point scatter above that level (a noisy loss's lucky best is
no level). A stretch of shifted points is a divergence once it has lasted twice
``shift_points`` points and ``shift_fraction`` of the points the run had logged and of
the steps it had taken when it began, and the median of its latest ``shift_points`` is
not below its first ``shift_points``' by ``shift_back`` of their height above the best:
a warm restart of the learning rate (SGDR), a spike, or a run learning new data after a
change of its mixture comes back down, a collapsed or climbing loss does not. How long a
healthy hump lasts is the risk: a real fine-tune's loss rose 2.7-fold for 27 % of the
steps it had taken, then came back to its best (``runs`` corpus, labelled healthy); half
the run is the wait, about twice that. Counted in points as well as steps, the wait is
known in records, so a replay need not call the rule at each point of a stretch too
short yet. A stretch's values are kept until it is a divergence or ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from trainguard.checker.model import FloatArray


class ShiftParams(Protocol):
    """The ``divergence`` parameters of this test (``DivergenceParams``)."""

    shift_points: int
    shift_fraction: float
    shift_back: float


@dataclass
class Climb:
    """A stretch of consecutive finite points of the objective far above its best."""

    start: int  # its first point, counted among the finite points
    at: int  # the record of its first point
    best: float  # the best level before it
    head: list[float]  # the values that made it a divergence: its level is their median
    wide: tuple[float, float]  # the first and the best levels of 9 points before it
    length: int = 0
    back: int | None = None  # the record of the finite point that ended it
    ready_at: int | None = None  # the record at which it became a divergence
    fall: Fall | None = None  # whether it is still coming back down, while not yet one

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def ready(self) -> bool:
        return self.ready_at is not None


@dataclass
class Shifted(Climb):
    """A stretch of shifted points, with its values and where it began."""

    where: float = math.nan  # its first point's step (NaN: none; then points count)
    values: list[float] = field(default_factory=list)
    ready_length: int = 0  # its length then: what its finding says, however long it goes on


#: A stretch still coming back down after this many points is no spike.
LONGEST_SPIKE = 32


@dataclass
class Fall:
    """A stretch's highest point and its latest ``keep`` points (6 at least), to tell
    whether it is still coming back down from a spike (a climb, or a blow-up's distances
    from its level)."""

    keep: int = 6
    peak: float = -math.inf
    tail: list[float] = field(default_factory=list)

    def add(self, x: float) -> None:
        self.peak = max(self.peak, x)
        self.tail.append(x)
        if len(self.tail) > max(self.keep, 6):
            del self.tail[0]

    def coming_back(self, factor: float, length: int) -> bool:
        """Whether the stretch, ``length`` points so far, is still coming back down: its
        latest level (a median of its last 3 points) at most half its highest point and
        ``factor`` times below the level of the (up to 3) points before those. Not
        standing or climbing; not after ``LONGEST_SPIKE`` points. Needs 4 points."""
        tail = self.tail
        if len(tail) < 4 or length >= LONGEST_SPIKE:
            return False
        latest = float(np.median(tail[-3:]))
        return latest <= 0.5 * self.peak and latest * factor <= float(np.median(tail[-6:-3]))


class Shifts:
    """The stretches of shifted points of one objective, fed by ``Climbs`` point by point
    or a chunk at a time (the same result either way)."""

    def __init__(self) -> None:
        self.open: Shifted | None = None
        self.pending: list[Shifted] = []  # ready, ended less than recover_points ago
        self.settled: Shifted | None = None  # the last one the run came back from

    def feed(self, high: np.ndarray, nf0: int, at: np.ndarray, v: FloatArray,
             wide: FloatArray, first_wide: float, where: FloatArray, p: ShiftParams) -> None:
        """The next finite points ``v`` (the first is finite point ``nf0``, records ``at``,
        steps ``where``), ``high`` where shifted, ``wide`` the best level before each."""
        k, m = 0, len(v)
        while k < m:
            if not high[k]:
                if self.open is not None:
                    self._close(int(at[k]))
                nxt = np.flatnonzero(high[k:])
                if not len(nxt):
                    return
                k += int(nxt[0])
            c = self.open
            if c is None:
                c = self.open = Shifted(nf0 + k, int(at[k]), float(wide[k]), [],
                                        (first_wide, float(wide[k])), where=float(where[k]))
            low = np.flatnonzero(~high[k:])
            e = m if not len(low) else k + int(low[0])
            self._grow(c, at[k:e], v[k:e], where[k:e], p)
            k = e

    def _grow(self, c: Shifted, at: np.ndarray, v: FloatArray, where: FloatArray,
              p: ShiftParams) -> None:
        points, fraction = p.shift_points, p.shift_fraction
        n0 = c.length
        c.length += len(v)
        if c.ready:
            return
        c.values += v.tolist()
        if c.length < 2 * points:  # its first and its latest points apart: a trend
            return
        base = max(n0, 2 * points - 1) - points + 1  # the first window ending at a new point
        tail = np.asarray(c.values[base:])
        latest = np.median(np.lib.stride_tricks.sliding_window_view(tail, points), axis=1)
        j = np.arange(base + points - 1, c.length)  # the stretch index each window ends at
        first = float(np.median(c.values[:points]))
        w = where[j - n0]
        # as many points as the run had logged, and where there are steps, as many steps
        long = j + 1 >= self.length_needed(c, p)
        with np.errstate(invalid="ignore"):
            long &= ~(np.isfinite(w) & math.isfinite(c.where)) | (w - c.where >= fraction * c.where)
        ok = np.flatnonzero(long & (latest >= first - p.shift_back * (first - c.best)))
        if len(ok):
            end = int(j[ok[0]])
            c.ready_at, c.ready_length = int(at[end - n0]), end + 1
            c.head = c.values[end - points + 1: end + 1]
            c.values = []

    @staticmethod
    def length_needed(c: Shifted, p: ShiftParams) -> int:
        """The fewest points a stretch needs to be a divergence."""
        return max(2 * p.shift_points, math.ceil(p.shift_fraction * c.start))

    def _close(self, back: int) -> None:
        c = self.open
        assert c is not None
        c.back = back
        if c.ready:
            self.pending.append(c)
        c.values = []
        self.open = None

    def settle(self, nf: int, recover: int) -> None:
        while self.pending and nf - self.pending[0].end >= recover:
            self.settled = self.pending.pop(0)
