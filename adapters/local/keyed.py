"""Records made of named fields (a CSV row, a JSON object): which field is the step,
which the time, and which are metrics."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from trainguard.adapters.local.base import (
    CumulativeTime,
    RunBuilder,
    epoch_seconds,
    looks_like_epoch,
    parse_timestamp,
)
from trainguard.adapters.local.errors import FormatError
from trainguard.checker.metrics import REWARD_WORDS, words

STEP_KEYS = frozenset({"step", "global_step", "iteration", "iter", "_step", "trainer/global_step",
                       "current_steps",
                       "time/total_timesteps"})  # stable-baselines3's progress.csv
#: The planned number of steps, as LLaMA-Factory's ``trainer_log.jsonl`` gives it.
PLANNED_KEYS = frozenset({"total_steps", "max_steps"})
WALL_KEYS = frozenset({"timestamp", "wall_time", "walltime", "_timestamp", "created_at",
                       "datetime"})
ELAPSED_KEYS = frozenset({"elapsed", "elapsed_time", "elapsed_s", "_runtime", "relative_time",
                          "train_time", "time/time_elapsed"})
AUTO_TIME_KEYS = frozenset({"time"})  # epoch seconds, ISO text, or seconds since start


@lru_cache(maxsize=1024)
def role(key: str) -> str:
    low = key.strip().lower()
    if low in STEP_KEYS:
        return "step"
    if low in WALL_KEYS:
        return "wall"
    if low in ELAPSED_KEYS:
        return "elapsed"
    if low in AUTO_TIME_KEYS:
        return "time"
    if low == "epoch":
        return "epoch"
    if low in PLANNED_KEYS:
        return "planned"
    return "metric"


#: A duration as Python's ``str(timedelta)`` writes it: ``0:32:48``, ``9 days, 21:39:23``.
_DURATION = re.compile(r"\s*(?:(\d+) days?, )?(\d+):([0-5]\d):([0-5]\d(?:\.\d*)?)\s*")


def duration(text: str) -> float | None:
    """Seconds in a ``[D day(s), ]H:MM:SS`` text (LLaMA-Factory's ``elapsed_time``)."""
    m = _DURATION.fullmatch(text)
    if m is None:
        return None
    days, h, mi, sec = m.groups()
    return ((int(days or 0) * 24 + int(h)) * 60 + int(mi)) * 60 + float(sec)


#: Words of a field the rules read as a number (a loss, an accuracy, a reward, the rate):
#: text there is a damaged value, never a label.
_MEASURES = REWARD_WORDS | {"loss", "acc", "accuracy", "lr", "norm", "perplexity", "ppl",
                            "error", "err"}


def _may_be_label(key: str) -> bool:
    return _MEASURES.isdisjoint(words(key))


class KeyedRecords:
    """Feeds one record at a time to a ``RunBuilder``. ``field`` is the word used in error
    messages ("column" for CSV, "key" for JSON)."""

    def __init__(self, path: Path, run: RunBuilder, field: str) -> None:
        self.path, self.run, self.field = path, run, field
        self.clock = CumulativeTime()
        # metric fields seen holding a number, and those holding text from their first
        # value on (a label: a sweep's "param_type: mup"), with the line it was first seen
        self.numeric: set[str] = set()
        self.labels: dict[str, int] = {}

    def number(self, key: str, cell: str | float, line: int) -> float:
        if isinstance(cell, float | int):
            return float(cell)
        try:
            return float(cell)
        except ValueError:
            if role(key) == "elapsed" and (seconds := duration(cell)) is not None:
                return seconds
            # a flag logged per record (stable-baselines3's monitor with
            # ``info_keywords=("is_success",)`` writes True/False): a rate, as JSON's own
            # true and false are read
            if (flag := cell.strip().lower()) in ("true", "false"):
                return 1.0 if flag == "true" else 0.0
            raise FormatError(self.path, f"{self.field} {key!r}: cannot read {cell!r} as a "
                              "number", line) from None

    def metric(self, key: str, cell: str | float, line: int) -> float | None:
        """A metric field's value; None for a label, a field that held text from its first
        value on and never a number (a number after it is an error, naming both lines: no
        value is dropped unsaid)."""
        if key in self.labels:
            try:
                self.number(key, cell, line)
            except FormatError:
                return None
            raise FormatError(self.path, f"{self.field} {key!r} holds a number here and "
                              f"text at line {self.labels[key]}: a label or a metric?", line)
        try:
            value = self.number(key, cell, line)
        except FormatError:
            if key in self.numeric or not _may_be_label(key):
                raise
            self.labels[key] = line
            return None
        self.numeric.add(key)
        return value

    def time(self, key: str, cell: str | float, line: int) -> tuple[float, bool]:
        """(seconds, is_wall) from epoch seconds or ms, ISO-8601 text, or seconds since start."""
        if isinstance(cell, str):
            try:
                return epoch_seconds(float(cell)), looks_like_epoch(float(cell))
            except ValueError:
                pass
            try:
                return parse_timestamp(cell), True
            except ValueError:
                raise FormatError(self.path, f"{self.field} {key!r}: cannot read {cell!r} as "
                                  "a time (epoch seconds or ISO-8601)", line) from None
        value = float(cell)
        return epoch_seconds(value), looks_like_epoch(value)

    def add(self, fields: Sequence[tuple[str, str | float]], line: int,
            epoch_is_step: bool) -> None:
        """One record; missing fields are simply absent from ``fields``."""
        step = wall = elapsed = epoch = math.nan
        metrics: list[tuple[str, float]] = []
        for key, cell in fields:
            r = role(key)
            if r == "metric":
                if (value := self.metric(key, cell, line)) is not None:
                    metrics.append((key, value))
            elif r == "step":
                step = self.number(key, cell, line)
            elif r == "epoch":
                epoch = self.number(key, cell, line)
            elif r == "planned":
                planned = self.number(key, cell, line)
                if math.isfinite(planned) and planned > 0:
                    self.run.planned_steps = int(planned)
            elif r == "elapsed":
                elapsed = self.clock(self.number(key, cell, line))
            else:
                t, is_wall = self.time(key, cell, line)
                if is_wall or r == "wall":
                    wall = t
                else:
                    elapsed = self.clock(t)
        if epoch_is_step and math.isnan(step):
            step = epoch
        elif not math.isnan(epoch):
            metrics.append(("epoch", epoch))
        add = self.run.add
        for key, value in metrics:
            add(key, value, step, wall, elapsed, line)
        if not metrics and not math.isnan(step):
            add("step", step, step, wall, elapsed, line)

    def finish(self) -> None:
        """After the last record: a time field that was each record's duration is no time
        axis (the run's clock is then its steps, or its wall time where it has one)."""
        if self.clock.per_record():
            self.run.elapsed[:] = [math.nan] * len(self.run.elapsed)
