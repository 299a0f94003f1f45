"""The CDK Terrain stacks, synthesised once per session from the sample environments.

No Terraform provider can be downloaded here, so nothing is planned: the synthesised
JSON is checked instead, by golden files (reviewed, normalised), by assertions on what
matters, by checkov and by promtool on the generated PrometheusRules.

Golden files: ``TRAINGUARD_UPDATE_GOLDEN=1 pytest tests/test_stacks.py`` rewrites them;
review the diff. The one value normalised is the Lambda asset's folder name, a hash of
the package (it changes with every commit of the packaged code, which the package test
checks byte for byte instead).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import SAMPLES
from trainguard.checker.logship import cloudwatch_pattern
from trainguard.checker.model import Severity
from trainguard.checker.registry import rule_names
from trainguard.checker.signatures import SIGNATURES
from trainguard.stacks import package
from trainguard.stacks.environment import ROOT, load_environment, this_month
from trainguard.stacks.prometheus_rules import rule_groups

pytestmark = pytest.mark.slow


GOLDEN = Path(__file__).parent / "stacks_golden"
CHECKOV = ROOT / ".tools" / "checkov" / "bin" / "checkov"
PROMTOOL = shutil.which("promtool")
ASSET = re.compile(r"assets/package/[0-9A-F]{32}/")

Stack = dict[str, Any]


def resources(stack: Stack, kind: str) -> dict[str, Any]:
    out: dict[str, Any] = stack["resource"].get(kind, {})
    return out


def test_cdktf_json_runs_this_app() -> None:
    manifest = json.loads((ROOT / "cdktf.json").read_text())
    assert manifest["language"] == "python"
    assert manifest["app"].endswith("-m trainguard.stacks")


def test_one_stack_per_environment_file(outdir: Path) -> None:
    files = sorted(p.stem for p in (ROOT / "environments").glob("*.yaml"))
    assert sorted(p.name for p in (outdir / "stacks").iterdir()) == files
    assert set(SAMPLES) <= set(files)


CLI = ROOT / ".tools" / "node_modules" / ".bin" / "cdktn"


def test_cdktn_cli_synth_gives_the_same_stacks(stacks: dict[str, Stack],
                                               tmp_path: Path) -> None:
    """``cdktn synth`` (the CLI, reading cdktf.json) writes what the app run directly
    writes."""
    if not CLI.exists():
        pytest.skip(f"cdktn-cli not installed at {CLI} (./run setup installs it)")
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, check=False)
    major = int(node.stdout.strip().lstrip("v").split(".")[0])
    env = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
           "CHECKPOINT_DISABLE": "1"}
    if major < 22:
        env["NODE_OPTIONS"] = f"--require {ROOT / 'stacks' / 'node20-shim.cjs'}"
    out = tmp_path / "cli.out"
    done = subprocess.run([str(CLI), "synth", "--output", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for name in SAMPLES:
        cli = json.loads((out / "stacks" / name / "cdk.tf.json").read_text())
        assert normalised(cli) == normalised(stacks[name]), name


# ---------------------------------------------------------------------------- golden


#: an Azure budget starts in the month of the synth (stacks/environment.py this_month)
BUDGET_START = re.compile(r'"start_date": "\d{4}-\d{2}-01T00:00:00Z"')


def normalised(stack: Stack) -> str:
    text = ASSET.sub("assets/package/<ASSET_HASH>/", json.dumps(stack, indent=1,
                                                                sort_keys=True)) + "\n"
    return BUDGET_START.sub('"start_date": "<THIS_MONTH>"', text)


@pytest.mark.parametrize("name", SAMPLES)
def test_golden(stacks: dict[str, Stack], name: str) -> None:
    text = normalised(stacks[name])
    assert str(ROOT) not in text, "an absolute path of this checkout leaked into the stack"
    golden = GOLDEN / f"{name}.json"
    if os.environ.get("TRAINGUARD_UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.is_file(), f"no golden file {golden}: run with TRAINGUARD_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), (
        f"{name} differs from {golden.name}; if intended, regenerate with "
        "TRAINGUARD_UPDATE_GOLDEN=1 and review the diff")


# ------------------------------------------------------------------------------- AWS


def policy_statements(stack: Stack) -> dict[str, dict[str, Any]]:
    (policy,) = resources(stack, "aws_iam_role_policy").values()
    return {s["Sid"]: s for s in json.loads(policy["policy"])["Statement"]}


def test_aws_schedule_and_state_change_rule(stacks: dict[str, Stack]) -> None:
    rules = resources(stacks["aws-dev"], "aws_cloudwatch_event_rule")
    assert rules["tick"]["schedule_expression"] == "rate(5 minutes)"
    pattern = json.loads(rules["job_state"]["event_pattern"])
    assert pattern == {"source": ["aws.sagemaker"],
                       "detail-type": ["SageMaker Training Job State Change"]}
    targets = resources(stacks["aws-dev"], "aws_cloudwatch_event_target")
    assert {t["arn"] for t in targets.values()} == {"${aws_lambda_function.watchdog.arn}"}


def test_aws_stop_only_on_tagged_jobs(stacks: dict[str, Stack]) -> None:
    stmts = policy_statements(stacks["aws-dev"])
    stopping = [s for s in stmts.values() if "sagemaker:StopTrainingJob" in s["Action"]]
    allow, deny = ([s for s in stopping if s["Effect"] == e] for e in ("Allow", "Deny"))
    (stop,) = allow
    assert stop["Action"] == ["sagemaker:StopTrainingJob"]
    assert stop["Resource"] == "arn:aws:sagemaker:us-east-1:111122223333:training-job/*"
    assert stop["Condition"] == {"StringEquals": {
        "aws:ResourceTag/trainguard:environment": "aws-dev"}}
    # The protect tag refuses the stop in IAM too (issue 16): present and not "false".
    (never,) = deny
    assert never["Resource"] == stop["Resource"]
    assert never["Condition"] == {
        "Null": {"aws:ResourceTag/trainguard:protect": "false"},
        "StringNotEqualsIgnoreCase": {"aws:ResourceTag/trainguard:protect": "false"}}


def test_aws_audit_rows_are_never_updated_or_deleted(stacks: dict[str, Stack]) -> None:
    deny = policy_statements(stacks["aws-dev"])["AuditIsAppendOnly"]
    assert deny["Effect"] == "Deny"
    assert set(deny["Action"]) == {"dynamodb:UpdateItem", "dynamodb:DeleteItem"}
    assert deny["Condition"] == {"ForAnyValue:StringEquals": {"dynamodb:LeadingKeys": ["audit"]}}
    from trainguard.lambdas.aws.dynamodb_state import AUDIT
    assert AUDIT == "audit"  # the store's partition key for audit records


def test_aws_tag_guard_boundary_and_scp(stacks: dict[str, Stack]) -> None:
    stack = stacks["aws-dev"]
    (guard,) = resources(stack, "aws_iam_policy").values()
    doc = json.loads(guard["policy"])["Statement"]
    (tags,) = [s for s in doc if s["Sid"] == "NoTrainguardTagChanges"]
    assert tags["Effect"] == "Deny"
    assert set(tags["Action"]) == {"sagemaker:AddTags", "sagemaker:DeleteTags"}
    assert "trainguard:*" in tags["Condition"]["ForAnyValue:StringLike"]["aws:TagKeys"]
    # as a permissions boundary it allows everything else
    assert {"Sid": "EverythingElse", "Effect": "Allow", "Action": "*", "Resource": "*"} in doc
    scp = json.loads(stack["output"]["tag_guard_scp"]["value"])["Statement"]
    assert scp == [s for s in doc if s["Effect"] == "Deny"]


def test_aws_no_wildcard_that_could_be_narrowed(stacks: dict[str, Stack]) -> None:
    # Actions with no resource type in IAM: "*" is the narrowest possible for them.
    unscoped = {"sagemaker:ListTrainingJobs", "cloudwatch:GetMetricData"}
    for sid, s in policy_statements(stacks["aws-dev"]).items():
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        assert all("*" not in a for a in actions), sid
        if s["Resource"] == "*":
            assert set(actions) <= unscoped, sid
    # The findings metrics are EMF lines: the function may not put metrics itself (a
    # compromised one could forge the training metrics of any job, issue 16).
    assert not any("cloudwatch:PutMetricData" in s["Action"]
                   for s in policy_statements(stacks["aws-dev"]).values())


def test_aws_encryption_and_recovery(stacks: dict[str, Stack]) -> None:
    stack = stacks["aws-dev"]
    key = "${aws_kms_key.key.arn}"
    (table,) = resources(stack, "aws_dynamodb_table").values()
    assert table["server_side_encryption"] == {"enabled": True, "kms_key_arn": key}
    assert table["point_in_time_recovery"] == {"enabled": True}
    (topic,) = resources(stack, "aws_sns_topic").values()
    assert topic["kms_master_key_id"] == key
    logs = resources(stack, "aws_cloudwatch_log_group")["function_logs"]
    assert logs["kms_key_id"] == key and logs["retention_in_days"] == 365
    (kms,) = resources(stack, "aws_kms_key").values()
    assert kms["enable_key_rotation"] is True


def test_aws_alarms_budgets_and_log_filter(stacks: dict[str, Stack]) -> None:
    stack = stacks["aws-dev"]
    env = load_environment(ROOT / "environments" / "aws-dev.yaml")
    alarms = resources(stack, "aws_cloudwatch_metric_alarm")
    # production-stops notifies or stops on warning and critical for every rule.
    assert len(alarms) == 2 * len(rule_names())
    for alarm in alarms.values():
        assert (alarm["namespace"], alarm["metric_name"]) == ("trainguard", "Findings")
        assert set(alarm["dimensions"]) == {"account", "rule", "severity"}
        assert alarm["alarm_actions"] == ["${aws_sns_topic.alarms.arn}"]
    (budget,) = resources(stack, "aws_budgets_budget").values()
    (acct,) = env.policy.budget.accounts
    assert budget["limit_amount"] == f"{acct.limit_usd:.2f}"
    assert budget["time_unit"] == "MONTHLY"
    actual = [n["threshold"] for n in budget["notification"]
              if n["notification_type"] == "ACTUAL"]
    assert actual == [round(f * 100, 2) for f in sorted(env.policy.budget.alert_at)]
    assert len(budget["notification"]) <= 5  # the AWS Budgets limit
    (flt,) = resources(stack, "aws_cloudwatch_log_subscription_filter").values()
    group = resources(stack, "aws_cloudwatch_log_group")["training_log_group"]
    assert group["name"] == "/aws/sagemaker/TrainingJobs"
    assert flt["log_group_name"] == "${aws_cloudwatch_log_group.training_log_group.name}"
    assert flt["filter_pattern"] == cloudwatch_pattern()
    for sig in SIGNATURES:
        assert all(f'"{lit}"' in flt["filter_pattern"] for lit in sig.literals), sig.name
    subs = resources(stack, "aws_sns_topic_subscription")
    assert {(s["protocol"], s["endpoint"]) for s in subs.values()} == {
        ("email", "ml-platform@example.com"),
        # the URL is an SSM SecureString read at deploy time, never in the repository
        ("https", "${data.aws_ssm_parameter.webhook_chat-relay_url.value}")}
    (param,) = stack["data"]["aws_ssm_parameter"].values()
    assert {k: v for k, v in param.items() if k != "//"} == {
        "name": "/trainguard/aws-dev/chat-relay-url", "with_decryption": True}
    assert "chat-relay.example.com" not in json.dumps(stack)


def test_aws_lambda_package_holds_this_commit(stacks: dict[str, Stack], outdir: Path,
                                              tmp_path: Path) -> None:
    (fn,) = resources(stacks["aws-dev"], "aws_lambda_function").values()
    assert fn["handler"] == "trainguard.lambdas.aws.handler" and fn["runtime"] == "python3.11"
    assert fn["reserved_concurrent_executions"] == 1
    zipped = outdir / "stacks" / "aws-dev" / fn["filename"]
    assert zipped.stat().st_size < package.LAMBDA_LIMIT_BYTES
    with zipfile.ZipFile(zipped) as zf:
        names = zf.namelist()
        assert names == sorted(names)
        for path in [*sorted((ROOT / "checker").rglob("*.py")),
                     *sorted((ROOT / "lambdas").rglob("*.py")),
                     *sorted((ROOT / "config").rglob("*.py")),
                     ROOT / "config" / "default-policy.yaml"]:
            rel = f"trainguard/{path.relative_to(ROOT).as_posix()}"  # one namespace
            assert zf.read(rel) == path.read_bytes(), f"{rel} in the package is not this commit's"
        assert zf.read("policy.yaml") == (ROOT / "policies" / "production-stops.yaml").read_bytes()
        for top in ("numpy/", "yaml/", "pydantic/", "pydantic_core/", "aws_lambda_powertools/"):
            assert any(n.startswith(top) for n in names), top
        assert not any("__pycache__" in n or n.startswith("boto3/") for n in names)
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    again = package.build(ROOT / "policies" / "production-stops.yaml", tmp_path / "again.zip")
    assert again.path.read_bytes() == zipped.read_bytes(), "the package is not reproducible"


# ----------------------------------------------------------------------------- Azure


def test_azure_function_identity_and_roles(stacks: dict[str, Stack]) -> None:
    stack = stacks["azure-research"]
    (fn,) = resources(stack, "azurerm_linux_function_app").values()
    assert fn["identity"] == {"type": "SystemAssigned"}
    assert fn["site_config"]["application_stack"] == {"python_version": "3.11"}
    assert fn["app_settings"]["TRAINGUARD_SCHEDULE"] == "0 */10 * * * *"
    assert fn["https_only"] is True
    (role,) = resources(stack, "azurerm_role_definition").values()
    ws = ("/subscriptions/00000000-1111-2222-3333-444444444444/resourceGroups/ml-research"
          "/providers/Microsoft.MachineLearningServices/workspaces/research-ws")
    assert role["scope"] == ws and role["assignable_scopes"] == [ws]
    (perms,) = role["permissions"]
    actions = perms["actions"]
    assert all(a.startswith("Microsoft.MachineLearningServices/workspaces/") for a in actions)
    assert not any("*" in a or a.endswith(("/write", "/delete")) for a in actions)
    # research-team runs with stop_enabled: false, so not even the cancel right.
    assert not any("cancel" in a for a in actions)
    scopes = {a["scope"] for a in resources(stack, "azurerm_role_assignment").values()}
    vault = ("/subscriptions/00000000-1111-2222-3333-444444444444/resourceGroups/"
             "trainguard-research/providers/Microsoft.KeyVault/vaults/tg-research-kv")
    # the state table only (not every table of the account), and the one webhook secret
    assert scopes == {ws, "${azurerm_storage_account.storage.id}",
                      "${azurerm_storage_table.state.resource_manager_id}",
                      "${azurerm_application_insights.insights.id}",
                      f"{vault}/secrets/teams-webhook-url"}


def test_azure_alerts_and_budget(stacks: dict[str, Stack]) -> None:
    stack = stacks["azure-research"]
    (group,) = resources(stack, "azurerm_monitor_action_group").values()
    assert [r["email_address"] for r in group["email_receiver"]] == [
        "research-leads@example.com"]
    assert [r["service_uri"] for r in group["webhook_receiver"]] == [
        "${data.azurerm_key_vault_secret.webhook_teams_url.value}"]
    assert "webhook.office.com" not in json.dumps(stack)
    queries = [r["criteria"][0]["query"]
               for r in resources(stack, "azurerm_monitor_scheduled_query_rules_alert_v2"
                                  ).values()]
    assert len(queries) == 2  # one per severity, the signature as the alert's dimension
    for sig in SIGNATURES:
        assert sum(f'"{sig.name}"' in q for q in queries) == 1, sig.name
    assert all(q.startswith("ContainerLogV2\n") for q in queries)
    assert all("tostring(LogMessage) matches regex" in q for q in queries)
    metric = resources(stack, "azurerm_monitor_metric_alert")
    assert {m["severity"] for m in metric.values()} <= {1, 2}
    # research-team: a monthly 40,000 budget becomes an Azure budget; its weekly one
    # cannot (Azure budgets have no week grain) and stays with the watchdog's budget rule.
    (budget,) = resources(stack, "azurerm_consumption_budget_subscription").values()
    assert budget["amount"] == 40000 and budget["time_grain"] == "Monthly"
    # this month's first day (a past month is rejected on apply), never replaced later
    assert budget["time_period"]["start_date"] == f"{this_month().isoformat()}T00:00:00Z"
    assert budget["lifecycle"]["ignore_changes"] == ["time_period[0].start_date"]
    assert len(budget["notification"]) <= 5


# ------------------------------------------------------------------------- OpenShift


def test_openshift_pod_security(stacks: dict[str, Stack]) -> None:
    (cron,) = resources(stacks["openshift-onprem"], "kubernetes_cron_job_v1").values()
    assert cron["spec"]["schedule"] == "*/5 * * * *"
    assert cron["spec"]["concurrency_policy"] == "Forbid"
    pod = cron["spec"]["job_template"]["spec"]["template"]["spec"]
    assert pod["security_context"]["run_as_non_root"] is True
    assert "run_as_user" not in pod["security_context"]  # restricted-v2 picks the uid
    (container,) = pod["container"]
    sc = container["security_context"]
    assert sc["run_as_non_root"] is True
    assert sc["allow_privilege_escalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["read_only_root_filesystem"] is True
    assert sc["seccomp_profile"] == {"type": "RuntimeDefault"}
    tmp = [v for v in pod["volume"] if v["name"] == "tmp"]
    assert tmp and "empty_dir" in tmp[0]
    assert {"mount_path": "/tmp", "name": "tmp"} in container["volume_mount"]


def test_openshift_rbac_is_only_what_the_watchdog_needs(stacks: dict[str, Stack]) -> None:
    roles = resources(stacks["openshift-onprem"], "kubernetes_role_v1")
    grants: set[tuple[str, str, str, str]] = set()
    for role in roles.values():
        ns = role["metadata"][0]["namespace"]
        for rule in role["rule"]:
            for group in rule["api_groups"]:
                for res in rule["resources"]:
                    for verb in rule["verbs"]:
                        grants.add((ns if ns.startswith("ml-") else "own", group, res, verb))
    expected = {("own", "", "configmaps", v) for v in ("get", "update")}
    for ns in ("ml-team-a", "ml-team-b"):
        # pods are listed, never read one by one nor watched; jobs read (again just
        # before a stop), listed, and patched to suspend them
        expected |= {(ns, "", "pods", "list")}
        for group, res in (("kubeflow.org", "pytorchjobs"), ("trainer.kubeflow.org",
                                                             "trainjobs")):
            expected |= {(ns, group, res, v) for v in ("get", "list", "patch")}
    assert grants == expected
    (state,) = [r for r in roles.values() if r["rule"][0]["resources"] == ["configmaps"]]
    assert state["rule"][0]["resource_names"] == ["trainguard-state"]


def test_openshift_rules_forwarder_and_receivers(stacks: dict[str, Stack]) -> None:
    stack = stacks["openshift-onprem"]
    env = load_environment(ROOT / "environments" / "openshift-onprem.yaml")
    manifests = {k: v["manifest"] for k, v in resources(stack, "kubernetes_manifest").items()}
    kinds = sorted(m["kind"] for m in manifests.values())
    # the rules' alerts in each watched namespace, and the watchdog-silent alert (the
    # sample pushes to a Pushgateway)
    assert kinds.count("PrometheusRule") == 3 and kinds.count("AlertmanagerConfig") == 3
    assert "ClusterLogForwarder" in kinds and kinds.count("AlertingRule") == 2
    for m in manifests.values():
        if m["kind"] == "PrometheusRule" and m["spec"]["groups"][0]["name"] != (
                "trainguard-watchdog"):
            assert m["spec"] == rule_groups(env.policy)
        if m["kind"] == "AlertmanagerConfig":
            (receiver,) = m["spec"]["receivers"]
            assert [e["to"] for e in receiver["emailConfigs"]] == ["gpu-oncall@example.com"]
            assert [w["urlSecret"] for w in receiver["webhookConfigs"]] == [
                {"name": "trainguard-webhooks", "key": "chat-relay-url"}]
            assert "url" not in receiver["webhookConfigs"][0]
        if m["kind"] == "AlertingRule":
            names = {r["labels"]["signature"] for r in m["spec"]["groups"][0]["rules"]}
            assert names == {s.name for s in SIGNATURES}
    (policy_cm,) = [c for c in resources(stack, "kubernetes_config_map_v1").values()
                    if c["metadata"]["name"] == "trainguard-policy"]
    assert policy_cm["data"]["policy.yaml"] == env.policy_path.read_text()


# --------------------------------------------------------------------------- checkov


def test_checkov_no_unjustified_failure(outdir: Path) -> None:
    if not CHECKOV.exists():
        pytest.skip(f"checkov not installed at {CHECKOV} (./run setup installs it)")
    skips = yaml.safe_load((ROOT / "stacks" / "checkov_skips.yaml").read_text())
    for s in skips:
        assert len(str(s.get("reason") or "").split()) >= 5, f"skip without a reason: {s}"
    accepted = {(s["cloud"], s["check"], s["resource"]) for s in skips}
    clouds = {"aws-dev": "aws", "azure-research": "azure", "openshift-onprem": "openshift"}
    done = subprocess.run(
        [str(CHECKOV), "-d", str(outdir / "stacks"), "--framework", "terraform_json",
         "--quiet", "--compact", "-o", "json"],
        capture_output=True, text=True, timeout=240, check=False)
    report = json.loads(done.stdout)
    reports = report if isinstance(report, list) else [report]
    failed = set()
    for rep in reports:
        for c in rep["results"]["failed_checks"]:
            env = Path(c["file_path"]).parent.name
            failed.add((clouds[env], c["check_id"], c["resource"].split(".")[-1]))
    assert failed - accepted == set(), "checkov failures without a justified skip"
    assert accepted - failed == set(), "stale skips in stacks/checkov_skips.yaml"
    passed = sum(r["summary"]["passed"] for r in reports)
    assert passed > 50


# -------------------------------------------------------------------------- promtool


def rules_file(tmp_path: Path, annotations: bool) -> Path:
    env = load_environment(ROOT / "environments" / "openshift-onprem.yaml")
    groups = rule_groups(env.policy)
    if not annotations:  # promtool test compares annotations too; the tests judge exprs
        for rule in groups["groups"][0]["rules"]:
            rule.pop("annotations", None)
    path = tmp_path / ("rules.yaml" if annotations else "rules-bare.yaml")
    path.write_text(yaml.safe_dump(groups, sort_keys=False))
    return path


def alert(severity: Severity, rule: str, **labels: str) -> dict[str, Any]:
    return {"exp_labels": {"severity": severity.value, "trainguard_rule": rule, **labels}}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: prometheus)")
def test_promtool_check_and_test_rules(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    checked = subprocess.run([PROMTOOL, "check", "rules", str(rules_file(tmp_path, True))],
                             capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 5 rules found" in checked.stdout
    crit, warn = Severity.CRITICAL, Severity.WARNING
    tests = {"rule_files": [str(rules_file(tmp_path, False))], "evaluation_interval": "1m",
             "tests": [
        {"interval": "1m", "input_series": [
            # hung at step 100 for 70 minutes; the healthy job steps every minute
            {"series": 'trainguard_step{pod="hung"}', "values": "100x70"},
            {"series": 'trainguard_step{pod="healthy"}', "values": "0+10x70"},
            # a job that started 10 minutes ago and has not stepped yet: too young to judge
            {"series": 'trainguard_step{pod="young"}', "values": "_x60 0x10"},
            # restarted at minute 40, down 10 minutes, resumed from its step-200 checkpoint
            # and stepping again, below the 400 it had reached: progress, not a stall
            {"series": 'trainguard_step{pod="resumed"}', "values": "0+10x40 _x10 200+10x20"}],
         "alert_rule_test": [
            {"eval_time": "20m", "alertname": "TrainguardStallWarning", "exp_alerts": []},
            {"eval_time": "35m", "alertname": "TrainguardStallWarning",
             "exp_alerts": [alert(warn, "stall", pod="hung")]},
            {"eval_time": "35m", "alertname": "TrainguardStallCritical", "exp_alerts": []},
            {"eval_time": "60m", "alertname": "TrainguardStallWarning",
             "exp_alerts": [alert(warn, "stall", pod="hung")]},
            {"eval_time": "65m", "alertname": "TrainguardStallCritical",
             "exp_alerts": [alert(crit, "stall", pod="hung")]}]},
        {"interval": "30s", "input_series": [
            {"series": 'trainguard_loss{pod="nan"}', "values": "2 1.9 1.8 NaN NaN NaN NaN"},
            {"series": 'trainguard_loss{pod="spike"}', "values": "2 1.9 NaN 1.8 1.7 1.6 1.5"},
            {"series": 'trainguard_loss{pod="healthy"}', "values": "2 1.9 1.8 1.7 1.6 1.5"},
            # a physics-informed loss in its own units: born beyond abs_limit, falling
            {"series": 'trainguard_loss{pod="born_huge"}',
             "values": "1.4e13 1.5e14 1.8e13 1.1e13 1.2e13 9e12 8e12"},
            {"series": 'trainguard_loss{pod="exploded"}',
             "values": "2 1.9 1.8 1e13 1e13 1e13 1e13"}],
         "alert_rule_test": [
            {"eval_time": "3m", "alertname": "TrainguardLossNotFinite",
             "exp_alerts": [alert(crit, "divergence", pod="nan"),
                            alert(crit, "divergence", pod="exploded")]}]},
        {"interval": "1m", "input_series": [
            {"series": 'DCGM_FI_DEV_GPU_UTIL{namespace="a", pod="idle", gpu="0"}',
             "values": "3x45"},
            {"series": 'DCGM_FI_DEV_GPU_UTIL{namespace="a", pod="idle", gpu="1"}',
             "values": "5x45"},
            {"series": 'DCGM_FI_DEV_GPU_UTIL{namespace="a", pod="starved", gpu="0"}',
             "values": "40x45"},
            {"series": 'DCGM_FI_DEV_GPU_UTIL{namespace="a", pod="busy", gpu="0"}',
             "values": "95x45"},
            # idle only for 10 minutes: a pause, not idle GPUs
            {"series": 'DCGM_FI_DEV_GPU_UTIL{namespace="a", pod="paused", gpu="0"}',
             "values": "95x30 2x15"}],
         "alert_rule_test": [
            {"eval_time": "20m", "alertname": "TrainguardGpuIdle", "exp_alerts": []},
            {"eval_time": "40m", "alertname": "TrainguardGpuIdle",
             "exp_alerts": [alert(crit, "utilization", namespace="a", pod="idle")]},
            {"eval_time": "40m", "alertname": "TrainguardGpuUnderused",
             "exp_alerts": [alert(warn, "utilization", namespace="a", pod="starved")]}]},
    ]}
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run([PROMTOOL, "test", "rules", str(test_file)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_two_builds_of_one_package_at_once_write_it_whole(tmp_path: Path) -> None:
    """Two synths of one checkout at once (the test suite's two workers did it): each
    wrote ``NAME.tmp`` and the first to finish moved the other's file away ("No such file
    or directory: azure-research-function.tmp"). Each build now writes a file of its own
    and replaces the package atomically; both succeed with the same bytes."""
    from concurrent.futures import ProcessPoolExecutor

    from trainguard.stacks import package

    out = tmp_path / "fn.zip"
    policy = ROOT / "policies" / "production-stops.yaml"
    with ProcessPoolExecutor(2) as pool:
        built = list(pool.map(package.FUNCTION.build, [policy] * 4, [out] * 4))
    assert all(b.path == out for b in built)
    single = package.FUNCTION.build(policy, tmp_path / "single.zip")
    assert out.read_bytes() == single.path.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fn.zip", "single.zip"]  # no .tmp
