"""Today's tools, replayed over a finished run: where each would first have fired.

Each anchor reproduces one tool's documented behaviour with that tool's own
defaults (the source of every default is cited beside it; see
``../shared/anchors.md``). ``first_fire`` walks the run's records in order, as the
tool would have seen them live, and returns the first record (or watcher tick) at
which the tool would have stopped the job or raised its alert, or ``None``.

Mapping a tool's notion of time onto our logs:

* Epoch- or validation-check tools (Keras and Lightning ``EarlyStopping``) are
  checked once per logged value of the monitored metric: on a step-level log each
  record stands for one epoch-end (or validation) check.
* Batch-level tools (Keras ``TerminateOnNaN``, Debugger tensor rules) see every record.
* Watchdogs (Debugger ``StalledTrainingRule``, ClearML's non-responsive watchdog)
  tick at their own interval on the run's time axis and fire when
  ``now - last_update > threshold``. A finished run is watched up to its last
  record only; a job still RUNNING with no end is watched past its end, so a log
  that simply stops fires once the threshold has passed. On a step clock there
  are no seconds and they stay silent.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from trainguard.checker.cost import NOT_PROGRESS
from trainguard.checker.metrics import loss_like
from trainguard.checker.model import FloatArray, Job, JobState, Series

RuleKind = Literal["divergence", "plateau", "overfit", "stall", "slowdown"]


@dataclass(frozen=True)
class Fire:
    """Where a tool first fired: the run's step then, its time (None on a step clock), why."""

    step: float
    time: float | None
    reason: str


class Anchor(ABC):
    name: ClassVar[str]
    #: The trainguard rule this tool competes with.
    rule_kind: ClassVar[RuleKind]
    #: Other rules it competes with: a failure it is also used against (an early stop on
    #: the validation loss is the usual guard against overfitting).
    also: ClassVar[tuple[RuleKind, ...]] = ()

    @classmethod
    def kinds(cls) -> tuple[RuleKind, ...]:
        return (cls.rule_kind, *cls.also)

    @abstractmethod
    def first_fire(self, job: Job, metric: str, peers: list[Job] | None = None) -> Fire | None:
        """Where this tool would first have fired on ``job``, watching ``metric``."""


# -- helpers ----------------------------------------------------------------------------------


def _series(job: Job, name: str) -> Series:
    s = job.series.get(name)
    if s is None or not len(s):
        have = ", ".join(sorted(k for k, v in job.series.items() if len(v))) or "none"
        raise ValueError(f"job {job.id!r}: no series {name!r} to watch (series: {have})")
    return s


def _monitored(job: Job, preferred: str, metric: str) -> tuple[Series, str]:
    """The tool's own default monitor when the run logs it, else ``metric`` (and a note)."""
    s = job.series.get(preferred)
    if s is not None and len(s):
        return s, ""
    return _series(job, metric), f" ({preferred} not logged; monitored {metric} instead)"


def _step(s: Series, i: int) -> float:
    """The step of record ``i``; its index when the record carried no step."""
    v = float(s.step[i])
    return v if math.isfinite(v) else float(i)


def _time(job: Job, s: Series, i: int) -> float | None:
    if job.clock == "step":
        return None
    t = float(s.time[i])
    return t if math.isfinite(t) else None


def _fire(job: Job, s: Series, i: int, reason: str) -> Fire:
    return Fire(step=_step(s, i), time=_time(job, s, i), reason=reason)


# -- Keras ------------------------------------------------------------------------------------


class KerasEarlyStopping(Anchor):
    """keras.callbacks.EarlyStopping with its defaults, mode min.

    Source: keras-team/keras, keras/src/callbacks/early_stopping.py (``on_epoch_end``).
    Per check: ``wait += 1``; an improvement (``current - min_delta < best`` with
    min_delta negated in min mode) sets best and, if it also beats ``baseline``,
    resets ``wait`` to 0; otherwise training stops when ``wait >= patience and
    epoch > 0``. So with patience=0 the first non-improving epoch after epoch 0
    stops; a NaN never improves (the comparison is False), so it stops too, except
    on epoch 0.
    """

    name = "keras_early_stopping"
    rule_kind = "plateau"
    also = ("overfit",)

    def __init__(
        self,
        monitor: str = "val_loss",  # early_stopping.py: monitor="val_loss"
        min_delta: float = 0.0,  # early_stopping.py: min_delta=0 (absolute)
        patience: int = 0,  # early_stopping.py: patience=0 epochs
        baseline: float | None = None,  # early_stopping.py: baseline=None
        start_from_epoch: int = 0,  # early_stopping.py: start_from_epoch=0
    ) -> None:
        self.monitor = monitor
        self.min_delta = abs(min_delta)
        self.patience = patience
        self.baseline = baseline
        self.start_from_epoch = start_from_epoch

    def _validation_loss(self, job: Job, metric: str) -> tuple[Series, str]:
        """``val_loss`` when logged; else the run's own validation loss (``metric`` when it
        is one, else the first by name: ``eval_loss``, ``val/box_loss``), as a Keras user
        would name it to monitor; else ``metric``."""
        s = job.series.get(self.monitor)
        if s is not None and len(s):
            return s, ""
        val = [k for k, v in sorted(job.series.items())
               if len(v) and "loss" in k.lower() and _is_validation(k)]
        if val:
            name = metric if metric in val else val[0]
            return job.series[name], (f" ({self.monitor} not logged; monitored the validation "
                                      f"loss {name})")
        return _monitored(job, self.monitor, metric)

    def _improves(self, current: float, reference: float) -> bool:
        # mode min: monitor_op is less and min_delta is negated
        return current + self.min_delta < reference

    def first_fire(self, job: Job, metric: str, peers: list[Job] | None = None) -> Fire | None:
        s, note = self._validation_loss(job, metric)
        best, wait = math.inf, 0
        for epoch, value in enumerate(s.value):
            current = float(value)
            if epoch < self.start_from_epoch:
                continue
            wait += 1
            if self._improves(current, best):
                best = current
                if self.baseline is None or self._improves(current, self.baseline):
                    wait = 0
                continue
            if wait >= self.patience and epoch > 0:
                return _fire(job, s, epoch, (
                    f"Keras EarlyStopping: {s.name}={current:.6g} did not improve on best "
                    f"{best:.6g} for {wait} check(s) (patience={self.patience}, "
                    f"min_delta={self.min_delta}){note}"))
        return None


class KerasTerminateOnNaN(Anchor):
    """keras.callbacks.TerminateOnNaN: stop at the first batch whose loss is NaN or inf.

    Source: keras-team/keras, keras/src/callbacks/terminate_on_nan.py (``on_batch_end``
    reads ``logs["loss"]``, the training loss, and tests ``np.isnan or np.isinf``). A run
    that logs no ``loss`` is watched on its training losses (never a validation one).
    """

    name = "keras_terminate_on_nan"
    rule_kind = "divergence"

    def __init__(self, monitor: str = "loss") -> None:  # terminate_on_nan.py: logs.get("loss")
        self.monitor = monitor

    def first_fire(self, job: Job, metric: str, peers: list[Job] | None = None) -> Fire | None:
        watched, note = self._training_loss(job, metric)
        first: Fire | None = None
        for s in watched:
            bad = np.flatnonzero(~np.isfinite(s.value))
            if not len(bad):
                continue
            i = int(bad[0])
            f = _fire(job, s, i, f"Keras TerminateOnNaN: {s.name}={s.value[i]} at batch {i}{note}")
            if first is None or f.step < first.step:
                first = f
        return first

    def _training_loss(self, job: Job, metric: str) -> tuple[list[Series], str]:
        """``logs["loss"]`` is the training loss: the run's ``loss`` when it logs one, else
        its training losses (a total NaN is any component NaN: YOLO's box, cls and dfl),
        else ``metric``; never a validation loss, which Keras keeps apart."""
        s = job.series.get(self.monitor)
        if s is not None and len(s):
            return [s], ""
        train = [v for k, v in sorted(job.series.items())
                 if len(v) and "loss" in k.lower() and not _is_validation(k)]
        if train:
            names = ", ".join(v.name for v in train)
            return train, f" ({self.monitor} not logged; watched the training loss {names})"
        s, note = _monitored(job, self.monitor, metric)
        return [s], note


# -- PyTorch Lightning ------------------------------------------------------------------------


class LightningEarlyStopping(Anchor):
    """lightning.pytorch.callbacks.EarlyStopping with its defaults, mode min.

    Source: Lightning-AI/pytorch-lightning, src/lightning/pytorch/callbacks/early_stopping.py,
    ``_evaluate_stopping_criteria``, in this order: a non-finite value stops
    (check_finite); stopping_threshold; divergence_threshold; an improvement
    (``current - min_delta < best``, min_delta negated in min mode) resets
    ``wait_count``; otherwise ``wait_count += 1`` and it stops at ``>= patience``.
    ``monitor`` has no default there: it is the metric the caller names.
    """

    name = "lightning_early_stopping"
    rule_kind = "plateau"
    also = ("overfit",)

    def __init__(
        self,
        min_delta: float = 0.0,  # early_stopping.py: min_delta=0.0
        patience: int = 3,  # early_stopping.py: patience=3 validation checks
        check_finite: bool = True,  # early_stopping.py: check_finite=True
        stopping_threshold: float | None = None,  # early_stopping.py: None
        divergence_threshold: float | None = None,  # early_stopping.py: None
    ) -> None:
        self.min_delta = -min_delta  # mode min: ``self.min_delta *= -1``
        self.patience = patience
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold

    def first_fire(self, job: Job, metric: str, peers: list[Job] | None = None) -> Fire | None:
        s = _series(job, metric)
        best, wait = math.inf, 0
        for i, value in enumerate(s.value):
            current = float(value)
            reason = ""
            if self.check_finite and not math.isfinite(current):
                reason = f"{metric}={current} is not finite"
            elif self.stopping_threshold is not None and current < self.stopping_threshold:
                reason = f"stopping threshold reached: {metric}={current:.6g}"
            elif self.divergence_threshold is not None and -current < -self.divergence_threshold:
                reason = f"divergence threshold reached: {metric}={current:.6g}"
            elif current - self.min_delta < best:
                best, wait = current, 0
            else:
                wait += 1
                if wait >= self.patience:
                    reason = (f"{metric} did not improve in the last {wait} checks "
                              f"(best {best:.6g}, patience={self.patience})")
            if reason:
                return _fire(job, s, i, f"Lightning EarlyStopping: {reason}")
        return None


# -- SageMaker Debugger -----------------------------------------------------------------------


def _mean_by_step(s: Series) -> tuple[FloatArray, FloatArray]:
    """Unique logged steps and the mean value at each (the rule reads a step's mean)."""
    ok = np.isfinite(s.step)
    steps, inverse = np.unique(s.step[ok], return_inverse=True)
    sums = np.bincount(inverse, weights=s.value[ok], minlength=len(steps))
    counts = np.bincount(inverse, minlength=len(steps))
    return steps.astype(np.float64), (sums / counts).astype(np.float64)


class DebuggerLossNotDecreasing(Anchor):
    """SageMaker Debugger built-in rule LossNotDecreasing with its defaults.

    Source: awsdocs/amazon-sagemaker-developer-guide, doc_source/debugger-built-in-rules.md
    (LossNotDecreasing) and awslabs/sagemaker-debugger docs/rules/README.md: the
    rule is evaluated every ``num_steps``; at a check it compares the (mean) loss
    at the current step with the loss at the newest saved step at least
    ``num_steps`` behind it; the next check is the first saved step at least
    ``num_steps`` after this one (saved every 3 steps: step 21 is compared with
    step 9, and the next check is step 33). It fires when the loss went down by
    less than ``diff_percent`` % (a flat loss included), or, when it went up, by
    more than ``increase_threshold_percent`` % (the documented meaning of that
    parameter: the most the loss may rise "in case loss has been increasing"; so
    a rise of up to 5 % passes a check that a flat loss fails). The rule's source
    (smdebug/rules/generic/loss_not_decreasing.py) was not available to read;
    this follows the documentation.
    """

    name = "debugger_loss_not_decreasing"
    rule_kind = "plateau"

    def __init__(
        self,
        num_steps: int = 10,  # debugger-built-in-rules.md: num_steps default 10
        diff_percent: float = 0.1,  # debugger-built-in-rules.md: diff_percent default 0.1 (%)
        increase_threshold_percent: float = 5.0,  # same page: default 5 (%)
    ) -> None:
        self.num_steps = num_steps
        self.diff_percent = diff_percent
        self.increase_threshold_percent = increase_threshold_percent

    def first_fire(self, job: Job, metric: str, peers: list[Job] | None = None) -> Fire | None:
        s = _series(job, metric)
        steps, values = _mean_by_step(s)
        last_check: float | None = None
        for i, step in enumerate(steps):
            if step < steps[0] + self.num_steps:
                continue  # nothing saved num_steps behind yet
            if last_check is not None and step < last_check + self.num_steps:
                continue
            last_check = float(step)
            j = int(np.searchsorted(steps, step - self.num_steps, side="right")) - 1
            prev, cur = float(values[j]), float(values[i])
            # percentages of the earlier loss; an earlier loss of exactly 0 leaves the
            # absolute change (a percentage of nothing is undefined)
            scale = abs(prev) or 1.0
            if cur <= prev:  # a flat loss did not decrease: it fails diff_percent
                change = (prev - cur) / scale * 100
                fired = change < self.diff_percent
                what = f"decreased by only {change:.4g}% (< diff_percent {self.diff_percent}%)"
            else:
                change = (cur - prev) / scale * 100
                fired = change > self.increase_threshold_percent
                what = (f"increased by {change:.4g}% (> increase_threshold_percent "
                        f"{self.increase_threshold_percent}%)")
            if fired:
                k = int(np.flatnonzero(s.step == step)[-1])
                return _fire(job, s, k, (
                    f"Debugger LossNotDecreasing: {metric} at step {step:g} ({cur:.6g}) vs step "
                    f"{steps[j]:g} ({prev:.6g}) {what}"))
        return None


class DebuggerExplodingTensor(Anchor):
    """SageMaker Debugger built-in rule ExplodingTensor: a NaN or infinite value.

    Source: awsdocs/amazon-sagemaker-developer-guide, doc_source/debugger-built-in-rules.md
    (ExplodingTensor; only_nan=False treats both NaN and infinity as exploding). With
    no regex or collection it inspects every saved tensor; here that is every loss
    series of the run plus ``metric``.
    """

    name = "debugger_exploding_tensor"
    rule_kind = "divergence"

    def __init__(self, only_nan: bool = False) -> None:  # built-in rules page: only_nan False
        self.only_nan = only_nan

    def first_fire(self, job: Job, metric: str, peers: list[Job] | None = None) -> Fire | None:
        watched = {s.name: s for s in loss_like(job)}
        watched[metric] = _series(job, metric)
        first: Fire | None = None
        for s in watched.values():
            bad = np.isnan(s.value) if self.only_nan else ~np.isfinite(s.value)
            hits = np.flatnonzero(bad)
            if not len(hits):
                continue
            i = int(hits[0])
            f = _fire(job, s, i, f"Debugger ExplodingTensor: {s.name}={s.value[i]}")
            if first is None or (f.step, f.time or 0.0) < (first.step, first.time or 0.0):
                first = f
        return first


#: Words that mark a validation series and, in the same place, its training twin:
#: ``val_loss``/``loss``, ``val/box_loss``/``train/box_loss``, ``eval_loss``/``loss``.
_VALIDATION = ("validation", "valid", "val", "eval", "test")
_TRAINING = ("train", "training", "")


def _validation_word(name: str) -> tuple[int, str] | None:
    """Where a validation word starts a part of ``name`` (``val/``, ``eval_``), and which."""
    low = name.lower()
    for word in _VALIDATION:
        at = low.find(word)
        if at >= 0 and (at == 0 or not name[at - 1].isalnum()):
            return at, word
    return None


def _is_validation(name: str) -> bool:
    return _validation_word(name) is not None


def _loss_pairs(job: Job) -> list[tuple[Series, Series]]:
    """(validation, training) loss series of one quantity, as logged side by side."""
    pairs = []
    names = {k: s for k, s in job.series.items() if len(s)}
    for name, val in sorted(names.items()):
        if "loss" not in name.lower():
            continue
        found = _validation_word(name)  # the word at the start of a name part only
        if found is None:
            continue
        at, word = found
        head, tail = name[:at], name[at + len(word):]
        twins = [head + t + tail for t in _TRAINING if t] + [
            (head + tail.lstrip("_/.-")) or ""]
        train = next((names[t] for t in twins if t in names and t != name), None)
        if train is not None:
            pairs.append((val, train))
    return pairs


class DebuggerOverfit(Anchor):
    """SageMaker Debugger built-in rule Overfit with its defaults.

    Source: awsdocs/amazon-sagemaker-developer-guide, doc_source/debugger-built-in-rules.md
    (Overfit): from ``start_step`` (0) it compares the mean validation loss with the
    mean training loss at each step; when ``(val - train) / train`` exceeds
    ``ratio_threshold`` (0.1) for ``patience`` (1) steps the rule fires. With no
    tensor_regex every loss tensor logged in both modes is compared; here, every
    validation loss with a training twin of the same name (``val_loss``/``loss``,
    ``val/box_loss``/``train/box_loss``). Our logs record the two at different steps,
    so at each validation record the training side is the mean of the training loss
    logged since the previous validation record (the latest one when none was).
    The rule's source was not available to read; this follows the documentation.
    """

    name = "debugger_overfit"
    rule_kind = "overfit"

    def __init__(
        self,
        start_step: int = 0,  # debugger-built-in-rules.md (Overfit): start_step default 0
        patience: int = 1,  # same page: patience default 1
        ratio_threshold: float = 0.1,  # same page: ratio_threshold default 0.1
    ) -> None:
        self.start_step = start_step
        self.patience = patience
        self.ratio_threshold = ratio_threshold

    def first_fire(self, job: Job, metric: str, peers: list[Job] | None = None) -> Fire | None:
        pairs = _loss_pairs(job)
        if not pairs:
            have = ", ".join(sorted(k for k, v in job.series.items() if len(v))) or "none"
            raise ValueError(f"job {job.id!r}: no validation loss with a training loss "
                             f"beside it (series: {have})")
        first: Fire | None = None
        for val, train in pairs:
            f = self._first(job, val, train)
            if f is not None and (first is None or f.step < first.step):
                first = f
        return first

    def _first(self, job: Job, val: Series, train: Series) -> Fire | None:
        ok = np.isfinite(train.value) & np.isfinite(train.step)
        t_steps, t_values = train.step[ok], train.value[ok]
        over, previous = 0, -math.inf
        for i in range(len(val)):
            step, v = float(val.step[i]), float(val.value[i])
            if not (math.isfinite(step) and step >= self.start_step and math.isfinite(v)):
                continue
            since = (t_steps > previous) & (t_steps <= step)
            previous = step
            if since.any():
                mean_train = float(np.mean(t_values[since]))
            else:
                seen = np.flatnonzero(t_steps <= step)
                if not len(seen):
                    continue
                mean_train = float(t_values[seen[-1]])
            if mean_train == 0:
                continue  # a ratio to nothing is undefined
            ratio = (v - mean_train) / abs(mean_train)
            over = over + 1 if ratio > self.ratio_threshold else 0
            if over >= self.patience:
                return _fire(job, val, i, (
                    f"Debugger Overfit: {val.name}={v:.6g} is {ratio:.3g} above the mean "
                    f"{train.name} {mean_train:.6g} (> ratio_threshold {self.ratio_threshold}) "
                    f"for {over} step(s) (patience={self.patience})"))
        return None


# -- watchdogs: no new data for too long ------------------------------------------------------


class _Watchdog(Anchor):
    """Ticks every ``interval_s`` from the job's start; fires when ``now - last > threshold_s``."""

    rule_kind = "stall"
    tool: ClassVar[str]

    def __init__(self, threshold_s: float, interval_s: float) -> None:
        self.threshold_s = threshold_s
        self.interval_s = interval_s

    def _update_times(self, job: Job) -> FloatArray:
        """When the tool saw the job update: every record of every series."""
        parts = [s.time for s in job.series.values()]
        t = np.concatenate(parts) if parts else np.empty(0)
        return np.unique(t[np.isfinite(t)])

    def first_fire(self, job: Job, metric: str, peers: list[Job] | None = None) -> Fire | None:
        if job.clock == "step":
            return None  # no seconds to count
        times = self._update_times(job)
        if not len(times):
            return None
        origin = job.start_time if job.start_time is not None else float(times[0])
        # a finished run is watched up to its last record; a running one with no end, on
        # and on: its open gap after the last record counts too
        still_running = job.end_time is None and not job.state.terminal
        ends = list(times[1:]) + ([math.inf] if still_running else [])
        for last, nxt in zip(times, ends, strict=False):
            # the first tick strictly past last + threshold; a record at a tick's own
            # time is already seen by that tick
            k = max(math.floor((last + self.threshold_s - origin) / self.interval_s) + 1, 1)
            tick = origin + k * self.interval_s
            if tick < nxt:
                return Fire(step=_step_before(job, float(last)), time=tick, reason=(
                    f"{self.tool}: no update for {tick - last:.0f} s "
                    f"(> {self.threshold_s:g} s, checked every {self.interval_s:g} s)"))
        return None


def _step_before(job: Job, t: float) -> float:
    """The furthest step the job had logged by time ``t`` (0 when none was)."""
    best = 0.0
    for s in job.series.values():
        seen = s.step[(s.time <= t) & np.isfinite(s.step)]
        if len(seen):
            best = max(best, float(seen.max()))
    return best


class DebuggerStalledTraining(_Watchdog):
    """SageMaker Debugger StalledTrainingRule: no new tensor for ``threshold`` seconds.

    Source: awsdocs/amazon-sagemaker-developer-guide, doc_source/debugger-built-in-rules.md
    (StalledTrainingRule: threshold default 1800 s; stop_training_on_fire False, so
    it alerts). How often the rule container looks is not documented; we assume once
    a minute, the scan interval of Debugger's profiler rules
    (awslabs/sagemaker-debugger-rulesconfig, smdebug_rulesconfig/profiler_rules/rules.py).
    """

    name = "debugger_stalled_training"
    tool = "Debugger StalledTrainingRule"

    def __init__(self, threshold_s: float = 1800.0, interval_s: float = 60.0) -> None:
        super().__init__(threshold_s, interval_s)

    def _update_times(self, job: Job) -> FloatArray:
        """Tensors the hook saved: the training records, not a job's heartbeat log lines."""
        parts = [s.time for k, s in job.series.items() if not k.startswith(NOT_PROGRESS)]
        t = np.concatenate(parts) if parts else np.empty(0)
        return np.unique(t[np.isfinite(t)])


class ClearMLNonResponsive(_Watchdog):
    """ClearML server's non-responsive task watchdog: marks a task stopped.

    Source: allegroai/clearml-server, apiserver/bll/task/non_responsive_tasks_watchdog.py:
    threshold_sec=7200 since the task's ``last_update`` (any update, log lines
    included), watch_interval_sec=900; it sleeps one interval before its first look
    and selects tasks with ``last_update < now - threshold``.
    """

    name = "clearml_nonresponsive"
    tool = "ClearML non-responsive watchdog"

    def __init__(self, threshold_s: float = 7200.0, interval_s: float = 900.0) -> None:
        super().__init__(threshold_s, interval_s)

    def _update_times(self, job: Job) -> FloatArray:
        logs = np.asarray([line.time for line in job.logs], dtype=np.float64)
        both = np.concatenate([super()._update_times(job), logs])
        return np.unique(both[np.isfinite(both)])


# -- Katib ------------------------------------------------------------------------------------


class KatibMedianStop(Anchor):
    """Katib's ``medianstop`` early stopping, as its code does it (not as its docs say).

    Sources, kubeflow/katib:
    * pkg/earlystopping/v1beta1/medianstop/service.py: defaults min_trials_required=3,
      start_step=4; for each succeeded trial the average of its first ``start_step``
      reported values; once there are at least min_trials_required of them, the
      "median" it sends is the *mean* of those averages (``get_median_value``).
    * cmd/metricscollector/v1beta1/file-metricscollector/main.go, ``updateStopRules``:
      the trial's objective value is replaced by its running best, a per-metric
      counter starts at start_step and counts reports down, and the rule is applied
      only on the report where it reaches zero: the ``start_step``-th report, once.
      A minimised objective stops when that running best is greater than the value.

    ``peers`` are the other runs of the same group (the same track or folder); a
    replayed peer counts as a completed trial unless it is marked FAILED or STOPPED.
    """

    name = "katib_median_stop"
    rule_kind = "plateau"

    def __init__(
        self,
        min_trials_required: int = 3,  # medianstop/service.py: self.min_trials_required = 3
        start_step: int = 4,  # medianstop/service.py: self.start_step = 4
    ) -> None:
        self.min_trials_required = min_trials_required
        self.start_step = start_step

    def _peer_averages(self, job: Job, metric: str, peers: list[Job]) -> list[float]:
        out = []
        for p in peers:
            s = p.series.get(metric)
            if p.id == job.id or s is None or not len(s):
                continue
            if p.state in (JobState.FAILED, JobState.STOPPED):
                continue
            out.append(float(np.mean(s.value[: self.start_step])))
        return out

    def first_fire(self, job: Job, metric: str, peers: list[Job] | None = None) -> Fire | None:
        s = _series(job, metric)
        averages = self._peer_averages(job, metric, peers or [])
        if len(averages) < self.min_trials_required or len(s) < self.start_step:
            return None
        median = sum(averages) / len(averages)  # service.py: sum / len, despite the name
        best = float(s.value[0])
        for v in s.value[1 : self.start_step]:
            if float(v) < best:  # main.go: a NaN never replaces the best, nor beats it
                best = float(v)
        if not best > median:
            return None
        i = self.start_step - 1
        return _fire(job, s, i, (
            f"Katib medianstop: best {metric} {best:.6g} after {self.start_step} reports is "
            f"worse than {median:.6g}, the mean of {len(averages)} other trials' first-"
            f"{self.start_step} averages"))


ANCHORS: dict[str, type[Anchor]] = {
    cls.name: cls
    for cls in (
        KerasEarlyStopping, KerasTerminateOnNaN, LightningEarlyStopping,
        DebuggerLossNotDecreasing, DebuggerStalledTraining, DebuggerExplodingTensor,
        DebuggerOverfit, ClearMLNonResponsive, KatibMedianStop,
    )
}
