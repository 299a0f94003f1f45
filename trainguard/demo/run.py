"""``run_demo``: four small real trainings as separate processes, watched live by the local
watchdog, which stops the three bad ones; then what each run cost and what stopping saved.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import trainguard
from trainguard.checker.policy import Policy
from trainguard.checker.prices import Price, lookup
from trainguard.lambdas.local import WatchResult, watch

# What each run is, and which rule should stop it (None: it must run to the end).
RUNS: dict[str, tuple[str, str | None]] = {
    "healthy": ("sensible learning rate (0.1)", None),
    "diverge": ("learning rate far too high (15): the loss explodes, then NaN", "divergence"),
    "nolearn": ("weights initialised to zero: nothing to learn with", "plateau"),
    "hang": ("data loader worker dies on a corrupt record; the loop waits forever", "stall"),
}

# The price the costs are stated at: the first instance the price book has a price for.
INSTANCES = ("ml.p4d.24xlarge", "ml.g5.48xlarge")
SECONDS_PER_DEMO_SECOND = 60.0  # each demo second stands for one minute of a real job
MAX_RUNTIME_S = 86400.0  # SageMaker's default MaxRuntimeInSeconds: how long a hang burns
STEPS = 300
INTERVAL_S = 0.18
TICK_S = 1.0
TIMEOUT_S = 240.0  # the whole demo, whatever happens


def demo_policy() -> Policy:
    from trainguard.config import load_policy

    with resources.as_file(resources.files("trainguard.demo") / "demo-policy.yaml") as path:
        return load_policy(path)


def demo_price() -> Price:
    for instance in INSTANCES:
        price = lookup(instance)
        if price is not None:
            return price
    raise RuntimeError(f"the price book has none of {', '.join(INSTANCES)}")


@dataclass
class DemoRun:
    name: str
    what: str
    expected_rule: str | None
    verdict: str
    stopped_by: str | None
    stop_reason: str | None
    stopped_after_s: float | None  # demo seconds from the process start
    ran_s: float  # demo seconds the process lived
    steps: float | None
    planned_steps: int
    exit_code: int | None
    cost_usd: float  # what it cost, at the stated price and time scale
    unwatched_cost_usd: float  # what it would have cost with no watchdog
    saved_usd: float

    @property
    def as_expected(self) -> bool:
        return self.stopped_by == self.expected_rule


@dataclass
class DemoResult:
    workdir: str
    instance_type: str
    usd_per_hour: float
    price_region: str
    price_source: str
    assumption: str
    runs: list[DemoRun] = field(default_factory=list)
    watch: WatchResult | None = None

    @property
    def saved_usd(self) -> float:
        return sum(r.saved_usd for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("runs", "watch")}
        out["runs"] = [{**asdict(r), "as_expected": r.as_expected} for r in self.runs]
        out["saved_usd"] = self.saved_usd
        out["watch"] = self.watch.to_dict() if self.watch else None
        return out

    def table(self) -> Table:
        t = Table(title="trainguard demo: four real trainings, watched live",
                  caption=f"{self.assumption}\nPrice: {self.instance_type} on demand, "
                          f"${self.usd_per_hour:.2f}/h ({self.price_region}).")
        for col in ("run", "what went on", "verdict", "stopped by", "stopped at",
                    "steps", "cost", "unwatched", "saved"):
            t.add_column(col, justify="right" if col in (
                "stopped at", "steps", "cost", "unwatched", "saved") else "left")
        for r in self.runs:
            style = "green" if r.stopped_by is None else "red"
            t.add_row(
                r.name, r.what, f"[{style}]{r.verdict}[/]", r.stopped_by or "-",
                f"{r.stopped_after_s:.0f}s (= {r.stopped_after_s:.0f} min)"
                if r.stopped_after_s is not None else "-",
                f"{r.steps:.0f}/{r.planned_steps}" if r.steps is not None else "-",
                f"${r.cost_usd:,.2f}", f"${r.unwatched_cost_usd:,.2f}",
                f"[bold]${r.saved_usd:,.2f}[/]" if r.saved_usd else "-")
        t.add_section()
        t.add_row("total", "", "", "", "", "", f"${sum(r.cost_usd for r in self.runs):,.2f}",
                  f"${sum(r.unwatched_cost_usd for r in self.runs):,.2f}",
                  f"[bold]${self.saved_usd:,.2f}[/]")
        return t


def _env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(trainguard.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"  # four small runs on a few cores: no thread oversubscription
    return env


def _end(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """Leave no training process behind, whatever happened."""
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 5.0
    for p in procs.values():
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_demo(workdir: str | Path, console: Console, seed: int = 0, steps: int = STEPS,
             interval_s: float = INTERVAL_S, tick_s: float = TICK_S) -> DemoResult:
    """Start the four runs, watch them under the demo policy until all have ended, and
    return what happened. The run logs, the processes' output and the watchdog's SQLite
    state are left in ``workdir``."""
    # Absolute: the trainings run with the work folder as their current directory.
    work = Path(workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    state = work / "state.sqlite"
    for old in [state, work / "state.sqlite-wal", work / "state.sqlite-shm",
                *(work / f"{name}.jsonl" for name in RUNS)]:
        old.unlink(missing_ok=True)  # a fresh demo: runs append, and old stop intents hold
    policy = demo_policy()
    price = demo_price()
    console.print(f"Starting {len(RUNS)} trainings (MLP on scikit-learn digits, {steps} steps "
                  f"each, about {steps * interval_s:.0f}s); logs and state in {work}")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    started: dict[str, float] = {}
    try:
        for name in RUNS:
            with open(work / f"{name}.out", "wb") as out:
                procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "trainguard.demo.train", "--mode", name,
                     "--out", str(work / f"{name}.jsonl"), "--steps", str(steps),
                     "--interval", str(interval_s), "--seed", str(seed)],
                    stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=work,
                    start_new_session=True)  # a stop reaches the whole process group
            started[name] = time.time()
        watched = watch([work / f"{name}.jsonl" for name in RUNS], policy, state, tick_s,
                        console, until=TIMEOUT_S,
                        processes={work / f"{name}.jsonl": p for name, p in procs.items()},
                        outputs={work / f"{name}.jsonl": work / f"{name}.out" for name in procs})
    finally:
        _end(procs)
    crashed = [n for n, p in procs.items() if p.returncode not in (0, None, -signal.SIGTERM,
                                                                   -signal.SIGKILL)
               and not (work / f"{n}.jsonl").exists()]
    if crashed:
        tails = "\n".join(f"--- {n}: {work / f'{n}.out'}\n"
                          + "\n".join((work / f"{n}.out").read_text(errors="replace")
                                      .splitlines()[-5:]) for n in crashed)
        raise DemoError(f"{len(crashed)} training(s) crashed before writing a record:\n{tails}")
    result = DemoResult(
        workdir=str(work), instance_type=price.instance_type, usd_per_hour=price.usd_per_hour,
        price_region=price.region, price_source=price.source,
        assumption=(f"Each demo second stands for one minute of a real job. Unwatched, a run "
                    f"that keeps stepping runs its {steps} steps; a hung run burns until "
                    f"SageMaker's default max runtime ({MAX_RUNTIME_S / 3600:.0f} h)."),
        watch=watched)
    by_id = {o.job_id: o for o in watched.runs}

    def ran_s(name: str) -> float:
        o = by_id[name]
        end = o.end_time if o.end_time is not None else watched.ended_at
        return max(end - started[name], 0.0)

    # A run that keeps stepping would have taken as long as the healthy one did.
    healthy = by_id["healthy"]
    full = ran_s("healthy") if healthy.exit_code == 0 else steps * interval_s
    for name, (what, expected) in RUNS.items():
        o = by_id[name]
        ran = ran_s(name)
        stopped_after = o.stopped_at - started[name] if o.stopped_at is not None else None
        cost = _usd(price, ran)
        if o.stopped_by is None:
            unwatched = cost
        elif expected == "stall" or o.stopped_by == "stall":
            unwatched = price.usd_per_hour * MAX_RUNTIME_S / 3600.0
        else:
            unwatched = _usd(price, max(full, ran))
        verdict = f"stopped: {o.stopped_by}" if o.stopped_by else (
            "ran to the end" if o.exit_code == 0 else f"ended ({o.state.lower()})")
        result.runs.append(DemoRun(
            name=name, what=what, expected_rule=expected, verdict=verdict,
            stopped_by=o.stopped_by, stop_reason=o.stop_reason, stopped_after_s=stopped_after,
            ran_s=ran, steps=o.steps, planned_steps=steps, exit_code=o.exit_code,
            cost_usd=cost, unwatched_cost_usd=unwatched, saved_usd=max(unwatched - cost, 0.0)))
    return result


class DemoError(RuntimeError):
    """A training of the demo could not run: the demo says so instead of pricing nothing."""


def _usd(price: Price, demo_seconds: float) -> float:
    real_hours = demo_seconds * SECONDS_PER_DEMO_SECOND / 3600.0
    return price.usd_per_hour * real_hours
