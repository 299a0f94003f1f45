"""A test of "the RL reward never rose", tried on every RL run of some labels files: why
``plateau`` does not judge it yet (docs/benchmarks.md, *RL runs that never learnt*).

    python bench/rl_never_rose.py LABELS.csv [LABELS.csv ...]

Per run with a reward (``checker.metrics.reward``; a value logged again unchanged counted
once, ``checker.stats.measured``): the rise, in units of the reward's point-to-point
noise (first differences, MAD), from the median of its first 2 % (3 points at least) to
the best median of later blocks of a tenth of the run (half-overlapping). Printed at the
run's end, and how many of 40 prefixes (from 20 points) stand below ``--line`` noise
units, as a replay would judge them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainguard.bench.harness import BenchError, load  # noqa: E402
from trainguard.bench.labels import read_labels  # noqa: E402
from trainguard.checker import metrics  # noqa: E402
from trainguard.checker.model import FloatArray  # noqa: E402
from trainguard.checker.stats import measured  # noqa: E402


def rise(v: FloatArray) -> float:
    """The best later block's median above the first 2 %, in noise units."""
    n = len(v)
    d = np.diff(v)
    noise = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2)
    if not noise > 0:
        noise = float(np.std(v)) or 1.0
    head, block = max(n // 50, 3), max(n // 10, 3)
    first = float(np.median(v[:head]))
    later = [float(np.median(v[i:i + block]))
             for i in range(head, n - block + 1, max(block // 2, 1))]
    return float(((max(later) if later else first) - first) / noise)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("labels", nargs="+", type=Path)
    ap.add_argument("--line", type=float, default=2.0, help="noise units of rise")
    args = ap.parse_args()
    print("| label | points | rise at the end | prefixes below the line | run |")
    print("|---|---|---|---|---|")
    for path in args.labels:
        for row in read_labels(path):
            try:
                job = load(row)
            except BenchError:
                continue
            r = metrics.reward(job)
            if r is None:
                continue
            v = r.value[np.isfinite(r.value)]
            v = v[measured(v)]
            if len(v) < 10:
                continue
            cuts = sorted(set(np.linspace(20, len(v), 40).astype(int))) if len(v) >= 20 else []
            below = sum(rise(v[:k]) < args.line for k in cuts)
            print(f"| {row.label} | {len(v)} | {rise(v):.2f} | "
                  f"{below}/{len(cuts) if cuts else '-'} | {path.parent.name}: {row.run} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
