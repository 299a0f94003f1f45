"""How the cost of a replay grows with the length of the run.

    python bench/replay_scale.py [--records 1000000] [--per-record 10000 20000 40000]

Builds a run with only steps (a training loss at every step, a validation loss every
100 steps: the shape of a long Lightning CSVLogger file) and replays it with the default
policy and all its rules:

* at the default schedule (every logging interval, at most ``MAX_AUTO_TICKS`` ticks, each
  fire timed back to its record) on ``--records`` records;
* at one tick per record on each of the ``--per-record`` sizes, to show how the cost
  grows when every record is a tick (the rules that read the training loss run at
  every tick; the others are skipped by their followers while their input is unchanged).

* at one tick per record with no rule at all on ``--framework`` records: what the replay
  itself costs (cutting the run, asking the rules);
* at one tick per record with one rule that keeps its work in ``ctx.state`` (the loss's
  running best; warns at 10 x it) on ``--incremental`` records: what judging every record
  costs once a rule looks only at the records new since its last run.

Prints one line per replay: records, ticks, wall seconds, microseconds per tick, and how
many rule runs the followers spared.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainguard.checker.evaluate import build_rules  # noqa: E402
from trainguard.checker.follow import Followers  # noqa: E402
from trainguard.checker.model import Finding, Job, JobState, Series, Severity  # noqa: E402
from trainguard.checker.rules.base import Context, Rule  # noqa: E402
from trainguard.config import default_policy  # noqa: E402
from trainguard.replay import replay  # noqa: E402


@dataclass
class _NoParams:
    pass


class RunningBest(Rule):
    """Warns while the loss stands at 10 x its best so far; the best is kept in
    ``ctx.state`` with the number of records it covers, so each record is read once."""

    name = "running_best"
    Params = _NoParams

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        s = job.series["loss"]
        state = ctx.state if ctx.state is not None else {}
        seen, best = state.get("seen", 0), state.get("best", math.inf)
        if seen > len(s):  # not the run it saw: start over
            seen, best = 0, math.inf
        new = s.value[seen:]
        if len(new):
            best = min(best, float(new.min()))
        state["seen"], state["best"] = len(s), best
        if len(s) and s.value[-1] > 10 * best:
            return [Finding(job.id, self.name, Severity.WARNING, "loss at 10 x its best",
                            evidence={"kind": "best"})]
        return []


def run(records: int, val_every: int = 100, seed: int = 0) -> Job:
    """A healthy run: the loss falls as 1/(1 + step/1000) with noise, on a step clock."""
    rng = np.random.default_rng(seed)
    step = np.arange(records, dtype=np.float64)
    loss = 2 + 8 / (1 + step / 1000) + 0.05 * rng.standard_normal(records)
    val = np.arange(0, records, val_every)
    return Job(id=f"synthetic-{records}", clock="step", state=JobState.SUCCEEDED,
               start_time=0.0, end_time=float(step[-1]),
               series={"loss": Series("loss", step, step, loss),
                       "val_loss": Series("val_loss", step[val], step[val], loss[val] + 0.1)})


def measure(records: int, tick: float | None, rules_on: bool = True,
            rules: list[Rule] | None = None) -> str:
    job, policy = run(records), default_policy()
    if rules is None:
        rules = build_rules(policy) if rules_on else []
    followers = Followers()
    began = time.perf_counter()
    result = replay(job, policy, tick, rules, followers)
    took = time.perf_counter() - began
    what = "default schedule" if tick is None else f"a tick every {tick:g} step"
    if not rules:
        what += ", no rule"
    elif len(rules) == 1:
        what += f", {rules[0].name} only"
    return (f"{records:>9,} records, {what:<22} {result.ticks:>9,} ticks  {took:8.2f} s  "
            f"{took / result.ticks * 1e6:8.0f} us/tick  rules run {followers.runs:,} of "
            f"{followers.calls:,} times; {len(result.histories)} findings")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--per-record", type=int, nargs="*", default=[10_000, 20_000, 40_000])
    ap.add_argument("--framework", type=int, default=200_000,
                    help="records replayed at one tick per record with no rule: the cost of "
                         "the replay itself (0: skip)")
    ap.add_argument("--incremental", type=int, default=1_000_000,
                    help="records replayed at one tick per record with one rule that keeps "
                         "its work in ctx.state (0: skip)")
    a = ap.parse_args()
    print(measure(a.records, None), flush=True)
    for n in a.per_record:
        print(measure(n, 1.0), flush=True)
    if a.framework:
        print(measure(a.framework, 1.0, rules_on=False), flush=True)
    if a.incremental:
        print(measure(a.incremental, 1.0, rules=[RunningBest()]), flush=True)


if __name__ == "__main__":
    main()
