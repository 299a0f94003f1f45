"""Cutting a job tick by tick and telling its followers what changed between two cuts, as
a replay does (``Followers.changed``): only then do they take a rule's word that its
findings stand (``checker.follow.STABLE``) and leave the rule uncalled."""

from __future__ import annotations

from trainguard.checker.follow import Changed, Followers
from trainguard.checker.model import Job


class Teller:
    def __init__(self, followers: Followers) -> None:
        self.followers = followers
        self._before: tuple[float, dict[str, int]] | None = None

    def cut(self, job: Job, now: float) -> Job:
        """``job`` as of ``now``; the followers told which series grew since the last cut."""
        cut = job.until(now)
        counts = {k: len(s) for k, s in cut.series.items()}
        if self._before is not None:
            grown = frozenset(k for k, n in counts.items() if n != self._before[1].get(k, 0))
            self.followers.changed = Changed(self._before[0], now, grown, False, False)
        self._before = (now, counts)
        return cut
