"""The ``divergence`` rule's test for an RL policy that collapsed: a reward never below 0
(a success rate, a verifier's score, where 0 is no reward at all) falls to
``1 / collapse_factor`` of a level it held and stays there for ``recover_points`` points.

Three GRPO runs of one study (an issue thread's blind set) scored 0.85-1.0 for their
first records, then 0 or 0.025 at every record to their end: the policy no longer
produces an answer the verifier accepts, and with every reward alike GRPO's advantages
are 0, so nothing brings it back. A healthy run's reward climbs, or dips and comes back.

The level is a median of ``recover_points`` consecutive points, the best such level of
points all older than the latest ``recover_points`` (so the fall is judged against a
level held before it, not against itself); a reward that falls by ``collapse_factor``
from a level of a few of its own logged steps (16 generations scoring 1 in 16 at best,
then none) shows no fall the log can resolve: the level must stand ``collapse_factor``
resolutions above 0, the resolution being the least gap between consecutive values. A
reward that has been below 0 has no floor to fall to (an SB3 return): not judged here.
It has recovered once the median of its latest ``recover_points`` is back at half the
level it fell from.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from trainguard.checker.follow import Band
from trainguard.checker.model import FloatArray, Series
from trainguard.checker.seen import Track

_MAX = sys.float_info.max


class CollapseParams(Protocol):
    """The ``divergence`` parameters of this test (``DivergenceParams``)."""

    recover_points: int
    collapse_factor: float


@dataclass
class Fell:
    """A collapse: where its latest ``recover_points`` points began, the level it fell
    from, and the record at which it came back (None: not yet)."""

    at: int  # the reward's record of the first of the points that made it one
    level: float  # the best level before it
    back: int | None = None


def _median(values: deque[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


class Collapse(Track):
    """The reward's collapse test, fed a record at a time or in chunks (the same result)."""

    def __init__(self) -> None:
        super().__init__()
        self.negative = False  # a value below 0 was read: no floor, never judged
        self.latest: deque[tuple[int, float]] = deque()  # (record, value) of the latest k
        self.pending: deque[float] = deque()  # levels of windows not yet older than k points
        self.best = -math.inf  # the best level of windows all older than the latest k
        self.high = 0.0  # the highest value read: no level can exceed it
        self.step = math.inf  # the resolution: least positive gap of consecutive values
        self.fell: Fell | None = None

    def read(self, s: Series, p: CollapseParams) -> None:
        def many(n0: int, v: FloatArray) -> None:
            for i, x in enumerate(v.tolist(), start=n0):
                if math.isfinite(x):
                    self._point(i, x, p)

        self.read_new(s, lambda i, x: self._point(i, x, p), many)

    def _point(self, i: int, x: float, p: CollapseParams) -> None:
        if self.negative:
            return
        if x < 0:
            self.negative, self.fell = True, None
            return
        k = p.recover_points
        if self.latest and (gap := abs(x - self.latest[-1][1])) > 0:
            self.step = min(self.step, gap)
        self.latest.append((i, x))
        self.high = max(self.high, x)
        if len(self.latest) > k:
            self.latest.popleft()
        if len(self.latest) == k:
            self.pending.append(_median(deque(v for _, v in self.latest)))
            if len(self.pending) > k:  # its window now lies wholly before the latest k
                self.best = max(self.best, self.pending.popleft())
        fell = self.fell
        if fell is not None and fell.back is None:
            if len(self.latest) == k and self.pending[-1] >= 0.5 * fell.level:
                fell.back = i
            return
        level = self.best
        if level > 0 and level >= p.collapse_factor * self.step \
                and all(v <= level / p.collapse_factor for _, v in self.latest) \
                and len(self.latest) == k:
            self.fell = Fell(self.latest[0][0], level)

    def band(self, p: CollapseParams) -> Band | None:
        """The rewards that change nothing found: all, once one was below 0; else those
        above a tenth (``collapse_factor``) of the highest so far and not above it (no
        level they make can be ten times theirs). None while a collapse stands."""
        if self.negative:
            return Band(math.inf, -_MAX, _MAX, True)
        if self.fell is not None and self.fell.back is None:
            return None
        if self.high == 0:
            return Band(math.inf, 0.0, 0.0, True)
        return Band(math.inf, math.nextafter(self.high / p.collapse_factor, math.inf),
                    self.high, True)
