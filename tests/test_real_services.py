"""Issue 12's ten defects, each checked against the service's own reference: what would
deploy fine and stay silent, or fail the apply, on a real account or cluster.

References are vendored under tests/reference (each file names its source and licence);
botocore's service models are read from the installed botocore. The tests on the
synthesised stacks use the session's one synth (tests/conftest.py)."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tests.sagemaker_replay import Recordings, parse
from trainguard.adapters.sagemaker import mapping
from trainguard.checker.model import JobState
from trainguard.checker.signatures import SIGNATURES
from trainguard.stacks.aws import budget_notifications
from trainguard.stacks.environment import (
    AzureEnvironment,
    FluentBitOutput,
    MlWorkspace,
    OpenshiftEnvironment,
    Schedule,
    load_environment,
    this_month,
)
from trainguard.stacks.openshift import DCGM, fluentbit_config

REFERENCE = Path(__file__).parent / "reference"
ROOT = Path(__file__).resolve().parents[1]
Stack = dict[str, Any]


def manifests(stack: Stack, kind: str) -> list[dict[str, Any]]:
    return [r["manifest"] for r in stack["resource"]["kubernetes_manifest"].values()
            if r["manifest"]["kind"] == kind]


# --- 1. Fluent Bit: the key the CRI parser writes -----------------------------------------

def cri_reference() -> tuple[re.Pattern[str], str]:
    """The ``cri`` multiline parser's regex and the key it puts a line's text under, read
    from Fluent Bit's own source (tests/reference/fluent-bit)."""
    src = (REFERENCE / "fluent-bit" / "flb_ml_parser_cri.c").read_text()
    m = re.search(r'#define FLB_ML_CRI_REGEX\s*\\\s*"(.+)"', src)
    assert m is not None
    key = re.search(r'"(\w+)",\s*/\* key_content \*/', src)
    assert key is not None
    return re.compile(m.group(1).replace("(?<", "(?P<")), key.group(1)


def fluentbit_env() -> OpenshiftEnvironment:
    digest = "@sha256:" + "0" * 64
    return OpenshiftEnvironment(
        name="fb-test", policy="policies/production-stops.yaml", cluster="c",
        watch_namespaces=["ml-a"], image="quay.io/x/trainguard" + digest,
        log_shipping="fluentbit",
        fluentbit=FluentBitOutput(host="loki.example.com",
                                  image="cr.fluentbit.io/fluent/fluent-bit" + digest))


def retag(record: dict[str, str], rules: list[str]) -> list[str]:
    """What rewrite_tag does with a record: each ``Rule KEY REGEX TAG KEEP`` whose key's
    value matches gives the record a copy under TAG (``$name``: the record's field)."""
    tags = []
    for rule in rules:
        key, regex, tag, _keep = rule.split()[1:]
        value = record.get(key.removeprefix("$"))
        if value is not None and re.search(regex, value):
            tags.append(tag)
    return tags


def test_fluent_bit_rules_key_on_what_the_cri_parser_writes() -> None:
    regex, key = cri_reference()
    filters = fluentbit_config(fluentbit_env())["filters"]
    rules = [line.strip() for line in filters.splitlines() if line.strip().startswith("Rule ")]
    assert len(rules) == len(SIGNATURES)
    assert {r.split()[1] for r in rules} == {f"${key}"}
    assert "multiline.parser cri" in fluentbit_config(fluentbit_env())["inputs"]
    # A container line as CRI-O writes it, parsed as the parser parses it, is re-tagged.
    line = ("2026-12-01T10:00:00.123456789+00:00 stderr F torch.OutOfMemoryError: CUDA out "
            "of memory. Tried to allocate 2.00 GiB")
    match = regex.match(line)
    assert match is not None
    record = match.groupdict()
    assert retag(record, rules) == ["trainguard.critical.cuda_oom"]
    plain = regex.match("2026-12-01T10:00:01.0+00:00 stdout F step 100 loss 2.31")
    assert plain is not None and retag(plain.groupdict(), rules) == []


# --- 2. the DCGM PodMonitor names the DaemonSet's container port ---------------------------

def test_dcgm_pod_monitor_names_the_exporters_container_port(stacks: dict[str, Stack]) -> None:
    daemonset = yaml.safe_load((REFERENCE / "gpu-operator" / "0800_daemonset.yaml").read_text())
    service = yaml.safe_load((REFERENCE / "gpu-operator" / "0600_service.yaml").read_text())
    pod = daemonset["spec"]["template"]
    container_ports = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
    [monitor] = [m for m in manifests(stacks["openshift-onprem"], "PodMonitor")
                 if m["metadata"]["namespace"] == DCGM["namespace"]]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in container_ports
    assert endpoint["port"] not in {p["name"] for p in service["spec"]["ports"]} - container_ports
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    # honorLabels keeps the exporter's pod label (the training pod), not the scrape's
    assert endpoint["honorLabels"] is True


# --- 3. Azure log-signature alerts: an explicit workspace, tostring(LogMessage) ----------

def azure(**kw: Any) -> AzureEnvironment:
    return AzureEnvironment(name="az-test", policy="policies/research-team.yaml",
                            subscription="00000000-1111-2222-3333-444444444444",
                            region="westeurope",
                            ml_workspace=MlWorkspace(resource_group="rg", name="ws"), **kw)


def test_azure_log_alerts_query_the_named_workspace_as_text(stacks: dict[str, Stack]) -> None:
    env = load_environment(ROOT / "environments" / "azure-research.yaml")
    assert isinstance(env.spec, AzureEnvironment)
    assert env.spec.log_query is not None
    rules = stacks["azure-research"]["resource"][
        "azurerm_monitor_scheduled_query_rules_alert_v2"].values()
    for rule in rules:
        # the Container Insights workspace the environment names, not the stack's own
        assert rule["scopes"] == [env.spec.log_query.workspace_id]
        assert "tostring(LogMessage) matches regex" in rule["criteria"][0]["query"]
        assert rule["skip_query_validation"] is False


def test_azure_log_query_needs_its_workspace() -> None:
    with pytest.raises(ValidationError, match="workspace_id"):
        azure(log_query={"table": "ContainerLogV2", "column": "LogMessage"})
    assert azure().log_query is None  # compute clusters: no query alert at all


# --- 4. the Azure budget's start date ---------------------------------------------------

def test_azure_budget_starts_this_month_and_rejects_past_months() -> None:
    assert azure().budget_start_date == this_month()
    past = (this_month() - timedelta(days=1)).replace(day=1)
    with pytest.raises(ValidationError, match="past month"):
        azure(budget_start=past.isoformat())
    with pytest.raises(ValidationError, match="first day"):
        azure(budget_start=this_month().replace(day=2).isoformat())
    later = (this_month() + timedelta(days=40)).replace(day=1)
    assert azure(budget_start=later.isoformat()).budget_start_date == later


def test_this_month_is_the_first_of_the_current_month() -> None:
    assert this_month(date(2026, 12, 17)) == date(2026, 12, 1)
    assert this_month() == datetime.now(UTC).date().replace(day=1)


# --- 5. the SageMaker log group exists before it is subscribed to -----------------------

def test_training_log_group_is_made_with_retention_and_subscribed_after(
        stacks: dict[str, Stack]) -> None:
    res = stacks["aws-dev"]["resource"]
    groups = {k: g for k, g in res["aws_cloudwatch_log_group"].items()
              if g["name"] == "/aws/sagemaker/TrainingJobs"}
    [(gid, group)] = groups.items()
    assert group["retention_in_days"] == 365
    (flt,) = res["aws_cloudwatch_log_subscription_filter"].values()
    assert flt["log_group_name"] == f"${{aws_cloudwatch_log_group.{gid}.name}}"
    assert f"aws_cloudwatch_log_group.{gid}" in flt["depends_on"]


# --- 6. EventBridge cron: day of week counted from Sunday = 1 --------------------------

EB = yaml.safe_load((REFERENCE / "eventbridge" / "cron.yaml").read_text())


def eventbridge_weekdays(field: str) -> set[int]:
    """Python weekdays (Monday 0) an EventBridge day-of-week field names, read as its
    documentation says (1-7 or SUN-SAT, 1 = SUN; ',' and '-')."""
    names = EB["day_of_week"]["names"]
    assert names[0] == EB["day_of_week"]["first_day"]

    def number(tok: str) -> int:
        n = names.index(tok) + 1 if tok in names else int(tok)
        if not 1 <= n <= 7:
            raise ValueError(f"{tok}: EventBridge days are 1-7")
        return n

    out: set[int] = set()
    for part in field.split(","):
        a, _, b = part.partition("-")
        for n in range(number(a), number(b or a) + 1):
            out.add((n + 5) % 7)  # 1 (SUN) -> 6, 2 (MON) -> 0
    return out


def cron_weekdays(field: str) -> set[int]:
    """Python weekdays a standard cron day-of-week field names (0 and 7 are Sunday)."""
    out: set[int] = set()
    for part in field.split(","):
        rng, _, step = part.partition("/")
        a, b = (0, 6) if rng == "*" else (int(rng.split("-")[0]), int(rng.split("-")[-1]))
        out.update((d + 6) % 7 for d in range(a, b + 1, int(step or 1)))
    return out


@pytest.mark.parametrize("dow", ["1-5", "0", "7", "6", "0,6", "5-7", "1,3,5", "*/2",
                                 "2-4", "0-6"])
def test_eventbridge_day_of_week_means_the_same_days(dow: str) -> None:
    expr = Schedule.parse(f"cron(30 9 * * {dow})").aws()
    fields = expr.removeprefix("cron(").removesuffix(")").split()
    assert len(fields) == len(EB["fields"])
    assert fields[2] == "?"  # one of the two day fields is '?'
    assert eventbridge_weekdays(fields[4]) == cron_weekdays(dow), expr


def test_both_day_fields_restricted_is_refused_for_eventbridge(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="EventBridge takes only one"):
        Schedule.parse("cron(0 9 1 * 1)").aws()
    text = (ROOT / "environments" / "aws-dev.yaml").read_text().replace(
        "schedule: rate(5 minutes)", "schedule: cron(0 9 1 * 1)")
    path = tmp_path / "aws-dev.yaml"
    path.write_text(text)
    with pytest.raises(Exception, match="schedule") as err:
        load_environment(path, root=ROOT)
    assert "EventBridge" in str(err.value)


# --- 7. AWS Budgets: no forecast on a daily budget --------------------------------------

def test_daily_budget_has_no_forecasted_notification() -> None:
    daily = budget_notifications("DAILY", [0.5, 0.8, 1.0])
    assert [k for k, _ in daily] == ["ACTUAL"] * 3
    monthly = budget_notifications("MONTHLY", [0.5, 0.8, 1.0, 1.2, 1.5])
    assert ("FORECASTED", 100.0) in monthly and len(monthly) == 5
    assert len(budget_notifications("DAILY", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6])) == 5


def test_notification_types_are_the_budgets_models() -> None:
    import botocore.session
    from botocore.model import StringShape
    model = botocore.session.get_session().get_service_model("budgets")
    notification_type, time_unit = model.shape_for("NotificationType"), model.shape_for("TimeUnit")
    assert isinstance(notification_type, StringShape) and isinstance(time_unit, StringShape)
    kinds = set(notification_type.enum)
    units = set(time_unit.enum)
    for unit in units:
        assert {k for k, _ in budget_notifications(unit, [0.8, 1.0])} <= kinds


# --- 8. the Azure Function's deploy path, as the docs say -------------------------------

def test_function_runs_from_a_private_blob_as_the_docs_say(stacks: dict[str, Stack]) -> None:
    res = stacks["azure-research"]["resource"]
    (app,) = res["azurerm_linux_function_app"].values()
    settings = app["app_settings"]
    assert settings["WEBSITE_RUN_FROM_PACKAGE"].startswith("${azurerm_storage_blob.")
    assert settings["WEBSITE_RUN_FROM_PACKAGE_BLOB_MI_RESOURCE_ID"] == "SystemAssigned"
    assert app["webdeploy_publish_basic_authentication_enabled"] is False
    assert app["ftp_publish_basic_authentication_enabled"] is False
    (container,) = res["azurerm_storage_container"].values()
    assert container["container_access_type"] == "private"
    docs = "\n".join((ROOT / p).read_text() for p in ("README.md", "docs/deploy.md"))
    assert "WEBSITE_RUN_FROM_PACKAGE" in docs
    # the site's public network access is on (the platform reaches it); no page says off
    assert app["public_network_access_enabled"] is True
    assert not re.search(r"public\s+(network\s+)?access\s+(is\s+)?(off|disabled)", docs, re.I)
    assert not re.search(r"zip (push|deploy)[^.\n]*(is how|deploys the app)", docs, re.I)


# --- 9. SageMaker InstancePreferences --------------------------------------------------

def test_instance_preferences_job_is_priced_by_the_selected_type() -> None:
    body = Recordings().body("describe-llm-pretrain-a")
    body["ResourceConfig"] = {
        "VolumeSizeInGB": 100,
        "InstancePreferences": [{"InstanceType": "ml.p5.48xlarge", "InstanceCount": 1},
                                {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2}],
        "SelectedInstanceType": "ml.p4d.24xlarge", "SelectedInstanceCount": 2}
    # decoded as botocore decodes DescribeTrainingJob: a field its model lacks is dropped
    doc = parse("DescribeTrainingJob", body)
    assert doc["ResourceConfig"]["SelectedInstanceType"] == "ml.p4d.24xlarge"
    job = mapping.to_job(doc)
    assert (job.instance_type, job.instance_count, job.gpus_per_instance) == (
        "ml.p4d.24xlarge", 2, 8)
    assert mapping.host_count(doc) == 2


def test_a_job_not_yet_placed_or_unmappable_is_listed_unknown_with_its_reason() -> None:
    body = Recordings().body("describe-llm-pretrain-a")
    body["ResourceConfig"] = {"InstancePreferences": [{"InstanceType": "ml.p5.48xlarge"}]}
    doc = parse("DescribeTrainingJob", body)
    with pytest.raises(mapping.MalformedJob, match="SelectedInstanceType"):
        mapping.to_job(doc)
    job = mapping.unmapped_job(doc, "llm-pretrain-a", "no instance chosen")
    assert job.state is JobState.UNKNOWN and job.id == "llm-pretrain-a"
    assert job.failure_reason == "not watched: no instance chosen"
    assert job.scope == "123456789012/us-east-1"


# --- 10. LokiStack: the AlertingRule and its namespace carry the ruler's selectors -------

def test_alerting_rules_match_the_lokistacks_selectors(stacks: dict[str, Stack]) -> None:
    loki = yaml.safe_load((REFERENCE / "lokistack" / "lokistack-rules.yaml").read_text())
    rules_spec = loki["spec"]["rules"]
    stack = stacks["openshift-onprem"]
    env = load_environment(ROOT / "environments" / "openshift-onprem.yaml")
    assert isinstance(env.spec, OpenshiftEnvironment)
    watched = set(env.spec.watch_namespaces)
    alerting = manifests(stack, "AlertingRule")
    assert {m["metadata"]["namespace"] for m in alerting} == watched
    for rule in alerting:
        assert rules_spec["selector"]["matchLabels"].items() <= rule["metadata"]["labels"].items()
    labelled = {r["metadata"][0]["name"] if isinstance(r["metadata"], list)
                else r["metadata"]["name"]: r
                for r in stack["resource"]["kubernetes_labels"].values()
                if r["kind"] == "Namespace"}
    assert set(labelled) == watched
    for ns in labelled.values():
        assert rules_spec["namespaceSelector"]["matchLabels"].items() <= ns["labels"].items()


# --- KQL: the tables and columns the queries use ----------------------------------------

def test_kql_uses_the_tables_columns_and_reads_dynamic_ones_as_text(
        stacks: dict[str, Stack]) -> None:
    """Each query names the table the environment gives, uses only that table's columns
    (Microsoft's table reference, vendored), and a ``dynamic`` column only through
    ``tostring()`` (``matches regex`` on a dynamic value fails)."""
    ref = yaml.safe_load((REFERENCE / "azure-monitor" / "ContainerLogV2.yaml").read_text())
    rules = stacks["azure-research"]["resource"][
        "azurerm_monitor_scheduled_query_rules_alert_v2"].values()
    for rule in rules:
        query = rule["criteria"][0]["query"]
        table, *body = query.split("\n")
        assert table == ref["table"]
        text = "\n".join(body)
        for m in re.finditer(r"(\w+|tostring\((\w+)\)) matches regex", text):
            column = m.group(2) or m.group(1)
            assert column in ref["columns"], column
            if ref["columns"][column] == "dynamic":
                assert m.group(2), f"{column} is dynamic: wrap it in tostring()"


def test_an_existing_training_log_group_is_adopted_by_an_import_block() -> None:
    """On a bare stack (CDK construct test): ``exists: true`` adopts the group with a
    Terraform import block instead of creating it (which fails with "already exists")."""
    import json

    from cdktn import TerraformStack, Testing

    from trainguard.stacks.aws import training_log_group
    from trainguard.stacks.environment import TrainingLogGroup

    app = Testing.app()
    synthed = {}
    for exists in (True, False):
        stack = TerraformStack(app, f"bare-{exists}".lower())
        training_log_group(stack, TrainingLogGroup(exists=exists, retention_days=30))
        synthed[exists] = json.loads(Testing.synth(stack))
    assert synthed[True]["import"] == [{"id": "/aws/sagemaker/TrainingJobs",
                                        "to": "aws_cloudwatch_log_group.training_log_group"}]
    assert "import" not in synthed[False]
    for out in synthed.values():
        group = out["resource"]["aws_cloudwatch_log_group"]["training_log_group"]
        assert group == {"name": "/aws/sagemaker/TrainingJobs", "retention_in_days": 30}
