"""The ``trainguard gate`` command: options to a ``GateSpec`` and a ``GateSource``, then
``trainguard.gate.run_gate``. Exit codes: 0 pass, 1 failed, 2 error, 3 cancelled (the
table in ``trainguard.gate``)."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from trainguard.checker.model import Job
from trainguard.gate import (
    ERROR,
    GateError,
    GateSource,
    GateSpec,
    Until,
    parse_duration,
    parse_target,
    run_gate,
)


def _fail(message: str) -> NoReturn:
    typer.echo(f"trainguard: error: {message}", err=True)
    raise typer.Exit(ERROR)


def _pairs(options: list[str]) -> dict[str, str]:
    pairs = {}
    for o in options:
        key, eq, value = o.partition("=")
        if not eq or not key.strip():
            _fail(f"--opt {o!r}: expected KEY=VALUE")
        pairs[key.strip()] = value.strip()
    return pairs


def provider_source(source: str, ref: str, opts: dict[str, str],
                    deadline_s: float | None) -> GateSource:
    """A cloud or cluster job through its adapter (``adapters.sources``)."""
    from trainguard.adapters.base import AdapterError
    from trainguard.adapters.sources import build

    try:
        adapter = build(source, opts)
    except (AdapterError, ValueError, KeyError) as e:
        _fail(f"--source {source}: {e}")
    return adapter_source(source, adapter, ref, deadline_s)


def adapter_source(name: str, adapter: Any, ref: str, deadline_s: float | None) -> GateSource:
    """The gate's source over an adapter: its ``get_job`` and its own ``stop``."""

    def read(now: float) -> Any:
        before = len(adapter.errors)
        job = adapter.get_job(ref, now)
        if job is None and len(adapter.errors) > before:
            raise GateError(adapter.errors[-1].reason)
        return job

    return GateSource(name, read, adapter.stop, ref, deadline_s, adapter)


def start(ref: str, command: str) -> subprocess.Popen[bytes]:
    """Start the training in a session of its own (a stop reaches its workers too); its
    output goes to ``RUN_FILE.out``."""
    try:
        with open(f"{ref}.out", "wb") as output:
            return subprocess.Popen(shlex.split(command), stdout=output,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    except (OSError, ValueError) as e:
        _fail(f"--start {command!r}: cannot start it: {e}")


def local_source(ref: str, process: int | subprocess.Popen[bytes] | None, metrics: list[str],
                 deadline_s: float | None) -> GateSource:
    """A run file being written, and the process writing it (its stop signals it)."""
    from trainguard.adapters.local.definitions import parse_metric_option
    from trainguard.adapters.local.process import Process
    from trainguard.adapters.local.source import LocalRun, LocalSource

    try:
        definitions = [parse_metric_option(m) for m in metrics] or None
    except ValueError as e:
        _fail(f"--metric: {e}")
    if process is None:
        _fail("--source local needs --start COMMAND (the gate starts the training) or "
              "--pid PID (the process writing the run file): the gate stops it")
    path = Path(ref)
    run = LocalRun(path, path.stem, Process(process), definitions)
    local = LocalSource([run])

    def read(now: float) -> Any:
        jobs = local.list_jobs(now)
        if not jobs and run.read_error:
            raise GateError(run.read_error)
        if not jobs and run.process is not None and run.process.poll(now):
            # the training is still loading (a model, a dataset) before its first record:
            # a running job with nothing logged yet, not one that cannot be read
            return Job(id=run.job_id, start_time=run.process.started_at,
                       raw_state="running, no record yet")
        return jobs[0] if jobs else None

    return GateSource("local", read, local.stop, ref, deadline_s, local)


def gate(job: Annotated[str, typer.Argument(
             help="The job: its name or id on the --source (a SageMaker training job name, "
                  "an Azure ML job name, NAMESPACE/KIND/NAME on Kubeflow), or the run file "
                  "with --source local.")],
         source: Annotated[str, typer.Option(
             "--source", help="sagemaker, azureml, kubeflow, prometheus or local.")],
         opt: Annotated[list[str] | None, typer.Option(
             "--opt", metavar="KEY=VALUE", help="An option of the source (repeatable), "
                                                "as for trainguard check.")] = None,
         until: Annotated[str, typer.Option(
             "--until", help="done: wait for the job to end (cancel it at the deadline); "
                             "deadline: pass a healthy job at the deadline, left running.")]
         = "done",
         deadline: Annotated[str | None, typer.Option(
             "--deadline", metavar="DURATION",
             help="The job's run time allowed (5400, 90m, 1h30m), from its start.")] = None,
         budget: Annotated[float | None, typer.Option(
             "--budget", metavar="USD", min=0.0, help="The job's spend allowed.")] = None,
         target: Annotated[str | None, typer.Option(
             "--target", metavar="METRIC<=VALUE",
             help="What the job must reach: val_loss<=0.35, accuracy>=0.9; the target "
                  "rule's forecast cancels a job that will not by the deadline or budget.")]
         = None,
         prior: Annotated[Path | None, typer.Option(
             "--prior", help="A recipe prior (trainguard prior learn) for the forecast.")]
         = None,
         without_prior: Annotated[bool, typer.Option(
             "--forecast-without-prior",
             help="Cancel on the forecast from the run's own points alone (less sure).")]
         = False,
         policy: Annotated[Path | None, typer.Option(
             "--policy", help="Policy YAML (rule parameters, protect tag, trust).")] = None,
         tick_s: Annotated[float, typer.Option(
             "--tick", min=0.01, help="Seconds between looks at the job.")] = 30.0,
         dry_run: Annotated[bool, typer.Option(
             "--dry-run", help="Say what the gate would stop; stop nothing.")] = False,
         trust_metrics: Annotated[bool, typer.Option(
             "--trust-metrics",
             help="Let findings on the job's own metrics stop it alone (where other "
                  "principals cannot write them: docs/security.md).")] = False,
         pid: Annotated[int | None, typer.Option(
             "--pid", help="--source local: the process writing the run file (its exit "
                           "code is unknown to the gate; --start knows it).")] = None,
         start_cmd: Annotated[str | None, typer.Option(
             "--start", metavar="COMMAND",
             help="--source local: start COMMAND (it writes the run file) and gate it; "
                  "its output goes to RUN_FILE.out.")] = None,
         metric: Annotated[list[str] | None, typer.Option(
             "--metric", metavar="NAME=REGEX",
             help="--source local: an extra metric definition for text logs.")] = None,
         json_out: Annotated[Path | None, typer.Option(
             "--json", metavar="FILE", help="Write the outcome as JSON (trainguard.gate/v1).")]
         = None) -> None:
    """Wait on a job a pipeline launched; print findings as they appear; stop it when it
    fails (exit 1) or will not pay off (exit 3); exit 0 when it passes, 2 on an error."""
    from trainguard.common import load_policy, out
    from trainguard.report import fit_output

    if until not in ("done", "deadline"):
        _fail(f"--until {until!r}: expected done or deadline")
    try:
        deadline_s = parse_duration(deadline) if deadline is not None else None
        wanted = parse_target(target) if target is not None else None
    except ValueError as e:
        _fail(f"--deadline/--target: {e}")
    if until == "deadline" and deadline_s is None:
        _fail("--until deadline needs --deadline")
    prior_data = None
    if prior is not None:
        try:
            prior_data = json.loads(prior.read_text())
        except (OSError, ValueError) as e:
            _fail(f"--prior {prior}: {e}")
    pol = load_policy(policy)
    spec = GateSpec(until=_until(until), deadline_s=deadline_s, budget_usd=budget,
                    tick_s=tick_s, dry_run=dry_run, trust_metrics=trust_metrics,
                    target=wanted, prior=prior_data, without_prior=without_prior)
    started: subprocess.Popen[bytes] | None = None
    if source == "local":
        if pid is not None and start_cmd is not None:
            _fail("--pid and --start: give one")
        if start_cmd is not None:
            started = start(job, start_cmd)
        src = local_source(job, started or pid, metric or [], deadline_s)
    else:
        if pid is not None or metric or start_cmd is not None:
            _fail("--pid, --start and --metric are options of --source local")
        src = provider_source(source, job, _pairs(opt or []), deadline_s)
    result = None
    try:
        result = run_gate(src, pol, spec, fit_output(out))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    finally:
        # what the gate started ends with it, unless it passed a running job on purpose
        if started is not None and (result is None or result.verdict != "pass"):
            from trainguard.adapters.local.process import Process, end_all

            end_all([Process(started)])
    if json_out is not None:
        json_out.write_text(json.dumps(result.to_dict(), indent=1, default=str) + "\n")
    raise typer.Exit(result.exit_code)


def _until(text: str) -> Until:
    return "deadline" if text == "deadline" else "done"
