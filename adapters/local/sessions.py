"""Records a later session of the same run rewrote, set aside as the reader builds the
run (the rule: ``checker.sessions``).

A file often holds more than one session of a run: Keras's ``CSVLogger(append=True)``,
``python train.py >> train.log`` run twice, LLaMA-Factory's ``trainer_log.jsonl`` and
MMEngine's ``scalars.json`` resumed from a checkpoint. Judged together on a step clock
(the step is then the time axis) the two sessions' points sort side by side: a restarted
run's first loss beside the first session's last one, "no better than chance" or a
many-fold climb. The built series are in step order, so the reader applies the rule to
its records while it still has their write order.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from trainguard.checker.model import FloatArray
from trainguard.checker.sessions import BoolArray, rewritten
from trainguard.checker.stats import ffill


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
