"""Text logs read as a user reads them: with the default definitions, not the labels'.

    python bench/default_reading.py LABELS.csv [LABELS.csv ...]

For every run of the labels files that gives metric definitions (the ``metrics``
column), the run is read twice: with its definitions, and with none (the reader's
defaults, as ``trainguard check train.log`` reads it). Printed: how often the default
reading gives the same loss series (within 10 % of its length and 5 % of its median),
another one, or none; and, judged as ``bench`` judges (``bench.harness.judge_run``, no
injected faults), where the verdict differs: a failure found with the definitions and
missed with the defaults, or the other way; a healthy run quiet with one, warned or
critical with the other. The numbers are in docs/benchmarks.md (*The text reader's
default definitions, as users meet them*).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainguard.bench.harness import BenchError, Case, Settings, judge_run, load  # noqa: E402
from trainguard.bench.labels import Labelled, read_labels  # noqa: E402
from trainguard.config import default_policy  # noqa: E402

#: the rule and severity that find each failure label, as ``bench`` counts them
FINDS = {"diverged": ("divergence", "critical"), "flat": ("plateau", "warning"),
         "overfit": ("overfit", "warning"), "stalled": ("stall", "critical")}


def verdict(case: Case) -> str:
    """found / missed for a failure; quiet / warned / critical for a healthy run."""
    tg = case.trainguard
    if case.label in FINDS:
        rule, level = FINDS[case.label]
        found = tg.get(rule, {})
        return "found" if found.get(level) or found.get("critical") else "missed"
    if any(v.get("critical") for v in tg.values()):
        return "critical"
    return "warned" if any(v.get("warning") for v in tg.values()) else "quiet"


def same_loss(a: Labelled, b: Labelled) -> str:
    """same / other / none: the default reading's loss against the definitions'."""
    try:
        la, lb = load(a).series.get("loss"), load(b).series.get("loss")
    except BenchError:
        return "unread"
    if la is None or not len(la):
        return "no loss with definitions"
    if lb is None or not len(lb):
        return "none"
    va, vb = la.value[np.isfinite(la.value)], lb.value[np.isfinite(lb.value)]
    if not len(va) or not len(vb):
        return "same" if len(va) == len(vb) and len(la) == len(lb) else "other"
    close = abs(float(np.median(va)) - float(np.median(vb))) <= 0.05 * abs(
        float(np.median(va))) + 1e-9
    return "same" if abs(len(la) - len(lb)) <= max(2, 0.1 * len(la)) and close else "other"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("labels", nargs="+", type=Path)
    args = ap.parse_args()
    policy, settings = default_policy(), Settings()
    series: collections.Counter[str] = collections.Counter()
    pairs: collections.Counter[tuple[str, str, str]] = collections.Counter()
    for path in args.labels:
        for row in read_labels(path):
            if not row.metrics:
                continue
            bare = dataclasses.replace(row, metrics=())
            series[same_loss(row, bare)] += 1
            judged = [judge_run(r, policy, settings) for r in (row, bare)]
            if not all(isinstance(j, list) for j in judged):
                continue
            a, b = (verdict(j[0]) for j in judged if isinstance(j, list))
            kind = row.label if row.label in FINDS else "healthy or spiky"
            pairs[(kind, a, b)] += 1
            if a != b:
                print(f"{path.parent.name}: {row.run} ({row.label}): {a} -> {b}")
    print("\nloss read by default:", ", ".join(f"{k} {v}" for k, v in series.most_common()))
    print("\n| label | with definitions | with the defaults | runs |\n|---|---|---|---|")
    for (kind, a, b), n in sorted(pairs.items()):
        print(f"| {kind} | {a} | {b} | {n} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
