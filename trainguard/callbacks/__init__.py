"""Framework callbacks that report through ``trainguard.emit``.

``trainguard.callbacks.hf.TrainguardCallback`` (Hugging Face ``Trainer``) and
``trainguard.callbacks.lightning.TrainguardCallback`` (PyTorch Lightning). Each module
imports its framework; this package imports neither.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any

from trainguard.emit import DEFAULT_HEARTBEAT, Emitter, default


class Phases:
    """At most one open pause (evaluation or checkpoint) at a time, opened and closed from
    separate framework hooks; heartbeats run while it is open."""

    def __init__(self, emitter: Emitter | None, every: float = DEFAULT_HEARTBEAT) -> None:
        self._emitter = emitter
        self.every = every
        self.phase: str | None = None
        self._cm: AbstractContextManager[None] | None = None

    @property
    def emitter(self) -> Emitter:
        return self._emitter or default()

    def begin(self, phase: str) -> None:
        if self.phase == phase:
            return
        self.end()
        self._cm = self.emitter.pause(phase, self.every)
        self._cm.__enter__()
        self.phase = phase

    def end(self, phase: str | None = None) -> None:
        """Close the open pause (only if it is ``phase``, when given)."""
        if self._cm is None or (phase is not None and phase != self.phase):
            return
        cm, self._cm, self.phase = self._cm, None, None
        cm.__exit__(None, None, None)


class Rate:
    """Samples per second between two written records, pauses left out."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.time = 0.0

    def reset(self) -> None:
        self.step = None

    def __call__(self, step: int, samples_per_step: float | None) -> float | None:
        now = time.monotonic()
        prev_step, prev_time = self.step, self.time
        self.step, self.time = step, now
        if prev_step is None or step <= prev_step or now <= prev_time:
            return None
        steps_per_s = (step - prev_step) / (now - prev_time)
        return steps_per_s * samples_per_step if samples_per_step else steps_per_s


def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a metrics dict (frameworks mix in strings and tensors)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, bool):
            continue
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out
