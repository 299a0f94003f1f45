"""Every shape of ``bench/built_shapes.py`` meets its bar, replayed as the watchdog sees
it: no critical finding at any tick on the 77 healthy curves of recipes the corpora lack
(language-model schedules and cadences, warm restarts, diffusion, resumed logs, 4-decimal
logs, a triplet loss, ...), a critical divergence on the 9 diverged ones, a plateau
warning and nothing critical on the stuck ones. The benchmark prints what each raised;
this holds the verdicts so that a rule change that breaks one shape fails here.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests import bench_scripts
from trainguard.checker import Policy, Severity
from trainguard.replay import replay

BENCH = bench_scripts.load("built_shapes")
SHAPES = list(BENCH.shapes())


def test_the_shapes_are_many_and_of_every_label() -> None:
    labels = [label for _, label, _, _ in SHAPES]
    assert (labels.count("healthy"), labels.count("diverged"), labels.count("stuck")) == (77, 9, 3)


@pytest.mark.parametrize(("name", "label", "curves", "dt"), SHAPES,
                         ids=[name for name, *_ in SHAPES])
def test_each_built_shape_meets_its_bar(name: str, label: str, curves: Callable[[], object],
                                        dt: float) -> None:
    r = replay(BENCH.job_of(curves(), dt), Policy())
    seen = [(h.rule, h.worst.value, h.first.step) for h in r.histories
            if h.worst.rank >= Severity.WARNING.rank]
    assert BENCH.met(label, seen), seen
