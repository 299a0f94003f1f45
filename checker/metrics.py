"""Which series a rule reads. Names are matched after the policy's aliases."""

from __future__ import annotations

from checker.model import Job, Series
from checker.policy import Policy

#: The order in which a "the loss" is looked for when the policy names none.
PRIMARY_ORDER = ("val_loss", "loss", "train_loss", "eval_loss", "validation_loss")


def get(job: Job, name: str, policy: Policy) -> Series | None:
    """The series for a well-known name, following ``policy.metrics`` aliases."""
    real = policy.metrics.get(name, name)
    s = job.series.get(real)
    return s if s is not None and len(s) else None


def loss_like(job: Job) -> list[Series]:
    """Every series whose name says it is a loss: the ones NaN and blow-ups matter in."""
    return [s for k, s in sorted(job.series.items()) if "loss" in k.lower() and len(s)]


def primary(job: Job, policy: Policy) -> Series | None:
    """The one metric that says whether the job is learning."""
    if "objective" in policy.metrics:
        return get(job, "objective", policy)
    for name in PRIMARY_ORDER:
        s = get(job, name, policy)
        if s is not None:
            return s
    losses = loss_like(job)
    return losses[0] if losses else None
