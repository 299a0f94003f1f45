"""``plateau``: a loss whose model is not changing is not learning, whatever the log
holds of the run's start. Two shapes from the seventh blind set (logs pasted in issue
threads): a DINO run whose loss stood at 11.090352 (ln 65,536: uniform over its
prototypes) for epochs 251-261, and a MiniGPT-4 fine-tune at exactly 10.3750 (ln 32,000)
for steps 3,950-4,400, both called *converged* because their logs begin late; and a
LoRA loop whose second epoch logged the first epoch's per-batch losses again, value for
value (no optimiser step). Curves are built here."""

from __future__ import annotations

import numpy as np

from trainguard.checker.model import Finding, Job, JobState, Series, Severity
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Context
from trainguard.checker.rules.plateau import Plateau


def _job(values: list[float] | np.ndarray, first: float = 1.0, every: float = 1.0,
         name: str = "loss") -> Job:
    v = np.asarray(values, dtype=np.float64)
    steps = first + every * np.arange(len(v), dtype=np.float64)
    return Job(id="run", clock="step", state=JobState.RUNNING, start_time=0.0,
               series={name: Series(name, steps, steps, v)})


def _judge(job: Job) -> list[Finding]:
    now = max(float(s.time[-1]) for s in job.series.values())
    return Plateau().check(job, Context(now=now, policy=Policy(), jobs=[job]))


def _unchanged(found: list[Finding]) -> bool:
    return any(f.severity is Severity.WARNING and (f.evidence.get("unchanged")
                                                   or f.evidence.get("repeated"))
               for f in found)


def test_a_loss_standing_at_one_value_in_a_log_begun_late_is_not_learning() -> None:
    dino = [11.090352058410645] * 10 + [11.090352177619934]  # float32's last bits move
    found = _judge(_job(dino, first=251))
    assert _unchanged(found)
    assert "not changing" in found[0].message and "11.09035206" in found[0].message
    assert _unchanged(_judge(_job([10.375] * 10, first=3950, every=50)))


def test_a_converged_loss_that_still_moves_in_its_last_digits_is_converged() -> None:
    rng = np.random.default_rng(0)
    still = np.round(0.25 + rng.normal(0, 0.0002, 40), 4)  # 4 decimals, moving
    found = _judge(_job(still, first=5000))
    assert not _unchanged(found)
    assert found and found[0].severity is Severity.INFO  # converged


def test_a_loss_at_few_logged_digits_is_not_judged_unchanged() -> None:
    """0.69 printed to 2 decimals has 69 units of its last digit: many losses sit there
    unchanged as printed; the chance-level and flatness tests judge it instead."""
    assert not _unchanged(_judge(_job([0.69] * 12, first=500)))


def test_a_reward_or_accuracy_at_one_value_is_not_judged_unchanged() -> None:
    """An agent at its ceiling (CartPole's 500) is converged, not dead."""
    found = _judge(_job([500.0] * 12, first=100, name="rollout/ep_rew_mean"))
    assert not _unchanged(found)


def test_per_batch_losses_logged_again_value_for_value_are_not_learning() -> None:
    epoch = [0.9741, 1.3742, 1.2390, 0.9670, 1.0386, 1.1681, 1.0522]
    found = _judge(_job(epoch + epoch[:6]))
    assert _unchanged(found)
    assert "same 6 values in the same order at steps 1-6 and again at 8-13" in found[0].message


def test_values_that_repeat_by_chance_at_few_digits_or_moving_are_not_a_repeat() -> None:
    """2-decimal losses (under 1,000 units of their last digit) can repeat 6 in a row by
    chance over a long run; 4-digit ones that change a little cannot be confused."""
    coarse = [0.71, 0.69, 0.70, 0.72, 0.68, 0.70]
    assert not any(f.evidence.get("repeated") for f in _judge(_job([*coarse, 0.7, *coarse])))
    epoch = np.array([0.9741, 1.3742, 1.2390, 0.9670, 1.0386, 1.1681, 1.0522])
    moved = np.concatenate([epoch, epoch[:6] - 0.0001])
    assert not _unchanged(_judge(_job(moved)))


def test_a_converged_loss_moving_in_its_last_two_digits_is_no_repeat() -> None:
    """A validation loss at 0.27520-0.27610 (5 decimals) wanders by a few units, and a
    stretch of 6 comes back value for value (a blind set's healthy text classifier)."""
    wander = [0.27576, 0.27577, 0.27578, 0.27578, 0.27577, 0.27576]
    series = [0.2752, 0.27531, 0.2755, *wander, 0.27561, 0.2759, 0.2757, *wander]
    assert not _unchanged(_judge(_job(series, first=100, every=100)))


def test_a_loss_standing_still_from_the_start_of_its_log_is_left_to_the_margins() -> None:
    """A tqdm postfix prints the last logged loss again at each update: 6.053 for 13
    records from step 1 is no dead model; the flatness tests judge it on their margins."""
    assert not any(f.evidence.get("unchanged") for f in _judge(_job([6.053] * 13)))


def test_a_log_whose_first_record_comes_a_few_steps_in_is_not_late() -> None:
    """The first logged loss at step 10, printed again at steps 11-14 by a progress bar:
    not a log begun far into training, so not judged by its standing still."""
    assert not any(f.evidence.get("unchanged") for f in _judge(_job([6.053] * 5, first=10)))


def test_a_loss_at_one_value_to_fourteen_digits_is_not_learning_however_early() -> None:
    """A trajectory model's training loss at 46.05170378351126 for every epoch from 16 on
    (its validation loss NaN; the eighth blind set): no progress bar reprints a loss to
    14 digits, so a log that begins 16 epochs in is judged, where 6.053 reprinted from
    step 10 is not."""
    found = _judge(_job([46.05170378351126] * 10, first=16))
    assert _unchanged(found) and "46.05170378" in found[0].message
    assert not any(f.evidence.get("unchanged") for f in _judge(_job([6.053] * 10, first=10)))


def test_an_epochs_progress_bar_written_twice_is_no_second_pass() -> None:
    """A notebook's output that holds the end of one epoch's progress bar twice (a blind
    set's EMNIST log, read with no definitions: each batch's loss at the epoch's step, as
    the log counts epochs and no steps). The same values at the same steps are the same
    records written twice, not a second pass through the same weights; at later steps
    they are (the LoRA loop above)."""
    tail = [0.4366, 0.4589, 0.4669, 0.4586, 0.4312, 0.4470]
    values = np.array([0.61, 0.55, 0.52, 0.50, 0.47, *tail, *tail])
    steps = np.full(len(values), 17.0)
    job = Job(id="run", clock="step", state=JobState.RUNNING, start_time=0.0,
              series={"loss": Series("loss", np.arange(len(values), dtype=np.float64),
                                     steps, values)})
    assert not _unchanged(_judge(job))
    later = np.r_[np.full(len(values) - 6, 17.0), np.full(6, 18.0)]
    job.series["loss"] = Series("loss", np.arange(len(values), dtype=np.float64), later,
                                values)
    assert _unchanged(_judge(job))
