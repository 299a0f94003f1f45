"""One metric definition: a name and a regex with one capture group, as a SageMaker
``MetricDefinition``. Its own module so that the definition sets built on it
(``definitions``, ``emit_format``) import it without importing each other."""

from __future__ import annotations

import re
from dataclasses import dataclass

STEP = "step"
PLANNED = "planned_steps"


@dataclass(frozen=True)
class MetricDefinition:
    name: str  # the series name, e.g. "val_loss"
    regex: str  # one capture group holds the value
    time: bool = False  # a cumulative time field (the time axis), not a series
    scale: float = 1.0  # multiply the captured value (e.g. 0.001 for ms -> s)
    # a text every line the regex matches holds: lines without it are not searched (the
    # built-in definitions' keys have one; a log's own definitions are searched on every line)
    needle: str = ""
    # a regex: where it matches the line before the value's match, the value is not read
    # (the built-in "loss": not after a word that says held-out data, "Test Set : Mean
    # loss: 0.45")
    not_after: str = ""

    def compile(self) -> re.Pattern[str]:
        try:
            rx = re.compile(self.regex)
        except re.error as e:
            raise ValueError(f"metric {self.name!r}: bad regex {self.regex!r}: {e}") from e
        if rx.groups != 1:
            raise ValueError(f"metric {self.name!r}: regex {self.regex!r} must have exactly "
                             f"one capture group, it has {rx.groups}")
        return rx
