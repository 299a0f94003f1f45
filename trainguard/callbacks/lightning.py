"""A PyTorch Lightning ``Callback`` that reports through ``trainguard.emit``.

    from trainguard.callbacks.lightning import TrainguardCallback
    trainer = L.Trainer(..., callbacks=[TrainguardCallback()])

After each training batch (rate-limited by emit): step (of the planned steps), loss,
learning rate, gradient norm (measured in ``on_before_optimizer_step``, only when a line
is due) and throughput (samples/s). Validation runs inside ``pause("eval")`` and its
``val*`` metrics follow as an ``event=eval`` line; a checkpoint save is a ``checkpoint``
pause from ``on_save_checkpoint`` to the next batch.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from trainguard.callbacks import Phases, Rate, numbers
from trainguard.emit import DEFAULT_HEARTBEAT, Emitter


def _batch_size(batch: Any) -> int | None:
    first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
    if isinstance(first, dict):
        first = next(iter(first.values()), None)
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else None


class TrainguardCallback(pl.Callback):
    def __init__(self, emitter: Emitter | None = None,
                 heartbeat_every: float = DEFAULT_HEARTBEAT) -> None:
        self.phases = Phases(emitter, heartbeat_every)
        self.rate = Rate()
        self.grad_norm: float | None = None

    @property
    def emitter(self) -> Emitter:
        return self.phases.emitter

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        planned = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else (
            trainer.estimated_stepping_batches)
        if planned and planned != float("inf"):
            self.emitter.total_steps = int(planned)
        self.rate(trainer.global_step, None)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        self.phases.end()  # a checkpoint written after the last batch is done by now

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        if not self.emitter.due():
            return  # the norm costs a pass over the gradients: only for a written line
        norms = [p.grad.detach().norm() for p in pl_module.parameters() if p.grad is not None]
        self.grad_norm = float(torch.stack(norms).norm()) if norms else None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        values: dict[str, float] = {}
        if loss is not None:
            # float() waits for the device: emit must see a NaN on every step
            values["loss"] = float(loss.detach()) if isinstance(loss, torch.Tensor) else loss
        values["epoch"] = trainer.current_epoch
        if trainer.optimizers:
            values["lr"] = float(trainer.optimizers[0].param_groups[0]["lr"])
        if self.grad_norm is not None:
            values["grad_norm"], self.grad_norm = self.grad_norm, None
        if self.emitter.due():
            throughput = self.rate(trainer.global_step, _batch_size(batch))
            if throughput is not None:
                values["throughput"] = throughput
        self.emitter.record(trainer.global_step, values)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.phases.begin("eval")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.phases.end("eval")
        self.rate.reset()
        if trainer.sanity_checking:
            return
        values = {k: v for k, v in numbers(dict(trainer.callback_metrics)).items()
                  if k.startswith("val")}
        self.emitter.record(trainer.global_step, values, event="eval")

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        # called while the checkpoint is assembled, before it is written: the pause ends
        # at the next batch, validation or the end of training
        self.emitter.emit(trainer.global_step, event="checkpoint")
        self.phases.begin("checkpoint")
        self.rate.reset()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.phases.end()
