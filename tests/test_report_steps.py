"""How ``check``'s table writes a finding's step: whole steps with thousands separators,
and a log whose steps are epochs (the Hugging Face Trainer's console dict, 0.05 into the
first) to its significant digits, where it printed "0" for every early finding."""

from __future__ import annotations

import math

import pytest

from trainguard.report import fmt_step


@pytest.mark.parametrize(("step", "shown"), [
    (12_500.0, "12,500"), (0.0, "0"), (3.0, "3"), (0.05, "0.05"), (2.5, "2.5"),
    (0.0125, "0.0125"), (1234.5, "1,234"), (None, "-"), (math.nan, "-"),
])
def test_a_step_is_written_as_the_log_counts_it(step: float | None, shown: str) -> None:
    assert fmt_step(step) == shown
