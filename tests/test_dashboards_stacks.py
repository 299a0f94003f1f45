"""The dashboards as the stacks deploy them (the session's one synth of the sample
environments): the CloudWatch dashboard, the Azure workbook, the OpenShift console
ConfigMap and the GrafanaDashboard are the generated ones, with the stack's own names
and resource references filled in. (The OpenShift objects are also validated against
their schemas in tests/test_conformance_kubernetes.py with every other object.)"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.test_dashboards import workbook_validator
from trainguard.stacks.dashboards import cloudwatch, grafana, kubernetes

pytestmark = pytest.mark.slow

Stack = dict[str, Any]


def resources(stack: Stack, kind: str) -> dict[str, Any]:
    return dict(stack["resource"].get(kind, {}))


def test_aws_dashboard_is_the_generated_one(stacks: dict[str, Stack]) -> None:
    (dash,) = resources(stacks["aws-dev"], "aws_cloudwatch_dashboard").values()
    assert dash["dashboard_name"] == "trainguard-aws-dev"
    assert json.loads(dash["dashboard_body"]) == cloudwatch.dashboard_body(
        "111122223333", "us-east-1")


def test_azure_workbook_reads_the_stacks_own_resources(stacks: dict[str, Stack]) -> None:
    stack = stacks["azure-research"]
    (book,) = resources(stack, "azurerm_application_insights_workbook").values()
    assert re.fullmatch(r"[0-9a-f-]{36}", book["name"])
    assert book["source_id"] == "${lower(azurerm_application_insights.insights.id)}"
    data = json.loads(book["data_json"])
    workbook_validator().validate(data)
    ids = {r for i in data["items"] if i["type"] == 10 for r in i["content"]["resourceIds"]}
    assert ids == {"${azurerm_application_insights.insights.id}",
                   "/subscriptions/00000000-1111-2222-3333-444444444444/resourceGroups/"
                   "ml-research/providers/Microsoft.MachineLearningServices/workspaces/"
                   "research-ws"}
    # the metric the workbook reads is the one the Function is told to publish on
    (app,) = resources(stack, "azurerm_linux_function_app").values()
    assert app["app_settings"]["TRAINGUARD_METRICS_RESOURCE_ID"] == \
        "${azurerm_application_insights.insights.id}"


def test_openshift_console_and_operator_dashboards(stacks: dict[str, Stack]) -> None:
    stack = stacks["openshift-onprem"]
    cm = resources(stack, "kubernetes_config_map_v1")["console_dashboard"]
    assert cm["metadata"]["namespace"] == "openshift-config-managed"
    assert cm["metadata"]["labels"]["console.openshift.io/dashboard"] == "true"
    assert json.loads(cm["data"][kubernetes.KEY]) == grafana.dashboard_json()
    manifest = resources(stack, "kubernetes_manifest")["grafana_dashboard"]["manifest"]
    assert manifest["kind"] == "GrafanaDashboard"
    assert manifest["spec"]["instanceSelector"] == {"matchLabels": {"dashboards": "grafana"}}
    assert json.loads(manifest["spec"]["json"]) == grafana.dashboard_json()
