"""A training loss stuck on one exact value far above where it has been
(``divergence_stuck``): the model collapsed to a constant output.

The failure class, seen on a held-out QLoRA fine-tune: its loss was 1.637 at its first
record, 11.8 at its second, then exactly 10.3735 (ln 32,000, a uniform guess over its
vocabulary) at every record after. No NaN reaches the loss, and the ratio test's best
level, a median of three points, is the collapsed level itself: trainguard warned ("never
improved on its first value") and did not stop it. Told from a 4-decimal loss repeating
near its best by rounding, from a loss that converged onto one value, and from one that
comes back. Curves are built in the test; the Hugging Face one is written as a
``trainer_state.json`` and read by the real reader.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.hf_state import trainer_state
from tests.test_divergence_zero import divergence, fine_tune, job_of
from trainguard.checker import Policy, Severity
from trainguard.checker.model import Series
from trainguard.checker.rules.divergence_state import Climbs, DivergenceParams
from trainguard.replay import replay

LN_VOCAB = round(float(np.log(32000)), 4)  # 10.3735
QLORA = [1.637, 11.8069, 11.6046, 10.3829] + [LN_VOCAB] * 6


def test_a_qlora_loss_stuck_at_ln_vocab_is_critical_at_its_fifth_repeat(
        tmp_path: Path) -> None:
    history = [{"step": i + 1, "epoch": (i + 1) / 10, "loss": x, "learning_rate": 5.0}
               for i, x in enumerate(QLORA)]
    job = trainer_state(tmp_path, history, max_steps=10)
    result = replay(job, Policy())
    (h,) = [h for h in result.histories if h.rule == "divergence"]
    assert h.worst is Severity.CRITICAL
    assert h.first.step == 9 and h.finding.step == 5  # the 5th repeat, from the 1st
    assert "stuck at exactly 10.3735" in h.finding.message
    assert h.finding.evidence["stuck_at"] == LN_VOCAB


def test_repeats_near_the_best_are_no_collapse() -> None:
    """A 4-decimal loss at 0.0005 after touching 0.0001 (5 units of its last digit), and a
    loss that converged onto exactly 0.25 (an LSTM predicting 0.5), repeat by rounding or
    by having learnt: nothing critical."""
    rng = np.random.default_rng(1)
    tail = np.round(np.where(rng.random(200) < 0.1, 0.0001, 0.0005), 4)
    tail[50:60] = 0.0005
    near_zero = np.concatenate([np.round(np.geomspace(2.0, 0.001, 100), 4), tail])
    converged = np.concatenate([np.round(np.geomspace(1.75, 0.26, 60), 4), [0.25] * 300])
    for loss in (near_zero, converged):
        assert not [s for s, _ in divergence(job_of(loss)) if s is Severity.CRITICAL]


def test_check_agrees_and_a_stuck_loss_that_comes_back_has_recovered() -> None:
    (sev, msg), = divergence(job_of(np.array(QLORA)))
    assert sev is Severity.CRITICAL and "stuck at exactly 10.3735" in msg
    back = np.array([*QLORA, 1.5, 1.45, 1.4, 1.35, 1.3, 1.25])
    (sev, msg), = divergence(job_of(back))
    assert sev is Severity.INFO and "stuck at exactly 10.3735" in msg
    assert "recovered at step 110" in msg


def test_fed_at_once_or_point_by_point_the_same_stretch() -> None:
    """``check`` reads a run at once (numpy), a replay record by record: the same verdict."""
    loss = fine_tune(400)
    loss[300:340] = LN_VOCAB
    steps = np.arange(400.0)
    s = Series("loss", steps, steps, loss)
    p = DivergenceParams()
    at_once, one_by_one = Climbs(), Climbs()
    at_once.read(s, p)
    for n in range(1, 401):
        one_by_one.read(Series("loss", steps[:n], steps[:n], loss[:n]), p)
    a, b = at_once.stuck.verdict(), one_by_one.stuck.verdict()
    assert a is not None and b is not None
    assert (a.start, a.at, a.level, a.length, a.back) == (b.start, b.at, b.level, b.length,
                                                          b.back) == (300, 300, a.level, 40, 340)
