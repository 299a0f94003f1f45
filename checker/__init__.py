"""trainguard's brain: the normalised model, the rules, cost and ``evaluate``.

Pure Python and numpy: it runs inside every watchdog function.
"""

from trainguard.checker.evaluate import evaluate
from trainguard.checker.model import (
    Action,
    Finding,
    Job,
    JobState,
    LogLine,
    Series,
    Severity,
    verdict,
)
from trainguard.checker.policy import AccountBudget, Budget, Cost, Policy, RuleConfig, Safety

__all__ = [
    "AccountBudget", "Action", "Budget", "Cost", "Finding", "Job", "JobState", "LogLine",
    "Policy", "RuleConfig", "Safety", "Series", "Severity", "evaluate", "verdict",
]
