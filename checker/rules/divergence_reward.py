"""The ``divergence`` rule's test for an RL policy that collapsed: a reward never below 0
(a success rate, a verifier's score, where 0 is no reward at all) falls to
``1 / collapse_factor`` of a level it held and stays there for ``recover_points`` points
or more.

Three GRPO runs of one study (an issue thread's blind set) scored 0.85-1.0 for their
first records, then 0 or 0.025 at every record to their end: the policy no longer
produces an answer the verifier accepts, and with every reward alike GRPO's advantages
are 0, so nothing brings it back. A healthy run's reward climbs, or dips and comes back.

The level is a median of ``recover_points`` consecutive points, the best of those all
older than the latest ``recover_points`` (so the fall is judged against a level held
before it, not against itself). A reward that scores 0 now and then by chance (8
answers a record each right 15 % of the time: 0 at a quarter of its records) has runs
of zeros too: the run of low points (at a tenth of the level or below) must be one the
reward's own history makes unlikely, ``n * q ** run <= CHANCE`` over its ``n`` points,
``q`` the share of low points before the run, taken at the upper end of its Wilson
interval (z = 2: a short history is no certainty). Five low points after 21 high ones
are a collapse; after 4 high ones, 11 are; 5 zeros in a reward at 0 a quarter of the
time are not (9 would be, in a run of 300 records). A sparse reward scoring 1 in 16 now
and then, 0 at 84 of its 100 records, is the plateau rule's to judge. A reward that has
been below 0 has no floor to fall to (an SB3 return): not judged here. It has recovered
once the median of its latest ``recover_points`` is back at half the level it fell from.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from trainguard.checker.follow import Band
from trainguard.checker.model import FloatArray, Series
from trainguard.checker.seen import Track
from trainguard.checker.stats import RATE_BOUNDS, measured

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
    points: int  # the low points in a row that made it one
    back: int | None = None


#: How unlikely, by the reward's own history, a run of low points must be to be a collapse.
CHANCE = 0.01
#: The confidence of the share of low points it is judged by (a normal z, as ``plateau``'s).
_Z = 2.0


def _upper(lows: int, points: int) -> float:
    """The Wilson score interval's upper end for a share of ``lows`` in ``points``: a
    short history's share is known loosely, so the run it makes unlikely is longer."""
    if points == 0:
        return 1.0
    q, z2 = lows / points, _Z * _Z
    centre = q + z2 / (2 * points)
    spread = _Z * math.sqrt(q * (1 - q) / points + z2 / (4 * points * points))
    return min((centre + spread) / (1 + z2 / points), 1.0)


class Collapse(Track):
    """The reward's collapse test, fed a record at a time or in chunks (the same result)."""

    def __init__(self) -> None:
        super().__init__()
        self.negative = False  # a value below 0 was read: no floor, never judged
        self.latest: deque[float] = deque()  # the latest k values
        self.pending: deque[float] = deque()  # levels of windows not yet older than k points
        self.best = -math.inf  # the best level of windows all older than the latest k
        self.high = 0.0  # the highest value read: no level can exceed it
        self.n = 0  # finite values read
        self.run = 0  # low values in a row at the end (low by the level when read)
        self.run_at = -1  # the record of its first
        self.values: FloatArray | None = None  # the series' values, for the share below
        self._share = (math.nan, 0, 0, 0)  # (threshold, up to record, lows, points) counted
        self.fell: Fell | None = None
        self.prev = math.nan  # the last finite value read

    def read(self, s: Series, p: CollapseParams) -> None:
        self.values = s.value

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
        if x == self.prev and x not in RATE_BOUNDS:
            return  # the same measurement logged again (``stats.measured``)
        self.prev = x
        k = p.recover_points
        self.n += 1
        self.latest.append(x)
        self.high = max(self.high, x)
        if len(self.latest) > k:
            self.latest.popleft()
        if len(self.latest) == k:
            self.pending.append(statistics.median(self.latest))
            if len(self.pending) > k and (old := self.pending.popleft()) > self.best:
                # its window now lies wholly before the latest k: a higher level makes
                # low points of ones before that were not, the run among them
                self.best = old
                self._run_back(i, old / p.collapse_factor)
        fell = self.fell
        if fell is not None and fell.back is None:
            if len(self.latest) == k and self.pending[-1] >= 0.5 * fell.level:
                fell.back = i
            return
        level = self.best
        if not (level > 0 and x <= level / p.collapse_factor):
            self.run = 0
            return
        self.run += 1
        if self.run == 1:
            self.run_at = i
        if self.run >= k and self.n * self._low_share(level / p.collapse_factor) \
                ** self.run <= CHANCE:
            self.fell = Fell(self.run_at, level, self.run)

    def _run_back(self, i: int, threshold: float) -> None:
        """The run of finite values at ``threshold`` or below that ends at record ``i - 1``,
        found again after the level rose."""
        if self.values is None:
            return
        run, at, after = 0, -1, math.nan
        for j in range(i - 1, -1, -1):
            x = float(self.values[j])
            if not math.isfinite(x):
                continue
            if x > threshold:
                break
            if x != after or x in RATE_BOUNDS:  # a value logged again counts once
                run += 1
            at, after = j, x
        self.run, self.run_at = run, at

    def _low_share(self, threshold: float) -> float:
        """The share of finite values at ``threshold`` or below before the run of low
        ones, at the upper end of its interval (``_upper``): counted on from where the
        last count stopped while the threshold is the same (a reward at 0 most of the
        time asks at every record)."""
        if self.values is None:
            return 1.0
        was, upto, lows, points = self._share
        if threshold != was or self.run_at < upto:
            upto = lows = points = 0
        v = self.values[max(upto - 1, 0):self.run_at]
        v = v[np.isfinite(v)]
        v = v[measured(v)][1 if upto > 0 else 0:]
        lows, points = lows + int((v <= threshold).sum()), points + len(v)
        self._share = (threshold, self.run_at, lows, points)
        return _upper(lows, points)

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
