"""The built-in rules. Importing this package registers each of them by name."""

from trainguard.checker.rules import (
    budget,
    divergence,
    logs,
    overfit,
    plateau,
    restarts,
    stall,
    target,
    utilization,
)

__all__ = [
    "budget", "divergence", "logs", "overfit", "plateau", "restarts", "stall", "target",
    "utilization",
]
