"""``trainguard bench LABELS.csv...``: the detection benchmark as a command.

Registered in ``trainguard/cli.py`` with ``app.command("bench")(bench)``. Exit codes:
0 when the benchmark ran, 2 for bad input (the labels file, a run in it, the policy or
an option), as one line per problem naming the file, line and reason. A run that cannot
be read stops no other: the rest are judged and reported, the run is listed in the
report and on stderr, and the exit code is 2.
"""

from __future__ import annotations

import enum
import re
import time
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trainguard.bench import harness
from trainguard.bench.labels import Labelled, LabelsError, read_labels
from trainguard.bench.tables import dumps, print_tables
from trainguard.checker.model import Severity
from trainguard.checker.policy import Policy
from trainguard.replay import LIVE_TICK_S, MAX_AUTO_TICKS
from trainguard.report import fit_output


class BenchFormat(enum.StrEnum):
    table = "table"
    json = "json"


class BenchView(enum.StrEnum):
    label = "label"
    family = "family"


def _fail(message: str) -> NoReturn:
    for line in message.splitlines() or [""]:
        typer.echo(f"trainguard: error: {line}", err=True)
    raise typer.Exit(2)


def _policy(path: Path | None) -> Policy:
    from trainguard.config import PolicyError, default_policy, load_policy

    try:
        return load_policy(path) if path is not None else default_policy()
    except PolicyError as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"{e.filename or path}: {e.strerror or e}")


def bench(
    labels: Annotated[list[Path], typer.Argument(
        help="Labels CSVs (the format of ../shared/data/runs/labels.csv), one or more, "
             "judged together; run paths are "
             "relative to its folder.")],
    format: Annotated[BenchFormat, typer.Option("--format", help="Output: table or json.")]
    = BenchFormat.table,
    policy: Annotated[Path | None, typer.Option(
        "--policy", help="Policy YAML (default: the built-in default policy).")] = None,
    inject: Annotated[bool, typer.Option(
        "--inject", help="Also judge a stall, a pause, a divergence and a spike injected "
                         "into every healthy run with a time axis.")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the injected faults.")] = 0,
    by: Annotated[BenchView, typer.Option(
        "--by", help="label: rows per label over all runs; family: the same, then per "
                     "family (the labels file's family column).")] = BenchView.label,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Processes to use.")] = 1,
    tick: Annotated[float | None, typer.Option(
        "--tick", min=0.001, help="Seconds between replay ticks on runs with a time axis "
                                  "(default: each run's logging interval, no less than "
                                  f"{LIVE_TICK_S:g} s, at most {MAX_AUTO_TICKS:,} ticks; "
                                  "detections are timed back to their record either "
                                  "way).")] = None,
    step_tick: Annotated[float | None, typer.Option(
        "--step-tick", min=0.001, help="Steps between ticks on runs with only steps "
                                       "(default: each run's logging interval, at most "
                                       f"{MAX_AUTO_TICKS:,} ticks).")] = None,
    price: Annotated[float | None, typer.Option(
        "--price", metavar="USD_PER_HOUR", min=0.0,
        help="Hourly cost of one run (default: the price book's Azure "
             "Standard_ND96isr_H100_v5, 8 x H100).")] = None,
    plot: Annotated[Path | None, typer.Option(
        "--plot", metavar="DIR",
        help="Write PNGs of a few runs where trainguard and a tool disagree.")] = None,
) -> None:
    """Replay labelled runs with trainguard's rules and today's tools; report recall, false
    alarms, detection delay and what stopping at detection would have saved."""
    began = time.perf_counter()
    pol = _policy(policy)
    try:
        rows = [row for path in labels for row in read_labels(path)]
    except LabelsError as e:
        _fail(str(e))
    seen: dict[str, Labelled] = {}
    for row in rows:  # a case is named by its run: the same name twice is ambiguous
        if row.run in seen:
            _fail(f"{row.where}: run: {row.run!r} is also listed at {seen[row.run].where}")
        seen[row.run] = row
    settings = harness.Settings(tick=tick, step_tick=step_tick, inject=inject, seed=seed,
                                by_family=by is BenchView.family,
                                price=harness.pricing(price))
    err = Console(stderr=True)
    columns = (TextColumn("replaying runs"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    try:
        with Progress(*columns, console=err, transient=True) as bar:
            task = bar.add_task("runs", total=len(rows))
            cases, unread = harness.judge_all(rows, pol, settings, jobs=jobs,
                                              advance=lambda: bar.advance(task))
    except harness.BenchError as e:
        _fail(str(e))
    result = harness.summarise(" + ".join(map(str, labels)), pol.name, rows, cases, settings,
                               unread)
    if plot is not None:
        for path in _plots(plot, rows, result.cases, settings):
            err.print(f"wrote {path}", highlight=False, soft_wrap=True)
    result.elapsed_s = time.perf_counter() - began
    if format is BenchFormat.json:
        typer.echo(dumps(result))
    else:
        print_tables(fit_output(Console(highlight=False, soft_wrap=False)), result)
    if unread:
        _fail("\n".join(n.error for n in unread))


def _plots(folder: Path, rows: list[Labelled], cases: list[harness.Case],
           settings: harness.Settings) -> list[Path]:
    """A PNG per disagreement, both detections marked (trainguard's in its severity's
    colour, the tool's in blue)."""
    from trainguard.plot import Marker, plot_run

    by_run = {r.run: r for r in rows}
    written = []
    for d in harness.disagreements(cases):
        row = by_run[d.case.run]
        job = harness.load(row)
        if d.case.injected is not None:
            job = next(f.job for f in harness.faults(job, row, settings)
                       if f.kind == d.case.injected)
        markers = []
        levels = d.case.trainguard.get(d.rule, {})
        for level, det in levels.items():
            if det is None or (level == "warning" and det == levels.get("critical")):
                continue  # a finding critical from the start: one marker
            markers.append(Marker(_x(det), f"trainguard {d.rule} ({det.severity or level})"
                                  f"{_at(det)}", Severity(det.severity or level)))
        fire = d.case.anchors.get(d.anchor)
        if fire is not None:
            markers.append(Marker(_x(fire), f"{d.anchor}{_at(fire)}", Severity.INFO))
        name = re.sub(r"[^\w.-]+", "_", f"{d.case.id}-{d.anchor}")
        path = folder / f"{name}.png"
        plot_run(job, markers, path, title=f"{d.case.id}\n{d.what}")
        written.append(path)
    return written


def _x(det: harness.Detection) -> float:
    """Where a detection goes on a plot: its time, or its step on a run without time."""
    if det.time is not None:
        return det.time
    return det.step if det.step is not None else 0.0


def _at(det: harness.Detection) -> str:
    return f" at step {det.step:,.0f}" if det.step is not None else ""
