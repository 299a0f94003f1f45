"""How the cost of a replay grows with the length of the run (issue 11's bar: a run of a
million records replayed at one tick per record in under 20 s).

    .venv/bin/python bench/replay_scale.py                    # the bar: 1,000,000 records
    .venv/bin/python bench/replay_scale.py --sizes 125000 250000 500000 1000000
    .venv/bin/python bench/replay_scale.py --clock elapsed    # records a second apart
    .venv/bin/python bench/replay_scale.py --no-skip          # every tick judged
    .venv/bin/python bench/replay_scale.py --collapse         # also a run that collapses

Builds a run (a training loss at every record, a validation loss every 100: the shape of a
long Lightning CSVLogger file, on a step clock unless ``--clock`` says otherwise) and
replays it with the default policy and all its rules at one tick per record (or on the
default schedule, ``--schedule default``):

* ``healthy``: the loss falls as 1/(1 + step/1000) with noise, and levels off;
* ``late fault``: the same run whose loss, at 95 % of it, climbs tenfold over 200 records
  and then turns NaN (a divergence the replay must call critical, at its record);
* ``collapse`` (with ``--collapse``): the same run whose loss doubles half-way and stays
  doubled (``divergence``'s shift test: a stretch watched for half the run, then a
  divergence going on for the rest).

Each replay runs in its own process, so that its peak memory (the process's maximum
resident set) is its own; the line also gives the memory of the run's own arrays and of
the process before the replay, to tell what the replay added. ``--without RULE`` leaves a
rule out, to show what it costs.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainguard.checker.evaluate import build_rules  # noqa: E402
from trainguard.checker.follow import Followers  # noqa: E402
from trainguard.checker.model import Job, JobState, Series  # noqa: E402
from trainguard.config import default_policy  # noqa: E402
from trainguard.replay import replay  # noqa: E402

VAL_EVERY = 100
FAULT_AT = 0.95  # where the late fault starts, as a share of the run
CLIMB = 200  # records the loss climbs before it turns NaN


KINDS = ("healthy", "late fault", "collapse")


def build(records: int, kind: str, clock: str = "step", seed: int = 0) -> Job:
    """The run: ``records`` training-loss records, a validation loss every VAL_EVERY."""
    rng = np.random.default_rng(seed)
    step = np.arange(records, dtype=np.float64)
    loss = 2 + 8 / (1 + step / 1000) + 0.05 * rng.standard_normal(records)
    if kind == "collapse":
        loss[records // 2:] *= 2
    if kind == "late fault":
        at = int(FAULT_AT * records)
        climb = np.minimum(np.arange(records - at, dtype=np.float64) / CLIMB, 1.0)
        loss[at:] *= 1 + 9 * climb
        loss[at + CLIMB:] = np.nan
    val = np.arange(0, records, VAL_EVERY)
    time_ = step if clock == "step" else 1_000.0 + step  # one record a second
    return Job(id=f"synthetic-{records}", clock=clock,  # type: ignore[arg-type]
               state=JobState.SUCCEEDED, start_time=float(time_[0]),
               end_time=float(time_[-1]),
               series={"loss": Series("loss", time_, step, loss),
                       "val_loss": Series("val_loss", time_[val], step[val], loss[val] + 0.1)})


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def one(records: int, kind: str, clock: str, per_record: bool,
        without: tuple[str, ...] = (), skip: bool = True) -> dict[str, object]:
    """One replay, in this process: what it took and what it found."""
    job, policy = build(records, kind, clock), default_policy()
    rules = [r for r in build_rules(policy) if r.name not in without]
    arrays_mb = sum(s.time.nbytes + s.step.nbytes + s.value.nbytes
                    for s in job.series.values()) / 2**20
    before_mb = _rss_mb()
    followers = Followers()
    began_cpu, began = time.process_time(), time.perf_counter()
    result = replay(job, policy, 1.0 if per_record else None, rules=rules,
                    followers=followers, skip=skip)
    took, cpu = time.perf_counter() - began, time.process_time() - began_cpu
    crit = result.first_critical
    return {
        "records": records, "run": kind, "clock": clock,
        "schedule": "one tick per record" if per_record else "default schedule",
        "without": list(without), "skip": skip, "judged": result.judged,
        "ticks": result.ticks, "seconds": took, "cpu_seconds": cpu,
        "us_per_tick": took / max(result.ticks, 1) * 1e6,
        "rule_runs": followers.runs, "rule_calls": followers.calls,
        "peak_rss_mb": _rss_mb(), "rss_before_mb": before_mb, "run_arrays_mb": arrays_mb,
        "findings": sorted({f"{h.rule}:{h.worst.value}" for h in result.histories}),
        "first_critical": (None if crit is None or crit.first_critical is None
                           else f"{crit.rule} at step {crit.first_critical.step:g}"),
    }


def measure(records: int, kind: str, clock: str, per_record: bool,
            without: tuple[str, ...] = (), skip: bool = True) -> dict[str, object]:
    """``one`` in a fresh process, so that its peak memory is its own."""
    out = subprocess.run(
        [sys.executable, __file__, "--one", str(records), "--kind", kind, "--clock", clock]
        + ([] if per_record else ["--default-only"])
        + [a for name in without for a in ("--without", name)]
        + ([] if skip else ["--no-skip"]),
        check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout))


def line(r: dict[str, object]) -> str:
    return (f"{r['records']:>9,} records, {r['run']:<10} {r['clock']:<7} {r['schedule']:<19} "
            f"{r['ticks']:>9,} ticks {r['seconds']:7.2f} s (cpu {r['cpu_seconds']:6.2f} s) "
            f"{r['us_per_tick']:6.1f} us/tick  peak {r['peak_rss_mb']:5.0f} MB "
            f"(before {r['rss_before_mb']:4.0f}, arrays {r['run_arrays_mb']:3.0f})  "
            f"rules run {r['rule_runs']:,} of {r['rule_calls']:,}; "
            f"found {', '.join(r['findings']) or 'nothing'}"  # type: ignore[arg-type]
            + (f"; first critical: {r['first_critical']}" if r["first_critical"] else "")
            + (f"  [without {', '.join(r['without'])}]" if r["without"] else "")  # type: ignore[arg-type]
            + ("" if r["skip"] else "  [every tick judged]")
            + (f"  [{r['judged']:,} ticks judged]" if r["skip"] else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[1_000_000],
                    help="run lengths (records) to replay at one tick per record")
    ap.add_argument("--clock", choices=("step", "elapsed"), default="step",
                    help="step: no time axis (a Lightning CSV); elapsed: a record a second")
    ap.add_argument("--schedule", choices=("record", "default", "both"), default="record",
                    help="record: one tick per record; default: the default schedule "
                    "(every logging interval, at most 1,000 ticks, fires timed back)")
    ap.add_argument("--without", action="append", default=[], metavar="RULE",
                    help="leave a rule of the default policy out (repeatable): what it costs")
    ap.add_argument("--no-skip", action="store_true",
                    help="judge every tick (replay(skip=False)): the replay before it skipped "
                    "the ticks at which no rule has anything new to read")
    ap.add_argument("--collapse", action="store_true",
                    help="also replay the run whose loss doubles half-way and stays")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--kind", choices=KINDS, default="healthy", help=argparse.SUPPRESS)
    ap.add_argument("--default-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.kind, a.clock, not a.default_only, tuple(a.without),
                             not a.no_skip)))
        return
    for n in a.sizes:
        for kind in KINDS if a.collapse else KINDS[:2]:
            without = tuple(a.without)
            if a.schedule in ("record", "both"):
                print(line(measure(n, kind, a.clock, True, without, not a.no_skip)),
                      flush=True)
            if a.schedule in ("default", "both"):
                print(line(measure(n, kind, a.clock, False, without, not a.no_skip)),
                      flush=True)


if __name__ == "__main__":
    main()
