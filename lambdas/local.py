"""The local watchdog: the shared tick over run files being written and the processes
writing them, with state in SQLite.

The source, its processes and the wall clock are ``trainguard.adapters.local``
(``source``, ``process``, ``clock``): ``LocalSource`` lists one job per run file and
stops a run's process with SIGTERM, then SIGKILL after a grace period. ``watch`` runs the
tick every ``tick_s`` seconds, prints findings and stops as they happen, says when a
process ends (its exit code and the tail of its output), and ends when every watched
process has exited (or after ``until`` seconds), with a table of every run's outcome.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainguard.adapters.local import MetricDefinition
from trainguard.adapters.local.ids import path_ids
from trainguard.adapters.local.process import GRACE_S, Process, end_all, exit_text, tail
from trainguard.adapters.local.source import LocalRun, LocalSource
from trainguard.checker.cost import progress
from trainguard.checker.model import Job
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Rule
from trainguard.lambdas import plugins
from trainguard.lambdas.sqlite_state import SQLiteStore
from trainguard.lambdas.state import AuditAction, AuditRecord
from trainguard.lambdas.tick import REMIND_EVERY_S, AlarmEvent, TickReport, tick


@plugins.sinks.register("console")
class ConsoleSink:
    """Prints alarm events as they happen and keeps them for the result."""

    def __init__(self, console: Console, started: float) -> None:
        self.console = console
        self.started = started
        self.events: list[AlarmEvent] = []

    def send(self, event: AlarmEvent) -> None:
        self._print(event)
        self.events.append(event)  # only once printed: a refused event is sent again

    def _print(self, event: AlarmEvent) -> None:
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
