"""PrometheusRules generated from the rules' parameters as the policy sets them, so the
cluster's own alerts and the watchdog agree on what a stall, a NaN and idle GPUs are.

Prometheus cannot learn a job's cadence as the ``stall`` rule does, so its alert uses
the rule's threshold for a job whose cadence is not learnt yet (``unlearnt_seconds``,
at least ``min_seconds``); the watchdog's own finding usually comes first.

Metric names: ``trainguard_step`` and ``trainguard_loss`` (what ``trainguard.emit`` and
the Prometheus adapter use), ``DCGM_FI_DEV_GPU_UTIL`` (NVIDIA DCGM exporter, per GPU,
labelled with the pod it serves), and ``trainguard_last_tick_timestamp_seconds`` (the
watchdog's own heartbeat on the Pushgateway, ``lambdas/k8s/sinks.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainguard.checker.model import Action, Severity
from trainguard.checker.policy import Policy
from trainguard.checker.registry import RULES, rule_names

SCRAPE_SECONDS = 30  # the PodMonitors' interval; a "for" of N points is N-1 intervals

Alert = dict[str, Any]


def _params(policy: Policy, name: str) -> Any:
    rule_names()
    return RULES[name].Params(**policy.rule(name).params)


def _alert(name: str, expr: str, severity: Severity, for_s: int, rule: str,
           summary: str, description: str) -> Alert:
    alert: Alert = {"alert": name, "expr": expr,
                    "labels": {"severity": severity.value, "trainguard_rule": rule},
                    "annotations": {"summary": summary, "description": description}}
    if for_s > 0:
        alert["for"] = f"{for_s}s"
    return alert


def _stall(policy: Policy) -> list[tuple[Severity, Alert]]:
    p = _params(policy, "stall")
    threshold = int(max(p.min_seconds, p.unlearnt_seconds))
    out = []
    for severity, seconds in ((Severity.WARNING, threshold),
                              (Severity.CRITICAL, int(p.critical_after(threshold)))):
        # No change of the step for `seconds`. A series with no value `seconds` ago is not
        # judged: a job that just started cannot have stalled for that long. A change
        # down counts: a pod restarted and resumed from an earlier checkpoint is making
        # progress below the step it had reached (a difference would read it as a stall
        # until it passed that step again).
        expr = (f"changes(trainguard_step[{seconds}s]) == 0 "
                f"and trainguard_step offset {seconds}s")
        out.append((severity, _alert(
            f"TrainguardStall{severity.value.title()}", expr, severity, 0, "stall",
            "training job {{ $labels.pod }} made no progress for "
            f"{seconds // 60} min",
            "trainguard_step of {{ $labels.namespace }}/{{ $labels.pod }} has not changed "
            f"in {seconds} s (stall rule: min_seconds={p.min_seconds:g}, "
            f"unlearnt_seconds={p.unlearnt_seconds:g}, "
            f"critical_factor={p.critical_factor:g}, "
            f"critical_seconds={p.critical_seconds:g}).")))
    return out


def _divergence(policy: Policy) -> list[tuple[Severity, Alert]]:
    p = _params(policy, "divergence")
    # Beyond abs_limit and blowup_factor x the least it was in the last 6 h: a loss that
    # starts at 1e13 in its own units (a physics-informed one) is not blown up; the rule
    # itself holds it to its first value, which PromQL does not keep.
    size = "abs(trainguard_loss)"
    expr = (f"trainguard_loss != trainguard_loss or ({size} > {p.abs_limit:g} and {size} > "
            f"{p.blowup_factor:g} * min_over_time({size}[6h:{SCRAPE_SECONDS}s]))")
    return [(Severity.CRITICAL, _alert(
        "TrainguardLossNotFinite", expr, Severity.CRITICAL,
        (p.nan_points - 1) * SCRAPE_SECONDS, "divergence",
        "training loss of {{ $labels.pod }} is NaN, infinite or blown up",
        f"trainguard_loss is NaN/inf, or beyond {p.abs_limit:g} and {p.blowup_factor:g} x "
        f"its least value in the last 6 h, for {p.nan_points} scrapes in a row (divergence "
        "rule: nan_points, abs_limit, blowup_factor). Value: {{ $value }}."))]


def _utilization(policy: Policy) -> list[tuple[Severity, Alert]]:
    p = _params(policy, "utilization")
    util = "avg by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL)"
    window = int(p.window_seconds)
    return [
        (Severity.CRITICAL, _alert(
            "TrainguardGpuIdle", f"{util} < {p.idle_p95:g}", Severity.CRITICAL, window,
            "utilization", "GPUs of {{ $labels.pod }} idle",
            f"mean GPU utilisation under {p.idle_p95:g} % for {window // 60} min "
            "(utilization rule: idle_p95, window_seconds). Value: {{ $value }} %.")),
        (Severity.WARNING, _alert(
            "TrainguardGpuUnderused", f"{util} < {p.underuse_p95:g} and {util} >= "
            f"{p.idle_p95:g}", Severity.WARNING, window, "utilization",
            "GPUs of {{ $labels.pod }} under-used",
            f"mean GPU utilisation under {p.underuse_p95:g} % for {window // 60} min "
            "(utilization rule: underuse_p95, window_seconds). Value: {{ $value }} %.")),
    ]


#: rule name -> its alerts (severity, alert) from the effective parameters
GENERATORS: dict[str, Callable[[Policy], list[tuple[Severity, Alert]]]] = {
    "stall": _stall, "divergence": _divergence, "utilization": _utilization}


def rule_groups(policy: Policy) -> dict[str, Any]:
    """The ``spec`` of a PrometheusRule (also a plain Prometheus rule file): alerts of
    enabled rules, for severities whose policy action is not ``none``."""
    rules: list[Alert] = []
    for name, generate in GENERATORS.items():
        cfg = policy.rule(name)
        if not cfg.enabled:
            continue
        rules.extend(alert for severity, alert in generate(policy)
                     if cfg.actions.get(severity, Action.NONE) is not Action.NONE)
    return {"groups": [{"name": "trainguard", "rules": rules}]}


HEARTBEAT = "trainguard_last_tick_timestamp_seconds"  # pushed by lambdas/k8s/sinks.py
MISSED_TICKS = 3  # ticks the watchdog may miss before its own alert fires


def watchdog_rules(environment: str, interval_s: int) -> dict[str, Any]:
    """The ``spec`` of a PrometheusRule on the watchdog itself: its last tick is older
    than ``MISSED_TICKS`` schedule intervals (the CronJob stopped running, its pods
    fail, or it cannot reach the Pushgateway). Its alerts about jobs expire on their own
    then, so this is the alert that says the watchdog is blind."""
    limit = MISSED_TICKS * interval_s
    series = f'{HEARTBEAT}{{environment="{environment}"}}'
    alert = _alert(
        "TrainguardWatchdogSilent", f"time() - max by (environment) ({series}) > {limit}",
        Severity.WARNING, 0, "watchdog",
        f"the trainguard watchdog of {environment} has not ticked for "
        f"{MISSED_TICKS} schedule intervals",
        f"{HEARTBEAT} is older than {limit} s ({MISSED_TICKS} x the {interval_s} s "
        "schedule): the CronJob does not run, fails, or cannot push its metrics. "
        "Nothing is being judged or stopped. Last tick {{ $value | humanizeDuration }} ago.")
    return {"groups": [{"name": "trainguard-watchdog", "rules": [alert]}]}
