"""The ``divergence`` rule's test for a run whose gradient died: the norm of the gradient
it logs (``grad_norm``), positive before, exactly 0 for ``recover_points`` records in a
row while the training objective stands at ``dead_factor`` times its best level or more.

A TinyLlama retrofit's loss climbed from 7.6 to 24 (3.2 x its best, under the ratio
test's 5 x) and sat there with ``grad_norm`` 0.0 at each of its last 34 records: with no
gradient the optimiser no longer moves the model, so the loss cannot come back however
long the run goes on. An exact 0 alone is no failure: DeepSpeed and ms-swift set-ups log
``grad_norm`` 0 for healthy runs from their first record (ms-swift#5890, composer#1501),
a lone 0 is a skipped step, and a converged loss may sit still at its best. So the norm
must have been positive before the zeros began, and the loss far above its best level
before them (a median of three, so one low point is no best). A NaN norm (an fp16 step
skipped) neither extends nor ends a run of zeros. The run is over once a norm is
positive again; it has recovered once ``recover_points`` finite norms have followed.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from trainguard.checker.follow import Band
from trainguard.checker.model import FloatArray, Series
from trainguard.checker.seen import Track
from trainguard.checker.stats import rolling_median3

_MAX = sys.float_info.max
_TINY = 5e-324  # the least positive float: a band of positive norms


class DeadParams(Protocol):
    """The ``divergence`` parameters of this test (``DivergenceParams``)."""

    recover_points: int
    dead_factor: float


@dataclass
class Died:
    """A run of exact zeros of the gradient norm, positive before it."""

    first: int  # the norm's record of its first zero
    last: int  # ... and of its last
    length: int  # zeros in it
    back: int = -1  # the norm's record of the positive one that ended it (-1: going on)
    after: int = 0  # finite norms read since it ended
    best: float = math.nan  # the objective's best level before it (once worked out)
    at: int = -1  # the objective's first record in it (once judged a divergence)
    level: float = math.nan  # ... and its level then

    @property
    def ended(self) -> bool:
        return self.back >= 0


class Dead(Track):
    """The runs of zeros of one gradient norm ``g``, fed a record at a time or in chunks
    (the same result either way), each judged against the objective ``obj`` when it
    ends, and the one going on when asked."""

    def __init__(self) -> None:
        super().__init__()
        self.positive = False  # a positive norm has been read
        self.run: Died | None = None  # a run of zeros going on, begun after a positive norm
        self.fired: Died | None = None  # the latest run judged a divergence

    def read(self, g: Series, obj: Series, p: DeadParams) -> None:
        def many(n0: int, v: FloatArray) -> None:
            ok = np.flatnonzero(np.isfinite(v))  # a NaN norm neither extends nor ends a run
            if len(ok) and not (v[ok] == 0).any():  # the common chunk: every norm positive
                self._point(n0 + int(ok[-1]), float(v[ok[-1]]), g, obj, p, len(ok))
                return
            for i in ok.tolist():
                self._point(n0 + i, float(v[i]), g, obj, p)

        self.read_new(g, lambda i, x: self._point(i, x, g, obj, p), many)

    def _point(self, i: int, x: float, g: Series, obj: Series, p: DeadParams,
               count: int = 1) -> None:
        """The finite norm ``x`` at record ``i`` (``count``: the norms it stands for)."""
        run = self.run
        if x == 0:
            if run is not None:
                run.last, run.length = i, run.length + 1
            elif self.positive:
                self.run = Died(i, i, 1)
            return
        if run is not None:  # over: its verdict is final
            run.back, self.run = i, None
            self._judge(run, g, obj, p)
        if self.fired is not None and self.fired.ended:
            self.fired.after += count
        self.positive = self.positive or x > 0

    def _judge(self, run: Died, g: Series, obj: Series, p: DeadParams,
               best_level: float = 0.0) -> None:
        """``run`` is a divergence if it is long enough and the objective stands at
        ``dead_factor`` x its best before it; ``best_level`` (no best is lower) bounds
        that cheaply first."""
        if run is self.fired or run.length < p.recover_points:
            return
        level = _level(obj, _at(g, obj, run.last, "right"))
        if not level >= p.dead_factor * best_level:
            return
        start = _at(g, obj, run.first, "left")
        if math.isnan(run.best):
            run.best = _best(obj.value[:start])
        if run.best > 0 and level >= p.dead_factor * run.best:
            run.at, run.level = min(start, len(obj) - 1), level
            self.fired = run

    def verdict(self, g: Series, obj: Series, best_level: float,
                p: DeadParams) -> Died | None:
        """The latest run of zeros judged a divergence (going on, ended, or recovered
        from: the caller tells which by ``ended`` and ``after``), else None.
        ``best_level``: the objective's lowest level so far."""
        if self.run is not None:
            self._judge(self.run, g, obj, p, best_level)
        return self.fired

    def band(self, p: DeadParams) -> Band | None:
        """The norms that change nothing found; None (judge at every record) while a run
        of zeros that may become a divergence goes on, or one not yet recovered from."""
        if self.run is not None or (
                self.fired is not None and self.fired.after < p.recover_points):
            return None
        if not self.positive:  # zeros begin nothing before a positive norm
            return Band(math.inf, -_MAX, 0.0, True)
        return Band(math.inf, _TINY, _MAX, True)


def _at(g: Series, obj: Series, i: int, side: str) -> int:
    """The objective's records before (``left``) or up to (``right``) record ``i`` of the
    norm, by step where both have one, else by time."""
    if math.isfinite(g.step[i]) and len(obj) and math.isfinite(obj.step[-1]):
        return int(np.searchsorted(obj.step, g.step[i], side=side))  # type: ignore[call-overload]
    return int(np.searchsorted(obj.time, g.time[i], side=side))  # type: ignore[call-overload]


def _level(obj: Series, n: int) -> float:
    """The median of the objective's last three finite values among its first ``n``."""
    v = obj.value[max(n - 8, 0): n]
    v = v[np.isfinite(v)][-3:]
    return float(np.median(v)) if len(v) else math.nan


def _best(v: FloatArray) -> float:
    """The lowest level (median of three finite values) of ``v``."""
    v = v[np.isfinite(v)]
    return float(rolling_median3(v).min()) if len(v) >= 3 else math.nan


def nan_gradient(g: Series, obj: Series, points: int) -> tuple[int, int] | None:
    """(the objective's first record of it, its length in norms) of a stretch of at least
    ``points`` non-finite gradient norms at the end of ``g`` over which the objective is
    exactly 0 (or non-finite) at every record, with a 0 among them: a fine-tune logging
    ``loss 0.0`` with ``grad_norm nan`` from its first record on (a Pink fine-tune in an
    issue thread) has no level before its zeros for the collapse test, but its gradients
    are not finite and nothing is learnt. None otherwise. Reads the tail only."""
    v = g.value
    if len(v) < points or np.isfinite(v[-points:]).any():
        return None
    finite = np.flatnonzero(np.isfinite(v))
    start = int(finite[-1]) + 1 if len(finite) else 0
    at = _at(g, obj, start, "left")
    span = obj.value[at:]
    if len(span) < points or not bool(((span == 0) | ~np.isfinite(span)).all()) \
            or not bool((span == 0).any()):
        return None
    return min(at, len(obj) - 1), len(v) - start


def nan_gradient_bands(g: Series, fired: bool) -> tuple[Band | None, Band | None]:
    """(the norm's band, the objective's) for ``nan_gradient``: a non-finite norm may
    begin a stretch (finite norms change nothing); while one goes on, every record counts
    until it has fired, and then only a finite norm or an objective off 0 ends it."""
    if len(g) == 0 or np.isfinite(g.value[-1]):
        return Band(math.inf, -_MAX, _MAX, False), None
    if not fired:
        return None, None
    return Band(math.inf, math.inf, -math.inf, True), Band(math.inf, 0.0, 0.0, True)
