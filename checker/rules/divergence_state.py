"""The ``divergence`` rule's tests, kept from tick to tick (``ctx.state``): per loss series
the stretches of non-finite or blown-up points (``Blowups``), and for the training
objective the stretches far above its best level (``Climbs``). Each reads only the records
new since the last tick, and says within which values the next records cannot change
what it found (``band``, ``ceiling``), so that a follower need not call the rule while
the loss stays there (``checker.follow.Band``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainguard.checker.follow import Band
from trainguard.checker.model import FloatArray, Series
from trainguard.checker.rules.base import param
from trainguard.checker.rules.divergence_shift import Climb, Fall, Shifts
from trainguard.checker.rules.divergence_stuck import Stuck
from trainguard.checker.rules.divergence_zero import Zeros
from trainguard.checker.seen import SMALL, Track
from trainguard.checker.stats import rolling_median3, runs

_BLOCK = 16  # points per block for the rolling reference level
_EPS = 1e-9  # bands are drawn this much inside their bounds: rounding cannot cross one
_WIDE = 9  # points in the levels of the undo test: noise moves a median of 9 little
_HORIZON = 32  # blocks a band over a shift stretch may span
Before = dict[int, tuple[float | str | None, float | str | None]]


@dataclass
class DivergenceParams:
    metrics: list[str] | None = param(None, "series to watch; default every series named *loss*")
    nan_points: int = param(2, "consecutive non-finite points that make a divergence")
    blowup_factor: float = param(
        20.0, "a finite point this many reference scales away from the recent level is a blow-up")
    recover_points: int = param(
        5, "a blow-up still there after this many points is a divergence, else a spike")
    abs_limit: float = param(
        1e12, "a loss beyond this magnitude (or blowup_factor times its first value, when "
        "that is larger: a loss that starts at 1e13 in its own units) is a blow-up whatever "
        "came before")
    collapse_fraction: float = param(
        0.01, "the training objective dropping to exactly 0 from at least this fraction of "
        "its first level (and 100 units of its last logged digit), and staying there for "
        "recover_points points, is a divergence: learning reaches zero through values far "
        "below that (a fine-tune logging loss 0.0 with grad_norm nan: an fp16 overflow)")
    collapse_factor: float = param(
        10.0, "an RL run's reward, never below 0, at most 1/this of a level it held (the "
        "best median of recover_points points, all older than the latest "
        "recover_points) for recover_points points in a row or more, a run of low points "
        "its own history makes unlikely, is a divergence: the policy collapsed (GRPO runs "
        "scoring 0.85 falling to 0 and staying; see divergence_reward)")
    regress_factor: float = param(
        5.0, "the training objective this many times its best level (the lowest median of "
        "3 points so far) is a divergence without NaN; noise near a best is a few-fold")
    regress_points: int = param(
        4, "... when this many points in a row are there: more than a loss spike lasts "
        "(a bad batch or a loss-scale skip is back within three logged points); it has "
        "recovered once recover_points are back")
    regress_back: float = param(
        1.1, "... unless it is still coming back down when it has them (and so for a "
        "blow-up at recover_points): its latest level (a median of its last 3 points) at "
        "most half its highest point and this many times below the level of the (up to 3) "
        "points before those, for at most 32 points. A loss that jumped 1,000-fold and "
        "fell back over 14 points, 5-50 x its best all the while, was a spike; one that "
        "jumped and stays, or climbs, is a divergence at its regress_points-th point, or "
        "when it stops falling")
    regress_lost: float = param(
        0.5, "... and has given back at least this fraction of what it had learnt (its "
        "first level minus its best): a loss near zero bouncing many-fold has lost nothing")
    regress_noise: float = param(
        4.0, "... and at least this many times the point scatter (see undo_noise, once a "
        "block of points has given one) above that best: the best of a heavy-tailed "
        "per-batch loss (a held-out pose loss whose points span 3 to 150 around a level of "
        "20) is a lucky dip, and its ordinary points stand 5-fold above it four at a time")
    undo_fraction: float = param(
        0.8, "the training objective back up this fraction of the way from its best to its "
        "first level (medians of 9 points, which noise cannot move far; the first median "
        "of 3 where that is higher: a run that learnt within its first 9 points started "
        "there) is a divergence without NaN too, however small the ratio: the run has "
        "undone its learning...")
    undo_learnt: float = param(
        2.0, "... when its first level was at least this many times its best (it had "
        "learnt something to undo), for regress_points points in a row...")
    undo_noise: float = param(
        6.0, "... and what it had learnt (first level minus best) is at least this many "
        "times the point scatter (from first differences: the median over blocks of 16 "
        "points of their median step): the best of a noisy loss is a lucky dip, and its "
        "points reach back up often")
    dead_factor: float = param(
        2.0, "the training objective (a median of 3 points) at least this many times its "
        "best level before, while the gradient norm the run logs (grad_norm), positive "
        "before, is exactly 0 for recover_points records in a row, is a divergence: the "
        "optimiser no longer moves the model, so the loss cannot come back (a lone 0, or "
        "a norm logged as 0 from the first record on as some DeepSpeed set-ups do, is not)")
    shift_factor: float = param(
        1.5, "the training objective this many times its best level (9-point medians), "
        "for a run that had learnt (first level at least undo_learnt x its best)...")
    shift_noise: float = param(
        8.0, "... and this many times the point scatter above it...")
    shift_points: int = param(
        8, "... for twice this many points in a row and shift_fraction of the points the "
        "run had logged and of the steps it had taken when it began, without coming back "
        "down (its latest shift_points not below its first by shift_back of their height "
        "above the best) is a divergence: a loss that moved to a higher level and stays (a "
        "language model collapsing to its unigram entropy), where a warm restart, a "
        "change of data or a spike comes back")
    shift_back: float = param(
        0.1, "... (see shift_points): a loss that came back down by more is learning again, "
        "as after a warm restart or a change of data")
    shift_fraction: float = param(
        0.5, "... (see shift_points): a real healthy fine-tune's loss stood 2.7-fold above "
        "its best for 27 % of the steps it had taken before it came back")


def _blocks(values: FloatArray, b0: int, b1: int) -> tuple[FloatArray, FloatArray]:
    """Level and scale of blocks ``b0 .. b1 - 1`` (``_BLOCK`` points each): the block's
    median, and the larger of its magnitude and its spread (infinite where both are 0).
    Medians ignore single outliers; a block with NaN in it (a diverging job) is judged on
    its finite points."""
    blocks = values[b0 * _BLOCK: b1 * _BLOCK].reshape(b1 - b0, _BLOCK)
    finite = np.isfinite(blocks)
    if not finite.all():
        blocks = np.where(finite, blocks, np.nan)  # inf is no level either
    med = np.median(blocks, axis=1)  # NaN where a block holds a NaN: mended below
    mad = np.median(np.abs(blocks - med[:, None]), axis=1)
    # numpy's nanmedian on the whole array is ten times slower
    for i in np.flatnonzero(np.isnan(med)):
        finite = blocks[i][np.isfinite(blocks[i])]
        if len(finite):
            med[i] = np.median(finite)
            mad[i] = np.median(np.abs(finite - med[i]))
    scale = np.maximum(np.abs(med), 3 * 1.4826 * mad)
    # Most of a block exactly zero (a hinge or triplet loss with every margin met, a loss
    # logged to 4 decimals that rounds to 0.0) has no scale: a point is not "20 scales"
    # away from it for being 0.0001 or 0.3. Such a block judges no finite point.
    scale[scale == 0] = np.inf
    # Some of it exactly zero: a loss clipped at its floor, whose median and spread say
    # little of the values it takes above it (a hinge loss near zero: 0, 0, 0.05, 0,
    # 0.12...). Its scale is at least its largest value, so five positive batches in a
    # row are no blow-up.
    zero = (blocks == 0).any(axis=1)
    if zero.any():
        mag = np.max(np.where(np.isfinite(blocks), np.abs(blocks), 0.0), axis=1)
        scale = np.where(zero, np.maximum(scale, mag), scale)
    return med, scale


#: New records beyond ``seen.SMALL`` are read a part of this many at a time: a replay
#: that has not called the rule for a long stretch (``band``) hands it that stretch at
#: once, and numpy's work arrays for a million records would outweigh the run's own.
_CHUNK = 1 << 16


@dataclass
class Blowup:
    """A stretch of consecutive blown-up points (non-finite, or far from the level)."""

    start: int
    length: int = 0
    nan_at: int | None = None  # its first non-finite point
    worst_bad: int = 0  # the most non-finite points in a row in it
    bad_now: int = 0  # non-finite points in a row at its end
    # the level and scale its first point was far from: it ends at a point back near
    # them, not at one near a newer block (a loss that moved far and stays is no recovery)
    level: float = math.nan
    scale: float = math.nan
    stayed: bool = False  # blown up for recover_points, and not coming back down then
    # its finite points' distances from the level, until it stayed
    fall: Fall | None = field(default_factory=Fall)

    @property
    def end(self) -> int:
        return self.start + self.length

    def add(self, bad: list[bool], values: list[float], p: DivergenceParams) -> None:
        """The next points: ``bad`` where non-finite, ``values`` as logged."""
        for i, b in enumerate(bad):
            if b:
                if self.nan_at is None:
                    self.nan_at = self.end + i
                self.bad_now += 1
                self.worst_bad = max(self.worst_bad, self.bad_now)
            else:
                self.bad_now = 0
            if (fall := self.fall) is None:  # it stayed: nothing more to tell
                continue
            if not b:
                x = values[i]
                fall.add(abs(x - self.level) if math.isfinite(self.level) else abs(x))
            if (n := self.length + i + 1) >= p.recover_points and not fall.coming_back(
                    p.regress_back, n):
                self.stayed, self.fall = True, None
        self.length += len(bad)

    def sustained(self, p: DivergenceParams) -> bool:
        """A divergence rather than a spike: non-finite ``nan_points`` in a row, or blown
        up for ``recover_points`` and not still coming back down then (``regress_back``:
        a loss that jumped 1,000-fold and fell back over 14 points was a spike)."""
        return self.worst_bad >= p.nan_points or self.stayed

    def what(self) -> str:
        return "diverged" if self.worst_bad else "blew up and stayed up"


class Blowups(Track):
    """The NaN and blow-up test of one series, kept from tick to tick.

    Whether point i is blown up depends on the points up to i alone (its reference is the
    complete block before its own), so each point is judged once; a stretch of them is
    settled once ``recover_points`` points follow it: what it was cannot change after.
    """

    def __init__(self) -> None:
        super().__init__()
        self.lo, self.hi, self.nonfinite = math.inf, -math.inf, 0
        self.block: tuple[int, float, float] = (-1, math.nan, math.nan)  # the last one used
        self.open: Blowup | None = None
        self.pending: list[Blowup] = []  # ended less than recover_points ago
        self.fired: Blowup | None = None  # the first settled divergence (the run came back)
        self.spike: Blowup | None = None  # the first settled spike
        self.before: Before = {}
        # abs_limit, or blowup_factor times the first finite value when that is larger: a
        # physics-informed loss that starts at 1e13 in its own units has not blown up
        self.limit = math.nan

    def read(self, s: Series, p: DivergenceParams) -> None:
        n = len(s)
        for a in range(self.n, n, _CHUNK):
            self._read(s.value, a, min(a + _CHUNK, n), p)
        self.read_to(s)
        while self.pending and n - self.pending[0].end >= p.recover_points:
            run = self.pending.pop(0)
            if run.sustained(p):
                self.fired = self.fired or run
            else:
                self.spike = self.spike or run

    def _read(self, values: FloatArray, n0: int, n: int, p: DivergenceParams) -> None:
        """Records n0 .. n-1."""
        new = values[n0:n]
        if math.isnan(self.limit) and np.isfinite(new).any():
            first = float(new[np.isfinite(new)][0])
            self.limit = max(p.abs_limit, p.blowup_factor * abs(first))
        if n - n0 <= SMALL:
            vals = new.tolist()
            bad = [not math.isfinite(x) for x in vals]
            for x, b in zip(vals, bad, strict=True):
                if b:
                    self.nonfinite += 1
                else:
                    self.lo, self.hi = min(self.lo, x), max(self.hi, x)
        else:
            ok = np.isfinite(new)
            bad = (~ok).tolist()
            self.nonfinite += len(new) - int(ok.sum())
            if ok.any():
                self.lo = min(self.lo, float(new[ok].min()))
                self.hi = max(self.hi, float(new[ok].max()))
        blown = None if self.tight(p) else self._blown(values, n0, n, bad, p)
        self._feed(blown or [False] * len(bad), bad, values, n0, p)

    def band(self, s: Series, p: DivergenceParams) -> Band | None:
        """The records ``s`` may gain, and the values they may take, with nothing found
        changing: no new blow-up, no stretch settling. None while a stretch that may
        still be a spike is open."""
        count = self.pending[0].end + p.recover_points if self.pending else math.inf
        if (now := self.open) is not None:
            # a divergence going on stays the same, more blown-up points or not, until it
            # has ended and settled: recover_points points from now at the soonest
            if now.sustained(p):  # NaN or finite values alike, unless a NaN is new to it
                return Band(min(count, self.n + p.recover_points), -math.inf, math.inf,
                            bool(now.worst_bad))
            return None
        if self.tight(p):  # any points within [lo / r, hi * r] keep it tight
            r = math.sqrt((p.blowup_factor + 1) * self.lo / self.hi) * (1 - _EPS)
            return Band(count, self.lo / r, min(self.hi * r, self.limit))
        # else each point is held to the block before its own: the same block until the
        # next block begins (none before the first block is complete)
        n = self.n
        count = min(count, _BLOCK * (n // _BLOCK + 1) + 1)
        limit = p.abs_limit if math.isnan(self.limit) else self.limit
        lo, hi = -limit, limit
        if n >= _BLOCK:
            level, scale = self._ref(s.value, n // _BLOCK - 1)
            reach = p.blowup_factor * scale * (1 - _EPS)
            lo, hi = max(lo, level - reach), min(hi, level + reach)
        return Band(count, lo, hi)

    def tight(self, p: DivergenceParams) -> bool:
        """Exact shortcut: every block's scale is at least its median, which is at least
        the series' minimum, so a positive series this tight cannot hold a blow-up."""
        return (not self.nonfinite and self.lo > 0
                and self.hi - self.lo <= p.blowup_factor * self.lo and self.hi <= self.limit)

    def _ref(self, values: FloatArray, b: int) -> tuple[float, float]:
        if self.block[0] != b:
            med, sc = _blocks(values, b, b + 1)
            self.block = (b, float(med[0]), float(sc[0]))
        return self.block[1], self.block[2]

    def _blown(self, values: FloatArray, n0: int, n: int, bad: list[bool],
               p: DivergenceParams) -> list[bool]:
        """Which of records n0 .. n-1 are blown up: non-finite, or far from the level of
        the complete block before their own (by ``blowup_factor`` of its scale)."""
        if n - n0 <= SMALL:
            out = []
            for i, b in enumerate(bad, start=n0):
                x = float(values[i])
                if b or abs(x) > self.limit:
                    out.append(True)
                    continue
                lv, sc = self._ref(values, i // _BLOCK - 1) if i >= _BLOCK else (
                    math.nan, math.nan)
                out.append(abs(x - lv) > p.blowup_factor * sc)
            return out
        b0, b1 = max(n0 // _BLOCK - 1, 0), (n - 1) // _BLOCK  # reference blocks b0 .. b1-1
        level, scale = np.full(n - n0, np.nan), np.full(n - n0, np.nan)
        if b1 > b0:
            meds, scales = _blocks(values, b0, b1)
            self.block = (b1 - 1, float(meds[-1]), float(scales[-1]))
            ref = np.arange(n0, n) // _BLOCK - 1 - b0  # each point sees the block before its own
            ok = ref >= 0
            level[ok], scale[ok] = meds[ref[ok]], scales[ref[ok]]
        v = values[n0:n]
        with np.errstate(all="ignore"):
            far = (np.abs(v - level) > p.blowup_factor * scale) | (np.abs(v) > self.limit)
        return [b or f for b, f in zip(bad, far.tolist(), strict=True)]

    def _feed(self, blown: list[bool], bad: list[bool], values: FloatArray, n0: int,
              p: DivergenceParams) -> None:
        """Records n0 ... (``blown``: far from the block before their own) into stretches:
        one opens at a blown point and ends at the first point back near the level its
        first point was far from."""
        m, i = len(blown), 0
        far = np.asarray(blown, dtype=bool)
        while i < m:
            if self.open is None:
                try:
                    i = blown.index(True, i)
                except ValueError:
                    return
                lv, sc = self._ref(values, (n0 + i) // _BLOCK - 1) if n0 + i >= _BLOCK \
                    else (math.nan, math.nan)
                self.open = Blowup(n0 + i, level=lv, scale=sc)
            c = self.open
            k = self._back(c, values, far, n0, i, self.limit, p)
            c.add(bad[i:k], values[n0 + i:n0 + k].tolist(), p)
            if k == m:
                return
            self.pending.append(c)
            self.open = None
            i = k + 1

    @staticmethod
    def _back(c: Blowup, values: FloatArray, far: np.ndarray, n0: int, i: int, limit: float,
              p: DivergenceParams) -> int:
        """The first of records n0 + i ... (``far``: blown) back near ``c``'s level, as an
        index into ``far``; ``len(far)`` if none. Looked for in windows growing 16-fold:
        a spike ends within a few points, and a long run is not read again per spike."""
        m, w = len(far), _BLOCK
        while i < m:
            j = min(i + w, m)
            v = values[n0 + i:n0 + j]
            with np.errstate(all="ignore"):
                back = np.isfinite(v) & (np.abs(v) <= limit) & ~far[i:j]
                if np.isfinite(c.level):
                    back &= np.abs(v - c.level) <= p.blowup_factor * c.scale
            if back.any():
                return i + int(np.argmax(back))
            i, w = j, w * 16
        return m


def _scatter(blocks: FloatArray) -> Any:
    """Point scatter of each block (the last axis) from its first differences:
    1.4826 x median |diff| / sqrt(2); a slow trend barely moves it."""
    return 1.4826 * np.median(np.abs(np.diff(blocks, axis=-1)), axis=-1) / math.sqrt(2)


def _known(scatter: float) -> float:
    """The point scatter, 0 while no block has given one (a short run is judged without)."""
    return scatter if math.isfinite(scatter) else 0.0


class _RunningMedian:
    """The median of the values added so far (the lower middle one of an even count), in
    O(log n) per value: two heaps."""

    def __init__(self) -> None:
        self.low: list[float] = []  # the lower half, negated (a max-heap)
        self.high: list[float] = []  # the upper half
        self.value = math.inf  # none yet: no scatter is known

    def add(self, x: float) -> None:
        if self.low and x > -self.low[0]:
            heapq.heappush(self.high, x)
        else:
            heapq.heappush(self.low, -x)
        if len(self.low) > len(self.high) + 1:
            heapq.heappush(self.high, -heapq.heappop(self.low))
        elif len(self.high) > len(self.low):
            heapq.heappush(self.low, -heapq.heappop(self.high))
        self.value = -self.low[0]

    def upper(self, k: int) -> float:
        """The highest the median can be after ``k`` more values, whatever they are."""
        if not self.low:
            return math.inf
        at = (len(self.low) + len(self.high) + k + 1) // 2 - 1 - len(self.low)
        if at < 0:
            return self.value
        return heapq.nsmallest(at + 1, self.high)[-1] if at < len(self.high) else math.inf


def _grow(c: Climb, values: list[float], records: list[int], p: DivergenceParams) -> None:
    """``c`` gains the points ``values`` (records ``records``); it becomes a divergence
    at the first of them that gives it ``regress_points`` points while it is not coming
    back down (``regress_back``)."""
    if c.ready:
        c.length += len(values)
        return
    fall = c.fall = c.fall or Fall(p.regress_points)
    for j, x in enumerate(values):
        c.length += 1
        fall.add(x)
        if c.length >= p.regress_points and not fall.coming_back(p.regress_back, c.length):
            c.ready_at = records[j]
            c.head = fall.tail[-p.regress_points:]
            c.length += len(values) - j - 1
            c.fall = None
            return


def _rising_start(a: float, b: float, c: float, level: float) -> float:
    """The best the first three finite points give: their median, or the first where each
    stands above the one before (a climb from the first record: a re-id loss 10.8, 19.5,
    45.3 and on to 85, whose median of three, 19.5, is already in the climb)."""
    return a if a < b < c else level


class Climbs(Track):
    """The test for a divergence without NaN, kept from tick to tick: the finite points
    read, the running best level (the lowest median of three), the first level, and the
    stretches of points many times that best."""

    def __init__(self) -> None:
        super().__init__()
        self.nf = 0  # finite points read
        self.low = math.inf  # the lowest of them
        self.last: list[float] = []  # the last two of them
        self.best = math.inf  # the lowest level (median of three) so far
        self.first = math.nan  # the first level
        self.last_wide: list[float] = []  # the last eight finite points
        self.best_wide = math.inf  # the lowest level of 9 points so far
        self.noise = _RunningMedian()  # the scatter of the points, block by block
        self.block: list[float] = []  # the finite points of the block being filled
        self.first_wide = math.nan  # the first level of 9 points
        self.open: Climb | None = None
        self.pending: list[Climb] = []  # long enough, ended less than recover_points ago
        self.settled: Climb | None = None  # the last one settled: the run came back from it
        self.shifts = Shifts()  # the shift test's stretches (``divergence_shift``)
        self.zeros = Zeros()  # the collapse test's run of zeros (``divergence_zero``)
        self.stuck = Stuck()  # the stretch stuck on one value (``divergence_stuck``)
        self.before: Before = {}

    def read(self, s: Series, p: DivergenceParams) -> None:
        self.read_new(s, lambda i, x: self._point(i, x, p, s.step),
                      lambda n0, new: self._parts(new, n0, p, s.step))
        while self.pending and self.nf - self.pending[0].end >= p.recover_points:
            self.settled = self.pending.pop(0)
        self.shifts.settle(self.nf, p.recover_points)

    def _point(self, at: int, x: float, p: DivergenceParams, where: FloatArray) -> None:
        """The next finite point, record ``at`` (``where``: the objective's steps): the best
        is that of the levels wholly before it, so a single lucky low point is not a best
        and x is not its own."""
        best, wide = self.best, self.best_wide
        high = (x >= p.regress_factor * best
                and x >= best + p.regress_lost * max(self.first - best, 0.0)
                and x - best >= p.regress_noise * _known(self.noise.value)) or (
            self.first_wide >= p.undo_learnt * wide
            and self.first_wide - wide >= p.undo_noise * self.noise.value
            and x >= wide + p.undo_fraction * (self._start(self.first_wide) - wide))
        self._stretch(high, at, x, best, p)
        shifted = (self.first_wide >= p.undo_learnt * wide and x >= p.shift_factor * wide
                   and x - wide >= p.shift_noise * self.noise.value)
        if shifted or self.shifts.open is not None:
            self.shifts.feed(np.array([shifted]), self.nf, np.array([at]), np.array([x]),
                             np.array([wide]), self.first_wide, where[[at]], p)
        self.low = min(self.low, x)
        window = self.last_wide
        window.append(x)
        if len(window) == _WIDE:
            level = sorted(window)[_WIDE // 2]
            if math.isnan(self.first_wide):
                self.first_wide = level
            self.best_wide = min(self.best_wide, level)
            del window[0]
        block = self.block
        block.append(x)
        if len(block) == _BLOCK:
            # _scatter's arithmetic on one block, in Python: a sixteenth of the cost
            steps = sorted([abs(b - a) for a, b in itertools.pairwise(block)])
            self.noise.add(1.4826 * steps[(_BLOCK - 1) // 2] / math.sqrt(2))
            block.clear()
        last = self.last
        if len(last) == 2:
            a, b = last
            level = max(min(a, b), min(max(a, b), x))  # stats.rolling_median3's formula
            if self.nf == 2:
                self.first = level
                level = _rising_start(a, b, x, level)
            self.best = min(self.best, level)
            last[0], last[1] = b, x
        else:
            last.append(x)
        self.zeros.point(x, at, self.nf, self.first, p)
        self.stuck.point(x, at, self.nf, self.first, p)
        self.nf += 1

    def _stretch(self, high: bool, at: int, x: float, best: float,
                 p: DivergenceParams) -> None:
        c = self.open
        if high:
            if c is None:
                c = self.open = Climb(self.nf, at, best, [], (self.first_wide, self.best_wide))
            _grow(c, [x], [at], p)
        elif c is not None:
            self._close(c, at, p)

    def _close(self, c: Climb, back: int, p: DivergenceParams) -> None:
        c.back = back
        if c.ready:
            self.pending.append(c)
        self.open = None

    def _parts(self, new: FloatArray, n0: int, p: DivergenceParams,
               where: FloatArray) -> None:
        for a in range(0, len(new), _CHUNK):
            self._many(new[a:a + _CHUNK], n0 + a, p, where)

    def _many(self, new: FloatArray, n0: int, p: DivergenceParams,
              where: FloatArray) -> None:
        """``_point`` on each finite value of ``new`` (records n0 ...), vectorised."""
        ok = np.isfinite(new)
        at = n0 + np.flatnonzero(ok)
        v = new[ok]
        m = len(v)
        if not m:
            return
        lag = len(self.last)
        w = np.concatenate((self.last, v))
        levels = rolling_median3(w)  # levels[k] ends at point k + 2 - lag of v
        if self.nf < 3 and len(levels):
            self.first = float(levels[0])  # the level of the first three finite points
            levels[0] = _rising_start(float(w[0]), float(w[1]), float(w[2]), self.first)
        # before point j of v: the carried best and the levels ending before j
        cm = np.minimum.accumulate(np.minimum(levels, self.best))
        k = np.arange(m) - 3 + lag
        best = np.full(m, self.best)
        best[k >= 0] = cm[k[k >= 0]]
        noise = self._noise(v)
        wide, first_wide = self._wide(v)
        with np.errstate(invalid="ignore"):
            high = ((v >= p.regress_factor * best)
                    & (v >= best + p.regress_lost * np.maximum(self.first - best, 0.0))
                    & (v - best >= p.regress_noise * np.where(np.isfinite(noise), noise, 0.0))) | (
                (first_wide >= p.undo_learnt * wide)
                & (first_wide - wide >= p.undo_noise * noise)
                & (v >= wide + p.undo_fraction * (self._start(first_wide) - wide)))
            shifted = ((first_wide >= p.undo_learnt * wide) & (v >= p.shift_factor * wide)
                       & (v - wide >= p.shift_noise * noise))
        if shifted.any() or self.shifts.open is not None:
            self.shifts.feed(shifted, self.nf, at, v, wide, first_wide, where[at], p)
        if self.open is not None and not high[0]:
            self._close(self.open, int(at[0]), p)
        for start, length in runs(high):
            c = self.open
            if c is None:
                c = self.open = Climb(self.nf + start, int(at[start]), float(best[start]), [],
                                       (first_wide if np.isfinite(wide[start]) else math.nan,
                                        float(wide[start])))
            _grow(c, v[start:start + length].tolist(), at[start:start + length].tolist(), p)
            if start + length < m:
                self._close(c, int(at[start + length]), p)
        self.zeros.many(v, at, self.nf, self.first, p)
        self.stuck.many(v, at, self.nf, self.first, p)
        self.low = min(self.low, float(v.min()))
        self.best = float(cm[-1]) if len(cm) else self.best
        self.last = w[-2:].tolist()
        self.nf += m

    def _wide(self, v: FloatArray) -> tuple[FloatArray, float]:
        """Per point of ``v`` (the next finite points), the best level of 9 points wholly
        before it; and the first such level. Carries both over to the next points."""
        m, lag = len(v), len(self.last_wide)
        w = np.concatenate((self.last_wide, v))
        best = np.full(m, self.best_wide)
        if len(w) >= _WIDE:
            levels = np.median(np.lib.stride_tricks.sliding_window_view(w, _WIDE), axis=1)
            if math.isnan(self.first_wide):
                self.first_wide = float(levels[0])
            cm = np.minimum.accumulate(np.minimum(levels, self.best_wide))
            k = np.arange(m) - _WIDE + lag  # the last level ending before point j of v
            best[k >= 0] = cm[k[k >= 0]]
            self.best_wide = float(cm[-1])
        self.last_wide = w[-(_WIDE - 1):].tolist()
        return best, self.first_wide

    def _noise(self, v: FloatArray) -> FloatArray:
        """Per point of ``v``, the scatter of the complete blocks before it."""
        m, lag = len(v), len(self.block)
        w = np.concatenate((self.block, v))
        noise = np.full(m, self.noise.value)
        full = len(w) // _BLOCK
        for b, x in enumerate(_scatter(w[: full * _BLOCK].reshape(full, _BLOCK)).tolist()
                              if full else []):
            self.noise.add(x)
            noise[(b + 1) * _BLOCK - lag:] = self.noise.value  # points after the block
        self.block = w[full * _BLOCK:].tolist()
        return noise

    def ceiling(self, floor: float, p: DivergenceParams) -> Band | None:
        """The records the objective may gain, and the values they may take, with nothing
        found changing, given that no finite one will be below ``floor`` (> 0): no point
        far above its best, no stretch settling (non-finite points are not read here).
        None while the tests are not yet armed (the first levels are not known)."""
        if self.nf < _WIDE + p.regress_points:
            return None
        if self.low <= 0:  # judged again only by the collapse test
            return Band(*self.zeros.band(self.n, self.nf, p))
        nowhere = Band(math.inf, math.inf, -math.inf, True)  # a finite point ends or grows it
        going, short = self.shifts.open, math.inf
        if going is not None and not going.ready:
            short = self.shifts.length_needed(going, p) - going.length
            if short <= 0:  # long enough: any point may make it a divergence
                return nowhere
        stuck = self.stuck.run
        if self.open is not None or (stuck is not None and stuck.back is None):
            return nowhere
        pending = [c.end for c in self.pending[:1] + self.shifts.pending[:1]]
        if stuck is not None and self.nf - stuck.end < p.recover_points:
            pending.append(stuck.end)  # until it has recovered
        left = min(pending) + p.recover_points - self.nf if pending else math.inf
        if going is not None:  # a divergence going on, or a stretch too short to be one
            return self._shifted_band(min(left, short), p)
        # The shift test's threshold, shift_factor x a best level that may fall to the
        # floor, would sit below the lowest point with a floor at half of it: a floor at
        # low / sqrt(shift_factor) keeps the band about the lowest point.
        floor = max(floor, self.low / math.sqrt(p.shift_factor))
        # the best levels can only fall, and not below the lowest point: each test's
        # threshold is lowest at that bound (the shift test's needs a run that had learnt)
        m = min(floor, self.low)
        shift = p.shift_factor * m if self.first_wide >= p.undo_learnt * m else math.inf
        return Band(self.n + left, floor, min(self._far(m, m, p), shift) * (1 - _EPS), True)

    def _start(self, first_wide: float) -> float:
        """Where the run started, for the undo test: its first level of 9 points, or of 3
        where that is higher (a run that learnt within its first 9 points started there)."""
        return max(self.first, first_wide)

    def _far(self, best: float, wide: float, p: DivergenceParams) -> float:
        """The least value a point takes to be far above the best levels ``best`` (of 3
        points) and ``wide`` (of 9) by the ratio or the undo test (taken as armed)."""
        ratio = max(p.regress_factor * best, best + p.regress_lost * max(self.first - best, 0))
        return min(ratio, wide + p.undo_fraction * (self._start(self.first_wide) - wide))

    def _shifted_band(self, left: float, p: DivergenceParams) -> Band:
        """While a shift stretch goes on (a divergence, or too short yet to be one): the
        points that keep it going and open no other stretch, for ``left`` more points at
        most and while at most ``_HORIZON`` blocks of 16 renew the point scatter (its
        median can rise only so far in that many). Such points cannot lower the best
        levels; the run had learnt, so the undo test may be armed."""
        k = _HORIZON if math.isfinite(self.noise.upper(_HORIZON)) else 1
        wide = self.best_wide
        lo = max(p.shift_factor * wide, wide + p.shift_noise * self.noise.upper(k))
        until = self.n + min(left, k * _BLOCK - len(self.block))
        return Band(until, lo * (1 + _EPS), self._far(self.best, wide, p) * (1 - _EPS), True)

    def verdict(self, p: DivergenceParams) -> Climb | None:
        """The stretch to report: the first going on or ended within recover_points, else
        the last one the run came back from, else None."""
        if self.nf < 3 + p.regress_points or self.low <= 0:
            return None  # too short, or no floor to measure a ratio against
        going = self.pending[:1] + self.shifts.pending[:1]
        if self.open is not None and self.open.ready:
            going.append(self.open)
        if (shift := self.shifts.open) is not None and shift.ready:
            going.append(shift)
        if going:
            return min(going, key=lambda c: c.at)
        done = [c for c in (self.settled, self.shifts.settled) if c is not None]
        return max(done, key=lambda c: c.at) if done else None
