"""``plateau`` across a new phase of a run: its ``epoch`` starts again while the step goes on.

The failure class, seen on a held-out Hugging Face fine-tune (``trainer_state.json``): at
step 2,000 of a long run the trainer was built again on new data, keeping the global
step; the epoch went from 0.63 back to 0.04, the learning rate back up, and the loss from
2.12 to 2.49, from where it fell slowly. At step 2,500 trainguard said "loss improved
-16.79% over the whole run: not learning" (a warning), comparing the new data's loss with
the old's. Runs written as the Trainer writes them, read by the real reader and replayed
record by record.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.hf_state import trainer_state
from trainguard.checker.model import Job, Severity
from trainguard.config import default_policy
from trainguard.replay import replay


def _run(tmp_path: Path, second: np.ndarray, name: str) -> Job:
    """Three records of a first phase (2.12-2.16), then ``second`` from step 2,000 on,
    the epoch started again at 0.02 a record; a record every 500 steps."""
    history: list[dict[str, float | int]] = []
    for i, v in enumerate([2.1231, 2.1286, 2.158]):
        history.append({"step": 500 * (i + 1), "epoch": 0.21 * (i + 1), "loss": v,
                        "learning_rate": 4.98e-5 - 2e-7 * i})
    for i, v in enumerate(second):
        history.append({"step": 2000 + 500 * i, "epoch": round(0.04 + 0.01 * i, 2),
                        "loss": round(float(v), 4), "learning_rate": 4.996e-5 - 1e-8 * i})
    return trainer_state(tmp_path / name, history, max_steps=2_411_050)


def _warnings(job: Job) -> list[str]:
    res = replay(job, default_policy())
    return [f"{h.first.step:g}: {h.finding.message}" for h in res.histories
            if h.rule == "plateau" and h.worst.rank >= Severity.WARNING.rank]


def test_a_new_phase_starting_higher_is_not_judged_against_the_old_one(
        tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    # 2.49 falling 6 % over the next 80 records, as the held-out run's loss did
    falling = 2.49 * (1 - 0.06 * (1 - np.exp(-np.arange(80) / 20))) + rng.normal(0, 0.002, 80)
    assert _warnings(_run(tmp_path, falling, "falling")) == []


def test_a_new_phase_that_never_learns_is_still_not_learning(tmp_path: Path) -> None:
    """The control: the new phase sits at 2.49 for as long again as the falling one; once
    its records cover most of the run's steps it is warned about, as any flat run."""
    rng = np.random.default_rng(6)
    flat = 2.49 + rng.normal(0, 0.002, 80)
    found = _warnings(_run(tmp_path, flat, "flat"))
    assert found and "not learning" in found[0], found
    # not before its records cover half the run's steps (2,000 to 4,000)
    assert float(found[0].split(":")[0]) >= 4000, found


def test_the_same_drop_without_an_epoch_reset_is_judged_on_the_whole_run(
        tmp_path: Path) -> None:
    """Without the reset nothing says the data changed: a loss that went from 2.12 to
    2.49 and sits there is not learning, as before."""
    rng = np.random.default_rng(6)
    flat = 2.49 + rng.normal(0, 0.002, 80)
    history: list[dict[str, float | int]] = [
        {"step": 500 * (i + 1), "epoch": 0.01 * (i + 1), "loss": round(float(v), 4)}
        for i, v in enumerate([2.1231, 2.1286, 2.158, *flat])]
    found = _warnings(trainer_state(tmp_path / "no_reset", history, max_steps=2_411_050))
    assert found and "not learning" in found[0], found
