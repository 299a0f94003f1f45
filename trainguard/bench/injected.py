"""What an injector gives: a job with a known fault (or none) and where it starts.

Its own module so that the injector modules (``inject``, ``inject_speed``) can share it
without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from trainguard.checker.model import Job


@dataclass(frozen=True)
class Injected:
    job: Job
    kind: str  # the injector's name
    label: str  # "stalled", "diverged" or "healthy": what a detector should conclude
    onset_step: float | None
    onset_time: float | None  # on the job's clock; None on a step clock
    note: str
    extra: dict[str, float] = field(default_factory=dict)


Injector = Callable[[Job, np.random.Generator], Injected]
