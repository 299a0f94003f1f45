"""The Azure Monitor workbook of the Azure stack, over what the Azure runtime writes:

* the custom metric ``trainguard/Findings`` (dimensions ``rule``, ``severity``) on the
  Application Insights component (``lambdas/azure/sinks.py``): findings by rule and
  severity, and one tile per registered rule;
* the Function's tick log line ``trainguard tick: {...}`` (``function_app.summary``), in
  the component's ``traces``: its ``fleet`` (spend burn, jobs by verdict, what stopping
  saved) and its ``jobs`` count;
* the Azure ML workspace's own platform metrics ``GpuUtilizationPercentage`` and
  ``GpuMemoryUtilizationPercentage`` (dimensions ``RunId``, ``InstanceId``): GPU use and
  memory per job (run) and per node.

Azure ML publishes no throughput metric; a job's throughput lives in its MLflow run,
which a workbook cannot query.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from trainguard.stacks.dashboards.panels import PANELS, Panel, rule_panels

NOTEBOOK = "Notebook/1.0"
SCHEMA = "https://github.com/Microsoft/Application-Insights-Workbooks/blob/master/schema/workbook.json"
INSIGHTS = "microsoft.insights/components"
ML = "microsoft.machinelearningservices/workspaces"
DAY_MS = 86_400_000
TICK_LINE = "trainguard tick: "  # lambdas/azure/function_app.py logs the summary after it
# Workbook enums (the portal's own values): chart types and metric aggregations
LINE, BAR, AREA = 2, 3, 1
MAX, AVERAGE = 3, 4
QUERY_LOGS, LOGS_LINECHART, LOGS_BARCHART = 0, "timechart", "barchart"


def _fleet_kql(field: str, by: str | None = None) -> str:
    head = (f"traces | where message startswith '{TICK_LINE}' "
            f"| extend tick = parse_json(substring(message, {len(TICK_LINE)}))")
    if by is None:
        return f"{head} | project timestamp, {field} = todouble(tick.fleet.{field})"
    return (f"{head} | mv-expand kind = bag_keys(tick.fleet.{field}) to typeof(string) "
            f"| project timestamp, {by} = kind, jobs = toint(tick.fleet.{field}[kind]) "
            f"| evaluate pivot({by}, sum(jobs))")


def _logs(query: str, chart: str) -> dict[str, Any]:
    return {"version": "KqlItem/1.0", "query": query, "size": 0, "queryType": QUERY_LOGS,
            "resourceType": INSIGHTS, "visualization": chart,
            "timeContext": {"durationMs": DAY_MS}}


def _metric(resource: str, resource_type: str, namespace: str, metric: str,
            aggregation: int, split: str | None, filters: list[dict[str, Any]] | None = None,
            chart: int = LINE) -> dict[str, Any]:
    item: dict[str, Any] = {"version": "MetricsItem/2.0", "size": 0, "chartType": chart,
                            "resourceType": resource_type, "metricScope": 0,
                            "resourceIds": [resource], "timeContext": {"durationMs": DAY_MS},
                            "metrics": [{"namespace": namespace,
                                         "metric": f"{namespace}--{metric}",
                                         "aggregation": aggregation}]}
    if split:
        item["metrics"][0]["splitBy"] = split
    if filters:
        item["filters"] = filters
    return item


def items(insights_id: str, ml_workspace_id: str) -> dict[str, dict[str, Any]]:
    """Fleet panel key -> the workbook item's content (without its name and title)."""
    findings = ("trainguard", "Findings")
    ml = ML
    return {
        "spend": _logs(_fleet_kql("burn_usd_per_hour"), LOGS_LINECHART),
        "findings": _metric(insights_id, INSIGHTS, *findings, MAX, "severity"),
        "verdicts": _logs(_fleet_kql("verdicts", "verdict"), LOGS_BARCHART),
        "saved": _logs(_fleet_kql("saved_usd"), LOGS_BARCHART),
        "throughput": _logs(f"traces | where message startswith '{TICK_LINE}' | extend "
                            f"tick = parse_json(substring(message, {len(TICK_LINE)})) "
                            "| project timestamp, jobs = toint(tick.jobs.azureml)",
                            LOGS_LINECHART),
        "gpu_host": _metric(ml_workspace_id, ml, ml, "GpuUtilizationPercentage", AVERAGE,
                            "InstanceId"),
        "gpu_util": _metric(ml_workspace_id, ml, ml, "GpuUtilizationPercentage", AVERAGE,
                            "RunId"),
        "gpu_mem": _metric(ml_workspace_id, ml, ml, "GpuMemoryUtilizationPercentage",
                           AVERAGE, "RunId"),
    }


#: panels the workbook cannot draw, and why
NOT_AVAILABLE = {"throughput_host": "Azure ML publishes no throughput metric"}
#: what a panel is called where the Azure view differs from the others
TITLES = {"throughput": "Jobs listed per tick (Azure ML publishes no throughput metric)"}


def _item(p: Panel, content: dict[str, Any], width: str) -> dict[str, Any]:
    kind = 3 if content["version"].startswith("Kql") else 10
    title = TITLES.get(p.key, p.title)
    return {"type": kind, "name": p.key, "customWidth": width,
            "content": {**content, "title": title}}


def workbook(insights_id: str, ml_workspace_id: str) -> dict[str, Any]:
    """The workbook's serialized data: the fleet views, then one tile per rule."""
    content = items(insights_id, ml_workspace_id)
    out: list[dict[str, Any]] = [{"type": 1, "name": "title", "content": {"json": (
        "## trainguard: training jobs\nGenerated from the rule registry and the metrics "
        "the Azure runtime writes; do not edit by hand.")}}]
    out += [_item(p, content[p.key], "50") for p in PANELS if p.key not in NOT_AVAILABLE]
    for p in rule_panels():
        out.append(_item(p, _metric(insights_id, INSIGHTS, "trainguard", "Findings", MAX,
                                    "severity", [{"key": "rule", "operator": 0,
                                                  "values": [p.rule]}], BAR), "25"))
    return {"version": NOTEBOOK, "items": out, "fallbackResourceIds": [insights_id],
            "$schema": SCHEMA}


def dumps(insights_id: str, ml_workspace_id: str) -> str:
    return json.dumps(workbook(insights_id, ml_workspace_id), sort_keys=True)


def workbook_name(environment: str) -> str:
    """A workbook's resource name is a GUID: one fixed per environment, so a redeploy
    updates the same workbook."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"trainguard:{environment}:workbook"))
