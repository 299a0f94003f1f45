"""``divergence.regress_noise`` on heavy-tailed per-batch losses built here: how many of
them the ratio test calls critical at each guard (0 is no guard).

    .venv/bin/python bench/noise_guard.py

Each run: a level falling from 40 to 10 over 550 points, each point the level times a
log-normal factor of the given sigma (0.8: the middle 80 % of points span 0.4x to 2.8x;
1.5: 0.15x to 6.8x), replayed as the live watchdog sees it with the default policy but
for ``regress_noise``. None of them diverges: every critical finding is a false alarm.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainguard.checker import Job, Policy, Series, Severity  # noqa: E402
from trainguard.checker.policy import RuleConfig  # noqa: E402
from trainguard.replay import replay  # noqa: E402

T0 = 1_750_000_000.0
SIGMAS = (0.8, 1.0, 1.2, 1.5)
GUARDS = (0.0, 3.0, 4.0, 5.0, 6.0)
RUNS = 12


def loss(sigma: float, seed: int, n: int = 550) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (10 + 30 * np.exp(-np.arange(n) / 150)) * rng.lognormal(0.0, sigma, n)


def critical(values: np.ndarray, guard: float) -> bool:
    steps = np.arange(1.0, len(values) + 1) * 10
    t = T0 + steps * 6
    job = Job(id="noisy", start_time=T0, series={
        "step": Series("step", t, steps, steps), "loss": Series("loss", t, steps, values)})
    policy = Policy()
    policy.rules["divergence"] = RuleConfig(params={"regress_noise": guard})
    return any(h.rule == "divergence" and h.worst is Severity.CRITICAL
               for h in replay(job, policy).histories)


def main() -> int:
    print("| sigma | " + " | ".join(f"guard {g:g}" for g in GUARDS) + " |")
    print("|---|" + "---|" * len(GUARDS))
    for sigma in SIGMAS:
        runs = [loss(sigma, seed) for seed in range(RUNS)]
        counts = [sum(critical(r, g) for r in runs) for g in GUARDS]
        print(f"| {sigma:g} | " + " | ".join(f"{c}/{RUNS}" for c in counts) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
