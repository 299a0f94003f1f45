"""What every local reader shares: opening (.gz too), the time axis, and building the Job.

A reader implements ``collect``: it walks its file and hands each value to a ``RunBuilder``
with whatever it knows of the record's step, wall time and elapsed time. The builder then
picks the job's clock (wall, else elapsed, else step), fills the gaps, sorts every series
by time and adds the ``step`` (progress) series.
"""

from __future__ import annotations

import gzip
import itertools
import math
import os
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, ClassVar

import numpy as np
import numpy.typing as npt

from trainguard.adapters.local.definitions import MetricDefinition
from trainguard.adapters.local.marks import Marks
from trainguard.adapters.local.names import recognise
from trainguard.adapters.local.sessions import superseded
from trainguard.checker.cost import RESUME_GAP_FACTOR, logged_again
from trainguard.checker.model import Clock, FloatArray, Job, JobState, LogLine, Series
from trainguard.checker.stats import ffill

NAN = math.nan
MAX_LOG_LINES = 10_000
_GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: Path) -> bool:
    if path.suffix == ".gz":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(2) == _GZIP_MAGIC
    except OSError:
        return False


def plain_name(path: Path) -> str:
    """The file name without a trailing ``.gz``: what the format is judged by."""
    return path.name[:-3] if path.name.endswith(".gz") else path.name


@contextmanager
def open_text(path: Path) -> Iterator[IO[str]]:
    """A text handle on a plain or gzip file; undecodable bytes become U+FFFD."""
    from trainguard.adapters.local.errors import FormatError

    try:
        if is_gzip(path):
            f: IO[str] = gzip.open(path, "rt", encoding="utf-8-sig", errors="replace")  # noqa: SIM115
        else:
            f = open(path, encoding="utf-8-sig", errors="replace")  # noqa: SIM115
    except OSError as e:
        raise FormatError(path, e.strerror or str(e)) from None
    try:
        yield f
    except (EOFError, gzip.BadGzipFile) as e:
        raise FormatError(path, f"compressed file is damaged or cut short: {e}") from None
    finally:
        f.close()


def head(path: Path, size: int = 4096) -> str:
    """The first bytes of a file as text, for sniffing; '' when unreadable."""
    try:
        with open_text(path) as f:
            return f.read(size)
    except Exception:  # sniffing must never fail: the reader reports the real error
        return ""


def parse_timestamp(text: str) -> float:
    """ISO-8601 to epoch seconds; a timestamp without a zone is local time (the machine
    that wrote the log is the one that reads it)."""
    return datetime.fromisoformat(text.strip()).timestamp()


def epoch_seconds(value: float) -> float:
    """Epoch seconds from seconds or milliseconds (anything past year 5138 in s is ms)."""
    return value / 1000.0 if abs(value) >= 1e11 else value


def looks_like_epoch(value: float) -> bool:
    return abs(value) >= 1e9  # after 2001-09-09: a Unix time, not seconds since start


class CumulativeTime:
    """A cumulative time field that may restart from zero, kept increasing like a
    Prometheus counter: after a drop the new value is added to the last time before it."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.last_raw = -math.inf
        self.read = self.drops = 0

    def __call__(self, raw: float) -> float:
        self.read += 1
        if raw < self.last_raw:
            self.offset += self.last_raw
            self.drops += 1
        self.last_raw = raw
        return self.offset + raw

    def per_record(self) -> bool:
        """Whether the field is no clock but each record's own duration (Detectron2's and
        MMEngine's ``time``: seconds per iteration): a cumulative time drops only where a
        run restarts, a duration at about every other record."""
        return self.drops > max(2, self.read // 10)


class RunBuilder:
    """Collects records in file order and turns them into a ``Job``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.names: dict[str, int] = {}
        # one entry per record: series index (-1 for a log line), value (or log index), ...
        self.kind: list[int] = []
        self.value: list[float] = []
        self.step: list[float] = []
        self.wall: list[float] = []
        self.elapsed: list[float] = []
        self.row: list[int] = []
        self.logs: deque[tuple[int, str]] = deque(maxlen=MAX_LOG_LINES)
        self.marks = Marks()
        self._recorded = False  # whether a record came before the entries looked at
        self._looked = 0  # entries looked at for a record
        self.id: str | None = None
        self.name: str | None = None
        self.state = JobState.RUNNING
        self.raw_state = ""
        self.planned_steps: int | None = None
        self.start_time: float | None = None
        self.end_time: float | None = None
        self.tags: dict[str, str] = {}
        self.failure_reason: str | None = None

    def index(self, name: str) -> int:
        """The series number of ``name``, for readers that append to the columns directly."""
        idx = self.names.get(name)
        if idx is None:
            idx = self.names[name] = len(self.names)
        return idx

    def add(self, name: str, value: float, step: float = NAN, wall: float = NAN,
            elapsed: float = NAN, row: int = 0) -> None:
        self.kind.append(self.index(name))
        self.value.append(value)
        self.step.append(step)
        self.wall.append(wall)
        self.elapsed.append(elapsed)
        self.row.append(row)

    def log(self, text: str, step: float = NAN, wall: float = NAN, elapsed: float = NAN,
            row: int = 0) -> None:
        """A raw log line; only the last ``MAX_LOG_LINES`` are kept."""
        if len(self.logs) == MAX_LOG_LINES:
            self.kind[self.logs[0][0]] = -2  # dropped
        if not self._recorded:  # readers append records to the columns directly
            self._recorded = any(k >= 0 for k in self.kind[self._looked:])
            self._looked = len(self.kind)
        self.marks.line(len(self.kind), text, self._recorded)
        self.logs.append((len(self.kind), text))
        self.kind.append(-1)
        self.value.append(NAN)
        self.step.append(step)
        self.wall.append(wall)
        self.elapsed.append(elapsed)
        self.row.append(row)

    def _time_axis(self) -> tuple[Clock, FloatArray]:
        wall = np.array(self.wall, dtype=np.float64)
        elapsed = np.array(self.elapsed, dtype=np.float64)
        has_elapsed = bool((~np.isnan(elapsed)).any())
        # one lone timestamp (a banner line) says nothing of the pace: a time field does
        walls = np.unique(wall[~np.isnan(wall)])
        if (len(walls) >= 2 or (len(walls) == 1 and not has_elapsed)) and self._stamped(wall):
            return "wall", ffill(wall, None)
        if has_elapsed:
            return "elapsed", ffill(elapsed, 0.0)
        step = np.array(self.step, dtype=np.float64)
        if (~np.isnan(step)).any():
            return "step", ffill(step, None)
        # no step and no time: the n-th record row stands for step n
        _, rank = np.unique(np.array(self.row, dtype=np.int64), return_inverse=True)
        return "step", rank.astype(np.float64)

    def _stamped(self, wall: FloatArray) -> bool:
        """Whether at least half the progress records (the ``step`` records a reader
        adds, where there are two or more, else every record with a step) carry a time of
        their own. A script that
        logs its set-up and checkpoints through ``logging`` (stamped) and prints its
        steps (not stamped) has no clock for its steps: carried forward, the last stamp
        would date hours of steps to one instant, and a live watch would see them stall."""
        kind = np.array(self.kind, dtype=np.int64)
        at = self.names.get("step")
        rec = kind == at if at is not None else np.zeros(len(kind), dtype=bool)
        if np.count_nonzero(rec) < 2:
            # one step line (a launcher's "step=0" banner) says nothing of how the records
            # after it are dated: they are judged themselves
            rec = (kind >= 0) & ~np.isnan(np.array(self.step, dtype=np.float64))
        n = int(np.count_nonzero(rec))
        return n == 0 or 2 * int(np.count_nonzero(~np.isnan(wall[rec]))) >= n

    def build(self, default_id: str, sessions: bool = True) -> Job:
        """The job; ``sessions=False`` keeps the records a later session rewrote
        (``sessions.superseded``), for tools that cut the records themselves."""
        job = Job(id=self.id or default_id, provider="local", scope="local",
                  name=self.name or self.id or default_id, state=self.state,
                  raw_state=self.raw_state, planned_steps=self.planned_steps,
                  end_time=self.end_time, tags=dict(self.tags),
                  failure_reason=self.failure_reason)
        if not self.kind:
            job.clock = "wall" if self.start_time is not None else "step"
            job.start_time = self.start_time
            return job
        job.clock, time = self._time_axis()
        kind = np.array(self.kind, dtype=np.int64)
        value = np.array(self.value, dtype=np.float64)
        step = np.array(self.step, dtype=np.float64)
        gone = (superseded(kind, step, time, job.clock != "step", value,
                           self.names.get("epoch"), self.names.get("step"))
                if sessions else np.zeros(len(kind), dtype=bool))
        job.superseded = int(gone.sum())
        # sort by series, then by time; lexsort is stable so ties keep file order
        kept = np.where(gone, -3, kind)
        order = np.lexsort((time, kept))
        kind_s = kept[order]
        bounds = np.searchsorted(kind_s, np.arange(len(self.names) + 1))
        for name, idx in self.names.items():
            sel = order[bounds[idx]:bounds[idx + 1]]
            if name != "step" and len(sel):
                job.series[name] = Series(name, time[sel], step[sel], value[sel])
        # progress from every record that carries a step; a reader adds records named
        # "step" for steps that came with no metric
        progress = self._progress((kind >= 0) & ~np.isnan(step), step, time, job.series)
        if progress is not None:
            job.series["step"] = progress
        if self.logs:
            pos = np.array([p for p, _ in self.logs], dtype=np.int64)
            keep = np.argsort(time[pos], kind="stable")
            texts = [t for _, t in self.logs]
            job.logs = [LogLine(float(time[pos[i]]), texts[i]) for i in keep]
        if job.clock != "step":
            own = np.array(self.wall, dtype=np.float64) if job.clock == "wall" else time
            job.launches, job.finishes = self.marks.times(kind, time, own)
        first = [float(s.time[0]) for s in job.series.values() if len(s)]
        first += [job.logs[0].time] if job.logs else []
        job.start_time = self.start_time if self.start_time is not None else (
            min(first) if first else None)
        recognise(job)
        return job

    @staticmethod
    def _progress(records: npt.NDArray[np.bool_], step: FloatArray, time: FloatArray,
                  series: dict[str, Series]) -> Series | None:
        """One point per distinct step, at the first time it was recorded, in time order;
        and again after each resume from a checkpoint (after a silence far beyond the
        run's cadence, ``checker.cost.RESUME_GAP_FACTOR``, the step going back, or coming
        back to the last one logged with a series writing its record again:
        ``checker.cost.logged_again``), so that the resume can be seen. A metric logged
        late for an earlier step is no resume."""
        if not records.any():
            return None
        idx = np.flatnonzero(records)
        idx = idx[np.argsort(time[idx], kind="stable")]
        s, tm = step[idx], time[idx]
        gaps = np.diff(tm)
        typical = float(np.median(gaps[gaps > 0])) if (gaps > 0).any() else 0.0
        top = np.maximum.accumulate(s)[:-1]
        silent = gaps > RESUME_GAP_FACTOR * typical if typical > 0 else np.zeros_like(top, bool)
        found = silent & (s[1:] < top)
        for i in np.flatnonzero(silent & (s[1:] == top)):
            found[i] = logged_again(series, None, float(tm[i + 1]), float(s[i + 1]))
        starts = np.flatnonzero(found) + 1
        keep: list[np.ndarray] = []
        for a, b in itertools.pairwise([0, *starts.tolist(), len(idx)]):
            _, first = np.unique(s[a:b], return_index=True)
            keep.append(a + np.sort(first))
        idx = idx[np.concatenate(keep)]
        return Series("step", time[idx], step[idx], step[idx])


@dataclass
class Found:
    """One run in a file or folder: where it lies (a run folder inside a TensorBoard log
    dir, or the store), its name inside a store (``experiment/run``; None when the path
    names it), the other names it answers to (an MLflow run id), and the job read."""

    path: Path
    label: str | None
    job: Job
    aliases: tuple[str, ...] = ()


class Reader(ABC):
    """One file format. Subclasses set ``name`` and implement ``collect``; they may
    override ``matches_name`` and ``matches_content`` for ``detect_format``."""

    name: ClassVar[str]

    def sniff(self, path: str | Path) -> bool:
        p = Path(path)
        return self.matches_name(p) or self.matches_content(p)

    def matches_name(self, path: Path) -> bool:
        return False

    def matches_content(self, path: Path) -> bool:
        return False

    def default_id(self, path: Path) -> str:
        name = plain_name(path)
        return name.rsplit(".", 1)[0] if "." in name.lstrip(".") else name

    def read(self, path: str | Path, definitions: list[MetricDefinition] | None = None,
             *, run: str | None = None, sessions: bool = True) -> Job:
        from trainguard.adapters.local.errors import FormatError

        p = Path(path)
        if not os.path.exists(p):
            raise FormatError(p, "no such file or directory")
        builder = RunBuilder(p)
        self.collect(p, builder, definitions, run)
        return builder.build(self.default_id(p), sessions)

    def read_all(self, path: str | Path, definitions: list[MetricDefinition] | None = None
                 ) -> list[Found]:
        """Every run in ``path``: one for a file; a store or a log dir may hold many."""
        p = Path(path)
        return [Found(p, None, self.read(p, definitions))]

    @abstractmethod
    def collect(self, path: Path, run: RunBuilder, definitions: list[MetricDefinition] | None,
                select: str | None) -> None:
        """Hand every record of ``path`` to ``run``; ``select`` picks one run in a store."""
