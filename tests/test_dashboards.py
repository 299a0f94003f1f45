"""The generated dashboards: valid against their own schemas, drawing every panel, naming
only what the runtimes write, and growing a tile when a rule is registered.

No Grafana, OpenShift console, Azure portal or CloudWatch runs here; each is checked
against its own reference: the Grafana dashboard against grafana-foundation-sdk's typed
models (generated from Grafana's schema), the OpenShift objects against the Kubernetes
OpenAPI schemas and the grafana-operator's CRD (tests/reference/crds), the workbook
against the workbook schema (tests/reference/azure-monitor/workbook.schema.json). The
PromQL runs on a real Prometheus in tests/test_dashboards_e2e.py.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard
from typer.testing import CliRunner

from tests.test_real_services import REFERENCE
from trainguard.adapters.sagemaker import metrics as sagemaker_metrics
from trainguard.checker.model import Finding, Job, JobState, Severity
from trainguard.checker.policy import Policy
from trainguard.checker.registry import RULES
from trainguard.checker.rules.base import Context, Rule
from trainguard.cli import app
from trainguard.lambdas.aws import sinks as aws_sinks
from trainguard.stacks.dashboards import cloudwatch, grafana, kubernetes, promql, workbook
from trainguard.stacks.dashboards.panels import PANELS, panels

AI = ("/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg/providers/"
      "microsoft.insights/components/trainguard-research")
ML = ("/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/ml/providers/"
      "Microsoft.MachineLearningServices/workspaces/research")
WORKBOOK_SCHEMA = REFERENCE / "azure-monitor" / "workbook.schema.json"
GRAFANA_CRD = REFERENCE / "crds" / "grafanadashboards.grafana.integreatly.org.v1beta1.json"


@dataclass
class _NewParams:
    pass


class _NewRule(Rule):
    """A rule registered after the dashboards were written: it must get its tile."""

    name = "brand_new_rule"
    Params = _NewParams

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        return []


@pytest.fixture
def new_rule(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    panels()  # the built-in rules first
    monkeypatch.setitem(RULES, _NewRule.name, _NewRule)
    yield _NewRule.name


def sdk_round_trip(data: dict[str, Any]) -> dict[str, Any]:
    register_default_plugins()
    back: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(
        Dashboard.from_json(copy.deepcopy(data))))
    return back


def without_empty(value: Any) -> Any:
    """The SDK writes an empty ``custom`` field config back; nothing else may differ."""
    if isinstance(value, dict):
        return {k: without_empty(v) for k, v in value.items() if v != {}}
    if isinstance(value, list):
        return [without_empty(v) for v in value]
    return value


# --------------------------------------------------------------------------- Grafana

def test_grafana_dashboard_is_what_the_sdk_reads_back() -> None:
    """Every field is one Grafana's schema (as the SDK's typed models have it) knows:
    decoded into the models and encoded again, nothing is lost or changed."""
    data = grafana.dashboard_json()
    assert without_empty(sdk_round_trip(data)) == without_empty(data)
    assert data["uid"] == grafana.UID and data["schemaVersion"] >= 39
    titles = [p["title"] for p in data["panels"]]
    for p in panels():
        assert p.title in titles


def test_the_sdk_check_catches_a_field_grafana_does_not_know() -> None:
    data = grafana.dashboard_json()
    data["panels"][1]["gridPoss"] = data["panels"][1].pop("gridPos")
    assert without_empty(sdk_round_trip(data)) != without_empty(data)


def test_grafana_queries_use_the_viewers_prometheus_and_unique_ref_ids() -> None:
    data = grafana.dashboard_json()
    (variable,) = data["templating"]["list"]
    assert (variable["type"], variable["query"], variable["name"]) == (
        "datasource", "prometheus", "datasource")
    for panel in data["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert all(t["expr"] for t in panel["targets"])


def test_every_backend_draws_every_panel() -> None:
    """Every panel everywhere, but where the platform has no metric for it, which is said
    (and drawn nowhere there, rather than empty)."""
    keys = {p.key for p in PANELS}
    assert set(promql.QUERIES) == keys
    assert set(cloudwatch.searches("111122223333")) | set(cloudwatch.NOT_AVAILABLE) == keys
    assert set(workbook.items(AI, ML)) | set(workbook.NOT_AVAILABLE) == keys
    body = cloudwatch.dashboard_body("111122223333", "us-east-1")
    titles = {w["properties"]["title"] for w in body["widgets"]}
    book = {i["name"] for i in workbook.workbook(AI, ML)["items"]}
    for p in PANELS:
        assert (p.title in titles) != (p.key in cloudwatch.NOT_AVAILABLE), p.key
        assert (p.key in book) != (p.key in workbook.NOT_AVAILABLE), p.key


def test_a_newly_registered_rule_gets_its_tile_everywhere(new_rule: str) -> None:
    grafana_titles = [p["title"] for p in grafana.dashboard_json()["panels"]]
    assert new_rule in grafana_titles
    (tile,) = [p for p in grafana.dashboard_json()["panels"] if p["title"] == new_rule]
    assert f'rule="{new_rule}"' in tile["targets"][0]["expr"]
    body = cloudwatch.dashboard_body("111122223333", "us-east-1")
    assert any(f'rule=\\"{new_rule}\\"' in json.dumps(w) for w in body["widgets"])
    book = workbook.workbook(AI, ML)
    assert any(i.get("name") == f"rule:{new_rule}" for i in book["items"])
    data = json.loads(kubernetes.console_data()[kubernetes.KEY])
    assert new_rule in [p["title"] for p in data["panels"]]


# ------------------------------------------------------------------------- OpenShift

def test_console_configmap_is_a_valid_configmap_the_console_picks_up() -> None:
    obj = kubernetes.console_configmap({"app.kubernetes.io/name": "trainguard"})
    kubernetes_validate.validate(obj, "1.30.0", strict=True)
    assert obj["metadata"]["namespace"] == "openshift-config-managed"
    assert obj["metadata"]["labels"]["console.openshift.io/dashboard"] == "true"
    (text,) = obj["data"].values()
    assert json.loads(text) == grafana.dashboard_json()


def grafana_crd() -> dict[str, Any]:
    from tests.test_conformance_kubernetes import strict

    doc = json.loads(GRAFANA_CRD.read_text())
    assert doc["source"]["repository"] == "grafana/grafana-operator"
    schema: dict[str, Any] = strict(doc["schema"])
    return schema


def test_grafana_dashboard_object_is_valid_against_the_operators_crd() -> None:
    obj = kubernetes.grafana_dashboard("trainguard", {"app": "trainguard"},
                                       {"dashboards": "grafana"})
    assert (obj["apiVersion"], obj["kind"]) == ("grafana.integreatly.org/v1beta1",
                                                "GrafanaDashboard")
    body = {**obj, "metadata": {}}
    jsonschema.Draft7Validator(grafana_crd()).validate(body)
    assert json.loads(obj["spec"]["json"]) == grafana.dashboard_json()


@pytest.mark.parametrize(("mutate", "error"), [
    (lambda s: s.pop("instanceSelector"), "'instanceSelector' is a required"),
    (lambda s: s.update(resyncPeriod="10 minutes"), "does not match"),
    (lambda s: s.update(dashboardJson="{}"), "Additional properties"),
])
def test_the_crd_check_catches_a_mistake(mutate: Any, error: str) -> None:
    spec = kubernetes.operator_spec({"dashboards": "grafana"})
    mutate(spec)
    body = {"apiVersion": kubernetes.OPERATOR_API, "kind": "GrafanaDashboard",
            "metadata": {}, "spec": spec}
    with pytest.raises(jsonschema.ValidationError, match=error):
        jsonschema.Draft7Validator(grafana_crd()).validate(body)


# ----------------------------------------------------------------------------- Azure

def workbook_validator() -> jsonschema.Draft7Validator:
    schema = json.loads(WORKBOOK_SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def test_workbook_is_valid_against_the_workbook_schema() -> None:
    book = json.loads(workbook.dumps(AI, ML))
    workbook_validator().validate(book)
    kinds = {i["type"] for i in book["items"]}
    assert kinds == {1, 3, 10}


@pytest.mark.parametrize(("mutate", "error"), [
    (lambda b: b["items"][-1].update(type=7), "is not valid under any of the given schemas"),
    (lambda b: b["items"][1]["content"].pop("query"), "is not valid under any"),
    (lambda b: b.update(version="Notebook/2.0"), "was expected"),
])
def test_the_workbook_check_catches_a_mistake(mutate: Any, error: str) -> None:
    book = json.loads(workbook.dumps(AI, ML))
    mutate(book)
    with pytest.raises(jsonschema.ValidationError, match=error):
        workbook_validator().validate(book)


def test_workbook_reads_what_the_azure_runtime_writes() -> None:
    """The custom metric's namespace, name and dimensions are the Function's; the KQL reads
    fields of the tick line the Function logs (its ``summary`` of a real tick)."""
    from trainguard.lambdas.azure import function_app, sinks
    from trainguard.lambdas.state import MemoryStore
    from trainguard.lambdas.tick import tick

    book = workbook.workbook(AI, ML)
    metric_items = [i["content"] for i in book["items"] if i["type"] == 10]
    for content in metric_items:
        (m,) = content["metrics"]
        if m["namespace"] == "trainguard":
            assert m["metric"] == f"{sinks.METRIC_NAMESPACE}--{sinks.METRIC_NAME}"
            used = {m.get("splitBy")} | {f["key"] for f in content.get("filters", [])}
            assert used - {None} <= set(sinks.DIMENSIONS)
            assert content["resourceIds"] == [AI]
        else:
            assert content["resourceIds"] == [ML]
    source_text = Path(function_app.__file__).read_text()
    assert f'"{workbook.TICK_LINE}%s"' in source_text  # the line the KQL parses

    class Azure:
        name = "azureml"

        def list_jobs(self, now: float) -> list[Job]:
            return [Job(id="j1", provider="azureml", scope="sub/ws", state=JobState.RUNNING,
                        hourly_price=3.0, start_time=now - 3600)]

        def stop(self, job: Job, reason: str) -> None:
            raise AssertionError("no stop here")

    report = tick([Azure()], Policy(), MemoryStore(), [], 1_800_000_000.0)
    logged = json.loads(json.dumps(function_app.summary(report), default=str))
    queries = [i["content"]["query"] for i in book["items"] if i["type"] == 3]
    paths = {p for q in queries for p in re.findall(r"tick\.([\w.]+)", q)}
    assert paths >= {"fleet.burn_usd_per_hour", "fleet.saved_usd", "fleet.verdicts",
                     "jobs.azureml"}
    for path in paths:
        value: Any = logged
        for part in path.split("."):
            assert isinstance(value, dict) and part in value, (path, logged)
            value = value[part]
    assert logged["fleet"]["burn_usd_per_hour"] == 3.0
    assert logged["fleet"]["verdicts"]["ok"] == 1


def test_workbook_name_is_a_guid_fixed_per_environment() -> None:
    a, b = workbook.workbook_name("research"), workbook.workbook_name("prod")
    assert re.fullmatch(r"[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}", a)
    assert a == workbook.workbook_name("research") and a != b


# ------------------------------------------------------------------------ CloudWatch

def test_cloudwatch_reads_what_the_lambda_and_sagemaker_write() -> None:
    assert (cloudwatch.NAMESPACE, cloudwatch.FINDINGS, cloudwatch.SPEND, cloudwatch.JOBS,
            cloudwatch.SAVED) == (aws_sinks.NAMESPACE, aws_sinks.FINDINGS, aws_sinks.SPEND,
                                  aws_sinks.JOBS, aws_sinks.SAVED)
    job = Job(id="j", provider="sagemaker", scope="111122223333/us-east-1",
              state=JobState.RUNNING, hourly_price=30.0)
    emitted = {d.name: {k for k, _ in d.dimensions} for d in aws_sinks.tick_metrics(
        [job], [Finding("j", "stall", Severity.CRITICAL, "x")], Policy(), 12.5)}
    assert cloudwatch.SAGEMAKER == sagemaker_metrics.NAMESPACE
    body = cloudwatch.dashboard_body("111122223333", "us-east-1")
    pattern = re.compile(r"SEARCH\('\{([\w/]+),([\w,]+)\} MetricName=\"(\w+)\"(.*?)', "
                         r"'(\w+)', (\d+)\)")
    for widget in body["widgets"]:
        (expr,) = [m["expression"] for m in widget["properties"]["metrics"][0]]
        m = pattern.fullmatch(expr)
        assert m, expr
        namespace, dims, metric = m.group(1), set(m.group(2).split(",")), m.group(3)
        if namespace == cloudwatch.NAMESPACE:
            assert emitted[metric] == dims, expr
            assert 'account="111122223333"' in m.group(4)
        else:
            assert namespace == sagemaker_metrics.NAMESPACE
            assert (metric in sagemaker_metrics.HOST_METRICS and dims == {"Host"}) or (
                metric == "throughput" and dims == {"TrainingJobName"}), expr
        assert widget["properties"]["region"] == "us-east-1"
        assert widget["x"] + widget["width"] <= 24


# ------------------------------------------------------------------------------- CLI

def test_cli_writes_every_dashboard(tmp_path: Path) -> None:
    out = tmp_path / "dash"
    result = CliRunner().invoke(app, [
        "dashboards", "--out", str(out), "--grafana-label", "dashboards=grafana",
        "--aws-account", "111122223333", "--aws-region", "eu-west-1",
        "--azure-insights-id", AI, "--azure-ml-workspace-id", ML])
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in out.iterdir())
    assert written == ["cloudwatch-dashboard.json", "grafana-dashboard.json",
                       "grafanadashboard.yaml", "openshift-console-dashboard.yaml",
                       "workbook.json"]
    assert json.loads((out / "grafana-dashboard.json").read_text()) == \
        grafana.dashboard_json()
    cm = yaml.safe_load((out / "openshift-console-dashboard.yaml").read_text())
    kubernetes_validate.validate(cm, "1.30.0", strict=True)
    gd = yaml.safe_load((out / "grafanadashboard.yaml").read_text())
    jsonschema.Draft7Validator(grafana_crd()).validate({**gd, "metadata": {}})
    assert gd["spec"]["instanceSelector"] == {"matchLabels": {"dashboards": "grafana"}}
    workbook_validator().validate(json.loads((out / "workbook.json").read_text()))
    cw = json.loads((out / "cloudwatch-dashboard.json").read_text())
    assert cw == cloudwatch.dashboard_body("111122223333", "eu-west-1")
    for name in written:
        assert str(out / name) in result.output


def test_cli_without_cloud_ids_writes_the_grafana_ones_and_says_what_it_skipped(
        tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["dashboards", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "grafana-dashboard.json", "openshift-console-dashboard.yaml"]
    assert "--aws-account" in result.output and "--azure-insights-id" in result.output


@pytest.mark.parametrize("args", [
    ["--grafana-label", "dashboards"],
    ["--aws-account", "111122223333"],
    ["--azure-insights-id", "not-a-resource-id", "--azure-ml-workspace-id", ML],
])
def test_cli_bad_option_is_one_line_and_exit_2(tmp_path: Path, args: list[str]) -> None:
    result = CliRunner().invoke(app, ["dashboards", "--out", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert "trainguard: error:" in result.output and "Traceback" not in result.output
