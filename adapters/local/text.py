"""Plain log lines read with metric definitions (name + regex, SageMaker style)."""

from __future__ import annotations

import contextlib
import itertools
import math
import re
from pathlib import Path

from trainguard.adapters.local.base import (
    CumulativeTime,
    Reader,
    RunBuilder,
    open_text,
    parse_timestamp,
)
from trainguard.adapters.local.definitions import (
    DEFAULT_DEFINITIONS,
    EPOCH_DEFINITIONS,
    PLANNED,
    STEP,
    MetricDefinition,
)
from trainguard.adapters.local.errors import FormatError

# An ISO-8601 timestamp at the start of a line, optionally in brackets.
# ISO-8601, or with slashes in the date as MMEngine's logger writes it (2023/06/05 20:10:13);
# after the blanks and up to three bracketed tags a launcher puts before it
# (torchtitan's "[rank0]:[titan] 2026-04-19 12:18:01,628", Megatron's " [2025-03-01 ...]")
_TIMESTAMP = re.compile(
    r"[ \t]*(?:\[[^\]\s]{1,40}\]:?[ \t]?){0,3}"
    r"\[?(\d{4}([-/])\d{2}\2\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"
    r"(?:Z|[+-]\d{2}(?::?\d{2})?)?)")
_TS_START = frozenset("0123456789[")
# A line of Python source, which some scripts print at the top of their log (the
# modded-nanogpt records hold their training script): a statement keyword, a call to
# print, an assignment of a call; once such a line has been read, an indented assignment
# too. Its ``val_loss = 0.0`` and ``lr=3e-4`` are no records. A log line such as "epoch =
# 3, loss = 0.5" is none of these, nor "    loss = 0.5" in a log that holds no source.
_SOURCE = re.compile(
    r"\s*(?:(?:def|class|import|from|return|if|elif|for|while|with|assert|raise)\s"
    r"|print\(|[A-Za-z_][\w.]*\s*(?::[^=]*)?[-+*/]?=(?!=)\s*[A-Za-z_][\w.]*\()")
_INDENTED = re.compile(r"(?:\t| {4,})[A-Za-z_][\w.\[\]]*\s*(?::[^=]*)?[-+*/]?=(?!=)")
# A configuration printed whole: argparse's ``Namespace(lr=0.001, ...)``, OLMo's
# ``TrainConfig(...)`` on one line, or the Hugging Face Trainer's ``TrainingArguments(``
# one ``field=value,`` a line. Its ``learning_rate=7e-05`` is a setting, no record: read
# as one, it came before the warm-up's first logged rate and hid the warm-up.
# Terminal colours a logger writes into a file through ``tee`` (torchtitan's
# "\x1b[32mloss: 9.8"): the key would run on from the escape's letter.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Keras's console progress bar. Written to a file, each update is a line of its own (or
# overwritten with backspaces and a carriage return): "  32/1875 [>....] - ETA: 5:00 -
# loss: 2.3012" is a running mean over the epoch so far, no record; the epoch's own record
# is the line whose count reached its total, "1875/1875 [=====] - 21s 11ms/step - loss:
# 0.29 - val_loss: 0.31", with the epoch's duration. Keras 3 draws its bar with "━";
# ``verbose=2`` writes only the epoch's line, "1875/1875 - 21s - loss: 0.29 - 21s/epoch",
# and Keras 1 "224s - loss: 3.55 - acc: 0.29".
_KERAS_BAR = re.compile(r"[ \t]*(?P<done>\d+)/(?P<total>\d+|Unknown)[ \t]+"
                        r"(?:(?P<bar>\[[=>.]*\]|━+)|(?=-[ \t]+(?:ETA|\d+s)))"
                        r"(?:[ \t]*(?:-[ \t]*)?(?P<seconds>\d+)s\b)?")
_KERAS1_EPOCH = re.compile(r"[ \t]*(\d+)s - [a-z]")
_PER_EPOCH = re.compile(r" - (\d+(?:\.\d*)?)(m?s)/epoch\b")  # TF's precise duration
# The line Keras writes before each epoch: "Epoch 3/15".
_EPOCH_LINE = re.compile(r"[ \t]*Epoch[ \t]+(\d+)[ \t]*/[ \t]*(\d+)[ \t]*$")
_CONFIG = re.compile(r"\b(?:Namespace|[A-Z]\w*(?:Config|Arguments|Args|Params|Settings|Options))\("
                     r"|^\s*\w+=[^=,]*,\s*$")

# what a definition does with its value, in the order a line is read: the time and the
# step first, so the metrics on the same line get them
TIME, STEP_ROLE, PLANNED_ROLE, METRIC = range(4)


def _role(d: MetricDefinition) -> int:
    if d.time:
        return TIME
    return {STEP: STEP_ROLE, PLANNED: PLANNED_ROLE}.get(d.name, METRIC)


Compiled = list[tuple[re.Pattern[str], int, int, str, float, str]]


def compile_definitions(
    definitions: list[MetricDefinition] | tuple[MetricDefinition, ...],
) -> Compiled:
    """(regex, role, name id, name, scale), the step and time first; definitions of one
    name stay together, and on a line the first of them that matches wins (so
    ``train_time`` in ms and in s can share a name)."""
    ids: dict[tuple[int, str], int] = {}
    out: Compiled = []
    for d in definitions:
        role = _role(d)
        gid = ids.setdefault((role, d.name), len(ids))
        out.append((d.compile(), role, gid, d.name, d.scale, d.needle))
    out.sort(key=lambda item: (item[1], item[2]))  # stable: keeps each name's own order
    return out


class TextReader(Reader):
    name = "text"

    def matches_name(self, path: Path) -> bool:
        """A ``.log``, ``.txt`` or ``.out`` file, unless it holds CSV or JSON lines: Keras's
        ``CSVLogger`` writes ``training.log`` in its own docs."""
        if not (path.is_file() and
                path.name.removesuffix(".gz").endswith((".log", ".txt", ".out"))):
            return False
        from trainguard.adapters.local.jsonl import JsonLinesReader
        from trainguard.adapters.local.tabular import CsvReader

        return not (CsvReader().matches_content(path) or JsonLinesReader().matches_content(path))

    def collect(self, path: Path, run: RunBuilder, definitions: list[MetricDefinition] | None,
                select: str | None) -> None:
        try:
            if definitions and not any(d.name == "epoch" for d in definitions):
                definitions = [*definitions, *EPOCH_DEFINITIONS]
            compiled = compile_definitions(definitions or DEFAULT_DEFINITIONS)
        except ValueError as e:
            raise FormatError(path, str(e)) from None
        log = run.log
        # the hot loop appends to the builder's columns itself: a call per record costs
        # more than reading the line
        kind, values, steps = run.kind.append, run.value.append, run.step.append
        walls, elapses, rows = run.wall.append, run.elapsed.append, run.row.append
        entries = [(rx, role, gid, name, scale, needle,
                    run.index(name if role == METRIC else STEP))
                   for rx, role, gid, name, scale, needle in compiled]
        clock = CumulativeTime()
        elapsed = step = math.nan
        source = False  # a line of Python source has been read
        timed = stepped = False  # a time field, a step that moved has been read
        epoch_series, epochs = run.index("epoch"), 0
        durations: list[float] = []  # of the Keras epochs read
        with open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                if "\x1b" in line:
                    line = _ANSI.sub("", line)
                if "\x08" in line:  # a line written over with backspaces: what is left
                    line = line[line.rfind("\x08") + 1:]
                matched = False
                head = line.lstrip(" \t")[:1]
                if head.isdigit() and (keras := _keras_epoch(line, epochs > 0)) is not None:
                    if keras < 0:
                        continue  # a running mean part-way through the epoch
                    if not timed:
                        # the epoch's duration: the time axis is their sum, unless an
                        # epoch took "0s" or printed none (a clock that cannot order
                        # its records)
                        durations.append(keras if keras > 0 else 0.0)
                        if keras > 0:
                            elapsed = (0.0 if math.isnan(elapsed) else elapsed) + keras
                ep = _EPOCH_LINE.match(line) if head == "E" else None
                if ep is not None:
                    epochs = int(ep.group(2))
                    kind(epoch_series)
                    values(float(ep.group(1)))
                    steps(step)
                    walls(math.nan)
                    elapses(elapsed)
                    rows(lineno)
                    matched = True
                # a line's own time: the builder carries it to the lines after it, and
                # tells a log whose progress lines are stamped from one whose are not
                wall = math.nan
                if not source and _SOURCE.match(line):
                    source = True
                if line[:1] in _TS_START or (line[:1] in " \t"
                                             and line.lstrip(" \t")[:1] in _TS_START):
                    ts = _TIMESTAMP.match(line)
                    # a date-like prefix that is no real timestamp leaves the clock alone
                    if ts is not None:
                        with contextlib.suppress(ValueError):
                            wall = parse_timestamp(
                                ts.group(1).replace(",", ".").replace("/", "-"))
                hit = -1
                for rx, role, gid, name, scale, needle, series in entries:
                    if gid == hit or (ep is not None and series == epoch_series
                                      and role == METRIC):
                        continue  # an earlier definition of this name matched
                    if needle and needle not in line:
                        continue  # no line without its key matches it
                    m = rx.search(line)
                    if m is None:
                        continue
                    text = m.group(1)
                    if text is None:
                        continue
                    if not matched and source and (_SOURCE.match(line)
                                                   or _INDENTED.match(line)):
                        break  # source code, kept as a log line
                    if not matched and _CONFIG.search(line):
                        break  # a configuration printed whole, kept as a log line
                    try:
                        value = float(text) * scale
                    except ValueError:
                        raise FormatError(path, f"metric {name!r}: cannot read {text!r} "
                                          "as a number", lineno) from None
                    hit = gid
                    matched = True
                    if role == TIME:
                        elapsed = clock(value)
                        timed = True
                        continue
                    if role == PLANNED_ROLE:
                        if math.isfinite(value) and value > 0:
                            run.planned_steps = int(value)
                        continue
                    if role == STEP_ROLE:
                        # a step counter: a step that moved (a banner's lone "step=0",
                        # DeepSpeed's, is none)
                        stepped = stepped or (math.isfinite(step) and value != step)
                        step = value
                    # a record: the metric, or the step (progress) with the line's times
                    kind(series)
                    values(value)
                    steps(step)
                    walls(wall)
                    elapses(elapsed)
                    rows(lineno)
                if not matched:
                    text = line.rstrip("\r\n")
                    if text.strip():
                        log(text, step, wall, elapsed, lineno)
        if not stepped:
            _epochs_as_steps(run, epoch_series, epochs)
        else:
            _steps_across_epochs(run, epoch_series)
        if durations and not timed:
            if min(durations) <= 0:
                run.elapsed[:] = [math.nan] * len(run.elapsed)
            elif run.start_time is None:
                # the sum counts from the start of the first epoch read: the job was
                # running then (its first record came an epoch later)
                run.start_time = 0.0


def _steps_across_epochs(run: RunBuilder, epoch_series: int) -> None:
    """A step counter that starts again with each epoch ("Epoch 1 | Step 0/6501" after
    "Epoch 0 | Step 6500/6501": the batch of the epoch) made one that goes on: each
    epoch's steps follow the last one of the epoch before, one logging interval later, as
    the run's optimiser steps do. Only where the step went back at every epoch that began,
    and nowhere else: a run resumed from a checkpoint goes back in its epoch too, and is
    left to the sessions (``adapters/local/sessions.py``). The planned steps a counter
    printed ("/6501") were the epoch's, and are dropped."""
    kinds, values, steps, rows = run.kind, run.value, run.step, run.row
    # the epoch each record is in: its line's own, else the last one before it
    on_line = {rows[i]: values[i] for i, k in enumerate(kinds)
               if k == epoch_series and math.isfinite(values[i])}
    if len(set(on_line.values())) < 2:
        return
    epoch_of: list[float] = []
    epoch = math.nan
    for i in range(len(kinds)):
        epoch = on_line.get(rows[i], epoch)
        epoch_of.append(epoch)
    # where the step went back: only where an epoch began
    top = last_top = -math.inf
    epoch = math.nan
    back = False
    fresh = False  # the record is the first with a step in a new epoch
    for i, k in enumerate(kinds):
        if epoch_of[i] != epoch and math.isfinite(epoch_of[i]):
            if math.isfinite(epoch) and epoch_of[i] < epoch:
                return  # the epoch went back: a resume
            fresh = math.isfinite(epoch)  # not the first epoch
            epoch, last_top, top = epoch_of[i], max(last_top, top), -math.inf
        s = steps[i]
        if k < 0 or k == epoch_series or not math.isfinite(s):
            continue
        if fresh:
            fresh = False
            if s >= last_top:
                return  # this epoch's step went on: a global step
            back = True
        elif s < top:
            return  # back within an epoch: not a counter of the epoch's batches
        top = max(top, s)
    if not back:
        return
    firsts = [steps[i] for i, k in enumerate(kinds)
              if k >= 0 and k != epoch_series and math.isfinite(steps[i])]
    gaps = sorted(b - a for a, b in itertools.pairwise(firsts) if b > a)
    gap = gaps[len(gaps) // 2] if gaps else 1.0
    offset, top, epoch = 0.0, -math.inf, math.nan
    for i in range(len(kinds)):
        if epoch_of[i] != epoch and math.isfinite(epoch_of[i]):
            if math.isfinite(epoch) and math.isfinite(top):
                offset += top + gap
            epoch, top = epoch_of[i], -math.inf
        if math.isfinite(steps[i]):
            top = max(top, steps[i])
            steps[i] += offset
    run.planned_steps = None


def _keras_epoch(line: str, after_epoch_line: bool) -> float | None:
    """For a line of Keras's progress bar: -1 part-way through an epoch, else the epoch's
    duration in seconds (NaN where it prints none); None for any other line. The forms
    without a bar ("19/19 - 21s - loss: ...", "224s - loss: ...") are Keras's only after
    its "Epoch N/M" line: a loop's own "3/10 - 12s - loss: 0.41" is its epoch 3's record."""
    bar = _KERAS_BAR.match(line)
    if bar is not None and (after_epoch_line or bar["bar"] is not None):
        if bar["total"] == "Unknown" or int(bar["done"]) < int(bar["total"]):
            return -1.0
        seconds = bar["seconds"]
    elif after_epoch_line and (old := _KERAS1_EPOCH.match(line)) is not None:
        seconds = old.group(1)
    else:
        return None
    if (precise := _PER_EPOCH.search(line)) is not None:
        return float(precise.group(1)) * (0.001 if precise.group(2) == "ms" else 1.0)
    return float(seconds) if seconds is not None else math.nan


def _epochs_as_steps(run: RunBuilder, epoch_series: int, planned: int) -> None:
    """A log that counts no steps but epochs ("Epoch 3/15" before Keras's record of the
    epoch, "Epoch: 3, Batch: 10, Loss: ..."): each record's step is the epoch it is in,
    as a CSV log with an epoch column and no step, and the planned steps are the epochs
    Keras was asked for. Records before the first epoch are in the one before it (a log
    whose first line is cut: its first record is the end of epoch 1, then "Epoch 2/10"),
    if it is counted from 1."""
    kinds, values, steps = run.kind, run.value, run.step
    first = next((values[i] for i, k in enumerate(kinds) if k == epoch_series), math.nan)
    at = first - 1 if first > 1 else math.nan
    for i, k in enumerate(kinds):
        if k == epoch_series:
            at = values[i]
        steps[i] = at
    if planned > 0 and math.isfinite(at):
        run.planned_steps = planned
