"""Records a later session of the same run logged again, set aside: the rule for every
source (``set_aside``), and for one series (``rewritten``).

A job that is restarted or resumed logs again steps it logged before: a pod restarted by
its operator, a spot instance resumed from a checkpoint, a script appended to its old
log. TensorBoard's answer ("purge orphaned data") is taken for all of them: where a
series' step goes back, its earlier points at or after the new step are gone, rewritten
by the new session. A restart from scratch leaves the new session (a loss back at 10.9
after 0.06 is the restarted run's start, not a 180-fold climb), a resume from a
checkpoint the run up to the checkpoint and what came after it.

A step going back counts only when the series' next record stays at or below the step
it went back from (a second counter in the same series, as MMEngine's validation epoch,
goes back for one record and on past where it was), and, where the run logs an epoch,
when the pair (epoch, step) goes back too (not a step counter that starts again with
each epoch, not an epoch reset while the step goes on).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from trainguard.checker.model import FloatArray, Job, Series

BoolArray = npt.NDArray[np.bool_]


def _ranks(epoch: FloatArray, step: FloatArray) -> FloatArray:
    """Dense ranks of the pairs (epoch, step) in their lexicographic order."""
    order = np.lexsort((step, epoch))
    e, s = epoch[order], step[order]
    new = np.r_[True, (e[1:] != e[:-1]) | (s[1:] != s[:-1])]
    rank = np.empty(len(order))
    rank[order] = np.cumsum(new) - 1
    return rank


def rewritten(step: FloatArray, epoch: FloatArray) -> BoolArray:
    """Which of one series' points, in write order, a later session rewrote.

    A session starts where the step goes back and so does the pair (epoch, step): a step
    counter that starts again with each epoch goes back in step but on in the pair; an
    epoch counter reset while the step goes on, in the pair but not in step. It is
    confirmed by the next record staying at or below the old top, and it drops the
    earlier points whose pair is at or after its own.
    """
    n = len(step)
    if n < 3:
        return np.zeros(n, dtype=bool)
    rank = _ranks(epoch, step)
    top_s, top_r = np.maximum.accumulate(step)[:-2], np.maximum.accumulate(rank)[:-2]
    back = np.zeros(n, dtype=bool)
    back[1:-1] = ((step[1:-1] < top_s) & (rank[1:-1] < top_r)
                  & (step[2:] <= top_s) & (rank[2:] <= top_r))
    if not back.any():
        return back
    limit = np.where(back, rank, np.inf)
    # the lowest confirmed step-back after each point
    after = np.minimum.accumulate(limit[::-1])[::-1]
    dropped: BoolArray = rank >= np.r_[after[1:], np.inf]
    return dropped


def set_aside(job: Job) -> Job:
    """``job`` without the points a later session rewrote, counted in ``superseded``.

    For a job on a wall or elapsed clock, whose series are in time order, which is the
    order they were written in (a step clock's series are in step order: the local reader
    sets them aside before it sorts, ``adapters/local/sessions.py``). The progress
    (``step``) keeps every session, so the restart stays visible to ``stall`` and
    ``restarts``.
    """
    if job.clock == "step":
        return job
    ep = job.series.get("epoch")
    changed: dict[str, Series] = {}
    gone = 0
    for name, s in job.series.items():
        if name == "step" or len(s) < 3:
            continue
        ok = np.isfinite(s.step)
        st = s.step[ok]
        if len(st) < 3 or not (st[1:] < st[:-1]).any():
            continue  # the common case, at the cost of one comparison per record
        epoch = np.zeros(len(st))
        if ep is not None and len(ep) and name != "epoch":
            at = np.searchsorted(ep.time, s.time[ok], side="right") - 1
            epoch = np.where(at >= 0, ep.value[np.clip(at, 0, None)], ep.value[0])
        elif name == "epoch":
            epoch = s.value[ok]
        drop = np.zeros(len(s), dtype=bool)
        drop[ok] = rewritten(st, epoch)
        if drop.any():
            keep = ~drop
            changed[name] = Series(name, s.time[keep], s.step[keep], s.value[keep])
            gone += int(drop.sum())
    if not changed:
        return job
    return dataclasses.replace(job, series={**job.series, **changed},
                               superseded=job.superseded + gone)
