"""Where a text log's records lie when it counts epochs: Keras's console output (its
epoch lines, the progress bar's running means, the epochs' printed durations), a log that
counts epochs and no steps, and a step counter that starts again each epoch."""

from __future__ import annotations

import itertools
import math
import re

from trainguard.adapters.local.base import RunBuilder

# Keras's console progress bar. Written to a file, each update is a line of its own (or
# overwritten with backspaces and a carriage return): "  32/1875 [>....] - ETA: 5:00 -
# loss: 2.3012" is a running mean over the epoch so far, no record; the epoch's own record
# is the line whose count reached its total, "1875/1875 [=====] - 21s 11ms/step - loss:
# 0.29 - val_loss: 0.31", with the epoch's duration. Keras 3 draws its bar with "━";
# ``verbose=2`` writes only the epoch's line, "1875/1875 - 21s - loss: 0.29 - 21s/epoch",
# and Keras 1 "224s - loss: 3.55 - acc: 0.29".
KERAS_BAR = re.compile(r"[ \t]*(?P<done>\d+)/(?P<total>\d+|Unknown)[ \t]+"
                       r"(?:(?P<bar>\[[=>.]*\]|━+)|(?=-[ \t]+(?:ETA|\d+s)))"
                       r"(?:[ \t]*(?:-[ \t]*)?(?P<seconds>\d+)s\b)?")
KERAS1_EPOCH = re.compile(r"[ \t]*(\d+)s - [a-z]")
PER_EPOCH = re.compile(r" - (\d+(?:\.\d*)?)(m?s)/epoch\b")  # TF's precise duration
# The line Keras writes before each epoch: "Epoch 3/15".
EPOCH_LINE = re.compile(r"[ \t]*Epoch[ \t]+(\d+)[ \t]*/[ \t]*(\d+)[ \t]*$")


def line_epochs(run: RunBuilder, epoch_series: int) -> dict[int, float]:
    """The epoch each line names (its first finite one), by line: a record is in its own
    line's epoch, else in the last one named before it."""
    out: dict[int, float] = {}
    for v, r, k in zip(run.value, run.row, run.kind, strict=True):
        if k == epoch_series and math.isfinite(v):
            out.setdefault(r, v)
    return out


def steps_across_epochs(run: RunBuilder, epoch_series: int) -> None:
    """A step counter that starts again with each epoch ("Epoch 1 | Step 0/6501" after
    "Epoch 0 | Step 6500/6501": the batch of the epoch) made one that goes on: each
    epoch's steps follow the last one of the epoch before, one logging interval later, as
    the run's optimiser steps do. Only where the step went back at every epoch that began,
    and nowhere else: a run resumed from a checkpoint goes back in its epoch too, and is
    left to the sessions (``adapters/local/sessions.py``). The planned steps a counter
    printed ("/6501") were the epoch's, and are dropped."""
    kinds, steps, rows = run.kind, run.step, run.row
    if epoch_series not in kinds:
        return
    on_line = line_epochs(run, epoch_series)
    if len(set(on_line.values())) < 2:
        return
    counted = [steps[i] for i, k in enumerate(kinds)
               if k >= 0 and k != epoch_series and math.isfinite(steps[i])]
    gaps = sorted(b - a for a, b in itertools.pairwise(counted) if b > a)
    gap = gaps[len(gaps) // 2] if gaps else 1.0
    moved = list(steps)
    epoch, offset, back, fresh = math.nan, 0.0, False, False
    # the epoch's top step of a record, of all epochs' before it, and of any line in it
    top = last_top = ended = -math.inf
    for i, k in enumerate(kinds):
        e = on_line.get(rows[i], epoch)
        if e != epoch and math.isfinite(e):
            if math.isfinite(epoch):
                if e < epoch:
                    return  # the epoch went back: a resume
                fresh = True  # the next record with a step is this epoch's first
                if math.isfinite(ended):
                    offset += ended + gap
            epoch, last_top, top, ended = e, max(last_top, top), -math.inf, -math.inf
        s = steps[i]
        if not math.isfinite(s):
            continue
        ended = max(ended, s)
        moved[i] = s + offset
        if k < 0 or k == epoch_series:
            continue
        if fresh:
            fresh = False
            if s >= last_top:
                return  # this epoch's step went on: a global step
            back = True
        elif s < top:
            return  # back within an epoch: not a counter of the epoch's batches
        top = max(top, s)
    if back:
        steps[:] = moved
        run.planned_steps = None


def keras_clock(run: RunBuilder, durations: list[float]) -> None:
    """After the last line of a Keras console log with no time field: the sum of the
    epochs' ``durations`` is its clock, counted from the start of the first epoch read
    (the job was running then: its first record came an epoch later); none where an
    epoch took "0s" or printed none (a clock that cannot order its records)."""
    if min(durations) <= 0:
        run.elapsed[:] = [math.nan] * len(run.elapsed)
    elif run.start_time is None:
        run.start_time = 0.0


def keras_epoch(line: str, after_epoch_line: bool) -> float | None:
    """For a line of Keras's progress bar: -1 part-way through an epoch, else the epoch's
    duration in seconds (NaN where it prints none); None for any other line. The forms
    without a bar ("19/19 - 21s - loss: ...", "224s - loss: ...") are Keras's only after
    its "Epoch N/M" line: a loop's own "3/10 - 12s - loss: 0.41" is its epoch 3's record."""
    bar = KERAS_BAR.match(line)
    if bar is not None and (after_epoch_line or bar["bar"] is not None):
        if bar["total"] == "Unknown" or int(bar["done"]) < int(bar["total"]):
            return -1.0
        seconds = bar["seconds"]
    elif after_epoch_line and (old := KERAS1_EPOCH.match(line)) is not None:
        seconds = old.group(1)
    else:
        return None
    if (precise := PER_EPOCH.search(line)) is not None:
        return float(precise.group(1)) * (0.001 if precise.group(2) == "ms" else 1.0)
    return float(seconds) if seconds is not None else math.nan


def epochs_as_steps(run: RunBuilder, epoch_series: int, planned: int) -> None:
    """A log that counts no steps but epochs ("Epoch 3/15" before Keras's record of the
    epoch, "Epoch: 3, Batch: 10, Loss: ..."): each record's step is the epoch it is in,
    as a CSV log with an epoch column and no step, and the planned steps are the epochs
    Keras was asked for. Records before the first epoch are in the one before it (a Keras
    log whose first line is cut: its first record is the end of epoch 1, then "Epoch
    2/10"). Only where the epoch counts the records: it moves, and is on a line of its
    own or of theirs at least half as often as a line has records (an evaluation's
    "'epoch': 3.0" once at the end of 9,588 step lines that count nothing dates none of
    them: read as their epoch, they all sat at one step, and the run was a stall).

    A record is in its own line's epoch where the line names one after it (the Hugging
    Face Trainer's "{'loss': 2.1, ..., 'epoch': 0.01}"). A fractional epoch, the share
    of the data seen, is printed rounded (to 0.01), and lines that print the same one
    are spread evenly up to the next (``_spread``): the records keep their order on the
    step axis, one logging interval apart, as the Trainer's steps were."""
    kinds, values, steps, rows = run.kind, run.value, run.step, run.row
    if epoch_series not in kinds:
        return  # no epochs either: the records keep what they have
    epochs = [(rows[i], values[i]) for i, k in enumerate(kinds) if k == epoch_series]
    lines = {rows[i] for i, k in enumerate(kinds) if k >= 0 and k != epoch_series}
    if len({v for _, v in epochs}) < 2 or 2 * len({r for r, _ in epochs}) < len(lines):
        return
    on_line = line_epochs(run, epoch_series)
    first = epochs[0][1]
    at = first - 1 if planned > 0 and first > 1 else math.nan
    for i in range(len(kinds)):
        at = on_line.get(rows[i], at)
        steps[i] = at
    if any(math.isfinite(v) and v != math.floor(v) for _, v in epochs):
        _spread(steps, rows, [k >= 0 for k in kinds])
    if planned > 0 and math.isfinite(at):
        run.planned_steps = planned


def _spread(steps: list[float], rows: list[int], metric: list[bool]) -> None:
    """Lines of metrics that share a step are spread evenly from it to the next step (the
    last ones by the spacing of the ones before); the records of one line keep one step,
    and a line of no metric (progress) the step of the last line of metrics before it."""
    order: list[int] = []  # the lines of metrics, in order
    step_of: dict[int, float] = {}
    for s, r, m in zip(steps, rows, metric, strict=True):
        if m and r not in step_of:
            order.append(r)
            step_of[r] = s
    spread: dict[int, float] = {}
    j, increment = 0, math.nan
    while j < len(order):
        value = step_of[order[j]]
        k = j + 1
        while k < len(order) and step_of[order[k]] == value:
            k += 1
        nxt = step_of[order[k]] if k < len(order) else math.nan
        if math.isfinite(nxt) and math.isfinite(value) and nxt > value:
            increment = (nxt - value) / (k - j)
        for n in range(j, k):
            spread[order[n]] = (value + (n - j) * increment
                                if math.isfinite(increment) else value)
        j = k
    last = math.nan
    for i, r in enumerate(rows):
        if r in spread:
            last = steps[i] = spread[r]
        elif math.isfinite(last):  # before the first line of metrics: as it was
            steps[i] = last
