"""How well the learning-curve forecast and the ``target`` rule do on real modded-nanogpt runs.

For each run and each checkpoint (25%, 50%, 75% of its planned steps) the curve is cut at
the checkpoint and the final val_loss is forecast. Compared: the forecast's mean, the last
value seen, the best value seen; the coverage of its nominal 90% interval; the milliseconds
per forecast; and how often the ``target`` rule (default parameters) fires on runs that did
reach their target (wrong stops) and on runs that did not.

Honesty of the prior: a recipe prior (``checker.forecast.learn_prior``) is learnt per track
(track 1 and track 2 are two recipes) from the *other* folds only. Runs are split into
``--folds`` folds by record folder, so seeds of one record never sit on both sides; each
run is forecast by a prior that never saw it or its siblings. The last columns show the
forecast without any prior (the parametric ensemble) on the runs where it has enough points.

    python bench/forecast_eval.py [--curves DIR] [--format table|json] [--folds 10]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from trainguard.checker.forecast import Prior, forecast, learn_prior  # noqa: E402
from trainguard.checker.model import Job, Series  # noqa: E402
from trainguard.checker.policy import Policy  # noqa: E402
from trainguard.checker.rules.base import Context  # noqa: E402
from trainguard.checker.rules.target import Target  # noqa: E402

CHECKPOINTS = (0.25, 0.5, 0.75)
VAL = re.compile(r"step:(\d+)/(\d+) val_loss:(\S+)")


@dataclass
class Run:
    name: str
    group: str  # the record folder: seeds of one record
    track: str  # the recipe
    step: np.ndarray
    value: np.ndarray
    planned: float
    target: float
    final: float
    reached: bool


def read_runs(curves: Path) -> list[Run]:
    """The modded-nanogpt runs of ``labels.csv`` with their val_loss points."""
    labels = curves / "labels.csv"
    runs = []
    with labels.open(newline="") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            if not row["run"].startswith("modded-nanogpt/"):
                continue
            path = curves / row["run"]
            steps, values = [], []
            with path.open(errors="replace") as log:
                for text in log:
                    m = VAL.search(text)
                    if m:
                        steps.append(float(m[1]))
                        values.append(float(m[3]))
            if len(steps) < 2:
                raise ValueError(f"{path}: fewer than two val_loss lines")
            try:
                planned, target = float(row["planned_steps"]), float(row["target_value"])
                final = float(row["final_value"])
            except ValueError as e:
                raise ValueError(f"{labels}:{line}: bad number ({e})") from e
            folder = row["source"].rsplit("/", 1)[0]
            track = re.search(r"track_\w+", folder)
            if track is None:
                raise ValueError(f"{labels}:{line}: source names no track folder")
            runs.append(Run(row["run"], folder, track[0], np.array(steps),
                            np.array(values), planned, target, final, row["reached"] == "true"))
    return runs


def fold_priors(runs: list[Run], folds: int) -> tuple[dict[str, int], dict[tuple[int, str], Prior]]:
    groups = sorted({r.group for r in runs})
    fold_of = {g: i % folds for i, g in enumerate(groups)}
    priors = {}
    for f in range(folds):
        for track in sorted({r.track for r in runs}):
            train = [r for r in runs if fold_of[r.group] != f and r.track == track]
            priors[f, track] = learn_prior([(r.step, r.value, r.planned) for r in train],
                                           [r.group for r in train])
    return fold_of, priors


def fires(rule: Target, run: Run, step: np.ndarray, value: np.ndarray) -> bool:
    job = Job(id=run.name, clock="step", planned_steps=int(run.planned),
              series={"val_loss": Series("val_loss", step, step, value)})
    return bool(rule.detect(job, Context(now=float(step[-1]), policy=Policy(), jobs=[job])))


def evaluate_corpus(curves: Path, folds: int = 10) -> list[dict[str, Any]]:
    runs = read_runs(curves)
    fold_of, priors = fold_priors(runs, folds)
    rules = {key: Target({"target": None, "prior": p.to_dict()}) for key, p in priors.items()}
    table = []
    for c in CHECKPOINTS:
        err, last, best, cover, ms, wrong, right = [], [], [], [], [], 0, 0
        g_err, g_cover = [], []
        for r in runs:
            cut = r.step <= c * r.planned
            s, v = r.step[cut], r.value[cut]
            key = (fold_of[r.group], r.track)
            t0 = time.perf_counter()
            fc = forecast(s, v, r.planned, r.planned, level=0.9, prior=priors[key])
            ms.append((time.perf_counter() - t0) * 1000)
            if fc is None:
                raise ValueError(f"{r.name}: no forecast at {c:.0%}")
            err.append(abs(fc.mean - r.final))
            cover.append(fc.low <= r.final <= fc.high)
            last.append(abs(v[-1] - r.final))
            best.append(abs(v.min() - r.final))
            rule = rules[key]
            rule.params.target = r.target
            if fires(rule, r, s, v):
                wrong += r.reached
                right += not r.reached
            plain = forecast(s, v, r.planned, r.planned, level=0.9)
            if plain is not None:
                g_err.append(abs(plain.mean - r.final))
                g_cover.append(plain.low <= r.final <= plain.high)
        table.append({
            "checkpoint": c, "runs": len(runs), "mae_forecast": float(np.mean(err)),
            "mae_last": float(np.mean(last)), "mae_best": float(np.mean(best)),
            "coverage_90": float(np.mean(cover)), "median_ms": float(np.median(ms)),
            "wrong_stops": wrong, "reached": sum(r.reached for r in runs),
            "right_stops": right, "missed": sum(not r.reached for r in runs),
            "no_prior_runs": len(g_err),
            "no_prior_mae": float(np.mean(g_err)) if g_err else None,
            "no_prior_coverage_90": float(np.mean(g_cover)) if g_cover else None,
        })
    return table


def render(table: list[dict[str, Any]]) -> str:
    head = ("at   MAE fcst  MAE last  MAE best  cover90  ms/fcst  wrong stops  right stops"
            "  | no prior: n  MAE    cover90")
    lines = [head]
    for t in table:
        np_mae = f"{t['no_prior_mae']:.4f}" if t["no_prior_mae"] is not None else "  -   "
        np_cov = f"{t['no_prior_coverage_90']:.3f}" if t["no_prior_coverage_90"] is not None \
            else "  -  "
        lines.append(
            f"{t['checkpoint']:<4.0%} {t['mae_forecast']:8.4f}  {t['mae_last']:8.4f}  "
            f"{t['mae_best']:8.4f}  {t['coverage_90']:7.3f}  {t['median_ms']:7.2f}  "
            f"{t['wrong_stops']:4d} of {t['reached']:<4d}  "
            f"{t['right_stops']:4d} of {t['missed']:<4d}"
            f"  |        {t['no_prior_runs']:4d}  {np_mae} {np_cov}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--curves", type=Path, default=ROOT.parent / "shared" / "data" / "curves")
    ap.add_argument("--format", choices=("table", "json"), default="table")
    ap.add_argument("--folds", type=int, default=10)
    args = ap.parse_args(argv)
    if not (args.curves / "labels.csv").is_file():
        ap.error(f"{args.curves}: no labels.csv there")
    table = evaluate_corpus(args.curves, args.folds)
    print(json.dumps(table, indent=2) if args.format == "json" else render(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
