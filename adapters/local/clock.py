"""Runs put on the wall clock the watchdog ticks on."""

from __future__ import annotations

import dataclasses

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
