"""``bench/thinned.py``: a run kept at every k-th record is the same training logged less
often, and the rules give it the same verdict while enough points are left. The
benchmark runs this on both corpora; here on curves built in the test."""

from __future__ import annotations

import numpy as np
import pytest

from tests import bench_scripts
from tests.corpora import labelled
from trainguard.checker import Policy
from trainguard.checker.model import Job, JobState, Series
from trainguard.replay import replay

BENCH = bench_scripts.load("thinned")


def _job(values: np.ndarray) -> Job:
    """A run of one training loss and one validation loss per epoch, an epoch a minute."""
    job = Job(id="built", clock="elapsed", state=JobState.RUNNING)  # type: ignore[arg-type]
    e = np.arange(len(values), dtype=float)
    job.series["loss"] = Series("loss", 60.0 * e + 30.0, e, values * 0.9)
    job.series["val_loss"] = Series("val_loss", 60.0 * e + 60.0, e, values)
    return job


def test_thinning_keeps_every_kth_record_from_its_phase() -> None:
    job = _job(np.linspace(2.0, 1.0, 10))
    job.series["lr"] = Series("lr", np.array([0.0, 1.0]), np.array([0.0, 1.0]),
                              np.array([1e-4, 1e-4]))
    thinned = BENCH.thin(job, 3, 2)
    assert thinned.series["val_loss"].step.tolist() == [2.0, 5.0, 8.0]
    assert thinned.series["loss"].time.tolist() == [150.0, 330.0, 510.0]
    assert len(thinned.series["lr"]) == 2  # too short to thin: kept whole
    assert BENCH.thin(job, 1, 0) is job and len(job.series["val_loss"]) == 10


rng = np.random.default_rng(3)
EPOCHS = np.arange(60, dtype=float)
BUILT = {
    "healthy": 0.3 + 2.0 / (1.0 + EPOCHS / 5) + rng.normal(0, 0.01, 60),
    "flat": 1.2 + rng.normal(0, 0.002, 60),
    "diverged": np.where(EPOCHS < 45, 0.3 + 2.0 / (1.0 + EPOCHS / 5), np.nan),
}


@pytest.mark.parametrize("label", list(BUILT))
@pytest.mark.parametrize(("k", "phase"), [(1, 0), (2, 0), (2, 1), (3, 0), (3, 2)])
def test_a_built_run_keeps_its_verdict_when_logged_less_often(label: str, k: int,
                                                               phase: int) -> None:
    result = replay(BENCH.thin(_job(BUILT[label]), k, phase), Policy())
    verdict = frozenset((h.rule, h.worst) for h in result.histories)
    assert BENCH.met(label, verdict), verdict


@pytest.mark.realdata
def test_no_healthy_or_spiky_real_run_is_alarmed_when_logged_every_2nd_3rd_or_5th_record(
) -> None:
    """Every healthy and spiky run of ``runs`` and every twentieth of ``curves``, thinned
    in both phases: no critical finding and no ``plateau`` warning (as logged, none
    either). At every 5th record a resumed text log's resume repeats its last logged
    step, which was read as a stall before ``checker.cost.logged_again``; at every 10th
    the resume is not in the log at all (README), so the bar stops at the 5th."""
    judged, alarmed = 0, []
    for row in labelled():
        if row.label not in ("healthy", "spiky"):
            continue
        for k, phase in ((2, 0), (2, 1), (3, 0), (3, 2), (5, 0), (5, 4)):
            verdict, _ = BENCH.judge(row, k, phase)
            judged += 1
            if not BENCH.met(row.label, verdict):
                alarmed.append((row.run, k, phase, sorted((r, w.value) for r, w in verdict)))
    assert judged > 300 and not alarmed, alarmed
