"""A replay at one tick per record of a run that logs only loss components (a GAN's
generator and discriminator losses, no total): its objective is their sum, which must be
kept from tick to tick, not summed afresh at every tick (the square of the run).

    .venv/bin/python bench/replay_components.py --sizes 10000 20000 40000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainguard.checker.evaluate import build_rules
from trainguard.checker.follow import Followers
from trainguard.checker.model import Job, JobState, Series
from trainguard.config import default_policy
from trainguard.replay import replay


def build(n: int) -> Job:
    rng = np.random.default_rng(0)
    st = np.arange(n, dtype=float)
    g = 2 + np.sin(st / 50) + 0.1 * rng.standard_normal(n)
    d = 1 - 0.5 * np.sin(st / 50) + 0.1 * rng.standard_normal(n)
    return Job(id="gan", clock="step", state=JobState.SUCCEEDED, start_time=0.0,
               end_time=float(n - 1), series={"loss_G": Series("loss_G", st, st, g),
                                               "loss_D": Series("loss_D", st, st, d)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 20_000, 40_000])
    for n in ap.parse_args().sizes:
        job, policy, followers = build(n), default_policy(), Followers()
        began = time.perf_counter()
        replay(job, policy, 1.0, rules=build_rules(policy), followers=followers)
        took = time.perf_counter() - began
        print(f"{n:>7,} records, components only  {n:>7,} ticks {took:7.2f} s "
              f"{took / n * 1e6:6.1f} us/tick  rules run {followers.runs:,}", flush=True)


if __name__ == "__main__":
    main()
