"""One tick of ``checker.evaluate`` over many running jobs, on one core.

    python bench/evaluate_tick.py --jobs 10000 --series 4 --points 2000

Jobs are built from smooth decaying losses with noise, a step series and a GPU
utilisation series; one job in a hundred has a NaN, one in a hundred has stalled.
Prints wall time per tick (best of --repeat) and peak memory of the process.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

from trainguard.checker import Job, Policy, Series, evaluate
from trainguard.checker.evaluate import build_rules


def make_jobs(n: int, n_series: int, points: int, seed: int = 0) -> tuple[list[Job], float]:
    rng = np.random.default_rng(seed)
    now = 1.8e9
    jobs = []
    t = np.asarray(now - 4 * 3600 + np.arange(points) * (4 * 3600 / points), dtype=np.float64)
    step = np.arange(points, dtype=float) * 10
    for i in range(n):
        series = {"step": Series("step", t, step, step)}
        for k in range(n_series - 2):
            v = np.asarray(2 + 8 * np.exp(-step / 3000) + rng.normal(0, 0.05, points),
                           dtype=np.float64)
            if i % 100 == 1:
                v[-5:] = np.nan
            series["loss" if k == 0 else f"aux_{k}_loss"] = Series("l", t, step, v)
        series["gpu_util"] = Series("gpu_util", t, step,
                                     np.asarray(rng.uniform(80, 100, points), dtype=np.float64))
        job = Job(id=f"job-{i}", provider="sagemaker", scope="123456789012/us-east-1",
                  instance_type="ml.p4d.24xlarge", start_time=float(t[0]),
                  planned_steps=int(step[-1] * 2), series=series)
        if i % 100 == 2:
            job = job.until(float(t[-1]) - 3600)
        jobs.append(job)
    return jobs, float(now)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--series", type=int, default=4)
    ap.add_argument("--points", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    jobs, now = make_jobs(a.jobs, a.series, a.points)
    policy = Policy()
    rules = build_rules(policy)
    best = float("inf")
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        findings = evaluate(jobs, policy, now, rules)
        best = min(best, time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    by_rule: dict[str, int] = {}
    for f in findings:
        by_rule[f.rule] = by_rule.get(f.rule, 0) + 1
    print(f"jobs={a.jobs} series={a.series} points={a.points}: best of {a.repeat} "
          f"{best:.3f} s per tick ({best / a.jobs * 1e6:.0f} us per job), "
          f"peak RSS {peak:.0f} MiB, findings {by_rule}")


if __name__ == "__main__":
    main()
