"""Records a later session of the same run rewrote: set aside before the run is judged.

A file often holds more than one session of a run: Keras's ``CSVLogger(append=True)``,
``python train.py >> train.log`` run twice, LLaMA-Factory's ``trainer_log.jsonl`` and
MMEngine's ``scalars.json`` resumed from a checkpoint. The later session logs steps the
earlier one already logged. Judged together, the two sessions' points sort side by side
on the step (a step clock makes the step the time axis), so a restarted run's first loss
lies beside the first session's last one: "no better than chance", or a many-fold climb.

TensorBoard answers this the same way for every file it reads ("purge orphaned data"):
when a series' step goes back, that series' earlier points at or after the new step are
dropped, since the new session rewrites them. A restart from scratch thus leaves the
last session; a resume from a checkpoint leaves the run up to the checkpoint and the
resumed part after it.

Two things that also make a step go back are not sessions: a second counter logged into
the same series (MMEngine writes validation records with the epoch as their step, then
training records go on from where they were), and a step counter that restarts each
epoch. A step going back counts only when the series' next record stays at or below the
step it went back from, and, where the run logs an epoch, only when the epoch does not
rise with it (not a step counter that starts again with each epoch).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from trainguard.checker.model import FloatArray
from trainguard.checker.stats import ffill

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


def superseded(kind: npt.NDArray[np.int64], step: FloatArray, time: FloatArray,
               in_time_order: bool, value: FloatArray, epoch_kind: int | None,
               step_kind: int | None) -> BoolArray:
    """Per record (the ``RunBuilder``'s columns), whether a later session rewrote it.

    Records are taken in write order: the time order on a wall or elapsed clock (an MLflow
    store's lines are not in the order they were logged), else the file order. Records
    without a step, log lines and the records of the step alone (``step_kind``: the
    progress, which keeps every session so restarts stay visible) are never set aside.
    """
    n = len(kind)
    out = np.zeros(n, dtype=bool)
    seq = np.argsort(time, kind="stable") if in_time_order else np.arange(n)
    k, s = kind[seq], step[seq]
    epoch = np.zeros(n)
    if epoch_kind is not None and (k == epoch_kind).any():
        epoch = ffill(np.where(k == epoch_kind, value[seq], np.nan), None)
    has = (k >= 0) & (k != (-1 if step_kind is None else step_kind)) & ~np.isnan(s)
    if not has.any():
        return out
    for idx in np.unique(k[has]):
        pos = np.flatnonzero(has & (k == idx))
        out[seq[pos[rewritten(s[pos], epoch[pos])]]] = True
    return out
