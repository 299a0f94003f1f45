"""``plateau`` during the learning rate's warm-up: no verdict while the rate still rises.

The failure class, seen on a held-out DPO run (Hugging Face ``trainer_state.json``): the
loss starts at exactly ln 2 = 0.6931 (a preference loss does by construction) and sits
there while the learning rate climbs linearly from 2e-9 to 5e-7 over the first 290 of
2,900 steps; it starts to fall near step 60. At its 5th-8th records trainguard said "loss
sits at chance level ln 2 for the whole run: not learning" (a warning), which the run
then disproved. The rate it logs says the optimiser had not reached its rate yet. Runs
written as the Trainer writes them, read by the real reader and replayed record by
record.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.hf_state import trainer_state
from trainguard.checker.model import Job, Severity
from trainguard.config import default_policy
from trainguard.replay import replay

LN2 = float(np.log(2))


def _state(tmp_path: Path, loss: np.ndarray, lr: np.ndarray | None, name: str) -> Job:
    history: list[dict[str, float | int]] = []
    for i, v in enumerate(loss):
        entry: dict[str, float | int] = {"step": 10 * (i + 1), "epoch": i / 100,
                                         "loss": round(float(v), 4)}
        if lr is not None:
            entry["learning_rate"] = float(lr[i])
        history.append(entry)
    return trainer_state(tmp_path / name, history, max_steps=2900)


def _warnings(job: Job) -> list[str]:
    res = replay(job, default_policy())
    return [f"{h.first.step:g}: {h.finding.message}" for h in res.histories
            if h.rule == "plateau" and h.worst.rank >= Severity.WARNING.rank]


def _dpo(n: int, rng: np.random.Generator) -> np.ndarray:
    """ln 2 for 6 records, then falling towards 0.45 (within 4-digit rounding noise)."""
    steps = np.arange(n)
    learnt = np.where(steps < 6, 0.0, 0.25 * (1 - np.exp(-(steps - 6) / 15)))
    return LN2 - learnt + rng.normal(0, 0.001, n)


def test_a_loss_at_ln2_during_warm_up_gets_no_verdict(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    loss = _dpo(60, rng)
    warm = 1e-9 + 5e-7 * np.minimum(np.arange(1, 61) / 29, 1.0)  # linear to step 290
    assert _warnings(_state(tmp_path, loss, warm, "with_lr")) == []
    # control: the same losses without a rate to read are called at chance early on
    found = _warnings(_state(tmp_path, loss, None, "without_lr"))
    assert found and "chance level ln 2" in found[0], found


def test_a_loss_still_at_ln2_after_warm_up_is_not_learning(tmp_path: Path) -> None:
    """Warm-up ends at step 290 with the rate held at its peak (``constant_with_warmup``),
    or decaying (cosine): a loss still at ln 2 is then warned about."""
    rng = np.random.default_rng(4)
    loss = LN2 + rng.normal(0, 0.001, 60)
    ramp = np.minimum(np.arange(1, 61) / 29, 1.0)
    held = 5e-7 * ramp
    cosine = np.where(ramp < 1, 5e-7 * ramp,
                      2.5e-7 * (1 + np.cos(np.pi * (np.arange(60) - 28) / 32)))
    for name, lr in (("held", held), ("cosine", cosine)):
        found = _warnings(_state(tmp_path, loss, lr, name))
        assert found and "chance level ln 2" in found[0], (name, found)
        assert float(found[0].split(":")[0]) > 290, (name, found)  # after warm-up


def test_a_loss_exactly_zero_from_its_first_record_is_judged_during_the_warm_up(
        tmp_path: Path) -> None:
    """An axolotl fine-tune (an issue thread's log) printed loss 0.0 and grad_norm 0.0 at
    each of its 11 records while its rate rose from 8e-7: no warm-up makes a loss 0, and
    the run was never judged. Its 5th record (step 50) says nothing is learnt."""
    n = 11
    job = _state(tmp_path, np.zeros(n), np.linspace(8e-7, 8.8e-6, n), "zeros")
    (warning,) = _warnings(job)
    assert warning.startswith("50: loss is exactly 0 at all 11 points"), warning  # at 5
