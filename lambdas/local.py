"""The local watchdog: the shared tick over run files being written and the processes
writing them, with state in SQLite.

``LocalSource`` lists one job per run file (re-read only when the file changed) and, when
a run is tied to a process, takes the job's state from the process and stops it with
SIGTERM, then SIGKILL after a grace period: the whole process group when the watchdog
started the process (its DataLoader workers too), the process alone when given by PID.
``watch`` runs the tick every ``tick_s`` seconds, prints findings and stops as they
happen, says when a process ends (its exit code and the tail of its output), and ends
when every watched process has exited (or after ``until`` seconds), with a table of
every run's outcome.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainguard.adapters.local import MetricDefinition, assign_ids, load_runs
from trainguard.adapters.local.ids import path_ids
from trainguard.checker.cost import progress
from trainguard.checker.model import Job, JobState
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Rule
from trainguard.lambdas.pidguard import PidHandle
from trainguard.lambdas.sqlite_state import SQLiteStore
from trainguard.lambdas.state import AuditAction, AuditRecord
from trainguard.lambdas.tick import REMIND_EVERY_S, AlarmEvent, TickReport, tick

GRACE_S = 10.0
#: lines of a started process's output shown when it ends
TAIL_LINES = 10


def tail(path: Path | None, lines: int = TAIL_LINES, max_bytes: int = 16384) -> list[str]:
    """The last ``lines`` lines of a file ([] when there is none)."""
    if path is None:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - max_bytes, 0))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [ln for ln in text.splitlines() if ln.strip()][-lines:]


class Process:
    """A process to watch: a child we started (``Popen``) or any PID.

    A child started in its own session (``start_new_session=True``, as ``watch --start``
    does) is signalled as a process group, so the workers it forked end with it."""

    def __init__(self, target: int | subprocess.Popen[Any], output: Path | None = None) -> None:
        self.popen = target if isinstance(target, subprocess.Popen) else None
        self.pid = target.pid if isinstance(target, subprocess.Popen) else int(target)
        self.output = output  # where its stdout and stderr go, for the tail when it ends
        self.exit_code: int | None = None
        self.exited_at: float | None = None
        self.term_sent_at: float | None = None
        self.killed = False
        self.reported = False  # its end has been said
        self.group: int | None = None
        # A bare PID is pinned to the process it names now: never signal a PID reuse.
        self.handle = PidHandle(self.pid) if self.popen is None else None
        if self.popen is not None:
            with contextlib.suppress(OSError):
                if os.getpgid(self.pid) == self.pid:  # it leads its own group
                    self.group = self.pid

    def poll(self, now: float) -> bool:
        """True while the process runs; notes its exit code and time once it has ended."""
        if self.exited_at is not None:
            return False
        if self.popen is not None:
            code = self.popen.poll()
            alive = code is None
        else:
            code = None
            assert self.handle is not None
            alive = self.handle.alive()
        if not alive:
            self.exit_code, self.exited_at = code, now
        return alive

    def signal(self, sig: signal.Signals) -> None:
        """``sig`` to the process, or to its whole group (its workers outlive it otherwise,
        re-parented to PID 1)."""
        with contextlib.suppress(ProcessLookupError):  # it may have ended on its own
            if self.group is not None:
                os.killpg(self.group, sig)
            elif self.handle is not None:
                self.handle.send(sig)
            else:
                os.kill(self.pid, sig)

    def group_alive(self) -> bool:
        """Whether any process of the group (or the process) is left."""
        if self.popen is not None:
            self.popen.poll()  # reap it: a zombie still counts as a member of its group
        if self.handle is not None:
            return self.handle.alive()
        try:
            if self.group is not None:
                os.killpg(self.group, 0)
            else:
                os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def end(self, grace_s: float = GRACE_S) -> None:
        """SIGTERM the group, then SIGKILL what is left after ``grace_s``: for the processes
        the watchdog started and must not leave behind."""
        if not self.group_alive():
            return
        if self.term_sent_at is None:
            self.term_sent_at = time.time()
            self.signal(signal.SIGTERM)
        deadline = self.term_sent_at + grace_s
        while time.time() < deadline and self.group_alive():
            time.sleep(0.05)
        if self.group_alive():
            self.signal(signal.SIGKILL)
            self.killed = True
            for _ in range(100):  # the kernel takes a moment to tear them down
                if not self.group_alive():
                    break
                time.sleep(0.02)


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
                run.jobs = [on_wall_clock(f.job, signature[1] / 1e9) for f in found]
                run.read_error = None
            except Exception as e:  # a half-written or broken file: keep the last good read
                run.read_error = f"{run.path}: {e}"
            run.signature = signature
        return run.jobs

    def _with_state(self, run: LocalRun, job: Job, now: float) -> Job:
        proc = run.process
        if proc is None:
            return job
        alive = proc.poll(now)
        tags = {**job.tags, "pid": str(proc.pid)}
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


class ConsoleSink:
    """Prints alarm events as they happen and keeps them for the result."""

    def __init__(self, console: Console, started: float) -> None:
        self.console = console
        self.started = started
        self.events: list[AlarmEvent] = []

    def send(self, event: AlarmEvent) -> None:
        self.events.append(event)
        m = event.memory
        at = f"[dim]{event.time - self.started:6.1f}s[/]"
        run = escape(event.job.id if event.job else event.job_key.rsplit(":", 1)[-1])
        style = {"critical": "bold red", "warning": "yellow"}.get(m.severity, "cyan")
        if event.kind == "resolve":
            if event.job is not None and event.job.state.terminal:
                # the run ended: nothing cleared the finding, the end only stopped the rule
                self.console.print(f"{at} [dim]no longer judged[/] {run}: its {m.severity} "
                                   f"{m.rule} stands, the run ended "
                                   f"({event.job.state.value.lower()})")
            else:
                self.console.print(f"{at} [green]cleared[/] {run}: {m.rule}")
            return
        label = "reminder" if event.kind == "remind" else m.severity
        self.console.print(f"{at} [{style}]{label}[/] {run}: [bold]{m.rule}[/] "
                           f"{escape(m.message)}")


@dataclass
class RunOutcome:
    job_id: str
    path: str
    pid: int | None
    state: str
    exit_code: int | None
    steps: float | None
    start_time: float | None
    end_time: float | None
    findings: list[dict[str, Any]] = field(default_factory=list)  # every alarm raised
    stopped_by: str | None = None  # the rule whose finding stopped the run
    stop_reason: str | None = None
    stopped_at: float | None = None
    dry_run_stop: bool = False  # dry run: it would have been stopped

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class WatchResult:
    started_at: float
    ended_at: float
    ticks: int
    runs: list[RunOutcome]
    audit: list[AuditRecord]
    errors: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "ended_at": self.ended_at, "ticks": self.ticks,
                "runs": [r.to_dict() for r in self.runs],
                "audit": [a.to_dict() for a in self.audit], "errors": self.errors}


def _key(path: str | Path) -> Path:
    return Path(path).expanduser().resolve()


def watch(runs: Sequence[str | Path], policy: Policy, state_path: str | Path, tick_s: float,
          console: Console, until: float | None = None,
          processes: Mapping[str | Path, int | subprocess.Popen[Any]] | None = None,
          definitions: list[MetricDefinition] | None = None, fmt: str | None = None,
          outputs: Mapping[str | Path, str | Path] | None = None,
          grace_s: float = GRACE_S, remind_every_s: float = REMIND_EVERY_S,
          rules: list[Rule] | None = None,
          clock: Callable[[], float] = time.time) -> WatchResult:
    """Watch run files (and the processes writing them, keyed by run path) until every
    process has exited, or for at most ``until`` seconds. With no processes and no
    ``until`` it runs until interrupted. State and the audit log go to ``state_path``;
    ``outputs`` (keyed by run path) are where each process's output goes, whose tail is
    shown when it fails. The processes given as ``Popen`` (started for this watch) are
    ended with their process group when the watch ends."""
    if tick_s <= 0:
        raise ValueError(f"tick_s must be positive, got {tick_s}")
    paths = [Path(r) for r in runs]
    outs = {_key(k): Path(v) for k, v in (outputs or {}).items()}
    procs = {_key(k): Process(v, outs.get(_key(k))) for k, v in (processes or {}).items()}
    unknown = set(procs) - {_key(p) for p in paths}
    if unknown:
        raise ValueError(f"processes given for files not watched: "
                         f"{', '.join(sorted(map(str, unknown)))}")
    local_runs = [LocalRun(p, i, procs.get(_key(p)), definitions, fmt)
                  for p, i in zip(paths, path_ids(paths), strict=True)]
    source = LocalSource(local_runs, grace_s)
    store = SQLiteStore(state_path)
    started = clock()
    sink = ConsoleSink(console, started)
    audit: list[AuditRecord] = []
    errors: list[str] = []
    ticks = 0
    mode = "dry run: stops are only audited" if policy.safety.dry_run else "stops enabled"
    console.print(f"[bold]trainguard watch[/]: {len(paths)} run(s), "
                  f"{len(source.processes)} process(es), tick {tick_s:g}s, policy "
                  f"{escape(policy.name)} ({mode}); state in {escape(str(state_path))}")
    try:
        while True:
            now = clock()
            report = tick([source], policy, store, [sink], now, rules=rules,
                          remind_every_s=remind_every_s)
            ticks += 1
            audit.extend(report.audit)
            _print_report(console, report, started, errors, local_runs)
            _print_ended(console, report.time - started, local_runs)
            if source.processes and all(p.exited_at is not None for p in source.processes):
                break
            if until is not None and clock() - started >= until:
                break
            time.sleep(max(0.0, tick_s - (clock() - now)))
    finally:
        store.close()
        # what the watchdog started does not outlive it
        end_all([p for p in source.processes if p.popen is not None], grace_s)
    return WatchResult(started, clock(), ticks, _outcomes(source, sink.events, audit),
                       audit, errors)


def end_all(processes: Sequence[Process], grace_s: float = GRACE_S) -> None:
    """SIGTERM every group at once, then wait out one grace period for all of them."""
    for proc in processes:
        if proc.term_sent_at is None and proc.group_alive():
            proc.term_sent_at = time.time()
            proc.signal(signal.SIGTERM)
    for proc in processes:
        proc.end(grace_s)


def exit_text(code: int | None) -> str:
    """An exit code as a person reads it (a negative Popen code is a signal)."""
    if code is None:
        return "exit code unknown (not our child)"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _print_ended(console: Console, at_s: float, runs: list[LocalRun]) -> None:
    """Say once when a process ended: its exit code, and the tail of its output when it
    failed or wrote no run file."""
    for run in runs:
        proc = run.process
        if proc is None or proc.exited_at is None or proc.reported:
            continue
        proc.reported = True
        wrote = run.job is not None
        bad = proc.exit_code not in (0, None) and proc.term_sent_at is None
        style = "red" if bad or not wrote else "green"
        what = "" if wrote else f"; it never wrote {escape(str(run.path))}"
        console.print(f"[dim]{at_s:6.1f}s[/] [{style}]ended[/] {escape(run.job_id)}: pid "
                      f"{proc.pid}, {exit_text(proc.exit_code)}{what}", soft_wrap=True)
        if (bad or not wrote) and proc.output is not None:
            lines = tail(proc.output)
            head = f"last {len(lines)} line(s) of {proc.output}" if lines else \
                f"{proc.output} is empty"
            console.print(f"         {escape(head)}:" if lines else f"         {escape(head)}",
                          soft_wrap=True)
            for line in lines:
                console.print(f"         | {escape(line)}", soft_wrap=True, highlight=False)


def summary_table(result: WatchResult) -> Table:
    """One row per run: how it ended, the worst the watchdog said, and any stop."""
    table = Table(title="trainguard watch: runs", show_edge=False, pad_edge=False,
                  title_justify="left")
    for col in ("run", "state", "exit", "steps", "verdict", "findings", "stopped"):
        table.add_column(col, no_wrap=col != "findings")
    order = ["ok", "info", "warning", "critical"]
    for r in result.runs:
        severities = [f["severity"] for f in r.findings]
        worst = max(severities, key=order.index) if severities else "ok"
        rules = ", ".join(dict.fromkeys(f["rule"] for f in r.findings)) or "-"
        stopped = "-"
        if r.stopped_by is not None:
            stopped = f"{'would stop' if r.dry_run_stop else 'stopped'} ({r.stopped_by})"
        code = "-" if r.exit_code is None else (
            str(r.exit_code) if r.exit_code >= 0 else exit_text(r.exit_code))
        table.add_row(r.job_id, r.state, code,
                      "-" if r.steps is None else f"{r.steps:,.0f}", worst, rules, stopped)
    return table


def _print_report(console: Console, report: TickReport, started: float, errors: list[str],
                  runs: list[LocalRun]) -> None:
    at = f"[dim]{report.time - started:6.1f}s[/]"
    new = [f"source {k}: {v}" for k, v in report.source_errors.items()]
    new += report.sink_errors + report.warnings
    new += [r.read_error for r in runs if r.read_error and r.read_error not in errors]
    for e in new:
        if e not in errors:
            errors.append(e)
            console.print(f"{at} [red]error[/] {escape(e)}")
    for a in report.audit:
        text = escape(a.reason)
        if a.action == AuditAction.STOP:
            console.print(f"{at} [bold red]STOPPED[/] {escape(a.job_id)} (SIGTERM): {text}")
        elif a.action == AuditAction.WOULD_STOP:
            console.print(f"{at} [magenta]would stop[/] {escape(a.job_id)} (dry run): {text}")
        elif a.action == AuditAction.STOP_FAILED:
            console.print(f"{at} [red]stop failed[/] {escape(a.job_id)}: {text}")
        else:
            console.print(f"{at} [dim]not stopping {escape(a.job_id)}: {text}[/]")


def _outcomes(source: LocalSource, events: list[AlarmEvent],
              audit: list[AuditRecord]) -> list[RunOutcome]:
    out = []
    for run in source.runs:
        held: list[Job | None] = list(run.jobs) or [None]  # one outcome per run the path holds
        for job in held:
            out.append(_outcome(source, run, job, events, audit))
    return out


def _outcome(source: LocalSource, run: LocalRun, job: Job | None, events: list[AlarmEvent],
             audit: list[AuditRecord]) -> RunOutcome:
    job_id = job.id if job is not None else run.job_id
    proc = run.process
    prog = progress(job) if job is not None else None
    state = job.state.value if job is not None else "NOT STARTED"
    if proc is not None:
        probe = job or Job(id=run.job_id)
        state = source._with_state(run, probe, time.time()).state.value
    o = RunOutcome(
        job_id=job_id, path=str(run.path), pid=proc.pid if proc else None, state=state,
        exit_code=proc.exit_code if proc else None,
        steps=float(prog.step[-1]) if prog is not None and len(prog) else None,
        start_time=job.start_time if job else None,
        end_time=proc.exited_at if proc else None,
        findings=[{"rule": e.memory.rule, "severity": e.memory.severity,
                   "message": e.memory.message, "time": e.time}
                  for e in events if e.kind == "raise" and e.job is not None
                  and e.job.id == job_id])
    for a in audit:
        if a.job_id == job_id and a.action in (AuditAction.STOP, AuditAction.WOULD_STOP):
            o.stopped_by, o.stop_reason, o.stopped_at = a.rule, a.reason, a.time
            o.dry_run_stop = a.action == AuditAction.WOULD_STOP
            break
    return o
