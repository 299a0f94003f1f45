"""The CloudWatch dashboard of the AWS stack, over what the AWS runtime writes and what
SageMaker publishes:

* namespace ``trainguard`` (``lambdas/aws/sinks.py``, EMF): ``Findings`` (account, rule,
  severity), ``SpendUSDPerHour`` (account), ``Jobs`` (account, verdict), ``SavedUSD``
  (account);
* namespace ``/aws/sagemaker/TrainingJobs`` (``adapters/sagemaker/metrics.py``): the
  job's metric definitions (dimension ``TrainingJobName``; ``throughput`` is the
  well-known name) and the hosts' ``GPUUtilization`` and ``GPUMemoryUtilization``
  (dimension ``Host`` = ``JOB/algo-N``).

Every widget is a ``SEARCH``, so a new rule, job or host appears without a redeploy; the
per-rule tiles come from the rule registry.
"""

from __future__ import annotations

from typing import Any

from trainguard.stacks.dashboards.panels import PANELS, Panel, rule_panels

NAMESPACE = "trainguard"
SAGEMAKER = "/aws/sagemaker/TrainingJobs"
PERIOD = 300
# metric names of lambdas/aws/sinks.py (tests/test_dashboards.py checks they agree)
FINDINGS, SPEND, JOBS, SAVED = "Findings", "SpendUSDPerHour", "Jobs", "SavedUSD"


def _ours(metric: str, dims: str, account: str, stat: str, extra: str = "") -> str:
    return (f"SEARCH('{{{NAMESPACE},{dims}}} MetricName=\"{metric}\" "
            f"account=\"{account}\"{extra}', '{stat}', {PERIOD})")


def _sagemaker(metric: str, dim: str, stat: str) -> str:
    return f"SEARCH('{{{SAGEMAKER},{dim}}} MetricName=\"{metric}\"', '{stat}', {PERIOD})"


def searches(account: str) -> dict[str, str]:
    """Panel key -> its SEARCH expression."""
    return {
        "spend": _ours(SPEND, "account", account, "Average"),
        "findings": _ours(FINDINGS, "account,rule,severity", account, "Maximum"),
        "verdicts": _ours(JOBS, "account,verdict", account, "Average"),
        "saved": _ours(SAVED, "account", account, "Sum"),
        "throughput": _sagemaker("throughput", "TrainingJobName", "Average"),
        # the least busy moment of each host: a straggler's GPUs wait on the others
        "gpu_host": _sagemaker("GPUUtilization", "Host", "Minimum"),
        "gpu_util": _sagemaker("GPUUtilization", "Host", "Average"),
        "gpu_mem": _sagemaker("GPUMemoryUtilization", "Host", "Maximum"),
    }


#: panels CloudWatch cannot draw, and why (the README says so too)
NOT_AVAILABLE = {"throughput_host": "SageMaker publishes metric definitions per job only"}


def _widget(p: Panel, expression: str, region: str, x: int, y: int, width: int
            ) -> dict[str, Any]:
    return {"type": "metric", "x": x, "y": y, "width": width, "height": 6,
            "properties": {"title": p.title, "region": region, "view": "timeSeries",
                           "stacked": p.kind == "bars",
                           "metrics": [[{"expression": expression, "id": "e1"}]]}}


def dashboard_body(account: str, region: str) -> dict[str, Any]:
    """The fleet views three to a row, then one tile per registered rule, four to a row."""
    expressions = searches(account)
    widgets = []
    drawn = [p for p in PANELS if p.key not in NOT_AVAILABLE]
    for i, p in enumerate(drawn):
        widgets.append(_widget(p, expressions[p.key], region, (i % 3) * 8, (i // 3) * 6, 8))
    top = ((len(drawn) + 2) // 3) * 6
    for i, p in enumerate(rule_panels()):
        expr = _ours(FINDINGS, "account,rule,severity", account, "Maximum",
                     f" rule=\"{p.rule}\"")
        widgets.append(_widget(p, expr, region, (i % 4) * 6, top + (i // 4) * 6, 6))
    return {"widgets": widgets}
