"""A Hugging Face ``TrainerCallback`` that reports through ``trainguard.emit``.

    from trainguard.callbacks.hf import TrainguardCallback
    trainer = Trainer(..., callbacks=[TrainguardCallback()])

On each log (every ``logging_steps``, each written whatever the emit rate limit):
step (of ``max_steps``), loss, learning rate (as ``lr``), gradient norm, epoch
and throughput (samples/s from the step rate and the global batch size). Around an
evaluation and a checkpoint save: ``pause`` / heartbeats / ``resume`` lines; after an
evaluation its metrics as an ``event=eval`` line (``eval_loss`` as ``val_loss``).
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from trainguard.callbacks import Phases, Rate, numbers
from trainguard.emit import DEFAULT_HEARTBEAT, Emitter

# Trainer log keys -> trainguard names
_RENAME = {"learning_rate": "lr", "eval_loss": "val_loss"}
# the end-of-training summary and timing entries are not training metrics
_SKIP = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos",
         "train_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second")


class TrainguardCallback(TrainerCallback):  # type: ignore[misc]
    """``keep_nan_filter=False`` (the default) turns off the Trainer's
    ``logging_nan_inf_filter``: it logs the average of earlier losses in place of a NaN
    or infinite one, so a diverged run would be logged as healthy (loss 0 in our test)."""

    def __init__(self, emitter: Emitter | None = None,
                 heartbeat_every: float = DEFAULT_HEARTBEAT, keep_nan_filter: bool = False,
                 ) -> None:
        self.phases = Phases(emitter, heartbeat_every)
        self.rate = Rate()
        self.keep_nan_filter = keep_nan_filter

    @property
    def emitter(self) -> Emitter:
        return self.phases.emitter

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        if not self.keep_nan_filter:
            args.logging_nan_inf_filter = False  # read by the Trainer at every step
        if state.max_steps and state.max_steps > 0:
            self.emitter.total_steps = state.max_steps
        self.rate(state.global_step, None)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kwargs: Any) -> None:
        self.phases.end()  # a new step: whatever paused is over

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        # the flow callback (before this one) has decided what follows this step
        self.emitter.step = state.global_step  # the step the pause lines name
        if control.should_evaluate:
            self.phases.begin("eval")
        elif control.should_save:
            self.phases.begin("checkpoint")

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        logs = logs or {}
        if "train_runtime" in logs or any(k.startswith("eval_") for k in logs):
            return  # the summary, or evaluation metrics (on_evaluate writes them)
        values = {_RENAME.get(k, k): v for k, v in numbers(logs).items() if k not in _SKIP}
        batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(
            args.world_size, 1)
        throughput = self.rate(state.global_step, batch)
        if throughput is not None:
            values["throughput"] = throughput
        # every log the Trainer makes (each logging_steps), past the rate limit: the
        # Trainer paces them, and trainer_state.json holds them all, so the two are
        # judged alike
        self.emitter.record(state.global_step, values, force=True)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, metrics: dict[str, float] | None = None,
                    **kwargs: Any) -> None:
        self.phases.end("eval")
        values = {_RENAME.get(k, k): v for k, v in numbers(metrics or {}).items()
                  if k not in _SKIP and k != "epoch"}
        self.emitter.record(state.global_step, values, event="eval")
        self.rate.reset()  # the evaluation's time is not training throughput
        if control.should_save:
            self.phases.begin("checkpoint")

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        self.phases.end("checkpoint")
        self.emitter.emit(state.global_step, event="checkpoint")
        self.rate.reset()

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        self.phases.end()
