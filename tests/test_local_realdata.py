"""trainguard.adapters.local on the real training curves in ../shared/data/curves."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from trainguard.adapters.local import detect_format, load_run

pytestmark = pytest.mark.realdata


def labels(curves_dir: Path) -> list[dict[str, str]]:
    with open(curves_dir / "labels.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_every_labelled_run_loads(curves_dir: Path) -> None:
    rows = labels(curves_dir)
    assert rows
    for row in rows:
        path = curves_dir / row["run"]
        assert detect_format(path) == row["format"], row["run"]
        job = load_run(path)
        assert job.series, row["run"]
        target = job.series[row["target_metric"]]
        assert len(target), row["run"]
        for s in job.series.values():
            assert np.all(np.diff(s.time) >= 0), (row["run"], s.name)
        if row["planned_steps"]:
            assert job.planned_steps == int(row["planned_steps"]), row["run"]
        if row["last_step"]:
            assert job.series["step"].value[-1] == int(row["last_step"]), row["run"]
        if row["final_value"]:
            assert target.value[-1] == pytest.approx(float(row["final_value"]), abs=1e-4)


def test_modded_nanogpt_logs(curves_dir: Path) -> None:
    rows = [r for r in labels(curves_dir) if r["run"].startswith("modded-nanogpt/")]
    with_train_loss = 0
    for row in rows:
        path = curves_dir / row["run"]
        job = load_run(path)
        assert job.clock == "elapsed", row["run"]
        assert job.planned_steps == int(row["planned_steps"])
        val = job.series["val_loss"]
        assert len(val) >= 2 and val.value[0] > val.value[-1], row["run"]
        assert np.all(np.diff(job.series["step"].time) >= 0)
        if "train_loss:" in path.read_text(encoding="utf-8")[:100_000]:
            with_train_loss += 1
            assert len(job.series["train_loss"]) > 0, row["run"]
        # a log of 8xH100 speed runs lasts minutes to hours, never days
        assert 0 < job.series["step"].time[-1] < 86_400, row["run"]
        assert job.logs == []  # every line of these logs is a metric line
    assert with_train_loss > 0


def test_modded_nanogpt_timer_reset_keeps_time_increasing(curves_dir: Path) -> None:
    path = next((curves_dir / "modded-nanogpt").glob("mng-1-2024-10-20_ScaleUp1B-87bd*.log"))
    raw = [int(line.split("train_time:")[1].split("ms")[0])
           for line in path.read_text(encoding="utf-8").splitlines()[:13]]
    drop = next(i for i in range(1, len(raw)) if raw[i] < raw[i - 1])
    step = load_run(path).series["step"]
    # after the drop the raw value is added to the last time before it
    assert step.time[drop] == pytest.approx((raw[drop - 1] + raw[drop]) / 1000)
    assert np.all(np.diff(step.time) > 0)


def test_genrisk_divergence_is_kept(curves_dir: Path) -> None:
    job = load_run(curves_dir / "genrisk" / "version_0.csv")
    assert job.clock == "step"
    gen = job.series["train_gen_loss"]
    assert gen.step[0] == 0 and math.isnan(gen.value[0])
    assert job.series["train_disc_loss"].value[0] > 1e20
