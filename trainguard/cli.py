"""The ``trainguard`` command line: check, replay, rules, policy, watch, demo.

Exit codes: 0 when no finding is critical, 1 when one is, 2 for bad input (a file
that cannot be read, a bad policy or option), always as one line naming the file,
line and reason, never a traceback.
"""

from __future__ import annotations

import sys

# The package installs on Python 3.9+ for its training side (emit, callbacks, launch), and
# this entry point with it; the tool's dependencies install on 3.11+ only (pyproject.toml).
# One line and exit 2 (not 1: that means a critical finding), before any 3.11-only import.
if sys.version_info < (3, 11):
    print(f"trainguard: error: the trainguard command needs Python 3.11 or newer, this is "
          f"Python {sys.version.split()[0]}; here only trainguard.emit, trainguard.callbacks "
          "and trainguard.launch work", file=sys.stderr)
    sys.exit(2)

import dataclasses
import difflib
import fnmatch
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress
from rich.table import Table

from trainguard import report
from trainguard.checker.evaluate import build_rules, evaluate
from trainguard.checker.model import Job, Severity
from trainguard.checker.policy import Policy
from trainguard.checker.registry import RULES, rule_names
from trainguard.common import bad_input, err, fail, load_policy, local_files, out
from trainguard.report import Checked, OutputFormat, Run

app = typer.Typer(
    help="A watchdog for expensive ML training jobs: judge runs, replay them, manage policies.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
policy_app = typer.Typer(help="Show or validate a policy file.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")

#: More files than this get a progress bar (on stderr, so JSON on stdout stays clean).
PROGRESS_AFTER = 3


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"trainguard {version('trainguard')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("trainguard (not installed)")
        raise typer.Exit(0)


@app.callback()
def _main(show_version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_version,
        help="Print the installed version and exit.")] = False) -> None:
    """A watchdog for expensive ML training jobs: judge runs, replay them, manage policies."""


# --- inputs -----------------------------------------------------------------------------------

def _definitions(options: list[str] | None) -> list[Any] | None:
    from trainguard.adapters.local.definitions import parse_metric_option

    if not options:
        return None
    defs = []
    for option in options:
        try:
            defs.append(parse_metric_option(option))
        except ValueError as e:
            fail(f"--metric {option!r}: {e}" if not str(e).startswith("--metric") else str(e))
    return defs


def _local_load(path: Path, definitions: list[Any] | None) -> list[Run]:
    from trainguard.adapters.local import detect_format, load_runs

    fmt = detect_format(path)
    return [Run(str(f.path), fmt, f.job, f.aliases) for f in load_runs(path, definitions, fmt)]


def _local_ids(runs: list[Run]) -> None:
    from trainguard.adapters.local import Found, assign_ids

    found = [Found(Path(r.path), r.aliases[-1] if r.aliases else None, r.job) for r in runs]
    assign_ids(found)


@dataclasses.dataclass(frozen=True)
class Source:
    files: Callable[[Path], list[Path]]  # a PATH argument -> the run files in it
    load: Callable[[Path, list[Any] | None], list[Run]]  # a run file -> its runs
    ids: Callable[[list[Run]], None]  # ids that tell every run apart


SOURCES: dict[str, Source] = {"local": Source(local_files, _local_load, _local_ids)}


def _selected(run: Run, patterns: list[str]) -> bool:
    """``--run`` patterns (shell-style) against the run's id and every name it answers to."""
    names = {run.job.id, run.job.name, *run.aliases}
    return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names if n)


def _apply_overrides(job: Job, price: float | None, gpus: int | None) -> None:
    if price is not None:  # --price is for the whole job; the model prices one instance
        job.hourly_price = price / max(job.instance_count, 1)
    if gpus is not None:
        job.gpus_per_instance = gpus


def cloud_jobs(source: str, opts: list[str], refs: list[str], now: float) -> list[Job]:
    """The running jobs of a provider (or the named ones), with each job the adapter could
    not read reported on stderr."""
    from trainguard.adapters.base import AdapterError
    from trainguard.adapters.sources import build

    pairs = {}
    for o in opts:
        key, eq, value = o.partition("=")
        if not eq or not key:
            fail(f"--opt {o!r}: expected KEY=VALUE")
        pairs[key.strip()] = value.strip()
    try:
        adapter = build(source, pairs)
        if refs:
            jobs = [j for r in refs if (j := adapter.get_job(r, now)) is not None]
        else:
            jobs = adapter.list_jobs(now)
    except (AdapterError, ValueError, KeyError) as e:
        fail(f"--source {source}: {e}")
    for problem in adapter.errors:
        err.print(f"[yellow]trainguard: warning:[/] {source}: {problem.ref}: {problem.reason}")
    return jobs


def load_runs(paths: list[Path], source: str, metrics: list[str] | None,
              price: float | None, gpus: int | None,
              select: list[str] | None = None) -> list[Run]:
    """Every run under ``paths`` (with a progress bar when many files), each with an id
    that tells it from the others; ``select`` keeps the runs ``--run`` names."""
    if source not in SOURCES:
        fail(f"--source {source!r}: unknown source (known: {', '.join(sorted(SOURCES))})")
    src = SOURCES[source]
    definitions = _definitions(metrics)
    with bad_input():
        files = [f for p in paths for f in src.files(p)]
    if not files:
        fail(f"no run files found in {', '.join(map(str, paths))}")
    runs: list[Run] = []
    with Progress(console=err, transient=True, disable=len(files) <= PROGRESS_AFTER) as bar:
        task = bar.add_task("reading runs", total=len(files))
        for f in files:
            with bad_input():
                runs += src.load(f, definitions)
            bar.advance(task)
    src.ids(runs)
    if select:
        picked = [r for r in runs if _selected(r, select)]
        if not picked:
            known = ", ".join(r.job.id for r in runs[:20])
            fail(f"--run {', '.join(select)}: no such run (runs: {known})")
        runs = picked
    for run in runs:
        _apply_overrides(run.job, price, gpus)
    return runs


def _plot_path(base: Path, run: Run, many: bool) -> Path:
    if not many:
        return base
    safe = re.sub(r"[^\w.-]+", "_", run.job.id)
    return base.with_name(f"{base.stem}-{safe}{base.suffix or '.png'}")


# --- shared options ---------------------------------------------------------------------------

OptionalPathsArg = Annotated[list[Path] | None, typer.Argument(
    help="Run files or folders (local); job names or ids to judge (a provider --source; "
         "none: every running job).", show_default=False)]
OptOpt = Annotated[list[str] | None, typer.Option(
    "--opt", metavar="KEY=VALUE",
    help="An option of the provider --source (repeatable), e.g. region=us-east-1; "
         "see docs/permissions-<source>.md and the adapter's from_options.")]
NowOpt = Annotated[float | None, typer.Option(
    "--now", metavar="EPOCH_SECONDS",
    help="Judge as of this time instead of now (providers) or the last record (files).")]
PathsArg = Annotated[list[Path], typer.Argument(
    help="Run files, or folders searched recursively for files a reader recognises.")]
PolicyOpt = Annotated[Path | None, typer.Option(
    "--policy", help="Policy YAML (default: the built-in default policy).")]
MetricOpt = Annotated[list[str] | None, typer.Option(
    "--metric", metavar="NAME=REGEX",
    help="Extra metric definition for text logs (repeatable); the regex has one group.")]
FormatOpt = Annotated[OutputFormat, typer.Option(
    "--format", help="table (for people; full width in a pipe) or json (the machine form, "
                     "schema trainguard.check/v1: docs/json-schema.md).")]
SourceOpt = Annotated[str, typer.Option("--source", help="Where runs come from.")]
PlotOpt = Annotated[Path | None, typer.Option(
    "--plot", metavar="FILE.png",
    help="Draw the curves with each finding marked; several runs write FILE-<run id>.png.")]
PriceOpt = Annotated[float | None, typer.Option(
    "--price", metavar="USD_PER_HOUR", min=0.0,
    help="Hourly cost of the whole job, overriding the policy and price book.")]
RunOpt = Annotated[list[str] | None, typer.Option(
    "--run", metavar="PATTERN",
    help="Judge only the runs whose id or name matches (repeatable; shell patterns such "
         "as 'exp1/*'); an MLflow run also by its run id.")]
GpusOpt = Annotated[int | None, typer.Option(
    "--gpus", min=0, help="GPUs per instance, for GPU-hours (local logs do not say).")]


# --- check ------------------------------------------------------------------------------------

def judge_finished(run: Run, policy: Policy, rules: list[Any], now: float | None) -> Checked:
    """A run from a file judged as of its last record (or ``now``), on everything it
    recorded, as the watchdog saw it then: a run that has since finished is judged as it
    was while running, so ``check`` says what the last tick of ``replay`` says."""
    job = run.job
    at = job.last_time() if now is None else now
    if at is None:
        return Checked(run, None, [], no_data=report.no_data_reason(run))
    findings = evaluate([job.until(at)], policy, at, rules=rules)
    reason = None if report.has_data(job) else report.no_data_reason(run)
    return Checked(run, at, findings, no_data=reason)


def warn_unknown_series(policy: Policy, jobs: list[Job]) -> None:
    """A policy that maps or names a series no run has is almost surely a typo."""
    if not jobs:
        return
    have = {k for j in jobs for k, s in j.series.items()}
    named = [(f"metrics.{k}", v) for k, v in policy.metrics.items()]
    for name in rule_names():
        for key in ("metric", "metrics"):
            value = policy.rule(name).params.get(key)
            values = value if isinstance(value, list | tuple) else [value]
            named += [(f"rules.{name}.params.{key}", v) for v in values if isinstance(v, str)]
    for where, series in named:
        if series and series not in have:  # ("": the policy says there is none)
            close = difflib.get_close_matches(series, sorted(have), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            err.print(f"[yellow]trainguard: warning:[/] policy {policy.name!r}: {where} "
                      f"names series {series!r}, which no run has{hint}", soft_wrap=True)


@app.command()
def check(paths: OptionalPathsArg = None, policy: PolicyOpt = None, metric: MetricOpt = None,
          format: FormatOpt = OutputFormat.table, source: SourceOpt = "local",
          opt: OptOpt = None, now: NowOpt = None, run: RunOpt = None,
          plot: PlotOpt = None, price: PriceOpt = None, gpus: GpusOpt = None) -> None:
    """Judge each run; exit 1 if any finding is critical, 2 if a run has no data.

    Local files are judged as of their last record, on everything they recorded (a finished
    run as it was while it ran: what the last tick of ``replay`` says). With a provider
    --source the running jobs are listed and judged as of now (or --now), and PATHS, if
    any, name the jobs.
    """
    pol = load_policy(policy)
    rules = build_rules(pol)
    checked = []
    if source != "local":
        at = time.time() if now is None else now
        jobs = cloud_jobs(source, opt or [], [str(p) for p in paths or []], at)
        for job in jobs:
            _apply_overrides(job, price, gpus)
            cloud_run = Run(job.console_url or job.id, source, job)
            checked.append(Checked(cloud_run, at, evaluate([job], pol, at, rules=rules)))
    else:
        if opt:
            fail(f"--opt {opt[0]!r}: the local source takes no --opt (they are options of "
                 "a provider --source)")
        runs = load_runs(paths or [], source, metric, price, gpus, run)
        warn_unknown_series(pol, [r.job for r in runs])
        checked = [judge_finished(r, pol, rules, now) for r in runs]
    if plot is not None:
        from trainguard.plot import markers_from_findings, plot_run

        for c in checked:
            plot_run(c.run.job, markers_from_findings(c.findings),
                     _plot_path(plot, c.run, len(checked) > 1), title=c.run.job.id)
    if format is OutputFormat.json:
        typer.echo(report.dumps(report.check_json(checked, pol.name)))
    else:
        report.print_check(out, checked)
    critical = any(f.severity is Severity.CRITICAL for c in checked for f in c.findings)
    empty = any(c.verdict == report.NO_DATA for c in checked)
    raise typer.Exit(1 if critical else 2 if empty else 0)


# --- replay -----------------------------------------------------------------------------------

@app.command()
def replay(paths: PathsArg,
           tick: Annotated[float | None, typer.Option(
               "--tick",
               help="Seconds between ticks on the run's own time axis (steps on a run "
                    "that has only steps). Default: the run's logging interval (no less "
                    "than 60 s on a time axis), at most 1,000 ticks, each finding timed "
                    "back to the record that made it.")]
           = None,
           policy: PolicyOpt = None, metric: MetricOpt = None, plot: PlotOpt = None,
           format: FormatOpt = OutputFormat.table, price: PriceOpt = None,
           gpus: GpusOpt = None, source: SourceOpt = "local", run: RunOpt = None) -> None:
    """Replay finished runs tick by tick as if they were live.

    Says when each finding first fired, when it escalated, and what stopping at the first
    critical one would have saved. Exit 1 if any finding went critical, 2 if a run has no
    data. The last tick judges each run as of its last record: what ``check`` says.
    """
    from trainguard.replay import replay as run_replay

    pol = load_policy(policy)
    rules = build_rules(pol)
    results = []
    runs = load_runs(paths, source, metric, price, gpus, run)
    warn_unknown_series(pol, [r.job for r in runs])
    for one in runs:
        try:
            results.append((one, run_replay(one.job, pol, tick, rules=rules)))
        except ValueError as e:  # too many ticks: a tick in the wrong unit
            fail(f"{one.path}: {e}")
    if plot is not None:
        from trainguard.plot import markers_from_replay, plot_run

        for one, r in results:
            plot_run(one.job, markers_from_replay(r), _plot_path(plot, one, len(results) > 1),
                     title=f"{one.job.id} (replay, tick {r.tick:g} {r.unit})")
    if format is OutputFormat.json:
        typer.echo(report.dumps(report.replay_json(results, pol.name)))
    else:
        report.print_replay(out, results)
    critical = any(h.worst is Severity.CRITICAL for _, r in results for h in r.histories)
    empty = any(report.replay_verdict(r) == report.NO_DATA for _, r in results)
    raise typer.Exit(1 if critical else 2 if empty else 0)


# --- rules and policies -----------------------------------------------------------------------

@app.command("rules")
def rules_cmd() -> None:
    """Every registered rule with its parameters, defaults and what they mean."""
    table = Table(show_lines=False, title="trainguard rules")
    for col in ("rule", "parameter", "default", "meaning"):
        table.add_column(col, overflow="fold")
    for name in rule_names():
        cls = RULES[name]
        doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip()
        params = cls.describe()
        table.add_row(f"[bold]{name}[/]", "", "", doc.splitlines()[0] if doc else "",
                      end_section=not params)
        for i, (pname, default, pdoc) in enumerate(params):
            table.add_row("", pname, repr(default), pdoc, end_section=i == len(params) - 1)
    report.fit_output(out).print(table)


def policy_in_full(policy: Policy) -> dict[str, Any]:
    """The policy as YAML-ready data with every registered rule and every parameter's
    default filled in: what the watchdog will actually use."""
    from trainguard.config import policy_to_dict

    data = policy_to_dict(policy)
    rules = {}
    for name in rule_names():
        cfg = policy.rule(name)
        defaults = {p: d for p, d, _ in RULES[name].describe()}
        rules[name] = {"enabled": cfg.enabled, "params": defaults | dict(cfg.params),
                       "actions": data["rules"].get(name, {}).get("actions")
                       or {s.value: a.value for s, a in cfg.actions.items()}}
    data["rules"] = rules
    return data


@policy_app.command("show")
def policy_show(file: Annotated[Path | None, typer.Argument(
        help="Policy YAML; without it, the built-in default.")] = None) -> None:
    """Print the effective policy (defaults filled in) as YAML."""
    import yaml

    typer.echo(yaml.safe_dump(policy_in_full(load_policy(file)), sort_keys=False), nl=False)


@policy_app.command("check")
def policy_check(file: Annotated[Path, typer.Argument(help="Policy YAML to validate.")]) -> None:
    """Validate a policy file: exit 0 when valid, 2 with file, line and reason when not."""
    pol = load_policy(file)
    out.print(f"{file}: ok (policy {pol.name!r}, {len(pol.rules)} rule sections)")


# --- watch and demo: thin wrappers over lambdas.local and trainguard.demo ---------------------

def _pids(options: list[str] | None) -> dict[str | Path, int]:
    pids: dict[str | Path, int] = {}
    for option in options or []:
        path, sep, pid = option.rpartition("=")
        if not sep or not path or not pid.isdigit():
            fail(f"--pid {option!r}: expected PATH=PID, e.g. 'runs/train.log=4242'")
        pids[path] = int(pid)
    return pids


def _start(options: list[str] | None, paths: list[Path]) -> dict[str | Path, Any]:
    """Start each ``PATH=COMMAND`` in a process group of its own (so a stop reaches its
    workers too); the command's output goes to ``PATH.out``."""
    started: dict[str | Path, subprocess.Popen[bytes]] = {}
    for option in options or []:
        path, sep, command = option.partition("=")
        if not sep or not path or not command.strip():
            fail(f"--start {option!r}: expected PATH=COMMAND, e.g. 'run.log=python train.py'")
        if Path(path) not in paths:
            fail(f"--start {option!r}: {path} is not one of the runs watched")
        with open(f"{path}.out", "wb") as output:
            try:
                started[path] = subprocess.Popen(shlex.split(command), stdout=output,
                                                 stderr=subprocess.STDOUT,
                                                 start_new_session=True)
            except OSError as e:
                fail(f"--start {option!r}: cannot start it: {e}")
    return dict(started)


@app.command()
def watch(paths: Annotated[list[Path], typer.Argument(help="Run files being written.")],
          policy: PolicyOpt = None, metric: MetricOpt = None,
          tick: Annotated[float, typer.Option("--tick", help="Seconds between ticks.")] = 30.0,
          state: Annotated[Path, typer.Option(
              "--state", help="SQLite file for findings memory and the audit log.")]
          = Path(".trainguard/state.sqlite"),
          until: Annotated[float | None, typer.Option(
              "--until", help="Stop watching after this many seconds.")] = None,
          pid: Annotated[list[str] | None, typer.Option(
              "--pid", metavar="PATH=PID",
              help="The process writing PATH: its state is the job's, and a stop signals it.")]
          = None,
          start: Annotated[list[str] | None, typer.Option(
              "--start", metavar="PATH=COMMAND",
              help="Start COMMAND (it writes PATH) and watch it; a stop signals it. "
                   "Its output goes to PATH.out.")] = None,
          json_out: Annotated[Path | None, typer.Option(
              "--json", metavar="FILE", help="Write the outcome of every run as JSON.")]
          = None) -> None:
    """Watch run files live with the watchdog's own tick; exit 1 if a finding went critical
    or a watched process failed on its own (a non-zero exit not caused by a stop).

    Ends when every --pid or --start process has exited (saying each one's exit code, and
    the tail of its output when it failed or wrote nothing), after --until seconds, or on
    Ctrl-C, with a table of every run's outcome. The processes it started end with it:
    their whole process group, SIGTERM then SIGKILL after the grace period.
    """
    from trainguard.adapters.local.process import Process, end_all
    from trainguard.lambdas.local import summary_table
    from trainguard.lambdas.local import watch as run_watch

    pol = load_policy(policy)
    state.parent.mkdir(parents=True, exist_ok=True)
    processes: dict[str | Path, int | subprocess.Popen[Any]] = dict(_pids(pid))
    definitions = _definitions(metric)
    started = _start(start, paths)
    processes.update(started)
    report.fit_output(out)
    try:
        result = run_watch(paths, pol, state, tick, out, until=until, processes=processes,
                           definitions=definitions,
                           outputs={p: f"{p}.out" for p in started})
    except ValueError as e:  # a bad tick, a --pid for a file not watched
        fail(str(e))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    finally:  # the watchdog started them: none outlives it (watch ends them; this is
        # for an error before it could)
        end_all([Process(proc) for proc in started.values()])
    out.print(summary_table(result))
    if json_out is not None:
        json_out.write_text(report.dumps(result.to_dict()) + "\n")
    critical = any(f.get("severity") == "critical" for r in result.runs for f in r.findings)
    failed = any(r.exit_code not in (None, 0) and (r.stopped_by is None or r.dry_run_stop)
                 for r in result.runs)  # ended badly on its own, not by a stop
    raise typer.Exit(1 if critical or failed else 0)


@app.command()
def demo(workdir: Annotated[Path, typer.Option(
             "--workdir", help="Where the runs' logs and the watchdog's state are left.")]
         = Path("trainguard-demo"),
         seed: Annotated[int, typer.Option("--seed", help="Seed of the four trainings.")] = 0,
         format: FormatOpt = OutputFormat.table) -> None:
    """Four small real trainings on the CPU (one healthy, three going wrong), watched live;
    the watchdog stops the bad ones and says what that saved. Needs scikit-learn."""
    try:
        from trainguard.demo import run_demo
    except ImportError as e:  # the demo extra is not installed
        fail(f"the demo needs the 'demo' extra (pip install 'trainguard[demo]'): {e}")
    console = err if format is OutputFormat.json else report.fit_output(out)  # JSON alone
    from trainguard.demo.run import DemoError

    try:
        result = run_demo(workdir, console, seed=seed)
    except DemoError as e:
        fail(str(e))
    if format is OutputFormat.json:
        typer.echo(report.dumps(result.to_dict()))
    else:
        out.print(result.table())


# The detection benchmark lives with its harness; registering it here keeps one CLI.
from trainguard.bench.command import bench  # noqa: E402

app.command("bench")(bench)

prior_app = typer.Typer(help="Recipe priors for the target rule's forecast.",
                        no_args_is_help=True)
app.add_typer(prior_app, name="prior")
from trainguard.prior_cmd import prior_learn  # noqa: E402

prior_app.command("learn")(prior_learn)

from trainguard.prices_cmd import prices_app  # noqa: E402

app.add_typer(prices_app, name="prices")

from trainguard.preflight import command as preflight  # noqa: E402

app.command("preflight")(preflight)

from trainguard.dashboards_cmd import dashboards  # noqa: E402

app.command("dashboards")(dashboards)

from trainguard.gate_cmd import gate  # noqa: E402

app.command("gate")(gate)


def main() -> None:  # pragma: no cover - the console script
    app()
