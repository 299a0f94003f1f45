"""Where a local log shows one process of the run ending or the next one beginning.

A file written by more than one process (``python train.py >> train.log`` run again, a
run resumed by hand from its checkpoint hours later) goes silent between them. Where the
new process rewrites a step the records tell it (``checker.cost.resumes``); where it goes
on at the next step they do not, and a replay would call the silence a hang. Two marks,
in the processes' own words, tell it instead:

- the log's opening written again: its first line and two more of the lines the first
  process wrote before its first record (its banner: "Using 2 GPUs", "Collecting env
  info"), numbers aside, between the same two records later on. The first epoch's own
  lines are in the opening too and come again with every epoch (an "Epoch 1/10", a
  progress bar at 0 %), but after the lines a process writes first.
- a line saying training finished ("Training complete in 946m 39s", "Total training
  time: 3:02:11"): what the log goes on with after a silence is another process.

Each mark is only evidence: ``cost.resumes`` reads one as a resume where the records
around it are a silence far beyond the run's cadence. A replay calls the job down up to
the launch the new process's silence counts from (``cost.launched_since``: the first of
launches one after another, as processes dying before their first record, a restart
loop, are one silence; a later one after half an hour with no line); from there
``stall`` counts it, with a start's allowance.
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

from trainguard.checker.model import FloatArray

#: A line saying the training loop finished, as trainers word it.
FINISHED = re.compile(
    r"\btraining (is |has )?(complete|completed|finished|done|ended)\b|\bfinished training\b"
    r"|\btotal training time\b|\bepochs? completed in\b", re.IGNORECASE)
#: Distinct lines before the first record kept as the log's opening (a config dump may be
#: long).
OPENING = 200
#: Distinct opening lines between two records that make a new process's banner.
BANNER_LINES = 3

#: Characters of a line its shape is taken from.
SHAPE_CHARS = 120
_DIGITS = b"0123456789"
_NOT_WORDS = b" \t-=*#_+.,:;|/\\()[]<>{}%'\""


def _shape(text: str) -> bytes | None:
    """The line's start with its numbers taken out (a time stamp, a GPU count, a seed),
    or None for a line with nothing else but punctuation (a rule of dashes recurs
    anywhere). The start is enough to know a line by, and a config dump's lines are long.
    As bytes: ``bytes.translate`` deletes the digits ten times faster than ``str``'s."""
    shape = text[:SHAPE_CHARS].encode("utf-8", "surrogateescape").translate(
        None, _DIGITS).strip()
    return shape if shape.strip(_NOT_WORDS) else None


def _finished(text: str) -> bool:
    """Whether the line says training finished (the search only where it can)."""
    return (("rain" in text or "RAIN" in text or "poch" in text or "POCH" in text)
            and FINISHED.search(text) is not None)


class Marks:
    """Fed every log line in file order with its position among the builder's entries;
    asked at the end for the marks' times."""

    def __init__(self) -> None:
        self.opening: set[bytes] = set()
        self.first: bytes | None = None  # the opening's first line
        self.again: list[tuple[int, bytes]] = []  # (position, shape) of opening lines again
        self.finished: list[int] = []  # positions of lines saying training finished

    def line(self, pos: int, text: str, recorded: bool) -> None:
        """A log line at ``pos``; ``recorded``: whether a record came before it."""
        if recorded and _finished(text):
            self.finished.append(pos)
        shape = _shape(text)
        if shape is None:
            return
        if not recorded:
            if self.first is None:
                self.first = shape
            if len(self.opening) < OPENING:
                self.opening.add(shape)
        elif shape in self.opening:
            self.again.append((pos, shape))

    def times(self, kind: npt.NDArray[np.int64], time: FloatArray,
              own: FloatArray) -> tuple[list[float], list[float]]:
        """(launches, finishes): when each new process wrote the opening's first line in
        a banner, and each line saying training finished (records in ``kind`` are the
        entries >= 0; ``time`` is each entry's time, carried forward to lines without one,
        ``own`` its own, NaN where it has none). A banner without a stamp of its own
        (tacotron's "Starting new training run") is dated by the first stamp after it:
        the time carried to it is the crash's before it, hours earlier."""
        launches: list[float] = []
        if self.again:
            # entries recorded before each line: lines with the same count lie between
            # the same two records
            before = np.cumsum(kind >= 0)
            groups: dict[int, tuple[set[bytes], list[int]]] = {}
            for pos, shape in self.again:
                shapes, firsts = groups.setdefault(int(before[pos]), (set(), []))
                shapes.add(shape)
                if shape == self.first:
                    firsts.append(pos)
            stamped = np.flatnonzero(np.isfinite(own))

            def dated(p: int) -> float:
                j = int(np.searchsorted(stamped, p))
                return float(own[stamped[j]]) if j < len(stamped) else float(time[p])

            launches = [dated(p) for shapes, firsts in groups.values()
                        if len(shapes) >= BANNER_LINES for p in firsts]
        finishes = [float(time[p]) for p in self.finished]
        return ([t for t in sorted(launches) if np.isfinite(t)],
                [t for t in sorted(finishes) if np.isfinite(t)])
