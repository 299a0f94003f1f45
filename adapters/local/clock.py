"""Runs put on the wall clock the watchdog ticks on."""

from __future__ import annotations

import dataclasses

import numpy as np

from trainguard.checker.model import Job


def on_wall_clock(job: Job, mtime: float) -> Job:
    """A log with only a cumulative time field (``clock="elapsed"``) put on the wall clock
    the watchdog ticks on: its last record was written when the file last changed."""
    last = job.last_time()
    if job.clock != "elapsed" or last is None:
        return job
    offset = mtime - last
    series = {k: dataclasses.replace(s, time=s.time + offset) for k, s in job.series.items()}
    logs = [dataclasses.replace(line, time=line.time + offset) for line in job.logs]
    return dataclasses.replace(
        job, clock="wall", series=series, logs=logs,
        start_time=job.start_time + offset if job.start_time is not None else None,
        end_time=job.end_time + offset if job.end_time is not None else None)


class ReadClock:
    """A log on its steps alone (no time stamps, no time field: nanoGPT's ``iter 10: loss
    4.57``), put on the wall clock by when the watchdog saw each record: the records new
    at a read were written by the file's mtime then, within one tick. Without it a live
    watch could not tell a hung run from a running one, since a step clock measures no
    silence. The records there at the first read are spread evenly from the process's
    start to that read's mtime (the run's average pace: slower than its cadence when it
    warmed up, so a threshold learnt from it errs long). A series that lost records since
    the last read (a file rewritten, a session set aside) starts over as at a first read.
    """

    def __init__(self, start: float) -> None:
        self.start = start
        self.times: dict[str, np.ndarray] = {}  # per series, the time of each record seen
        self.log_times: list[float] = []
        self.reads = 0

    def stamp(self, job: Job, mtime: float) -> Job:
        """``job`` as read when the file's mtime was ``mtime``, on the wall clock."""
        if job.clock != "step":
            return job
        self.reads += 1
        series = {k: dataclasses.replace(s, time=self._times(k, len(s), mtime))
                  for k, s in job.series.items()}
        had = len(self.log_times)
        if len(job.logs) < had:
            self.log_times, had = [], 0
        self.log_times += [mtime] * (len(job.logs) - had)
        logs = [dataclasses.replace(line, time=t)
                for line, t in zip(job.logs, self.log_times, strict=True)]
        return dataclasses.replace(job, clock="wall", series=series, logs=logs,
                                   start_time=self.start)

    def _times(self, name: str, n: int, mtime: float) -> np.ndarray:
        had = self.times.get(name)
        if had is None or len(had) > n:  # first seen, or not the records seen before
            # at the first read, written since the start; a series begun later, by now
            new = (np.linspace(self.start, mtime, n + 1)[1:]
                   if mtime > self.start and (self.reads == 1 or had is not None)
                   else np.full(n, mtime))
        else:
            new = np.concatenate([had, np.full(n - len(had), mtime)])
        self.times[name] = new
        return new
