"""Runs from projects the rules were not designed on, unlabelled: what does each get?

    .venv/bin/python bench/heldout.py ../heldout          # the files of heldout_runs.csv
    .venv/bin/python bench/heldout.py ../heldout --all    # every run, not only flagged ones

``heldout_runs.csv`` names 205 public training runs from 194 repositories that neither
shared corpus draws on (Hugging Face ``trainer_state.json``, Lightning ``metrics.csv``,
Ultralytics ``results.csv``, Keras CSVLogger files, TensorBoard run folders, MLflow
stores, text logs of GPT training scripts), each at the commit it was read at. They are
not in this repository: check each out at its commit and copy its file or folder to
``DIR/<file>``. A missing one is reported and skipped.

Each run is replayed with the default policy as the live watchdog would see it. With no
labels, nothing is scored: the table says, per family, how many runs got the worst
severity each rule reached, and every run that reached a warning or worse is listed with
what it said, for a person to read against the curve.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainguard.adapters.local import load_runs  # noqa: E402
from trainguard.checker.model import Job, Severity  # noqa: E402
from trainguard.checker.policy import Policy  # noqa: E402
from trainguard.config import default_policy  # noqa: E402
from trainguard.replay import replay  # noqa: E402

MANIFEST = Path(__file__).with_name("heldout_runs.csv")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="where the manifest's files lie")
    ap.add_argument("--all", action="store_true", help="list every run, flagged or not")
    args = ap.parse_args()
    policy = default_policy()
    counts: Counter[tuple[str, str]] = Counter()
    runs: Counter[str] = Counter()
    missing = 0
    for row in csv.DictReader(MANIFEST.open()):
        path = args.folder / row["file"]
        if not path.exists():
            missing += 1
            print(f"missing: {path} ({row['repo']}@{row['commit'][:12]}:{row['path']})")
            continue
        for job in (found.job for found in load_runs(path)):
            runs[row["family"]] += 1
            flagged = _judge(job, policy, row["family"], counts)
            if flagged or args.all:
                print(f"{row['family']:12} {row['repo']}:{row['path']}")
                for line in flagged:
                    print(f"    {line}")
    print(f"\n{sum(runs.values())} runs, {missing} missing\n")
    print("| family | runs | critical | warning | info only or nothing |")
    print("|---|---|---|---|---|")
    for family in sorted(runs):
        crit, warn = counts[(family, "critical")], counts[(family, "warning")]
        print(f"| {family} | {runs[family]} | {crit} | {warn} | {runs[family] - crit - warn} |")
    return 0


def _judge(job: Job, policy: Policy, family: str, counts: Counter[tuple[str, str]]
           ) -> list[str]:
    """The warnings and worse the replay of ``job`` reached; the run counted once, by its
    worst."""
    res = replay(job, policy)
    flagged = [h for h in res.histories if h.worst.rank >= Severity.WARNING.rank]
    worst = max((h.worst for h in flagged), key=lambda s: s.rank, default=None)
    if worst is not None:
        counts[(family, worst.value)] += 1
    return [f"{h.rule} {h.worst.value} from step {h.first.step}: {h.finding.message}"
            for h in flagged]


if __name__ == "__main__":
    raise SystemExit(main())
