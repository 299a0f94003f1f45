"""How far a replay may skip ahead: the ticks at which no rule has anything new to read.

A replay at one tick per record of a million-record run spends most of its time on
ticks at which every follower answers as before (``checker.follow``): nothing it read
changed, or its rule said its findings stand (``STABLE``). ``quiet_until`` finds, from
the followers as they stand after tick ``i``, the first later tick at which one of them
might not, with a few bisections per rule instead of a pass per tick: the replay then
judges only the tick before that one (so that each finding's last sighting and money
are its own) and that one.

It is the follower's own test (``Follower._still`` and ``_Read.untouched``) over a span
of ticks at once, and it errs one way only: unsure, it says "the next tick". Whether a
follower answers as before at a tick is monotone in the tick for everything it checks
(a count reached stays reached, a record out of its band stays in the series, the clock
only grows), so the first tick at which it might not is the later of the first tick at
which something it read grew and the first at which its ``STABLE`` word no longer holds.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from trainguard.checker.follow import outside
from trainguard.checker.model import FloatArray, Job

if TYPE_CHECKING:
    from trainguard.checker.follow import Follower, Followers
    from trainguard.checker.rules.base import Rule


class Span:
    """The ticks of one replay and what changes the job between them, worked out once."""

    def __init__(self, job: Job, times: FloatArray, down: list[tuple[float, float]]) -> None:
        self.job, self.times = job, times
        self.cols = {k: s.time for k, s in job.series.items()}
        # the job's state, end, restarts or launches change at these moments (a down
        # stretch: at both ends)
        edges = [t for pair in down for t in pair] + [*job.restart_times, *job.launches]
        if job.end_time is not None:
            edges.append(job.end_time)
        self.edges = np.sort(np.asarray(edges, dtype=np.float64))
        # a cut holds the lines up to its time, in time order or not: it gains one when
        # a line's time is passed
        self.log_times = np.sort(np.fromiter((line.time for line in job.logs), np.float64,
                                             len(job.logs)))
        # of the last ``quiet_until``: per follower and banded series, the records now
        # known to lie in the band (``skip`` notes them checked, without a second pass)
        self.checked: list[tuple[Follower, str, int]] = []

    def tick_of(self, t: float) -> int:
        """The first tick at or after ``t``."""
        return int(self.times.searchsorted(t, "left"))

    def count(self, name: str, t: float) -> int:
        """Records of series ``name`` at time ``t``."""
        return int(self.cols[name].searchsorted(t, "right"))

    def reaches(self, name: str, count: float) -> int:
        """The first tick at which series ``name`` has at least ``count`` records."""
        col = self.cols[name]
        if count <= 0:
            return 0
        if count > len(col):
            return len(self.times)
        return self.tick_of(float(col[math.ceil(count) - 1]))

    def grows(self, name: str, t: float) -> int:
        """The first tick at which series ``name`` has more records than at ``t``."""
        return self.reaches(name, self.count(name, t) + 1)


def quiet_until(followers: Followers, rules: list[Rule], span: Span, i: int,
                limit: int) -> int:
    """The first tick after ``i`` (at most ``i + limit``) at which some rule may answer
    about the job otherwise than at tick ``i``; ``i + 1`` when unsure. Ticks in between
    would each be answered from the followers, as tick ``i`` was."""
    job, times = span.job, span.times
    now = float(times[i])
    end = min(len(times), i + limit)
    span.checked = []
    if end <= i + 2 or job.hosts:  # (a follower does not note reads of per-host series)
        return i + 1
    edge = int(span.edges.searchsorted(now, "left"))
    if edge < len(span.edges):  # the job's state may change there
        end = min(end, max(i + 1, span.tick_of(float(span.edges[edge]))))
    reading: list[tuple[Follower, int]] = []
    grows: dict[str, int] = {}  # per series, the first tick at which it grows

    def _grows(k: str) -> int:
        g = grows.get(k)
        if g is None:
            g = grows[k] = span.grows(k, now)
        return g

    for rule in rules:
        f = followers.by.get((job.id, rule.name))
        if f is None or f.read is None or f.read.never or f.seen_at != now:
            return i + 1
        if f.read.logs:
            lt = span.log_times
            c = int(lt.searchsorted(now, "right"))
            if c < len(lt):
                end = min(end, max(i + 1, span.tick_of(float(lt[c]))))
        # the first tick at which something it read grew
        grew = i + 1 if f.read.now else min(
            (_grows(k) for k in (span.cols if f.read.all else f.read.names)
             if k in span.cols), default=len(times))
        reading.append((f, max(i + 1, grew)))
        if f.stable is None:
            end = min(end, max(i + 1, grew))
        if end <= i + 2:
            return i + 1
    for f, grew in reading:  # the rules' own word, where something they read grows first
        if f.stable is None or grew >= end:
            continue
        end = min(end, max(grew, _word_holds_until(f, span, i, end)))
        if end <= i + 2:
            return i + 1
    return end


def _word_holds_until(f: Follower, span: Span, i: int, end: int) -> int:
    """The first tick (before ``end``, else ``end``) at which ``f``'s ``STABLE`` word may
    no longer hold: a count reached, a record out of its band, the clock at its bound, a
    series found empty gaining a record."""
    times, cols = span.times, span.cols
    first = end
    if f.clock is not None:
        first = min(first, span.tick_of(f.clock))
    for k, count in f.counts:
        if k not in cols:
            return i + 1
        first = min(first, span.reaches(k, count))
    for k in f.empty:
        if k in cols:
            first = min(first, span.reaches(k, 1))
    for k, (until, lo, hi, nonfinite) in f.bands:
        if k not in cols:
            return i + 1
        first = min(first, span.reaches(k, until))
        if first <= i + 1:
            return i + 1
        # the records it gains by the tick before ``first``, each checked once
        n0, n1 = f.banded[k], span.count(k, float(times[first - 1]))
        if n1 > n0:
            bad = np.flatnonzero(outside(span.job.series[k].value[n0:n1], lo, hi, nonfinite))
            if len(bad):
                n1 = n0 + int(bad[0])
                first = min(first, span.reaches(k, n1 + 1))
            span.checked.append((f, k, n1))
    return max(i + 1, first)


def skip(followers: Followers, rules: list[Rule], span: Span, i: int, to: int) -> None:
    """The followers as they would stand after answering ticks ``i + 1`` to ``to`` as
    they answered tick ``i`` (``quiet_until`` said they would): each saw tick ``to``,
    and the records ``quiet_until`` found in their bands are noted checked."""
    job = span.job
    now = float(span.times[to])
    for rule in rules:
        f = followers.by[(job.id, rule.name)]
        f.calls += to - i
        f.seen_at = now
    for f, k, known in span.checked:
        f.banded[k] = max(f.banded[k], min(known, span.count(k, now)))
    followers.saw(job, rules, now)
