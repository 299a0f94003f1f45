"""The default policy on the shared real runs (see ../shared/data/SOURCES.md).

The modded-nanogpt runs are all healthy: no divergence, plateau or stall may fire on
any of them, neither as of their last record nor at any tick of a live replay.
genrisk versions 0, 1 and 5 diverge at once; 2, 3 and 4 are flat; the rest are GANs
oscillating as they should.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from trainguard.adapters.local import load_run
from trainguard.checker import Job, Severity, evaluate
from trainguard.checker.evaluate import build_rules
from trainguard.config import default_policy

pytestmark = pytest.mark.realdata
JUDGED = {"divergence", "plateau", "stall"}


def labelled(curves: Path, prefix: str) -> list[dict[str, str]]:
    with open(curves / "labels.csv", newline="") as fh:
        return [r for r in csv.DictReader(fh) if r["run"].startswith(prefix)]


def first_nonfinite_step(job: Job) -> float:
    steps = [s.step[~np.isfinite(s.value)].min() for k, s in job.series.items()
             if "loss" in k and (~np.isfinite(s.value)).any()]
    return float(min(steps))


def test_no_false_alarm_on_any_healthy_modded_nanogpt_run(curves_dir: Path) -> None:
    policy = default_policy()
    rules = build_rules(policy)
    rows = labelled(curves_dir, "modded-nanogpt/")
    # SOURCES.md says 318; labels.csv lists 317 of them (300 + 18 - 1)
    assert len(rows) >= 300 and all(r["label"] == "healthy" for r in rows)
    alarms: list[str] = []
    ticks = 0
    for row in rows:
        job = load_run(curves_dir / row["run"])
        end = job.last_time()
        assert end is not None and job.clock == "elapsed"
        # As of the last record, then as a live watchdog would have seen it every minute.
        for t in [*np.arange(60.0, end, 60.0), end]:
            ticks += 1
            for f in evaluate([job.until(float(t))], policy, float(t), rules):
                if f.rule in JUDGED and f.severity is not Severity.INFO:
                    alarms.append(f"{row['run']} at {t:.0f}s: {f.rule} {f.message}")
    assert ticks > 2000
    assert alarms == []


def test_healthy_gans_raise_nothing_at_any_step_of_a_replay(curves_dir: Path) -> None:
    policy = default_policy()
    for row in labelled(curves_dir, "genrisk/"):
        if row["label"] != "healthy":
            continue
        job = load_run(curves_dir / row["run"])
        end = int(job.last_time() or 0)
        for t in range(end + 1):
            raised = [f for f in evaluate([job.until(t)], policy, float(t))
                      if f.severity is not Severity.INFO]
            assert raised == [], f"{row['run']} at step {t}: {raised[0].message}"


def test_genrisk_verdicts(curves_dir: Path) -> None:
    policy = default_policy()
    for row in labelled(curves_dir, "genrisk/"):
        job = load_run(curves_dir / row["run"])
        findings = evaluate([job], policy, job.last_time() or 0.0)
        by_rule = {f.rule: f for f in findings}
        if row["label"] == "diverged":
            f = by_rule["divergence"]
            assert f.severity is Severity.CRITICAL, row["run"]
            assert f.step == first_nonfinite_step(job) == float(row["onset_step"]), row["run"]
        elif row["label"] == "flat":
            assert "plateau" in by_rule, row["run"]
            assert "divergence" not in by_rule, row["run"]
        else:
            assert not [f for f in findings if f.severity is Severity.CRITICAL], row["run"]
            assert not [f for f in findings if f.rule in JUDGED
                        and f.severity is not Severity.INFO], row["run"]
