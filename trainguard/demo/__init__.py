"""``trainguard demo``: four small real trainings on the CPU (one healthy, three going
wrong in the usual ways), watched live by the local watchdog, which stops the bad ones.

The CLI calls ``run_demo(workdir, console)`` and prints ``result.table()`` (or
``result.to_dict()`` as JSON). Needs scikit-learn (the ``demo`` extra) for the digits data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainguard.demo.run import DemoResult, DemoRun, run_demo

__all__ = ["DemoResult", "DemoRun", "run_demo"]


def __getattr__(name: str) -> Any:
    # Lazy: the training processes import this package too, and need none of the watchdog.
    if name in __all__:
        from trainguard.demo import run

        return getattr(run, name)
    raise AttributeError(f"module 'trainguard.demo' has no attribute {name!r}")
