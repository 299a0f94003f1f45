"""What a followed rule has already read of a series (``checker.follow``, ``ctx.state``).

A rule that keeps its work from tick to tick keeps one ``Track`` per series it reads:
how many records it has worked through, and the first and the last of them (time
and value). The next
cut of the same run holds the same records and more; anything else (fewer records, or a
different first or last record where the track left off) is another series, and the
rule starts over on it. ``tracked`` hands a rule the track to go on with.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

from trainguard.checker.model import FloatArray, Series

#: New records up to this many are read one by one: a followed rule sees one or two new
#: records a tick, where numpy's cost per call would outweigh the work.
SMALL = 8

_Mark = tuple[float, ...]


def _mark(s: Series, n: int) -> _Mark:
    if n == 0:
        return ()
    t, v = s.time.item, s.value.item
    return (t(0), v(0), t(n - 1), v(n - 1))


def _same(a: _Mark, b: _Mark) -> bool:
    # NaN is a value here (a diverged record), so NaN matches NaN
    return a == b or (len(a) == len(b) and all(x == y or (x != x and y != y)
                                               for x, y in zip(a, b, strict=True)))


class Track:
    """What one rule worked out from the first ``n`` records of one series."""

    def __init__(self) -> None:
        self.n = 0
        self._mark: _Mark = ()
        self._values: object = None  # the values array last read (a replay reuses it)

    def extended_by(self, s: Series) -> bool:
        """True when ``s`` holds the records this track has read, and maybe more."""
        if s.value is self._values:
            return True
        return len(s) >= self.n and _same(_mark(s, self.n), self._mark)

    def read_new(self, s: Series, one: Callable[[int, float], None],
                 many: Callable[[int, FloatArray], None]) -> None:
        """Hands on the records of ``s`` new since the last read, then notes them read:
        up to ``SMALL`` of them one by one, each finite one as ``one(record, value)``;
        more, all at once as ``many(first record, values)``."""
        n0, n = self.n, len(s)
        if n > n0:
            if n - n0 <= SMALL:
                for i, x in enumerate(s.value[n0:n].tolist(), start=n0):
                    if math.isfinite(x):
                        one(i, x)
            else:
                many(n0, s.value[n0:n])
        self.read_to(s)

    def read_to(self, s: Series) -> None:
        """Notes that every record of ``s`` has now been worked through."""
        self._values = s.value
        if len(s) != self.n or not self._mark:
            self.n = len(s)
            self._mark = _mark(s, self.n)


T = TypeVar("T", bound=Track)


def tracked(state: dict[str, Any] | None, key: str, s: Series, new: Callable[[], T]) -> T:
    """The track of series ``s`` kept under ``key`` in ``state`` when ``s`` extends what it
    read; else a new one (kept there too). With no state (a rule judged once) a new one."""
    if state is None:
        return new()
    track = state.get(key)
    if not isinstance(track, Track) or not track.extended_by(s):
        track = state[key] = new()
    return track  # type: ignore[return-value]
