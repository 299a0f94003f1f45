"""What given rules cost a replay at one tick per record, as the run grows.

    .venv/bin/python bench/replay_rules.py --rules divergence overfit --sizes 10000 40000 160000
    .venv/bin/python bench/replay_rules.py --overfit ...


Builds a healthy run (a training loss at every record falling as 1/(1 + step/1000) with
noise, a validation loss every 100: the shape of bench/replay_scale.py's) and replays it
at one tick per record with only the rules named, then with no rule (the replay's own
share). A rule that reads only the records new since its last tick (``ctx.state``) costs
the same per tick at any length; one that re-reads the run costs more as it grows.
With ``--overfit`` the validation loss falls 0.6 -> 0.5 over the first tenth of the run
and then climbs steadily to 0.95 (``overfit``'s steady climb, found past the run's
middle: from there the rule reads the training loss at every record).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainguard.checker.follow import Followers  # noqa: E402
from trainguard.checker.model import Job, JobState, Series  # noqa: E402
from trainguard.checker.registry import rules as registry  # noqa: E402
from trainguard.checker.rules.base import Rule  # noqa: E402
from trainguard.config import default_policy  # noqa: E402
from trainguard.replay import replay  # noqa: E402


def build(records: int, seed: int = 0, overfit: bool = False) -> Job:
    rng = np.random.default_rng(seed)
    step = np.arange(records, dtype=np.float64)
    loss = 2 + 8 / (1 + step / 1000) + 0.05 * rng.standard_normal(records)
    val = np.arange(0, records, 100)
    held = loss[val] + 0.1
    if overfit:
        x = val / records
        held = np.where(x < 0.1, 0.6 - x, 0.5 + 0.45 * (x - 0.1) / 0.9)
        held = held * np.exp(0.01 * rng.standard_normal(len(val)))
    return Job(id=f"synthetic-{records}", clock="step", state=JobState.SUCCEEDED,
               start_time=0.0, end_time=float(step[-1]),
               series={"loss": Series("loss", step, step, loss),
                       "val_loss": Series("val_loss", step[val], step[val], held)})


def measure(records: int, rules: list[Rule], overfit: bool = False) -> str:
    job, policy, followers = build(records, overfit=overfit), default_policy(), Followers()
    began = time.perf_counter()
    result = replay(job, policy, 1.0, rules, followers)
    took = time.perf_counter() - began
    names = ", ".join(r.name for r in rules) or "no rule"
    return (f"{records:>9,} records, {names:<22} {result.ticks:>9,} ticks {took:8.2f} s "
            f"{took / result.ticks * 1e6:7.1f} us/tick  rules run {followers.runs:,} of "
            f"{followers.calls:,} times")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rules", nargs="+", default=["divergence", "overfit"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 40_000, 160_000])
    ap.add_argument("--overfit", action="store_true",
                    help="a validation loss climbing steadily from a tenth of the run")
    a = ap.parse_args()
    for n in a.sizes:
        print(measure(n, [registry.get(name)() for name in a.rules], a.overfit), flush=True)
        print(measure(n, []), flush=True)


if __name__ == "__main__":
    main()
