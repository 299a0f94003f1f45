"""The classes of failure issue 11 names, each on a curve built here.

Each test builds the shape a real run of that class has (uneven evaluation cadence,
a short run at chance level, per-batch losses repeating each epoch, a loss creeping to
many times its best, validation NaN during healthy training, a divergence the run came
back from, a run that learnt and levelled off, a run that overfits) and checks what a
user would see from ``evaluate``: which rule fires, at what severity, and what stays
quiet on the healthy twin of the same shape.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainguard.checker import Job, Policy, RuleConfig, Series, Severity, evaluate
from trainguard.checker.stats import normal_quantile, t_quantile, trend_z
from trainguard.replay import replay

T0 = 1_750_000_000.0


def job_of(series: dict[str, tuple[np.ndarray, np.ndarray]], *, dt: float = 10.0,
           **kw: object) -> Job:
    """A running job; each series is (steps, values), its time ``T0 + step * dt``."""
    out = {}
    last = 0.0
    for name, (steps, values) in series.items():
        steps = np.asarray(steps, dtype=float)
        out[name] = Series(name, T0 + steps * dt, steps, np.asarray(values, dtype=float))
        last = max(last, float(steps[-1]))
    st = np.arange(0.0, last + 1)
    out.setdefault("step", Series("step", T0 + st * dt, st, st))
    args: dict[str, object] = {"id": "j", "start_time": T0, "series": out}
    args.update(kw)
    return Job(**args)  # type: ignore[arg-type]


def judged(job: Job, rule: str, at: float | None = None,
           policy: Policy | None = None) -> list:  # type: ignore[type-arg]
    now = job.last_time() if at is None else at
    assert now is not None
    cut = job.until(now)
    return [f for f in evaluate([cut], policy or Policy(), now) if f.rule == rule]


def power_law(steps: np.ndarray, noise: float = 0.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 2.0 + 8.0 * (1.0 + steps / 50.0) ** -0.7 + rng.normal(0, noise, len(steps))


# --------------------------------------------------------------------------- statistics

@pytest.mark.parametrize(("df", "exact"), [(1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571),
                                           (10, 2.228), (30, 2.042), (10_000, 1.960)])
def test_t_quantile_matches_the_tables(df: int, exact: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(exact, rel=0.01)


def test_normal_quantile_matches_the_tables() -> None:
    assert normal_quantile(0.975) == pytest.approx(1.959964, abs=1e-6)
    assert normal_quantile(0.5) == pytest.approx(0.0, abs=1e-9)
    assert normal_quantile(0.001) == pytest.approx(-3.090232, abs=1e-5)


# ------------------------------------------------------- 1. uneven evaluation cadence

def uneven_steps() -> np.ndarray:
    """Evaluations every 125 steps to 5,000, then every 5 steps for the last 200."""
    return np.concatenate([np.arange(125, 5001, 125), np.arange(5005, 5201, 5)])


def test_a_dense_last_stretch_of_evaluations_is_not_a_plateau() -> None:
    steps = uneven_steps()
    job = job_of({"val_loss": (steps, power_law(steps, noise=0.002))})
    # 40 of the 80 points sit in the last 200 of 5,200 steps, where a power law is flat:
    # a window of "the later half of the points" sees only them. The window in steps
    # sees the later 2,600 steps, where the curve still falls by several per cent.
    assert [f for f in judged(job, "plateau") if f.severity is not Severity.INFO] == []


def test_a_flat_run_with_the_same_uneven_cadence_is_still_not_learning() -> None:
    steps = uneven_steps()
    flat = 4.2 + np.random.default_rng(1).normal(0, 0.002, len(steps))
    (f,) = judged(job_of({"val_loss": (steps, flat)}), "plateau")
    assert f.severity is Severity.WARNING and f.evidence["kind"] == "flat"


# ----------------------------------------------------------------------- 2. short runs

def test_a_short_run_at_chance_level_with_chance_accuracy_is_not_learning() -> None:
    steps = np.arange(6.0)
    k = 8  # an 8-class task: chance loss ln 8 = 2.079, chance accuracy 1/8
    loss = math.log(k) + np.array([0.004, -0.002, 0.001, -0.003, 0.002, -0.006])
    acc = 1 / k + np.array([0.01, -0.02, 0.0, 0.015, -0.01, 0.005])
    (f,) = judged(job_of({"val_loss": (steps, loss), "val_acc": (steps, acc)}), "plateau")
    assert f.severity is Severity.WARNING and f.evidence["kind"] == "chance"
    assert f.evidence["classes"] == k
    assert "sits at chance level ln 8" in f.message, f.message


def test_a_short_binary_run_at_ln2_is_not_learning_without_an_accuracy() -> None:
    steps = np.arange(6.0)
    # at ln 2 from the first evaluation to the last (a loss falling *to* ln 2 without an
    # accuracy could as well be a language model learning: see the next-but-one test)
    loss = math.log(2) + np.array([0.0017, 0.004, -0.001, 0.003, 0.0, 0.001])
    (f,) = judged(job_of({"val_loss": (steps, loss)}), "plateau")
    assert f.evidence["kind"] == "chance" and f.evidence["classes"] == 2


def test_chance_level_names_the_nearest_k_where_the_bands_overlap() -> None:
    steps = np.arange(6.0)
    # ln 10 = 2.303 also lies within ln 9's band (2.197 * 1.05 = 2.307): the run is at
    # the chance level of ten classes, and the finding must say so, not "ln 9".
    loss = math.log(10) + np.array([0.002, -0.001, 0.001, 0.0, -0.002, 0.001])
    policy = Policy(rules={"plateau": RuleConfig(params={"chance_max_classes": 10})})
    (f,) = judged(job_of({"val_loss": (steps, loss)}), "plateau", policy=policy)
    assert f.evidence["kind"] == "chance" and f.evidence["classes"] == 10
    assert "ln 10 = 2.303" in f.message


def test_an_accuracy_just_under_one_tenth_names_ten_classes_by_the_loss() -> None:
    """A Fashion-MNIST run at chance (a blind set's Lightning log): validation accuracy
    0.088-0.0915, its loss at ln 10 = 2.303. Rounding 1/0.0897 named 11 classes, and a
    loss at ln 10 stood below ln 11: no chance at all. 1/9, 1/10 and 1/11 are all within
    the accuracy's tolerance; the loss names 10."""
    steps = np.arange(8.0)
    loss = math.log(10) + np.array([0.004, -0.002, 0.003, -0.001, 0.002, -0.003, 0.001, 0.0])
    acc = np.array([0.0915, 0.088, 0.0897, 0.0902, 0.0885, 0.0899, 0.0893, 0.0896])
    (f,) = judged(job_of({"val_loss": (steps, loss), "val_acc": (steps, acc)}), "plateau")
    assert f.evidence["kind"] == "chance" and f.evidence["classes"] == 10
    assert "ln 10 = 2.303" in f.message


def test_a_held_out_accuracy_near_one_third_names_no_k_where_training_learns() -> None:
    """A CIFAR-10 model (a blind set's Lightning run, labelled spiky): held-out accuracy
    0.17-0.42 around 1/3 and its loss unstable at 1.6-4.7, above ln 3, while its training
    accuracy climbs 0.31 -> 0.58: 31 % is 3.1 tenths, not a 3-class task's chance. With
    the training accuracy at 1/3 too, the same held-out run is at chance."""
    steps = np.arange(12.0)
    val_acc = np.array([0.305, 0.415, 0.275, 0.405, 0.423, 0.372, 0.30, 0.171, 0.396,
                        0.333, 0.293, 0.31])
    val_loss = np.array([1.89, 1.63, 2.27, 1.90, 1.73, 1.95, 2.57, 4.65, 2.04, 2.08,
                         3.25, 2.4])
    train_acc = np.array([0.309, 0.436, 0.493, 0.531, 0.573, 0.579, 0.568, 0.578, 0.559,
                          0.571, 0.584, 0.579])
    series = {"val_loss": (steps, val_loss), "val_acc": (steps, val_acc)}
    assert judged(job_of({**series, "train_acc": (steps, train_acc)}), "plateau") == []
    at_chance = 1 / 3 + 0.02 * np.sin(np.arange(12.0))
    (f,) = judged(job_of({**series, "train_acc": (steps, at_chance)}), "plateau")
    assert f.evidence["kind"] == "chance" and f.evidence["classes"] == 3


def test_a_short_run_learning_through_chance_level_is_not_flagged() -> None:
    steps = np.arange(6.0)
    # starts at ln 2 like any binary classifier and learns: not at chance at its end
    loss = np.array([0.69, 0.60, 0.51, 0.45, 0.40, 0.37])
    acc = np.array([0.50, 0.66, 0.74, 0.79, 0.82, 0.84])
    assert judged(job_of({"val_loss": (steps, loss), "val_acc": (steps, acc)}),
                  "plateau") == []


def test_an_accuracy_near_one_third_on_a_falling_loss_is_not_chance() -> None:
    """A many-class task learning slowly: top-1 accuracy 0.30 to 0.35 (near 1/3, chance
    only on three classes) while its loss falls from 2.36 to 2.13, above ln 3. Read as
    "worse than chance", a real YOLO classifier's training loss was "not learning" (the
    runs corpus's BorisLeung run). A loss at that level that does not fall, with the same
    accuracy, still is."""
    epochs = np.arange(1.0, 11.0)
    acc = np.linspace(0.30, 0.35, 10)
    falling = np.linspace(2.36, 2.13, 10)
    assert judged(job_of({"train/loss": (epochs, falling),
                          "metrics/accuracy_top1": (epochs, acc)}), "plateau") == []
    level = 2.2 + np.array([0.004, -0.003, 0.002, 0.0, -0.002, 0.003, -0.001, 0.001,
                            -0.002, 0.002])
    flat_acc = 1 / 3 + np.array([0.01, -0.01, 0.005, 0.0, -0.005, 0.01, -0.01, 0.0,
                                 0.005, -0.005])
    (f,) = judged(job_of({"train/loss": (epochs, level),
                          "metrics/accuracy_top1": (epochs, flat_acc)}), "plateau")
    assert f.evidence["kind"] == "chance" and f.evidence["classes"] == 3
    # 2.2 is above ln 3 = 1.099 by far: the finding says worse than chance, not "at" it
    assert "no better than chance level ln 3" in f.message, f.message


def fine_tune_of_two_epochs(loss: np.ndarray, accuracy: list[float]) -> Job:
    """A Hugging Face fine-tune's shape: a training loss every 10 steps over two epochs
    (``epoch`` logged beside it, fractional), an evaluation at the end of each."""
    steps = 10.0 * np.arange(1, len(loss) + 1)
    evals = steps[[len(loss) // 2 - 1, len(loss) - 1]]
    return job_of({"loss": (steps, loss), "epoch": (steps, 2 * steps / steps[-1]),
                   "eval_accuracy": (evals, np.array(accuracy))})


def test_a_two_epoch_fine_tune_whose_loss_fell_to_chance_level_is_not_learning() -> None:
    """A 3-class NLI fine-tune (a blind held-out run): its training loss 1.13 -> 1.11,
    ln 3 = 1.099, over 50 records in two epochs, its accuracy 0.330 and 0.332 at its two
    evaluations. Judged per epoch it was two points (never judged), and a loss that falls
    2 % was "learning" however near ln 3 it ended: it fell *to* chance level, and two
    accuracies at 1/3 name the three classes."""
    rng = np.random.default_rng(5)
    loss = math.log(3) + np.linspace(0.035, 0.008, 50) + rng.normal(0, 0.006, 50)
    (f,) = judged(fine_tune_of_two_epochs(loss, [0.330, 0.332]), "plateau")
    assert f.evidence["kind"] == "chance" and f.evidence["classes"] == 3
    assert "sits at chance level ln 3" in f.message and f.evidence["points"] >= 40
    # the same loss learning through ln 3 (its accuracy climbing) is no finding
    learning = np.linspace(1.13, 0.55, 50) + rng.normal(0, 0.006, 50)
    assert judged(fine_tune_of_two_epochs(learning, [0.62, 0.78]), "plateau") == []


def test_a_three_epoch_run_is_judged_on_its_points_not_three_medians() -> None:
    """Per-epoch medians need epochs: a run of three epochs and 60 training losses that sit
    flat was three medians, fewer than ``min_points``, and never judged; it is judged on
    its 60 points (per-epoch medians from five epochs on)."""
    rng = np.random.default_rng(6)
    steps = np.arange(1.0, 61.0)
    flat = 2.5 + rng.normal(0, 0.004, 60)
    (f,) = judged(job_of({"loss": (steps, flat), "epoch": (steps, steps / 20)}), "plateau")
    assert f.evidence["kind"] == "flat" and "per-epoch" not in f.evidence["metric"]


def test_a_held_out_loss_too_noisy_to_tell_leaves_the_verdict_to_the_training_loss() -> None:
    """A blind held-out TensorBoard run: the training loss at 6.07-6.14 for 100 epochs,
    the validation loss jumping between 5.8 and 9 with no trend. The validation loss is
    neither confidently flat nor confidently improving; the training loss says the model
    learns nothing. Where the training loss learns, or the held-out loss improves, the
    noise says nothing."""
    rng = np.random.default_rng(8)
    epochs = np.arange(1.0, 101.0)
    noisy_val = 6.2 + np.abs(rng.standard_cauchy(100)) * 0.3
    flat_train = 6.1 + rng.normal(0, 0.01, 100)
    flat_train[0] = 6.074  # and never better than its first value, as the real run's
    (f,) = judged(job_of({"val_loss": (epochs, noisy_val), "loss": (epochs, flat_train)}),
                  "plateau")
    assert f.severity is Severity.WARNING and f.evidence["held_out"] == "val_loss"
    assert f.message.startswith("val_loss too noisy to tell; loss never improved on its "
                                "first value 6.074")
    # a training loss that learnt 57-fold in its first epochs and then sat still (a
    # healthy weather model's) says nothing here, nor one that learns throughout
    for train in (np.r_[0.1986, 0.0092, np.full(98, 0.0036) + rng.normal(0, 1e-4, 98)],
                  2 + 4 * np.exp(-epochs / 30) + rng.normal(0, 0.02, 100)):
        assert [g.evidence["kind"] for g in judged(job_of(
            {"val_loss": (epochs, noisy_val), "loss": (epochs, train)}), "plateau")] \
            in ([], ["converged"])
    # an RL run's evaluation reward, noisy, beside a loss that follows moving targets:
    # the reward is judged by itself
    noisy_reward = -150 + 40 * rng.standard_normal(100)
    assert [g.evidence.get("held_out") for g in judged(job_of(
        {"eval/mean_reward": (epochs, noisy_reward), "train/loss": (epochs, flat_train)}),
        "plateau")] in ([], [None])
    improving_val = np.linspace(9, 4, 100) + rng.normal(0, 0.5, 100)
    assert judged(job_of({"val_loss": (epochs, improving_val), "loss": (epochs, flat_train)}),
                  "plateau") == []


def test_a_held_out_loss_of_few_points_leaves_the_verdict_to_the_training_loss() -> None:
    """Three validation epochs say nothing (5 points are needed); the 30 training losses
    logged meanwhile do. Flat at 1.32 to four digits, the run is not learning, and the
    finding names the series it read. Its healthy twin, whose training loss falls, is
    not; and once validation has 5 points, it is judged again."""
    train_steps = np.arange(1.0, 31.0) * 10
    val_steps = np.array([100.0, 200.0, 300.0])
    flat = 1.32 + 1e-4 * np.sin(train_steps)
    val = np.array([1.41, 1.40, 1.41])
    (f,) = judged(job_of({"train_loss": (train_steps, flat), "val_loss": (val_steps, val)}),
                  "plateau")
    assert f.severity is Severity.WARNING and f.evidence["kind"] == "flat"
    assert f.message.startswith("train_loss")
    learning = 0.5 + 1.0 * np.exp(-train_steps / 100)
    assert not [f for f in judged(job_of({"train_loss": (train_steps, learning),
                                          "val_loss": (val_steps, val)}), "plateau")
                if f.severity is Severity.WARNING]
    five = np.arange(1.0, 6.0) * 60
    falling_val = np.array([1.6, 1.3, 1.1, 0.95, 0.85])
    judged_on_val = judged(job_of({"train_loss": (train_steps, flat),
                                   "val_loss": (five, falling_val)}), "plateau")
    assert not [f for f in judged_on_val if f.severity is Severity.WARNING]
    # an objective the policy names is judged alone: its few points say nothing yet
    named = Policy(metrics={"objective": "val_loss"})
    assert judged(job_of({"train_loss": (train_steps, flat), "val_loss": (val_steps, val)}),
                  "plateau", policy=named) == []


def test_a_short_run_constant_to_six_digits_is_not_learning() -> None:
    steps = np.arange(7.0) * 100
    loss = 246.4912 + np.array([3e-4, 1e-4, 2e-4, 0.0, 1e-4, 2e-4, 1e-4])
    (f,) = judged(job_of({"train_loss": (steps, loss)}), "plateau")
    assert f.severity is Severity.WARNING and f.evidence["kind"] == "flat"


def test_weak_evidence_on_few_points_is_not_enough() -> None:
    steps = np.arange(7.0)
    # about flat, but noisy: seven points cannot say the improvement is under 1 %
    loss = 1.0 + np.array([0.00, 0.05, -0.04, 0.03, -0.05, 0.04, -0.02])
    assert judged(job_of({"val_loss": (steps, loss)}), "plateau") == []


# ------------------------------------------------- 3. per-batch losses repeating each epoch

def batches(levels: list[float], per_epoch: int = 40) -> tuple[np.ndarray, np.ndarray,
                                                               np.ndarray]:
    """Per-batch losses whose within-epoch pattern (the same batches in the same order)
    repeats every epoch around each epoch's level; and the epoch of each record."""
    pattern = 0.8 * np.sin(np.linspace(0, 6 * np.pi, per_epoch)) + np.random.default_rng(
        2).normal(0, 0.3, per_epoch)
    loss = np.concatenate([lv + pattern for lv in levels])
    epoch = np.repeat(np.arange(len(levels), dtype=float), per_epoch)
    steps = np.arange(len(loss), dtype=float)
    return steps, loss, epoch


def test_repeating_per_batch_losses_are_judged_per_epoch_and_found_flat() -> None:
    steps, loss, epoch = batches([3.0] * 8)
    job = job_of({"train_loss": (steps, loss), "epoch": (steps, epoch)})
    (f,) = judged(job, "plateau")
    assert f.severity is Severity.WARNING
    assert "per-epoch" in f.evidence["metric"]
    # Without the epoch column, values repeated exactly in the same order say it: the same
    # batches through the same weights.
    (f,) = judged(job_of({"train_loss": (steps, loss)}), "plateau")
    assert f.severity is Severity.WARNING and f.evidence.get("repeated")
    # With the batches' losses moving a little from epoch to epoch (dropout, shuffling),
    # the same numbers are too noisy to call without the epoch column.
    moved = loss + np.random.default_rng(5).normal(0, 0.01, len(loss))
    assert judged(job_of({"train_loss": (steps, moved)}), "plateau") == []


def test_per_batch_losses_over_a_falling_level_are_not_flat() -> None:
    steps, loss, epoch = batches([3.0, 2.6, 2.3, 2.1, 1.95, 1.85, 1.78, 1.72])
    job = job_of({"train_loss": (steps, loss), "epoch": (steps, epoch)})
    assert judged(job, "plateau") == []


# --------------------------------------------------------- 4. divergence without NaN

def test_a_fine_tune_creeping_to_many_times_its_start_is_critical() -> None:
    steps = np.arange(60.0) * 10
    loss = np.concatenate([np.linspace(1.0, 0.4, 20), np.geomspace(0.4, 6.0, 40)])
    (f,) = judged(job_of({"loss": (steps, loss)}), "divergence")
    assert f.severity is Severity.CRITICAL and f.evidence["kind"] == "regressed"
    # it fires where the level first passed 5x its best, not at the end of the climb
    assert loss[int(f.step // 10)] >= 5 * 0.4 * 0.9
    assert f.step < steps[-1]


def test_a_jump_of_an_order_of_magnitude_that_stays_is_critical_within_an_interval() -> None:
    steps = np.arange(80.0) * 50
    loss = power_law(steps / 50, noise=0.01)
    loss[50:] = 10 * loss[49] + np.random.default_rng(3).normal(0, 0.2, 30)
    job = job_of({"loss": (steps, loss)})
    fired = None
    for i in range(45, 80):
        found = [f for f in judged(job, "divergence", at=float(T0 + steps[i] * 10))
                 if f.severity is Severity.CRITICAL]
        if found:
            fired = i
            break
    assert fired is not None
    # needs a sustained level (3 medians of 3): its fourth point after the jump at the latest
    assert fired - 50 <= 3


def test_learning_rate_warm_up_and_an_oscillating_gan_do_not_diverge() -> None:
    steps = np.arange(100.0)
    warm = np.concatenate([np.linspace(2.3, 4.0, 10), 4.0 * np.exp(-np.arange(90) / 30) + 1])
    assert [f for f in judged(job_of({"loss": (steps, warm)}), "divergence")
            if f.severity is not Severity.INFO] == []
    phase = np.sin(np.arange(100) / 6)
    gen = 2.0 + 1.9 * phase  # the generator wins, then the discriminator, in turn
    disc = 2.0 - 1.9 * phase
    gan = job_of({"train_gen_loss": (steps, gen), "train_disc_loss": (steps, disc)})
    assert [f for f in judged(gan, "divergence") if f.severity is not Severity.INFO] == []


# ----------------------------------------------------- 5. evaluation-only non-finite

def detector_run(val_nan: slice) -> Job:
    epochs = np.arange(40.0)
    train = 3.0 * np.exp(-epochs / 15) + 0.5
    val = 2.0 * np.exp(-epochs / 15) + 0.9
    val[val_nan] = np.nan
    return job_of({"train/box_loss": (epochs, train), "train/cls_loss": (epochs, train / 2),
                   "val/box_loss": (epochs, val)}, dt=600.0)


def test_validation_nan_while_training_is_finite_is_a_warning_never_critical() -> None:
    job = detector_run(slice(3, 10))
    during = T0 + 8 * 600.0
    (f,) = judged(job, "divergence", at=during)
    assert f.severity is Severity.WARNING
    assert f.evidence["kind"] == "eval_nonfinite" and "evaluation only" in f.message
    # ...and once evaluation is finite again the run is healthy: nothing above info.
    assert all(f.severity is Severity.INFO for f in judged(job, "divergence"))


def test_nan_in_the_training_objective_is_still_critical() -> None:
    epochs = np.arange(40.0)
    train = 3.0 * np.exp(-epochs / 15) + 0.5
    train[30:] = np.nan
    job = job_of({"train/box_loss": (epochs, train), "train/cls_loss": (epochs, train / 2),
                  "val/box_loss": (epochs, train + 0.3)})
    (f,) = judged(job, "divergence")
    assert f.severity is Severity.CRITICAL and f.step == 30


# ------------------------------------------------------ 6. recovered, as of the last record

def test_a_divergence_the_run_came_back_from_is_info_recovered_with_when() -> None:
    steps = np.arange(200.0)
    loss = power_law(steps, noise=0.01)
    loss[100:104] = np.nan
    job = job_of({"loss": (steps, loss)})
    # A replay sees it fire: critical at the first non-finite step, while it lasts.
    (live,) = judged(job, "divergence", at=T0 + 103 * 10.0)
    assert live.severity is Severity.CRITICAL and live.step == 100
    # As of the last record it has recovered: info, saying when it fired and recovered.
    (f,) = judged(job, "divergence")
    assert f.severity is Severity.INFO and f.evidence["kind"] == "recovered"
    assert f.evidence["fired_step"] == 100 and f.evidence["recovered_step"] == 104
    assert "recovered at step 104" in f.message


def test_a_divergence_that_came_back_and_went_again_is_critical() -> None:
    steps = np.arange(200.0)
    loss = power_law(steps, noise=0.01)
    loss[100:104] = np.nan
    loss[190:] = np.nan
    (f,) = judged(job_of({"loss": (steps, loss)}), "divergence")
    assert f.severity is Severity.CRITICAL and f.step == 190


def test_a_blow_up_to_a_new_level_that_stays_is_not_recovered() -> None:
    """A loss below zero (a continuous negative log-likelihood) jumps to -5e5 and stays
    there. It is not judged by ratio to its best (below zero), so only the blow-up test
    sees it; its reference used to be the block before each point, so once a block at
    the new level was complete the stretch "ended" and, as of the last record, the run
    read as *recovered* (info) while its loss was still -5e5. A stretch ends only at a
    point back near the level its first point was far from."""
    steps = np.arange(400.0)
    rng = np.random.default_rng(2)
    nll = -1.0 - power_law(steps, noise=0.01)
    nll[250:] = -5e5 + rng.normal(0, 1e3, 150)
    job = job_of({"loss": (steps, nll)})
    (f,) = judged(job, "divergence")
    assert f.severity is Severity.CRITICAL and f.step == 250, f.message
    assert "recovered" not in f.message
    # one that comes back near its old level has recovered
    nll[260:] = -1.0 - power_law(steps[260:], noise=0.01)
    (f,) = judged(job_of({"loss": (steps, nll)}), "divergence")
    assert f.severity is Severity.INFO and f.evidence["recovered_step"] == 260
    # an evaluation loss that jumps 100-fold and stays is a warning to the end, not info
    val = power_law(steps, noise=0.01)
    val[250:] *= 100
    train = power_law(steps, noise=0.01)
    (f,) = judged(job_of({"loss": (steps, train), "val_loss": (steps, val)}), "divergence")
    assert f.severity is Severity.WARNING and f.evidence["metric"] == "val_loss", f.message
    assert "recovered" not in f.message


# ----------------------------------------------------- 7. not learning versus converged

def test_a_run_that_learnt_and_levelled_off_is_converged_with_the_saving() -> None:
    steps = np.arange(400.0)
    # levelled off by the later half of its steps (at -steps / 40 it still fell 1 % there:
    # called converged only while the spike filter took its fall for spikes)
    loss = 1.0 + 3.0 * np.exp(-steps / 25) + np.random.default_rng(4).normal(0, 0.003, 400)
    job = job_of({"loss": (steps, loss)}, hourly_price=30.0, planned_steps=1000)
    (f,) = judged(job, "plateau")
    assert f.severity is Severity.INFO and f.evidence["kind"] == "converged"
    # 600 steps left at 10 s each: 1 h 40 min at $30/h.
    assert f.evidence["saving_usd"] == pytest.approx(50.0, rel=0.05)
    assert "save $50" in f.message
    assert "not learning" not in f.message


def test_a_run_that_never_improved_is_not_learning() -> None:
    steps = np.arange(400.0)
    loss = 4.0 + np.random.default_rng(5).normal(0, 0.003, 400)
    (f,) = judged(job_of({"loss": (steps, loss)}), "plateau")
    assert f.severity is Severity.WARNING and "not learning" in f.message


def resumed_run(first: float, last: float, *, learning: bool = True) -> Job:
    """A run logged every 50 steps from ``first`` to ``last``, as the log of a run resumed
    from a checkpoint holds it: a healthy power-law tail, or a loss stuck at its level."""
    steps = np.arange(first, last, 50.0)
    level = 2.0 + 8.0 * (1.0 + steps / 100.0) ** -0.5 if learning else np.full(len(steps), 2.36)
    loss = level * np.exp(np.random.default_rng(6).normal(0, 0.02, len(steps)))
    return job_of({"loss": (steps, loss), "step": (steps, steps)})


def test_a_log_that_begins_far_into_training_is_never_called_not_learning() -> None:
    """A healthy run resumed at step 50,000 improves 0.2 % over its first 2,500 logged
    steps, inside its 2 % noise: judged as if those steps were the whole run, it was "not
    learning" at step 52,550. Its records never cover half its steps, so at every tick of
    a replay it is at most converged (while it levels off between its noise), saying where
    its records begin."""
    job = resumed_run(50_000, 100_000)
    res = replay(job, Policy())
    (h,) = [h for h in res.histories if h.rule == "plateau"]
    assert h.worst is Severity.INFO
    f = h.finding
    assert f.evidence["kind"] == "converged"
    assert "records begin at step 50000" in f.message and "learnt and" not in f.message


def test_a_stuck_run_resumed_is_not_learning_once_its_log_covers_half_its_steps() -> None:
    """The same resumed log stuck at its level: converged at most while its records hold
    less than half the run's steps; not learning once they hold more."""
    early = judged(resumed_run(50_000, 90_000, learning=False), "plateau")
    assert [f.evidence["kind"] for f in early] == ["converged"]
    (late,) = judged(resumed_run(50_000, 110_000, learning=False), "plateau")
    assert late.severity is Severity.WARNING and "not learning" in late.message


# --------------------------------------------------------------------------- 8. overfit

def overfit_run(val_end: float, train_end: float = 0.05) -> Job:
    epochs = np.arange(50.0)
    val = np.concatenate([np.linspace(0.9, 0.3, 10), np.linspace(0.3, val_end, 40)])
    train = np.linspace(1.0, train_end, 50)
    return job_of({"val_loss": (epochs, val), "train_loss": (epochs, train)}, dt=60.0,
                  hourly_price=12.0)


def test_validation_climbing_many_fold_while_training_falls_is_overfit() -> None:
    (f,) = judged(overfit_run(val_end=3.0), "overfit")
    assert f.severity is Severity.WARNING
    assert f.evidence["best_step"] == 9 and f.step == 9
    assert f.evidence["ratio"] > 3
    # spend since the best checkpoint: 40 epochs of 60 s at $12/h
    assert f.burnt_usd == pytest.approx(12.0 * 40 / 60, rel=0.01)
    assert "best checkpoint is at step 9" in f.message


def test_validation_drifting_up_a_little_is_not_overfit() -> None:
    assert judged(overfit_run(val_end=0.45), "overfit") == []


def test_a_validation_loss_that_doubled_is_overfit_unless_the_policy_waits_for_more() -> None:
    """A Keras lab's validation loss (a held-out run's shape): 0.79 at its third epoch,
    1.75 at its 25th (2.2 x) while its training loss falls 1.33 -> 0.06, labelled overfit
    blind: the rule's median of three evaluations at 2 x its best (the default) finds it; a
    policy at 3 x (every way of climbing) does not, and a 1.2-fold drift is no finding
    either way."""
    epochs = np.arange(25.0)
    val = np.concatenate([[1.26, 0.91, 0.79], np.linspace(0.80, 1.75, 22)])
    train = np.geomspace(1.33, 0.06, 25)
    job = job_of({"val_loss": (epochs, val), "loss": (epochs, train)})
    (f,) = judged(job, "overfit")
    assert f.evidence["best_step"] == 2 and 2.0 <= f.evidence["ratio"] < 2.2
    waits = Policy(rules={"overfit": RuleConfig(params={
        "factor": 3.0, "steady_factor": 3.0, "long_factor": 3.0})})
    assert judged(job, "overfit", policy=waits) == []
    mild = np.concatenate([[1.26, 0.91, 0.79], np.linspace(0.80, 0.95, 22)])
    assert judged(job_of({"val_loss": (epochs, mild), "loss": (epochs, train)}),
                  "overfit") == []


def test_a_validation_blow_up_coming_back_down_is_not_overfit() -> None:
    """A Keras CSVLogger's validation loss (a blind set's run, labelled spiky): 0.016 at
    epoch 5, 42 and 36 at epochs 6 and 7, 2.4 and 0.08 after, then 0.0004 and on down,
    while the training loss falls. Three levels (medians of three) stood at 2 x its best,
    the third already a fifteenth of the top: a blow-up coming back down is no climb (it
    was warned at epoch 9). The same jump that stays near its top is overfitting, at its
    third level there."""
    epochs = np.arange(29.0)
    val = np.concatenate([[5.59, 3.21, 1.22, 0.30, 0.26, 0.016, 42.1, 35.8, 2.37, 0.079,
                           0.111], np.geomspace(4e-4, 1e-5, 18)])
    train = np.geomspace(1.38, 0.011, 29)
    # an epoch a minute: every record is a tick of the replay
    spike = replay(job_of({"val_loss": (epochs, val), "loss": (epochs, train)}, dt=60.0),
                   Policy())
    assert [h for h in spike.histories if h.rule == "overfit"] == []  # at no record
    stays = val.copy()
    stays[8:] = 30.0 + np.arange(21)  # up, and climbing on
    climb = replay(job_of({"val_loss": (epochs, stays), "loss": (epochs, train)}, dt=60.0),
                   Policy())
    (h,) = [h for h in climb.histories if h.rule == "overfit"]
    assert h.worst is Severity.WARNING and h.first.step == 9  # its third level at 2 x
    assert h.finding.evidence["best_step"] == 5


def test_a_validation_loss_near_zero_wobbling_a_hundredfold_is_not_overfit() -> None:
    """The same Keras run later: its validation loss learnt from 5.6 to 5e-6, then sat at
    7e-6, 7e-5, 2e-3, 0.9, 2e-5 while the training loss fell: levels a hundred times its
    best, having given back nothing of the 5.6 it had learnt (under a tenth). A climb
    that gives back a tenth of it, from a best of 0.3, is overfitting."""
    epochs = np.arange(30.0)
    val = np.concatenate([np.geomspace(5.6, 5e-6, 23),
                          [6.7e-6, 6.7e-5, 2.4e-3, 0.95, 1.8e-5, 9.9e-6, 2.1e-3]])
    train = np.geomspace(1.38, 0.011, 30)
    wobble = replay(job_of({"val_loss": (epochs, val), "loss": (epochs, train)}, dt=60.0),
                    Policy())
    assert [h for h in wobble.histories if h.rule == "overfit"] == []
    gave_back = np.concatenate([np.geomspace(5.6, 0.3, 23), np.linspace(0.9, 1.2, 7)])
    climb = replay(job_of({"val_loss": (epochs, gave_back), "loss": (epochs, train)},
                          dt=60.0), Policy())
    (h,) = [h for h in climb.histories if h.rule == "overfit"]
    assert h.finding.evidence["best_step"] == 22


def test_a_doubling_that_dips_under_two_fold_between_ticks_is_still_overfit() -> None:
    """A held-out run's validation loss (a GRU classifier logged by Keras, 3-second
    epochs): best 0.14 at epoch 95, then its level hovers 1.9-2.1 x, at 2 x for three
    evaluations in a row only now and then. A watchdog judging once a minute, 17 epochs a
    tick, saw it only below 2 x and said nothing; judged per record it fired and cleared.
    Three levels at 2 x fire it, and it stands until the level falls below
    ``steady_factor`` (1.5) x its best: the same at every cadence and in ``check``. A level
    back under 1.5 x clears it."""
    epochs = np.arange(200.0)
    rng = np.random.default_rng(3)
    val = np.concatenate([np.linspace(0.66, 0.14, 96),
                          0.14 * (1.2 + 0.8 * (1 - np.exp(-np.arange(104) / 20)))])
    val[96:] *= 1 + 0.03 * rng.standard_normal(104)
    val[150:153] = 0.14 * 2.15  # the one stretch at 2 x
    val[153:] = np.minimum(val[153:], 0.14 * 1.95)
    train = np.geomspace(0.69, 0.08, 200)
    job = job_of({"val_loss": (epochs, val), "loss": (epochs, train)}, dt=3.0)
    (f,) = judged(job, "overfit")
    assert f.evidence["best_step"] == 95 and "climbed to 2.1x and stands at 1.9x" in f.message
    for tick in (None, 60.0):
        res = replay(job, Policy(), tick=tick)
        (h,) = [h for h in res.histories if h.rule == "overfit"]
        assert h.first.step is not None and 150 <= h.first.step <= 175
    # followed tick by tick, a few evaluations at a time or many, it says what a fresh
    # judgement says at every tick (the latch's stretch and peak do not hang on batching)
    from tests.test_divergence_follow import follow_and_compare
    times = job.series["val_loss"].time
    for every in (1, 7, 40):
        assert follow_and_compare(job, times[::every], every=1) > 0
    back = val.copy()
    back[170:] = 0.14 * 1.3  # came back under 1.5 x
    assert judged(job_of({"val_loss": (epochs, back), "loss": (epochs, train)}, dt=3.0),
                  "overfit") == []


def steady_run(val_after: np.ndarray, val_before: np.ndarray | None = None) -> Job:
    """Evaluations once an epoch: the held-out loss falls over ``val_before`` (default
    0.9 -> 0.5 in five epochs), then follows ``val_after``; the training loss falls
    throughout (0.9 -> 0.03)."""
    before = np.linspace(0.9, 0.5, 5) if val_before is None else val_before
    val = np.concatenate([before, val_after])
    epochs = np.arange(float(len(val)))
    return job_of({"val_loss": (epochs, val),
                   "loss": (epochs, np.geomspace(0.9, 0.03, len(val)))})


def test_a_steady_climb_back_above_where_it_started_is_overfit_below_two_fold() -> None:
    """The held-out shapes the 2 x line missed (a Keras lab's validation loss 0.79 ->
    1.54 over 22 epochs, a Hugging Face fine-tune's 0.51 -> 1.23 over 8 evaluations):
    climbing every evaluation or nearly, from 0.5 to 0.85 (1.7 x, above the first
    evaluation's 0.9 only at the end) with noise: a warning that says it climbed
    steadily, from the lowest evaluation's step."""
    rng = np.random.default_rng(3)
    climb = np.linspace(0.52, 0.95, 16) + rng.normal(0, 0.015, 16)
    (f,) = judged(steady_run(climb), "overfit")
    assert f.severity is Severity.WARNING and "climbed steadily" in f.message
    assert f.evidence["steady"] and f.evidence["trend_z"] >= 2.33
    assert f.evidence["best_step"] == 4 and f.evidence["climbing_since_step"] == 5
    assert 1.5 <= f.evidence["ratio"] < 2.0
    # the 2 x line alone does not see it
    only_many_fold = Policy(rules={"overfit": RuleConfig(params={"steady_factor": 2.0,
                                                                  "long_factor": 2.0})})
    assert judged(steady_run(climb), "overfit", policy=only_many_fold) == []


def test_the_trend_statistic_is_rare_on_noise_and_large_on_a_steady_climb() -> None:
    """Mann-Kendall's z: six evaluations each above the one before are 2.6 (past the
    2.33 line), a falling run as far below, equal values 0; on points in random order it
    passes 2.33 about once in a hundred, whatever their distribution (heavy tails too)."""
    assert trend_z(np.arange(6.0)) == pytest.approx(2.63, abs=0.01)
    assert trend_z(-np.arange(6.0)) == pytest.approx(-2.63, abs=0.01)
    assert trend_z(np.ones(8)) == 0.0 and trend_z(np.arange(2.0)) == 0.0
    rng = np.random.default_rng(7)
    for n in (8, 30, 64):
        z = np.array([trend_z(rng.standard_cauchy(n)) for _ in range(2000)])
        assert (z >= 2.33).mean() < 0.02


def test_a_shift_or_a_partial_give_back_is_not_a_steady_climb() -> None:
    """Not overfitting by this path: a held-out loss that stepped up once to 1.9 x its best
    and sits there with noise (no order in its evaluations after the lowest: the 2 x line
    judges a level); one that learnt much (2.0 -> 0.4) and climbed back 1.75-fold,
    steadily, to half its first level (the held-out gain mostly kept); and one climbing
    by 1.4 x over six evaluations (too few for ``long_z``, a mild drift)."""
    rng = np.random.default_rng(4)
    shifted = 0.95 + rng.normal(0, 0.03, 16)
    assert judged(steady_run(shifted), "overfit") == []
    kept = steady_run(np.linspace(0.42, 0.7, 16), np.geomspace(2.0, 0.4, 8))
    assert judged(kept, "overfit") == []
    assert judged(steady_run(np.linspace(0.52, 0.70, 6)), "overfit") == []


def mini_gpt(climb: np.ndarray, before: tuple[float, ...] = (8.05, 6.2, 6.0, 5.96)) -> Job:
    """A small language model evaluated every 100 steps (a blind set's run, labelled
    overfit): untrained at 8.05, 6.2 after 100 steps, 5.89 after 400 (after ``before``),
    then ``climb``, while its training loss falls 8 -> 1.2."""
    val = np.concatenate([before, [5.89], climb])
    steps = 100.0 * np.arange(len(val))
    return job_of({"val_loss": (steps, val),
                   "loss": (steps, np.geomspace(8.0, 1.2, len(val)))})


def test_a_long_steady_climb_is_overfit_a_quarter_above_its_best() -> None:
    """The blind sets' mild overfits: a language model's validation loss rising 16
    evaluations running, 5.9 -> 7.8 (1.3 x), while its training loss falls; a classifier's
    2.4 -> 3.7 over 40 epochs. Neither reached 1.5 x its best nor its first evaluation (an
    untrained model's), so the steady path left them. A climb in rank order at
    ``long_z`` (3.5 standard deviations: nine evaluations or more each above the one
    before) is overfitting from ``long_factor`` (1.25) x its best, once it has given back
    half of what the held-out loss had learnt."""
    rng = np.random.default_rng(5)
    climb = np.linspace(6.0, 7.8, 16) + rng.normal(0, 0.06, 16)
    (f,) = judged(mini_gpt(climb), "overfit")
    assert f.severity is Severity.WARNING and "climbed steadily" in f.message
    assert f.evidence["best_step"] == 400 and f.evidence["trend_z"] >= 3.5
    assert 1.25 <= f.evidence["ratio"] < 1.5
    # the same climb over six evaluations is too short to be told from noise at 1.3 x
    assert judged(mini_gpt(climb[::3]), "overfit") == []
    # a long climb that keeps most of what it had learnt (its first level 12, a median
    # of three, down to 5.9, back to 7.6) is not
    assert judged(mini_gpt(np.linspace(6.0, 7.6, 16), (14.0, 12.0, 11.0, 9.0)),
                  "overfit") == []
    # nor one below long_factor (1.2 x)
    assert judged(mini_gpt(np.linspace(6.0, 7.05, 16)), "overfit") == []


def test_a_short_run_rising_at_every_evaluation_is_overfit() -> None:
    """A blind set's five-epoch fine-tune (labelled overfit): its evaluation loss 0.351,
    0.392, 0.598, 0.95, 0.996 while its training loss falls 0.456 -> 0.0097. Too few
    evaluations for three levels (medians of three) at 2 x or for a trend test: the
    evaluations since the lowest, each above the one before (at least ``points``), the
    last two at 2 x, are overfitting. Not when the last two are under 2 x, nor in a run
    whose validation loss already rose 2-fold and came back before its lowest (a linear
    probe swinging 4-42 at a high learning rate rises three evaluations running by
    chance). Followed tick by tick, it says what a fresh judgement says."""
    steps = 749.0 * np.arange(1, 6)
    train = np.array([0.456, 0.249, 0.12, 0.0439, 0.0097])

    def run(val: list[float]) -> Job:
        at = 749.0 * np.arange(1, len(val) + 1)
        return job_of({"eval_loss": (at, np.array(val)),
                       "loss": (at, np.geomspace(0.456, 0.0097, len(val)))})

    job = job_of({"eval_loss": (steps, np.array([0.351, 0.392, 0.598, 0.95, 0.996])),
                  "loss": (steps, train)})
    (f,) = judged(job, "overfit")
    assert f.severity is Severity.WARNING and f.evidence["best_step"] == 749
    assert "rose at each of its 4 evaluations since its lowest, to 2.8x" in f.message
    assert f.evidence["rising"] == 4
    from tests.test_divergence_follow import follow_and_compare
    assert follow_and_compare(job, job.series["eval_loss"].time) > 0
    assert judged(run([0.351, 0.392, 0.55, 0.62, 0.69]), "overfit") == []  # under 2 x
    swung = [0.9, 0.45, 1.1, 0.5, 0.35, 0.392, 0.75, 0.95]  # 2.4 x and back, before
    assert judged(run(swung), "overfit") == []
    assert judged(run([0.9, 0.5, 0.35, 0.392, 0.75, 0.95]), "overfit") != []


def test_a_best_at_the_first_evaluation_counts() -> None:
    """A temporal-fusion transformer of the blind held-out runs: its validation loss 18.4
    at its first evaluation, then 40.5, 44.6, 43.7, 47.4, 50.6 while the training loss
    falls 0.79 -> 0.43. A median of three never holds a first evaluation (it has one
    neighbour), so the best level was 40.5 and the climb 1.2-fold; the first evaluation
    is a level of its own now, and the warning names it as the checkpoint to keep."""
    steps = 3919.0 * np.arange(1, 7)
    val = np.array([18.42, 40.5, 44.6, 43.7, 47.4, 50.62])
    train = np.array([0.79, 0.62, 0.55, 0.50, 0.46, 0.43])
    (f,) = judged(job_of({"val_loss": (steps, val), "train_loss_epoch": (steps, train)}),
                  "overfit")
    assert f.evidence["best_step"] == 3919 and f.evidence["ratio"] > 2
    # a first evaluation 1.45 x below the rest, which then sit still, is no overfit
    still = np.array([18.42, 27.0, 25.5, 26.8, 25.9, 26.4])
    assert judged(job_of({"val_loss": (steps, still), "train_loss_epoch": (steps, train)}),
                  "overfit") == []


def test_training_falling_again_after_a_step_that_set_both_back_is_overfit() -> None:
    """A Keras network of the blind held-out runs: at epoch 10 the validation loss jumps
    11-fold and the training loss 2.4-fold; then training falls again (0.089 -> 0.057)
    while validation climbs to 20 x its best. Training is still above where it stood at
    validation's best, so "training lower than at the best" missed it; it is lower than
    where the climb began."""
    epochs = np.arange(16.0)
    val = np.array([8.33, 0.201, 0.223, 0.245, 0.119, 0.183, 0.111, 0.083, 0.062, 0.055,
                    0.639, 0.196, 0.191, 0.173, 0.482, 1.139])
    train = np.array([0.402, 0.131, 0.101, 0.087, 0.074, 0.062, 0.053, 0.046, 0.040, 0.037,
                      0.089, 0.075, 0.072, 0.066, 0.063, 0.057])
    (f,) = judged(job_of({"val_loss": (epochs, val), "loss": (epochs, train)}), "overfit")
    assert f.evidence["best_step"] == 9
    assert f.evidence["train_now"] < f.evidence["train_then"]


def test_validation_climbing_while_training_climbs_too_is_not_overfit() -> None:
    assert judged(overfit_run(val_end=3.0, train_end=2.0), "overfit") == []


def test_a_window_in_seconds_or_steps_covers_that_much_of_the_run() -> None:
    steps = np.arange(300.0)
    # improving by ~10 % in the first half, flat in the last 100 steps (1,000 s)
    loss = np.concatenate([np.linspace(4.4, 4.0, 200), np.full(100, 4.0)])
    loss += np.random.default_rng(7).normal(0, 0.002, 300)
    job = job_of({"loss": (steps, loss)})
    def flat_with(**params: float) -> bool:
        policy = Policy(rules={"plateau": RuleConfig(params=dict(params))})
        return any(f.severity is not Severity.INFO for f in judged(job, "plateau",
                                                                     policy=policy))

    # The last 1,000 s (100 steps) are flat, but the whole run learnt: converged, info.
    assert not flat_with(window_seconds=1000.0)
    (f,) = judged(job, "plateau", policy=Policy(
        rules={"plateau": RuleConfig(params={"window_steps": 100.0})}))
    assert f.evidence["kind"] == "converged" and f.step is not None and f.step >= 199
    # A window of 2,500 s reaches back into the learning: no plateau at all.
    assert judged(job, "plateau", policy=Policy(
        rules={"plateau": RuleConfig(params={"window_seconds": 2500.0})})) == []


def test_a_fine_tune_improving_slowly_near_some_ln_k_is_not_at_chance() -> None:
    steps = np.arange(12.0) * 100
    # a language-model fine-tune: 2.40 -> 2.30 (4 %) sits inside ln 10's +5 % all along;
    # with no accuracy to say there are 10 classes, that is not chance level
    loss = np.linspace(2.40, 2.30, 12) + np.random.default_rng(8).normal(0, 0.002, 12)
    found = judged(job_of({"loss": (steps, loss)}), "plateau")
    assert [f for f in found if f.evidence["kind"] == "chance"] == []
    # nor is a loss still falling through ln 2 (0.72 -> 0.70, 3 %)
    loss = np.linspace(0.72, 0.70, 12) + np.random.default_rng(8).normal(0, 0.0005, 12)
    found = judged(job_of({"loss": (steps, loss)}), "plateau")
    assert [f for f in found if f.evidence["kind"] == "chance"] == []


# ------------------------------------------------------------- which series a rule reads

def test_series_are_told_apart_by_the_words_in_their_names() -> None:
    from trainguard.checker.metrics import is_eval, objective, primary, training_objective

    steps = np.arange(10.0)
    ones = np.ones(10)
    yolo = job_of({"train/box_loss": (steps, ones), "train/cls_loss": (steps, 2 * ones),
                   "val/box_loss": (steps, 3 * ones), "val/cls_loss": (steps, 4 * ones),
                   "metrics/mAP50(B)": (steps, ones)})
    assert is_eval("val/box_loss") and is_eval("outcome_val_loss") and is_eval("evalLoss")
    assert not is_eval("train/box_loss") and not is_eval("interval_loss")
    # no total is logged: the components are summed, on each side
    train = training_objective(yolo, Policy())
    assert train is not None and list(train.value) == [3.0] * 10
    held = primary(yolo, Policy())
    assert held is not None and list(held.value) == [7.0] * 10
    # a logged total wins over components, its per-epoch form over its per-step one
    lit = job_of({"train_loss_step": (steps, ones), "train_loss_epoch": (steps, 2 * ones),
                  "val_loss": (steps, 3 * ones)})
    obj = objective(lit, held_out=False)
    assert obj is not None and obj.name == "train_loss_epoch"
    # HF logs loss and eval_loss: the held-out one is the primary
    hf = job_of({"loss": (steps, ones), "eval_loss": (steps[::2], ones[::2])})
    assert (p := primary(hf, Policy())) is not None and p.name == "eval_loss"


def test_a_loss_near_zero_bouncing_many_fold_has_not_diverged() -> None:
    steps = np.arange(120.0)
    # learnt 2.0 -> 1e-4, then bounces to 6-8e-4 for a stretch: many-fold, but it has
    # given back none of what it learnt
    loss = np.concatenate([np.geomspace(2.0, 1e-4, 80), np.full(20, 1e-4), np.full(20, 7e-4)])
    found = judged(job_of({"loss": (steps, loss)}), "divergence")
    assert [f for f in found if f.severity is Severity.CRITICAL] == []



def zero_most_of_the_time(kind: str) -> Job:
    """A loss that is exactly 0.0 most of the time late in training: a triplet loss with
    every margin met on most batches, or a Hugging Face log (losses rounded to 4
    decimals) of a fine-tune that fits its data to below 5e-5."""
    rng = np.random.default_rng(0)
    steps = np.arange(10.0, 20_000.0, 10.0)
    if kind == "triplet":
        share = np.clip(0.6 * np.exp(-steps / 3_000), 0.02, 1)
        loss = np.where(rng.random(len(steps)) < share, rng.exponential(0.2, len(steps)), 0.0)
    else:
        loss = np.round((1e-5 + 1.5 * np.exp(-steps / 200)) * np.exp(
            rng.normal(0, 0.5, len(steps))), 4)
    return job_of({"loss": (steps, loss), "step": (steps, steps)})


@pytest.mark.parametrize("kind", ["triplet", "rounded"])
def test_a_loss_that_is_mostly_exactly_zero_raises_nothing_at_any_tick(kind: str) -> None:
    """A block of points mostly 0.0 has no scale: against it, a triplet loss's 0.3 was
    "blown up" and five in a row critical (a stop), and a rounded log's 0.0001 a spike."""
    res = replay(zero_most_of_the_time(kind), Policy())
    assert [(h.rule, h.worst) for h in res.histories if h.worst.rank >= Severity.WARNING.rank
            ] == []


def test_a_loss_at_zero_that_goes_nan_or_explodes_is_still_critical() -> None:
    job = zero_most_of_the_time("rounded")
    loss = job.series["loss"]
    for bad in (np.nan, 1e13):  # beyond abs_limit: a blow-up whatever came before
        loss.value[-10:] = bad
        (f,) = judged(job, "divergence")
        assert f.severity is Severity.CRITICAL


def born_huge(seed: int, explode_at: int | None = None) -> Job:
    """A physics-informed loss in its own units (a held-out Lightning run: 1.4e13 at step
    0, ten-fold up and down over its first points, down to 13 by the end); with
    ``explode_at``, a thousand-fold up from there on."""
    rng = np.random.default_rng(seed)
    steps = np.arange(0.0, 950.0)
    loss = (1.4e13 * np.exp(-steps / 12) + 13) * np.exp(rng.normal(0, 0.8, len(steps)))
    if explode_at is not None:
        loss[explode_at:] = 1e3 * loss[explode_at]
    return job_of({"mean_loss": (steps, loss)})


def test_a_loss_born_beyond_abs_limit_in_its_own_units_is_no_blow_up() -> None:
    """abs_limit (1e12) was a magnitude no loss reaches unless it blew up: a run that starts
    at 1e13 was critical at its fifth point ("blew up and stayed up at step 0"). The limit
    is now the larger of abs_limit and blowup_factor times the run's first value."""
    for seed in range(5):
        res = replay(born_huge(seed), Policy())
        assert [(h.rule, h.worst) for h in res.histories
                if h.rule == "divergence" and h.worst.rank >= Severity.WARNING.rank] == [], seed


@pytest.mark.parametrize("at", [3, 400])
def test_a_loss_born_huge_that_explodes_is_still_critical(at: int) -> None:
    """Within its first block (no level to compare with yet) and later."""
    for seed in range(5):
        (f,) = judged(born_huge(seed, explode_at=at), "divergence")
        assert f.severity is Severity.CRITICAL, (seed, f.message)
        assert f.step is not None and at <= f.step <= at + 1, (seed, f.step)


def test_plateau_says_a_held_out_loss_past_its_best_is_not_a_run_that_never_learnt() -> None:
    (f,) = judged(overfit_run(val_end=0.55), "plateau")
    assert f.severity is Severity.INFO and f.evidence["kind"] == "converged"
    assert "past its best" in f.message and "not learning" not in f.message
    assert f.evidence["best_step"] == 9


def test_a_spike_on_the_first_few_evaluations_is_not_a_plateau() -> None:
    steps = np.arange(5.0) * 250
    # an LLM's first evaluations, the last three in a loss spike (3-10x for 1-3 points):
    # on five points the noise scale is the spike's own, so only the spike rule sees it
    loss = np.array([4.0, 3.9, 12.0, 13.0, 14.0])
    assert judged(job_of({"val_loss": (steps, loss)}), "plateau") == []
    # a climb that lasts longer than a spike is left to the divergence rule too
    steps = np.arange(9.0) * 250
    climb = np.array([4.0, 3.9, 3.8, 22.0, 25.0, 28.0, 31.0, 34.0, 37.0])
    assert judged(job_of({"val_loss": (steps, climb)}), "plateau") == []
    (div,) = judged(job_of({"val_loss": (steps, climb)}), "divergence")
    assert div.severity is Severity.CRITICAL


def test_a_held_out_loss_swinging_with_a_training_loss_that_barely_moves_is_no_overfit(
) -> None:
    """A linear evaluation at a high learning rate: its training loss swings 4-25 from
    epoch to epoch and ends 1.5 % lower, its held-out loss swings with it to 3 x its
    best. Not learning the training set better is no overfitting; the same held-out
    climb beside a training loss falling beyond its scatter is."""
    rng = np.random.default_rng(7)
    n = 120
    steps = np.arange(n, dtype=float)
    train = np.clip(12.0 + 6.0 * rng.standard_normal(n), 4.0, 25.0)
    val = np.concatenate([np.linspace(20.0, 5.0, 40), 5.0 + np.linspace(0.0, 12.0, 80)])
    val = val * (1 + 0.05 * rng.standard_normal(n))
    train[-3:] = np.median(train[38:41]) * 0.985  # 1.5 % below where the best was
    job = job_of({"loss": (steps, train), "val_loss": (steps, val)})
    assert judged(job, "overfit") == []
    falling = np.linspace(12.0, 3.0, n) * (1 + 0.02 * rng.standard_normal(n))
    job = job_of({"loss": (steps, falling), "val_loss": (steps, val)})
    (f,) = judged(job, "overfit")
    assert f.severity is Severity.WARNING
