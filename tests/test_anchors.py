"""Each anchor against its tool's documented behaviour, on hand-made series."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from trainguard.bench.anchors import (
    ANCHORS,
    ClearMLNonResponsive,
    DebuggerExplodingTensor,
    DebuggerLossNotDecreasing,
    DebuggerOverfit,
    DebuggerStalledTraining,
    KatibMedianStop,
    KerasEarlyStopping,
    KerasTerminateOnNaN,
    LightningEarlyStopping,
)
from trainguard.checker.model import Clock, Job, JobState, LogLine, Series

NAN, INF = float("nan"), float("inf")


def series(name: str, values: Sequence[float], steps: Sequence[float] | None = None,
           times: Sequence[float] | None = None) -> Series:
    steps = list(range(len(values))) if steps is None else steps
    times = [10.0 * s for s in steps] if times is None else times
    return Series(name, np.asarray(times, float), np.asarray(steps, float),
                  np.asarray(values, float))


def job(*ss: Series, clock: Clock = "elapsed", state: JobState = JobState.SUCCEEDED,
        end_time: float | None = None, id: str = "run") -> Job:
    last = max(float(s.time[-1]) for s in ss)
    if end_time is None and state.terminal:
        end_time = last
    return Job(id=id, clock=clock, state=state, start_time=0.0, end_time=end_time,
               series={s.name: s for s in ss})


# -- registry ---------------------------------------------------------------------------------


def test_registry_names_every_anchor_with_its_rule_kind() -> None:
    assert set(ANCHORS) == {
        "keras_early_stopping", "keras_terminate_on_nan", "lightning_early_stopping",
        "debugger_loss_not_decreasing", "debugger_stalled_training",
        "debugger_exploding_tensor", "debugger_overfit", "clearml_nonresponsive",
        "katib_median_stop"}
    for name, cls in ANCHORS.items():
        anchor = cls()
        assert anchor.name == name
        assert anchor.rule_kind in ("divergence", "plateau", "overfit", "stall")
        assert set(cls.kinds()) <= {"divergence", "plateau", "overfit", "stall"}
    # an early stop on the validation loss is the usual guard against overfitting
    assert "overfit" in KerasEarlyStopping.kinds() and "overfit" in LightningEarlyStopping.kinds()


def test_missing_metric_is_a_clear_error() -> None:
    j = job(series("train_loss", [3, 2, 1]))
    with pytest.raises(ValueError, match=r"job 'run'.*no series 'val_loss'.*train_loss"):
        LightningEarlyStopping().first_fire(j, "val_loss")


# -- Keras EarlyStopping ----------------------------------------------------------------------


def test_keras_patience_zero_stops_at_first_non_improving_epoch() -> None:
    fire = KerasEarlyStopping().first_fire(job(series("val_loss", [5, 4, 3, 3.5, 2])), "val_loss")
    assert fire is not None
    assert (fire.step, fire.time) == (3, 30)
    assert "did not improve" in fire.reason


def test_keras_equal_value_is_no_improvement_with_min_delta_zero() -> None:
    fire = KerasEarlyStopping().first_fire(job(series("val_loss", [5, 4, 4])), "val_loss")
    assert fire is not None and fire.step == 2


def test_keras_min_delta_requires_a_large_enough_drop() -> None:
    j = job(series("val_loss", [5, 4, 3.95, 3]))
    fire = KerasEarlyStopping(min_delta=0.1).first_fire(j, "val_loss")
    assert fire is not None and fire.step == 2
    assert KerasEarlyStopping().first_fire(j, "val_loss") is None


def test_keras_never_stops_on_epoch_zero_even_on_nan() -> None:
    assert KerasEarlyStopping().first_fire(job(series("val_loss", [NAN, 5, 4, 3])),
                                           "val_loss") is None
    fire = KerasEarlyStopping().first_fire(job(series("val_loss", [5, 4, NAN])), "val_loss")
    assert fire is not None and fire.step == 2


def test_keras_patience_counts_non_improving_epochs() -> None:
    j = job(series("val_loss", [5, 4, 4.1, 4.2, 3, 3.1, 3.2, 3.3]))
    fire = KerasEarlyStopping(patience=3).first_fire(j, "val_loss")
    assert fire is not None and fire.step == 7


def test_keras_monitors_val_loss_and_falls_back_to_the_loss_when_absent() -> None:
    both = job(series("val_loss", [5, 4, 3, 2]), series("train_loss", [5, 6, 7, 8]))
    assert KerasEarlyStopping().first_fire(both, "train_loss") is None  # val_loss improves
    only_train = job(series("train_loss", [5, 6, 7, 8]))
    fire = KerasEarlyStopping().first_fire(only_train, "train_loss")
    assert fire is not None and fire.step == 1
    assert "val_loss not logged; monitored train_loss" in fire.reason


def test_keras_without_val_loss_monitors_the_runs_own_validation_loss() -> None:
    """A YOLO or Trainer run names its validation loss otherwise: a Keras user would
    monitor that, not the training loss the label is about."""
    run = job(series("train/box_loss", [5, 6, 7, 8]), series("val/box_loss", [5, 4, 3, 2]),
              series("val/cls_loss", [5, 4, 5, 2]))
    assert KerasEarlyStopping().first_fire(run, "train/box_loss") is None  # val/box_loss falls
    fire = KerasEarlyStopping().first_fire(run, "val/cls_loss")  # the label's own, if one
    assert fire is not None and fire.step == 2
    assert "monitored the validation loss val/cls_loss" in fire.reason
    hf = job(series("loss", [5, 6, 7, 8]), series("eval_loss", [5, 4, 3, 2]))
    assert KerasEarlyStopping().first_fire(hf, "loss") is None


def test_keras_checks_each_logged_value_as_one_epoch_on_step_logs() -> None:
    s = series("val_loss", [5, 4, 4.5], steps=[0, 125, 250], times=[0, 200, 410])
    fire = KerasEarlyStopping().first_fire(job(s), "val_loss")
    assert fire is not None and (fire.step, fire.time) == (250, 410)


def test_keras_step_clock_has_no_time() -> None:
    fire = KerasEarlyStopping().first_fire(job(series("val_loss", [2, 3]), clock="step"),
                                           "val_loss")
    assert fire is not None and fire.time is None and fire.step == 1


# -- Keras TerminateOnNaN ---------------------------------------------------------------------


def test_terminate_on_nan_stops_at_first_nan_or_inf_batch() -> None:
    fire = KerasTerminateOnNaN().first_fire(job(series("loss", [3, 2, INF, NAN])), "loss")
    assert fire is not None and fire.step == 2
    fire = KerasTerminateOnNaN().first_fire(job(series("loss", [3, 2, 1, NAN])), "loss")
    assert fire is not None and fire.step == 3
    assert KerasTerminateOnNaN().first_fire(job(series("loss", [3, 2, 1])), "loss") is None


def test_terminate_on_nan_reads_the_training_loss_not_val_loss() -> None:
    j = job(series("loss", [3, 2, 1]), series("val_loss", [3, NAN, 1]))
    assert KerasTerminateOnNaN().first_fire(j, "val_loss") is None
    fire = KerasTerminateOnNaN().first_fire(job(series("train_loss", [3, NAN])), "train_loss")
    assert fire is not None and "loss not logged" in fire.reason


def test_terminate_on_nan_without_a_loss_watches_the_training_losses_not_validation() -> None:
    """A YOLO results.csv: no ``loss``, three training components and their validation
    twins. NaN in validation only is not what Keras' ``logs["loss"]`` would hold."""
    train = [series(f"train/{c}_loss", [3, 2, 1, 1]) for c in ("box", "cls", "dfl")]
    val = series("val/box_loss", [3, NAN, NAN, 1])
    assert KerasTerminateOnNaN().first_fire(job(*train, val), "val/box_loss") is None
    train[1] = series("train/cls_loss", [3, 2, INF, 1])
    fire = KerasTerminateOnNaN().first_fire(job(*train, val), "val/box_loss")
    assert fire is not None and fire.step == 2 and "train/cls_loss" in fire.reason


# -- Lightning EarlyStopping ------------------------------------------------------------------


def test_lightning_stops_immediately_on_non_finite() -> None:
    fire = LightningEarlyStopping().first_fire(job(series("val_loss", [5, 4, NAN, 3])),
                                               "val_loss")
    assert fire is not None and fire.step == 2 and "not finite" in fire.reason
    fire = LightningEarlyStopping().first_fire(job(series("val_loss", [INF, 4])), "val_loss")
    assert fire is not None and fire.step == 0


def test_lightning_stops_after_three_non_improving_checks() -> None:
    fire = LightningEarlyStopping().first_fire(
        job(series("val_loss", [5, 4, 4.5, 4.2, 4.1, 3])), "val_loss")
    assert fire is not None and fire.step == 4
    assert "did not improve in the last 3 checks" in fire.reason


def test_lightning_improvement_resets_the_count() -> None:
    j = job(series("val_loss", [5, 4, 4.5, 4.2, 3.9, 4.0, 4.0, 3.95, 2]))
    fire = LightningEarlyStopping().first_fire(j, "val_loss")
    assert fire is not None and fire.step == 7
    assert LightningEarlyStopping().first_fire(job(series("val_loss", [5, 4, 3, 2])),
                                               "val_loss") is None


def test_lightning_thresholds_when_set() -> None:
    j = job(series("val_loss", [5, 4, 9, 3]))
    fire = LightningEarlyStopping(divergence_threshold=8).first_fire(j, "val_loss")
    assert fire is not None and fire.step == 2 and "divergence threshold" in fire.reason
    fire = LightningEarlyStopping(stopping_threshold=3.5).first_fire(j, "val_loss")
    assert fire is not None and fire.step == 3


# -- Debugger LossNotDecreasing ---------------------------------------------------------------


def test_loss_not_decreasing_reproduces_the_documented_example() -> None:
    # saved every 3 steps: at step 21 the loss is compared with step 9; the next
    # check is step 33 (31 and 32 are not saved)
    steps = list(range(9, 61, 3))
    flat = job(series("loss", [2.0] * len(steps), steps=steps))
    fire = DebuggerLossNotDecreasing().first_fire(flat, "loss")
    assert fire is not None and fire.step == 21 and "vs step 9 " in fire.reason

    # decreasing 2 % per saved point up to step 24, flat after: the check at 33
    # (vs 21) still sees a decrease, the next one at 45 (vs 33) does not
    values = [2.0 * 0.98 ** min(i, 5) for i in range(len(steps))]
    fire = DebuggerLossNotDecreasing().first_fire(job(series("loss", values, steps=steps)),
                                                  "loss")
    assert fire is not None and fire.step == 45 and "vs step 33 " in fire.reason


def test_loss_not_decreasing_needs_a_decrease_of_diff_percent_per_window() -> None:
    steps = list(range(0, 101))
    fast = [3.0 * 0.999 ** s for s in steps]  # about 1 % per 10 steps: enough
    assert DebuggerLossNotDecreasing().first_fire(job(series("loss", fast)), "loss") is None
    slow = [3.0 * 0.99999 ** s for s in steps]  # 0.01 % per 10 steps: too little
    fire = DebuggerLossNotDecreasing().first_fire(job(series("loss", slow)), "loss")
    assert fire is not None and fire.step == 10 and "decreased by only" in fire.reason


def test_loss_not_decreasing_tolerates_rises_up_to_increase_threshold() -> None:
    steps = list(range(0, 41))
    # step 10 vs 0: +4 % (within increase_threshold_percent=5), then it decreases again
    recovers = [1.0] * 10 + [1.04] + [0.9 * 0.99 ** (s - 11) for s in range(11, 41)]
    assert DebuggerLossNotDecreasing().first_fire(job(series("loss", recovers, steps)),
                                                  "loss") is None
    stays = [1.0] * 10 + [1.04] * 31  # ... but staying there is a flat window at step 20
    fire = DebuggerLossNotDecreasing().first_fire(job(series("loss", stays, steps)), "loss")
    assert fire is not None and fire.step == 20
    jump = [1.0] * 10 + [1.2] * 31  # step 10 vs 0: +20 % > 5 %
    fire = DebuggerLossNotDecreasing().first_fire(job(series("loss", jump, steps)), "loss")
    assert fire is not None and fire.step == 10 and "increased by 20%" in fire.reason


def test_loss_not_decreasing_reads_the_mean_at_a_step() -> None:
    # two workers log each step; their mean decreases although one of them does not
    steps = [s for s in range(0, 21) for _ in (0, 1)]
    values = [v for s in range(0, 21) for v in (2.0, 2.0 - 0.05 * s)]
    j = job(series("loss", values, steps=steps))
    fire = DebuggerLossNotDecreasing().first_fire(j, "loss")
    assert fire is None


# -- Debugger ExplodingTensor -----------------------------------------------------------------


def test_exploding_tensor_fires_on_nan_or_inf_in_any_loss() -> None:
    j = job(series("val_loss", [3, 2, 1, 1, 1, NAN]), series("train_loss", [3, 2, 1, INF, 1, 1]))
    fire = DebuggerExplodingTensor().first_fire(j, "val_loss")
    assert fire is not None and fire.step == 3 and "train_loss=inf" in fire.reason
    fire = DebuggerExplodingTensor(only_nan=True).first_fire(j, "val_loss")
    assert fire is not None and fire.step == 5
    assert DebuggerExplodingTensor().first_fire(job(series("val_loss", [3, 2])),
                                                "val_loss") is None


# -- watchdogs: Debugger StalledTrainingRule and ClearML --------------------------------------


def running(times: Sequence[float]) -> Job:
    return job(series("loss", [1.0] * len(times), times=times), state=JobState.RUNNING)


def test_stalled_rule_fires_once_1800_s_have_passed_since_the_last_tensor() -> None:
    fire = DebuggerStalledTraining().first_fire(running(range(0, 1001, 10)), "loss")
    assert fire is not None and fire.time is not None
    assert 1800 < fire.time - 1000 <= 1800 + 60  # checked once a minute
    assert fire.step == 100  # the last step logged
    exact = DebuggerStalledTraining(interval_s=1).first_fire(running([0, 1000]), "loss")
    assert exact is not None and exact.time == 1000 + 1801


def test_stalled_rule_ignores_a_1799_s_gap_in_a_finished_run() -> None:
    assert DebuggerStalledTraining(interval_s=1).first_fire(
        job(series("loss", [1, 1, 1], times=[0, 1000, 2799])), "loss") is None
    fire = DebuggerStalledTraining(interval_s=1).first_fire(
        job(series("loss", [1, 1, 1], times=[0, 1000, 3000])), "loss")
    assert fire is not None and fire.time == 2801 and fire.step == 1


def test_watchdogs_are_silent_on_a_step_clock_and_on_a_healthy_finished_run() -> None:
    s = series("loss", [1.0] * 100)
    assert DebuggerStalledTraining().first_fire(job(s, clock="step", state=JobState.RUNNING),
                                                "loss") is None
    assert ClearMLNonResponsive().first_fire(job(s), "loss") is None


def test_clearml_checks_every_900_s_for_7200_s_without_any_update() -> None:
    fire = ClearMLNonResponsive().first_fire(running(range(0, 1001, 10)), "loss")
    assert fire is not None and fire.time == 9000  # first 900 s tick past 1000 + 7200
    with_log = running(range(0, 1001, 10))
    with_log.logs = [LogLine(5000.0, "still alive")]
    fire = ClearMLNonResponsive().first_fire(with_log, "loss")
    assert fire is not None and fire.time == 12600  # log lines count as updates
    assert DebuggerStalledTraining().first_fire(with_log, "loss") is not None  # tensors only


# -- Katib median stop ------------------------------------------------------------------------


def peers(*curves: Sequence[float]) -> list[Job]:
    return [job(series("val_loss", c), id=f"peer{i}") for i, c in enumerate(curves)]


def test_katib_stops_a_trial_worse_than_the_others_after_four_reports() -> None:
    group = peers([4, 3, 2, 1, 0.5], [5, 4, 3, 2, 1], [3, 2, 1, 0.5, 0.4])  # means 2.5, 3.5, 1.625
    bad = job(series("val_loss", [5, 4.5, 4, 3.8, 1, 0.1]))
    fire = KatibMedianStop().first_fire(bad, "val_loss", group)
    assert fire is not None and fire.step == 3 and "3.8" in fire.reason
    good = job(series("val_loss", [3, 2, 1, 0.5]))
    assert KatibMedianStop().first_fire(good, "val_loss", group) is None


def test_katib_needs_three_completed_peers() -> None:
    bad = job(series("val_loss", [9, 9, 9, 9]))
    two = peers([1, 1, 1, 1], [1, 1, 1, 1])
    assert KatibMedianStop().first_fire(bad, "val_loss", two) is None
    failed = job(series("val_loss", [1, 1, 1, 1]), id="failed", state=JobState.FAILED)
    assert KatibMedianStop().first_fire(bad, "val_loss", [*two, failed]) is None
    same = job(series("val_loss", [9, 9, 9, 9]), id="run")  # the trial itself is no peer
    assert KatibMedianStop().first_fire(bad, "val_loss", [*two, same]) is None
    assert KatibMedianStop().first_fire(bad, "val_loss", [*two, *peers([1, 1, 1, 1])])


def test_katib_judges_once_at_the_fourth_report_with_the_running_best() -> None:
    group = peers([2, 2, 2, 2], [2, 2, 2, 2], [2, 2, 2, 2])
    late_blowup = job(series("val_loss", [3, 1, 3, 3, 9, 9, 9]))  # best 1 by report 4
    assert KatibMedianStop().first_fire(late_blowup, "val_loss", group) is None


def test_katib_uses_the_mean_of_peer_averages_as_its_code_does() -> None:
    group = peers([1, 1, 1, 1], [1, 1, 1, 1], [10, 10, 10, 10])  # median 1, mean 4
    trial = job(series("val_loss", [3, 3, 3, 3]))
    assert KatibMedianStop().first_fire(trial, "val_loss", group) is None


# -- Debugger Overfit -------------------------------------------------------------------------


def test_overfit_fires_when_validation_is_more_than_ten_percent_above_training() -> None:
    train = series("loss", [1.0, 0.8, 0.6, 0.5, 0.4, 0.3])
    # 1.05 x the training loss at steps 0-2, then 1.2 x at step 3: patience 1 fires there
    val = series("val_loss", [1.05, 0.84, 0.63, 0.6, 0.6, 0.6])
    fire = DebuggerOverfit().first_fire(job(train, val), "val_loss")
    assert fire is not None and fire.step == 3
    assert "ratio_threshold 0.1" in fire.reason and "val_loss" in fire.reason


def test_overfit_compares_with_the_mean_training_loss_since_the_last_evaluation() -> None:
    # dense training loss, an evaluation every 4 steps; the training mean over steps 5-8 is
    # (1 + 1 + 1 + 1) / 4 = 1, so a validation loss of 1.09 passes and 1.11 fires
    train = series("train/box_loss", [3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1])
    val = series("val/box_loss", [3.2, 1.09, 1.11], steps=[4, 8, 12])
    fire = DebuggerOverfit().first_fire(job(train, val), "val/box_loss")
    assert fire is not None and fire.step == 12
    assert DebuggerOverfit(ratio_threshold=0.2).first_fire(job(train, val), "x") is None


def test_overfit_patience_counts_consecutive_evaluations() -> None:
    train = series("train_loss", [1.0] * 6)
    val = series("val_loss", [1.2, 1.0, 1.2, 1.2, 1.0, 1.0])
    fire = DebuggerOverfit(patience=2).first_fire(job(train, val), "val_loss")
    assert fire is not None and fire.step == 3
    assert DebuggerOverfit(start_step=4).first_fire(job(train, val), "val_loss") is None


def test_overfit_needs_a_validation_loss_with_its_training_twin() -> None:
    with pytest.raises(ValueError, match=r"no validation loss with a training loss"):
        DebuggerOverfit().first_fire(job(series("loss", [1, 2, 3])), "loss")
    # an ``interval`` is no validation, and ``eval_loss`` pairs with ``loss``
    j = job(series("interval_loss", [1, 1]), series("loss", [1.0, 1.0]),
            series("eval_loss", [1.0, 2.0]))
    fire = DebuggerOverfit().first_fire(j, "eval_loss")
    assert fire is not None and "eval_loss" in fire.reason and fire.step == 1
