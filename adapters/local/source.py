"""``LocalSource``: one job per run file (re-read only when the file changed) and, when
a run is tied to a process, the job's state from the process, and a stop that signals it
(``trainguard.adapters.local.process``)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trainguard.adapters.local import MetricDefinition, assign_ids, load_runs
from trainguard.adapters.local.clock import ReadClock, on_wall_clock
from trainguard.adapters.local.process import GRACE_S, Process
from trainguard.checker.model import Job, JobState


@dataclass
class LocalRun:
    path: Path
    job_id: str
    process: Process | None = None
    definitions: list[MetricDefinition] | None = None
    fmt: str | None = None
    signature: tuple[int, int] | None = None  # (size, mtime_ns) of the last read
    jobs: list[Job] = field(default_factory=list)  # the last good read: one per run held
    read_error: str | None = None
    clocks: dict[str, ReadClock] = field(default_factory=dict)  # step-clock runs, per job id

    @property
    def job(self) -> Job | None:
        """The run's job when the path holds one run (a log file); the first otherwise."""
        return self.jobs[0] if self.jobs else None


def signature_of(path: Path) -> tuple[int, int]:
    """(size, newest mtime_ns) of a file, or of every file under a folder (an MLflow
    store or a TensorBoard log dir is written inside, which leaves the folder's own mtime
    alone)."""
    if not path.is_dir():
        st = path.stat()
        return st.st_size, st.st_mtime_ns
    size, newest = 0, path.stat().st_mtime_ns
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(os.path.join(root, name))
                size, newest = size + st.st_size, max(newest, st.st_mtime_ns)
    return size, newest


class LocalSource:
    """Jobs from local run files, optionally tied to the processes writing them."""

    name = "local"

    def __init__(self, runs: Sequence[LocalRun], grace_s: float = GRACE_S) -> None:
        self.runs = list(runs)
        self.grace_s = grace_s
        self._owner: dict[str, LocalRun] = {}  # job id -> the watched path that holds it

    def list_jobs(self, now: float) -> list[Job]:
        jobs: list[Job] = []
        for run in self.runs:
            if run.process is not None:
                self._escalate(run.process, now)
                run.process.poll(now)  # a process that ends before writing anything ends too
            for job in self._read(run):
                self._owner[job.id] = run
                jobs.append(self._with_state(run, job, now))
        return jobs

    def _read(self, run: LocalRun) -> list[Job]:
        """Every run the path holds: one for a log file, one per run of an MLflow store or
        TensorBoard log dir (``experiment/run``, after the path's id when several paths are
        watched), runs that appear later included."""
        try:
            signature = signature_of(run.path)
        except FileNotFoundError:
            return run.jobs  # not written yet (or removed): nothing new to read
        if signature != run.signature:
            try:
                found = load_runs(run.path, run.definitions, run.fmt)
                if len(found) == 1 and not found[0].label:
                    found[0].job.id = run.job_id
                else:
                    assign_ids(found)  # experiment/run, as check names them
                    if len(self.runs) > 1:  # several paths watched: say which one too
                        for f in found:
                            f.job.id = f"{run.job_id}/{f.job.id}"
                mtime = signature[1] / 1e9
                run.jobs = [self._on_wall_clock(run, on_wall_clock(f.job, mtime), mtime)
                            for f in found]
                run.read_error = None
            except Exception as e:  # a half-written or broken file: keep the last good read
                run.read_error = f"{run.path}: {e}"
            run.signature = signature
        return run.jobs

    @staticmethod
    def _on_wall_clock(run: LocalRun, job: Job, mtime: float) -> Job:
        """A run on its steps alone, put on the wall clock by when its records were seen
        (``ReadClock``) where the process writing it says when it began: a stall is then
        measured live. Without a process (nothing to stop) it stays on its steps."""
        start = run.process.started_at if run.process is not None else None
        if job.clock != "step" or start is None:
            return job
        clock = run.clocks.setdefault(job.id, ReadClock(start))
        return clock.stamp(job, mtime)

    def _with_state(self, run: LocalRun, job: Job, now: float) -> Job:
        proc = run.process
        if proc is None:
            return job
        alive = proc.poll(now)
        tags = {**job.tags, "pid": str(proc.pid)}
        if job.clock == "wall" and proc.started_at is not None and (
                job.start_time is None or proc.started_at < job.start_time):
            # the log's first record is not its start: the process's start is (stall
            # judges a silence after one record by how long the job took to reach it)
            job = dataclasses.replace(job, start_time=proc.started_at)
        if alive:
            stopping = proc.term_sent_at is not None
            return dataclasses.replace(
                job, tags=tags, state=JobState.STOPPING if stopping else JobState.RUNNING,
                raw_state=f"pid {proc.pid} {'stopping' if stopping else 'running'}")
        code = proc.exit_code
        if proc.term_sent_at is not None:
            state, raw = JobState.STOPPED, f"stopped by trainguard (exit {code})"
        elif code == 0:
            state, raw = JobState.SUCCEEDED, "exit 0"
        elif code is None:
            state, raw = JobState.UNKNOWN, f"pid {proc.pid} ended, exit code unknown"
        else:
            state, raw = JobState.FAILED, f"exit {code}"
        return dataclasses.replace(
            job, tags=tags, state=state, raw_state=raw, end_time=proc.exited_at,
            failure_reason=raw if state == JobState.FAILED else job.failure_reason)

    def _escalate(self, proc: Process, now: float) -> None:
        """SIGKILL a process that ignored SIGTERM for longer than the grace period."""
        if (proc.term_sent_at is not None and not proc.killed
                and now - proc.term_sent_at >= self.grace_s and proc.group_alive()):
            proc.signal(signal.SIGKILL)
            proc.killed = True

    def stop(self, job: Job, reason: str) -> None:
        run = self._owner.get(job.id)
        if run is None or run.process is None:
            raise RuntimeError(f"run {job.id!r} has no process to stop (watch a PID to stop it)")
        if run.process.term_sent_at is None:
            run.process.term_sent_at = time.time()
            run.process.signal(signal.SIGTERM)

    @property
    def processes(self) -> list[Process]:
        return [r.process for r in self.runs if r.process is not None]
