"""What every dashboard draws, independent of where: one ``Panel`` per view, the per-rule
tiles generated from the rule registry (``checker.registry``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainguard.checker.registry import rule_names

Kind = Literal["timeseries", "stat", "bars"]


@dataclass(frozen=True)
class Panel:
    key: str  # what the backends' query tables are keyed by
    title: str
    description: str
    unit: str  # a Grafana unit id; the other backends map it
    kind: Kind = "timeseries"
    rule: str | None = None  # a per-rule tile: the rule it counts


#: the fleet views, in the order they are laid out
PANELS: tuple[Panel, ...] = (
    Panel("spend", "Spend burn", "Hourly cost of the running jobs the watchdog lists.",
          "currencyUSD"),
    Panel("findings", "Findings by rule and severity",
          "Findings of the last tick, per rule and severity.", "short"),
    Panel("verdicts", "Jobs by verdict",
          "Jobs per verdict (worst finding): ok, info, warning, critical.", "short", "bars"),
    Panel("saved", "What stopping saved",
          "Projected spend the stops kept from being spent (dry run: would have).",
          "currencyUSD", "bars"),
    Panel("throughput", "Throughput per job", "Steps or samples per second of each job.",
          "short"),
    Panel("throughput_host", "Throughput per host",
          "Per pod (host) of each job, where the training metrics are scraped per pod: a "
          "pod far below the others is a straggler.", "short"),
    Panel("gpu_host", "GPU use per host",
          "Mean GPU utilisation per host: a host far below the others is a straggler.",
          "percent"),
    Panel("gpu_util", "GPU use", "Mean GPU utilisation per job (pod).", "percent"),
    Panel("gpu_mem", "GPU memory", "GPU memory in use per job (pod), percent of the total.",
          "percent"),
)


def rule_panels() -> tuple[Panel, ...]:
    """One tile per registered rule: its findings now, by severity."""
    return tuple(Panel(f"rule:{name}", name, f"Findings of the {name} rule in the last tick.",
                       "short", "stat", rule=name) for name in rule_names())


def panels() -> tuple[Panel, ...]:
    """Every panel: the fleet views, then one tile per registered rule."""
    return PANELS + rule_panels()
