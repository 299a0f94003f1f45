"""What a policy says, as plain dataclasses, and every default a policy has: written
once, here. The YAML loader that validates a file into these lives in
``trainguard.config.policy`` (pydantic) and takes its defaults from these dataclasses;
``config/default-policy.yaml`` restates them for people, and a test holds it to them.
This package needs numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from trainguard.checker.model import Action, Severity

Period = Literal["day", "week", "month"]
#: What a finding can rest on besides the training metrics a job writes: the job's state
#: and resources as the platform reports them, its log lines, and the GPU/host metrics
#: the platform writes. See lambdas/trust.py and docs/security.md.
Signal = Literal["state", "logs", "platform_metrics"]
#: The signals others may be able to write for a job (the training metrics among them).
Writable = Literal["metrics", "logs", "platform_metrics"]


def _default_actions() -> dict[Severity, Action]:
    return {Severity.INFO: Action.NONE, Severity.WARNING: Action.NOTIFY,
            Severity.CRITICAL: Action.NOTIFY}


@dataclass
class RuleConfig:
    """One rule's switch, parameters (see each rule's ``Params``) and actions per severity."""

    enabled: bool = True
    params: dict[str, Any] = field(default_factory=dict)
    actions: dict[Severity, Action] = field(default_factory=_default_actions)


@dataclass
class AccountBudget:
    """Spend of every job in a scope (an account, subscription or namespace) per period."""

    limit_usd: float
    period: Period = "month"
    scope: str = "*"  # "*" is every scope the watchdog sees, else a scope string


@dataclass
class Budget:
    per_job_usd: float | None = None
    accounts: list[AccountBudget] = field(default_factory=list)
    alert_at: list[float] = field(default_factory=lambda: [0.5, 0.8, 1.0])


@dataclass
class Safety:
    """Stops are the one thing that cannot be undone, so every default says no."""

    dry_run: bool = True  # findings and audit records, never a real stop
    max_stops_per_tick: int = 1  # a bug or a bad policy must not stop the fleet
    # A job with this tag (any value but "false") is never stopped.
    protect_tag: str = "trainguard:protect"
    persist_ticks: int = 3  # a finding must be seen this many ticks in a row before a stop
    # Where other principals can write a job's metrics (or logs), a stop resting on them
    # also needs a finding of the same job resting on one of these: docs/security.md.
    corroborate_with: list[Signal] = field(default_factory=lambda: ["state"])
    # Signals this account has closed to other writers (e.g. with the SCP in
    # docs/security.md): a stop may rest on them alone. Empty: trust the source's word.
    trusted_signals: list[Writable] = field(default_factory=list)


@dataclass
class Cost:
    region: str | None = None  # the price book's region; None means the book's default
    # instance type -> $/hour per instance; wins over the price book
    prices: dict[str, float] = field(default_factory=dict)
    gpu_hour_usd: float | None = None  # on-prem: $ per GPU-hour when a job has no instance price
    default_hourly_usd: float | None = None  # a job with no known price at all


@dataclass
class Policy:
    name: str = "default"
    rules: dict[str, RuleConfig] = field(default_factory=dict)
    budget: Budget = field(default_factory=Budget)
    safety: Safety = field(default_factory=Safety)
    cost: Cost = field(default_factory=Cost)
    # well-known name -> this team's metric name, e.g. loss: train_loss
    metrics: dict[str, str] = field(default_factory=dict)

    def rule(self, name: str) -> RuleConfig:
        return self.rules.get(name) or RuleConfig()
