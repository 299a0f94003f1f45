"""What the readers make of other trainers' files: the 26 public logs of
``trainer_files.csv`` (LLaMA-Factory, Detectron2, MMEngine, YOLOv5, the Hugging Face
Trainer's console, Megatron, DeepSpeed, W&B, OLMo), not vendored.

    .venv/bin/python bench/trainer_files.py DIR    # DIR/<file> for each row

Check each row's repository out at its commit and copy its file to ``DIR/<file>``; a
missing one is reported and skipped. Per file: the format detected, the clock, and the
longest loss series: its points, how many carry a step, and the planned steps.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainguard.adapters.local import FormatError, detect_format, load_runs  # noqa: E402

MANIFEST = Path(__file__).with_name("trainer_files.csv")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="where the manifest's files lie")
    args = ap.parse_args()
    print("| tool | file | format | clock | loss points | with a step | planned |")
    print("|---|---|---|---|---|---|---|")
    for row in csv.DictReader(MANIFEST.open()):
        path = args.folder / row["file"]
        name = f"{row['repo']}:{row['path']}"
        if not path.exists():
            print(f"| {row['tool']} | {name} | missing | | | | |")
            continue
        try:
            job = load_runs(path)[0].job
        except FormatError as e:
            print(f"| {row['tool']} | {name} | refused: {e} | | | | |")
            continue
        losses = [s for k, s in job.series.items() if "loss" in k.lower()]
        loss = max(losses, key=len) if losses else None
        points = len(loss) if loss is not None else 0
        stepped = int(np.isfinite(loss.step).sum()) if loss is not None else 0
        print(f"| {row['tool']} | {name} | {detect_format(path)} | {job.clock} | {points} "
              f"| {stepped} | {job.planned_steps or ''} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
