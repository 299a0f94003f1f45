"""What ``check`` and ``replay`` print: rich tables for people, JSON for programs.

The JSON layout is ``trainguard.check/v1``, documented in docs/json-schema.md.
Change it only by adding fields; anything else is a new schema version.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainguard.checker.model import Finding, Job, Severity, verdict
from trainguard.lambdas.message import clean
from trainguard.replay import Fire, History, ReplayResult, Savings, first_record

SCHEMA = "trainguard.check/v1"

#: the verdict of a run with no records: nothing to judge is not "ok"
NO_DATA = "no data"
#: console width when the output is a pipe, a file or a CI log: wide enough that no table
#: column is folded; a person reading such a log scrolls sideways, a program reads JSON
PIPE_WIDTH = 1000

_STYLE = {"ok": "green", "info": "cyan", "warning": "yellow", "critical": "bold red",
          NO_DATA: "magenta"}

#: the series a rule judges when its evidence does not name one
RULE_SERIES = {"stall": "step", "restarts": "step", "utilization": "gpu_util",
               "slowdown": "throughput"}


def fit_output(console: Console) -> Console:
    """Tables at their natural width when not on a terminal (no 80-column wrap into
    boxes in a pipe or a CI log); on a terminal, the terminal's width."""
    if not console.is_terminal:
        console.width = PIPE_WIDTH
    return console


def series_of(f: Finding, job: Job | None = None) -> str | None:
    """The series a finding judged, by its own name in the run (``eval_loss`` for a
    ``val_loss`` the reader recognised)."""
    name = f.evidence.get("metric") or f.evidence.get("series") or RULE_SERIES.get(f.rule)
    if not isinstance(name, str):
        return None
    s = job.series.get(name) if job is not None else None
    return s.name if s is not None else name


class OutputFormat(enum.StrEnum):
    """``--format``: rich tables for people, JSON for programs."""

    table = "table"
    json = "json"


@dataclass
class Run:
    """One run file as loaded: where it came from and what the reader made of it."""

    path: str
    fmt: str | None
    job: Job
    # other names the run answers to (an MLflow run id and name); the last is its name
    # inside its store (``experiment/run``)
    aliases: tuple[str, ...] = ()


@dataclass
class Checked:
    run: Run
    now: float | None  # the run's last record: what "now" meant for the check
    findings: list[Finding]
    no_data: str | None = None  # why nothing could be judged (no records), else None

    @property
    def verdict(self) -> str:
        if self.no_data is not None and not self.findings:
            return NO_DATA
        return verdict(self.findings)


def has_data(job: Job) -> bool:
    """Whether the run recorded anything a rule can judge (a metric or a step)."""
    return any(len(s) for s in job.series.values())


def no_data_reason(run: Run) -> str:
    """Why a run has nothing to judge, said so the user can act on it."""
    path = Path(run.path)
    size: int | None = None
    head = b""
    if path.is_file():
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                head = f.read(4096)
        except OSError:
            pass
    if size == 0:
        return "no data: the file is empty"
    if b"\0" in head and not head.startswith(b"\x1f\x8b"):
        return "no data: a binary file, not a training log"
    lines = len(run.job.logs)
    if lines:
        return (f"no data: no metric or step recognised in {lines} line(s) "
                "(add --metric NAME=REGEX for this log's format)")
    return f"no data: no records in this {run.fmt or 'run'}"


def replay_verdict(result: ReplayResult) -> str:
    """The worst the watchdog said at any tick of the replay; ``no data`` for a run with
    nothing to judge."""
    worst = [h.worst for h in result.histories]
    if worst:
        return max(worst, key=lambda s: s.rank).value
    return "ok" if has_data(result.job) else NO_DATA


def worst_of(verdicts: list[str]) -> str:
    order = ["ok", NO_DATA, "info", "warning", "critical"]
    return max(verdicts, key=order.index) if verdicts else "ok"


# --- JSON -------------------------------------------------------------------------------------

def _clean(value: Any, in_evidence: bool = False) -> Any:
    """JSON-safe values: no NaN or inf anywhere (null; the string "nan" inside evidence)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, enum.Enum):
        return _clean(value.value, in_evidence)
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if not in_evidence:
            return None
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _clean(v, in_evidence) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_clean(v, in_evidence) for v in value]
    return str(value)


def _elapsed(job: Job, t: float | None, start: float | None) -> float | None:
    if t is None or start is None or job.clock == "step":
        return None
    return t - start


def finding_json(f: Finding, job: Job, start: float | None) -> dict[str, Any]:
    return {
        "key": f.key,
        "rule": f.rule,
        "series": series_of(f, job),
        "severity": f.severity.value,
        "step": f.step,
        "time": f.started_at,
        "elapsed_s": _elapsed(job, f.started_at, start),
        "message": f.message,
        "evidence": _clean(f.evidence, in_evidence=True),
        "burnt_usd": f.burnt_usd,
        "projected_usd": f.projected_usd,
        "action": f.action.value,
    }


def _run_json(run: Run, verdict_: str) -> dict[str, Any]:
    return {"id": run.job.id, "path": run.path, "format": run.fmt, "clock": run.job.clock,
            "superseded": run.job.superseded, "verdict": verdict_}


def check_json(checked: list[Checked], policy_name: str) -> dict[str, Any]:
    runs = []
    for c in checked:
        start = first_record(c.run.job)
        runs.append(_run_json(c.run, c.verdict) | {
            "now": c.now, "no_data": c.no_data,
            "findings": [finding_json(f, c.run.job, start) for f in c.findings],
        })
    return _document("check", policy_name, runs)


def _fire_json(fire: Fire, job: Job, start: float) -> dict[str, Any]:
    return {"time": fire.time, "elapsed_s": _elapsed(job, fire.time, start), "step": fire.step,
            "severity": fire.severity.value}


def _savings_json(s: Savings | None) -> dict[str, Any] | None:
    if s is None:
        return None
    return {"stop_time": s.stop_time, "stop_step": s.stop_step, "end_time": s.end_time,
            "end_step": s.end_step, "remaining_hours": s.remaining_hours,
            "remaining_steps": s.remaining_steps, "hourly_usd": s.hourly_usd, "usd": s.usd,
            "gpu_hours": s.gpu_hours}


def _history_json(h: History, job: Job, start: float) -> dict[str, Any]:
    return finding_json(h.finding, job, start) | {
        "severity": h.worst.value,
        "first_fired": _fire_json(h.first, job, start),
        "escalations": [_fire_json(e, job, start) for e in h.escalations],
        "last_seen": _fire_json(h.last_seen, job, start),
        "savings": _savings_json(h.savings),
    }


def replay_json(results: list[tuple[Run, ReplayResult]], policy_name: str) -> dict[str, Any]:
    runs = []
    for run, r in results:
        runs.append(_run_json(run, replay_verdict(r)) | {
            "tick": r.tick, "tick_unit": r.unit, "ticks": r.ticks,
            "start": r.start, "end": r.end, "hourly_usd": r.hourly_usd,
            "findings": [_history_json(h, r.job, r.start) for h in r.histories],
            "savings": _savings_json(r.savings),
        })
    return _document("replay", policy_name, runs)


def _document(command: str, policy_name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schema": SCHEMA, "command": command, "policy": policy_name,
            "verdict": worst_of([r["verdict"] for r in runs]), "runs": runs}


def dumps(document: dict[str, Any]) -> str:
    # allow_nan=False: a NaN that slipped past _clean is a bug to hear about, not bad JSON.
    return json.dumps(_clean(document), indent=2, allow_nan=False)


# --- tables -----------------------------------------------------------------------------------

def fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m"
    return f"{m}m{sec:02d}s" if m else f"{sec}s"


def fmt_when(job: Job, t: float | None, start: float | None) -> str:
    """A time as a person reads it: since the run's first record (steps have no time)."""
    return fmt_duration(_elapsed(job, t, start))


def fmt_step(step: float | None) -> str:
    """A step as the log counts it: whole steps with thousands separators, a fractional
    one (a log whose steps are epochs, 0.05 into the first) to its significant digits."""
    if step is None or not math.isfinite(step):
        return "-"
    return f"{step:,.0f}" if step.is_integer() or abs(step) >= 1000 else f"{step:.4g}"


def fmt_usd(usd: float | None) -> str:
    return "-" if usd is None or not math.isfinite(usd) else f"${usd:,.2f}"


def _sev(s: str) -> str:
    return f"[{_STYLE.get(s, '')}]{s}[/]"


def _heading(console: Console, run: Run, verdict_: str, extra: str = "") -> None:
    if run.job.superseded:
        # said at once: the judged curve is shorter than the file, and why
        extra += (f"; {run.job.superseded:,} records set aside: a later session (restart "
                  "or resume) logged their steps again")
    # A remote job's id is its owner's to choose: no terminal control sequence, no markup.
    console.print(f"{_sev(verdict_)}  [bold]{escape(clean(run.job.id))}[/]  "
                  f"{escape(clean(run.path))}  "
                  f"({run.fmt or '?'}, {run.job.clock} clock{extra})", highlight=False,
                  soft_wrap=True)


def _findings_table(c: Checked) -> Table:
    job = c.run.job
    start = first_record(job)
    priced = any(f.burnt_usd is not None or f.projected_usd is not None for f in c.findings)
    # Columns that would be all dashes are left out: the message needs the room.
    cols: list[tuple[str, Callable[[Finding], str]]] = [
        ("severity", lambda f: _sev(f.severity.value)),
        ("rule", lambda f: f.rule),
        ("series", lambda f: series_of(f, job) or "-"),
        ("from step", lambda f: fmt_step(f.step)),
    ]
    if job.clock != "step":
        cols.append(("from time", lambda f: fmt_when(job, f.started_at, start)))
    cols.append(("message", lambda f: f.message))
    if priced:
        cols += [("burnt", lambda f: fmt_usd(f.burnt_usd)),
                 ("projected", lambda f: fmt_usd(f.projected_usd))]
    cols.append(("action", lambda f: f.action.value))
    table = Table(show_edge=False, pad_edge=False)
    for name, _ in cols:
        table.add_column(name, overflow="fold", ratio=4 if name == "message" else None,
                         no_wrap=name != "message")
    for f in sorted(c.findings, key=lambda f: -f.severity.rank):
        table.add_row(*(cell(f) for _, cell in cols))
    return table


#: what the findings table's less obvious columns mean, printed under it
CHECK_LEGEND = "series: what the rule judged; from step: where the trouble began"
CHECK_LEGEND_TIME = "; from time: when it began, as time since the run's first record"


def print_check(console: Console, checked: list[Checked]) -> None:
    fit_output(console)
    for c in checked:
        _heading(console, c.run, c.verdict)
        if c.no_data is not None and not c.findings:
            console.print(f"  {c.no_data}", highlight=False, soft_wrap=True)
        if c.findings:
            console.print(_findings_table(c))
    if any(c.findings for c in checked):
        timed = any(c.findings and c.run.job.clock != "step" for c in checked)
        console.print(f"[dim]{CHECK_LEGEND}{CHECK_LEGEND_TIME if timed else ''}[/]",
                      soft_wrap=True)
    _summary(console, [c.verdict for c in checked])


def _fire_text(fire: Fire, job: Job, start: float) -> str:
    if job.clock == "step":
        return f"step {fmt_step(fire.step)}"
    return f"{fmt_when(job, fire.time, start)} (step {fmt_step(fire.step)})"


def savings_text(s: Savings, job: Job, start: float) -> str:
    if s.remaining_hours is None:
        left = f"{fmt_step(s.remaining_steps)} steps"
    else:
        left = fmt_duration(s.remaining_hours * 3600)
        if s.remaining_steps is not None:
            left += f" ({fmt_step(s.remaining_steps)} steps)"
    if s.usd is not None:
        money = f", {fmt_usd(s.usd)}"
    elif s.remaining_hours is None:
        money = " (a run with steps but no times has no $)"
    else:
        money = ", $ unknown (nothing prices the job: use --price)"
    gpu = f", {s.gpu_hours:,.1f} GPU-hours" if s.gpu_hours is not None else ""
    when = _fire_text(Fire(s.stop_time, s.stop_step, Severity.CRITICAL), job, start)
    return f"stopping at {when} would have saved {left}{money}{gpu}"


def print_replay(console: Console, results: list[tuple[Run, ReplayResult]]) -> None:
    fit_output(console)
    for run, r in results:
        unit = "steps" if r.unit == "step" else "s"
        _heading(console, run, replay_verdict(r), f", {r.ticks} ticks of {r.tick:g} {unit}")
        if replay_verdict(r) == NO_DATA:
            console.print(f"  {no_data_reason(run)}", highlight=False, soft_wrap=True)
        if r.histories:
            table = Table(show_edge=False, pad_edge=False)
            for col in ("rule", "series", "first fired", "as", "escalated", "last seen",
                        "message"):
                table.add_column(col, overflow="fold", ratio=3 if col == "message" else None)
            for h in r.histories:
                esc = ", ".join(f"{_sev(e.severity.value)} at {_fire_text(e, r.job, r.start)}"
                                for e in h.escalations)
                table.add_row(h.rule, series_of(h.finding, r.job) or "-",
                              _fire_text(h.first, r.job, r.start),
                              _sev(h.first.severity.value), esc or "-",
                              _fire_text(h.last_seen, r.job, r.start), h.finding.message)
            console.print(table)
        if r.savings is not None:
            console.print("  " + savings_text(r.savings, r.job, r.start), highlight=False,
                          soft_wrap=True)
    _summary(console, [replay_verdict(r) for _, r in results])


def _summary(console: Console, verdicts: list[str]) -> None:
    if len(verdicts) < 2:
        return
    counts = {v: verdicts.count(v) for v in ("critical", "warning", "info", "ok", NO_DATA)
              if v in verdicts}
    console.print(f"{len(verdicts)} runs: "
                  + ", ".join(f"{n} {_sev(v)}" for v, n in counts.items()))
