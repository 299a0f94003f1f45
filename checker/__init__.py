"""trainguard's brain: the normalised model, the rules, cost and ``evaluate``.

Pure Python and numpy: it runs inside every watchdog function.
"""

from checker.evaluate import evaluate
from checker.model import Action, Finding, Job, JobState, LogLine, Series, Severity, verdict
from checker.policy import AccountBudget, Budget, Cost, Policy, RuleConfig, Safety

__all__ = [
    "AccountBudget", "Action", "Budget", "Cost", "Finding", "Job", "JobState", "LogLine",
    "Policy", "RuleConfig", "Safety", "Series", "Severity", "evaluate", "verdict",
]
