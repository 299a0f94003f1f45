"""The seams between the stacks and the runtimes they deploy. Each test reads both sides
(the runtime's code or constants, and the synthesised stack or the stack's own
functions) and fails when one side changes without the other: the settings each entry
point reads, the metric names alarms watch, the calls a role must allow, the handler
paths, the TTL attribute, the heartbeat alert.

Names a runtime reads are found in its code with ``ast`` (no constant lists to keep in
step by hand); the settings a stack leaves to the runtime's defaults are listed below
with the reason, and a listed name the runtime no longer reads fails too.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainguard.stacks.environment import (
    DEFAULT_PROTECT_TAG,
    ROOT,
    EnvironmentFileError,
    OpenshiftEnvironment,
    Schedule,
    label_safe,
    load_environment,
)

pytestmark = pytest.mark.slow

Stack = dict[str, Any]
PROMTOOL = shutil.which("promtool")


def resources(stack: Stack, kind: str) -> dict[str, Any]:
    out: dict[str, Any] = stack["resource"].get(kind, {})
    return out


def tree(rel: str) -> ast.Module:
    return ast.parse((ROOT / rel).read_text(encoding="utf-8"), rel)


def function(module: ast.Module, name: str, cls: str | None = None) -> ast.FunctionDef:
    scope: list[ast.stmt] = module.body
    if cls is not None:
        (klass,) = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls]
        scope = klass.body
    (fn,) = [n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name]
    return fn


def calls(node: ast.AST) -> Iterator[ast.Call]:
    yield from (n for n in ast.walk(node) if isinstance(n, ast.Call))


def first_str(call: ast.Call) -> str | None:
    if call.args and isinstance(call.args[0], ast.Constant) \
            and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def stack_sets(names: set[str], reads: set[str], left_to_default: dict[str, str],
               set_by_platform: frozenset[str] = frozenset()) -> None:
    """Every name the runtime reads is set by the stack, left to its default on purpose,
    or set by the platform; and the defaults listed are still read."""
    missing = reads - names - set(left_to_default) - set_by_platform
    assert not missing, f"the runtime reads {sorted(missing)}, the stack does not set them"
    stale = set(left_to_default) - reads
    assert not stale, f"listed as left to the runtime's default but no longer read: {stale}"


# ------------------------------------------------------------------------------- AWS

AWS_SETTINGS = "lambdas/aws/settings.py"
#: what the Lambda may read that the stack leaves to the handler's default, and why
AWS_DEFAULTS = {
    "TRAINGUARD_IDEMPOTENCY_TTL_S": "an hour covers EventBridge's retries of one event",
}
AWS_PLATFORM = frozenset({"AWS_REGION", "AWS_DEFAULT_REGION"})  # set by Lambda, reserved


def aws_reads() -> set[str]:
    """The variables the Lambda's ``Settings.from_env`` reads (config/settings/aws.py,
    the one list of them; tests/test_settings.py holds the parse to it)."""
    from trainguard.config.settings import aws

    return set(aws.KNOWN)


def aws_python_files() -> list[Path]:
    return sorted((ROOT / "lambdas" / "aws").rglob("*.py"))


def aws_function(stacks: dict[str, Stack]) -> dict[str, Any]:
    (fn,) = resources(stacks["aws-dev"], "aws_lambda_function").values()
    return dict(fn)


def test_aws_lambda_env_is_what_the_handler_reads(stacks: dict[str, Stack]) -> None:
    from trainguard.lambdas.aws.settings import SAGEMAKER_ENV_PREFIX, SERVICE

    variables: dict[str, str] = aws_function(stacks)["environment"]["variables"]
    reads = aws_reads()
    assert "TRAINGUARD_STATE_TABLE" in reads  # the AST walk found the settings
    stack_sets(set(variables), reads, AWS_DEFAULTS, AWS_PLATFORM)
    ours = {k for k in variables if k.startswith("TRAINGUARD_")}
    unread = {k for k in ours - reads if not k.startswith(SAGEMAKER_ENV_PREFIX)}
    assert not unread, f"the stack sets {unread}; the handler never reads them"
    assert variables["TRAINGUARD_STOP_ENABLED"] in ("true", "false")
    key, _, value = variables["TRAINGUARD_STOP_TAG"].partition("=")
    assert key and value, "TRAINGUARD_STOP_TAG must be KEY=VALUE"
    assert variables["POWERTOOLS_SERVICE_NAME"] == SERVICE


def test_aws_handler_path_resolves_as_lambda_resolves_it(stacks: dict[str, Stack],
                                                          outdir: Path) -> None:
    fn = aws_function(stacks)
    module, _, attr = fn["handler"].rpartition(".")  # Lambda: "module.function"
    handler = getattr(importlib.import_module(module), attr)
    assert callable(handler) and handler.__name__ == "handler"
    with zipfile.ZipFile(outdir / "stacks" / "aws-dev" / fn["filename"]) as zf:
        names = set(zf.namelist())
    assert f"{module.replace('.', '/')}/__init__.py" in names
    assert f"{handler.__module__.replace('.', '/')}.py" in names


#: a table call (boto3 method) -> the IAM action that allows it
TABLE_ACTIONS = {"get_item": "GetItem", "put_item": "PutItem", "update_item": "UpdateItem",
                 "delete_item": "DeleteItem", "query": "Query", "scan": "Scan",
                 "batch_write_item": "BatchWriteItem", "batch_get_item": "BatchGetItem"}
#: a TransactWriteItems item kind -> the action IAM checks it against
TRANSACT_ITEMS = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
                  "ConditionCheck": "ConditionCheckItem"}


def table_actions(source: str, owner: str) -> set[str]:
    """The IAM actions the ``self.client.<call>(...)`` calls of ``source`` need."""
    actions: set[str] = set()
    for c in calls(ast.parse(source)):
        f = c.func
        if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute)
                and f.value.attr == "client"):
            continue
        if f.attr == "transact_write_items":
            continue  # its items are counted below, by kind
        assert f.attr in TABLE_ACTIONS, f"{owner}: unknown table call {f.attr}"
        actions.add(f"dynamodb:{TABLE_ACTIONS[f.attr]}")
    if "transact_write_items" in source:
        kinds = {k.value for d in ast.walk(ast.parse(source)) if isinstance(d, ast.Dict)
                 for k in d.keys if isinstance(k, ast.Constant) and k.value in TRANSACT_ITEMS}
        assert kinds, f"{owner}: a transaction whose item kinds were not found"
        actions |= {f"dynamodb:{TRANSACT_ITEMS[k]}" for k in kinds}
    return actions


def test_aws_role_allows_exactly_the_state_calls(stacks: dict[str, Stack]) -> None:
    from aws_lambda_powertools.utilities.idempotency.persistence import dynamodb

    store = table_actions((ROOT / "lambdas/aws/dynamodb_state.py").read_text(),
                          "dynamodb_state")
    idempotency = table_actions(Path(dynamodb.__file__).read_text(), "powertools")
    assert "dynamodb:Query" in store and "dynamodb:GetItem" in idempotency
    (policy,) = resources(stacks["aws-dev"], "aws_iam_role_policy").values()
    statements = json.loads(policy["policy"])["Statement"]
    allows = [s for s in statements if s["Effect"] == "Allow"]
    granted = {a for s in allows for a in s["Action"] if a.startswith("dynamodb:")}
    assert granted == store | idempotency
    (state,) = [s for s in allows if any(a.startswith("dynamodb:") for a in s["Action"])]
    assert state["Resource"] == "${aws_dynamodb_table.state.arn}"


class RecordingClient:
    """A DynamoDB client that records each call's arguments and answers emptily."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, kwargs))
            return self  # get_waiter(...).wait(...)
        return call


def test_aws_table_ttl_is_the_attribute_the_runtime_writes(stacks: dict[str, Stack]) -> None:
    from trainguard.lambdas.aws.dynamodb_state import DynamoDBStore, create_table

    (table,) = resources(stacks["aws-dev"], "aws_dynamodb_table").values()
    ttl = table["ttl"]
    assert ttl["enabled"] is True
    client = RecordingClient()
    store = DynamoDBStore(client, "t", clock=lambda: 1_000.0)
    store.put_event("job-a", {"detail": {}}, 900.0)
    create_table(client, "t")
    (item,) = [kw["Item"] for name, kw in client.calls if name == "put_item"]
    expiring = {k for k, v in item.items() if "N" in v and int(float(v["N"])) > 1_000}
    assert expiring == {ttl["attribute_name"]}, "the store's expiry is not the table's TTL"
    (spec,) = [kw["TimeToLiveSpecification"] for name, kw in client.calls
               if name == "update_time_to_live"]
    assert spec["AttributeName"] == ttl["attribute_name"]
    # powertools' idempotency records, in the same table
    layer = {k.arg: k.value.value for f in aws_python_files()
             for c in calls(ast.parse(f.read_text())) for k in c.keywords
             if k.arg in ("expiry_attr", "key_attr", "sort_key_attr")
             and isinstance(k.value, ast.Constant)}
    assert layer == {"expiry_attr": ttl["attribute_name"], "key_attr": table["hash_key"],
                     "sort_key_attr": table["range_key"]}


def test_aws_alarms_and_dashboard_read_the_metrics_the_lambda_emits(
        stacks: dict[str, Stack]) -> None:
    from trainguard.checker.model import Finding, Job, JobState, Severity
    from trainguard.config import default_policy
    from trainguard.lambdas.aws import sinks
    from trainguard.stacks import aws

    stack, account = stacks["aws-dev"], "111122223333"
    job = Job(id="j", provider="sagemaker", scope=f"{account}/us-east-1",
              state=JobState.RUNNING, instance_type="ml.p4d.24xlarge", hourly_price=30.0)
    data = sinks.tick_metrics([job], [Finding("j", "stall", Severity.CRITICAL, "x")],
                              default_policy())
    emitted = {d.name: tuple(k for k, _ in d.dimensions) for d in data}
    assert emitted == {aws.FINDINGS: ("account", "rule", "severity"),
                       aws.SPEND: ("account",), aws.JOBS: ("account", "verdict"),
                       sinks.SAVED: ("account",)}
    assert sinks.EmfWriter().namespace == aws.NAMESPACE == sinks.NAMESPACE
    for f in aws_python_files():  # powertools' own Metrics objects: the same namespace
        for c in calls(ast.parse(f.read_text())):
            if isinstance(c.func, ast.Name) and c.func.id == "Metrics":
                (ns,) = [k.value for k in c.keywords if k.arg == "namespace"]
                assert isinstance(ns, ast.Name) and ns.id == "NAMESPACE", f
    alarms = resources(stack, "aws_cloudwatch_metric_alarm").values()
    assert alarms
    for alarm in alarms:
        assert (alarm["namespace"], alarm["metric_name"]) == (aws.NAMESPACE, aws.FINDINGS)
        assert tuple(alarm["dimensions"]) == emitted[aws.FINDINGS]
        assert alarm["dimensions"]["account"] == account
    (dash,) = resources(stack, "aws_cloudwatch_dashboard").values()
    searches = [m[0]["expression"] for w in json.loads(dash["dashboard_body"])["widgets"]
                for m in w["properties"]["metrics"]]
    found = {}
    for text in searches:
        m = re.match(r"SEARCH\('\{([\w/]+),([\w,]+)\} MetricName=\"(\w+)\"", text)
        assert m, text
        if m.group(1) == "/aws/sagemaker/TrainingJobs":  # SageMaker's own (test_dashboards)
            continue
        assert m.group(1) == sinks.NAMESPACE
        found[m.group(3)] = tuple(m.group(2).split(","))
    assert found == emitted


# ----------------------------------------------------------------------------- Azure

AZURE_APP = "lambdas/azure/function_app.py"
#: settings the Function reads that the stack leaves to its defaults, and why
AZURE_DEFAULTS = {
    "TRAINGUARD_ML_ENDPOINT": "tests and proxies only: Azure Resource Manager by default",
    "TRAINGUARD_ML_CA_FILE": "goes with ML_ENDPOINT",
    "TRAINGUARD_ML_RETRIES": "the adapter's default (4) suits ARM's throttling",
    "TRAINGUARD_ML_BACKOFF": "the adapter's default (0.8 s)",
    "TRAINGUARD_STATE_CONNECTION": "local runs (Azurite): the stack uses the identity",
    "TRAINGUARD_STATE_TABLE": "goes with STATE_CONNECTION; STATE_TABLE_URL names the table",
    "TRAINGUARD_METRICS_ENDPOINT": "tests only: the region's monitoring endpoint by default",
    "TRAINGUARD_METRICS_CA_FILE": "goes with METRICS_ENDPOINT",
    "TRAINGUARD_WEBHOOK_MIN_SEVERITY": "critical by default, as on the other clouds",
}


def azure_reads() -> set[str]:
    """``Settings.from_env``'s names (config/settings/azure.py), and the ``%NAME%`` the
    timer trigger's schedule names (the host reads that one)."""
    from trainguard.config.settings.azure import NAMES
    from trainguard.lambdas.azure.function_app import PREFIX

    module = tree(AZURE_APP)
    names = {PREFIX + name for name in NAMES.values()}
    for c in calls(module):
        for k in c.keywords:
            if k.arg == "schedule" and isinstance(k.value, ast.Constant):
                names |= set(re.findall(r"%(\w+)%", str(k.value.value)))
    return names


def azure_function(stacks: dict[str, Stack]) -> dict[str, Any]:
    (fn,) = resources(stacks["azure-research"], "azurerm_linux_function_app").values()
    return dict(fn)


def test_azure_app_settings_are_what_the_function_reads(stacks: dict[str, Stack]) -> None:
    settings: dict[str, str] = azure_function(stacks)["app_settings"]
    reads = azure_reads()
    assert {"TRAINGUARD_SUBSCRIPTION", "TRAINGUARD_SCHEDULE"} <= reads
    stack_sets(set(settings), reads, AZURE_DEFAULTS)
    unread = {k for k in settings if k.startswith("TRAINGUARD_")} - reads
    assert not unread, f"the stack sets {unread}; the Function never reads them"
    env = load_environment(ROOT / "environments" / "azure-research.yaml")
    vault = env.spec.alarms.webhooks[0].key_vault
    assert vault is not None  # the URL is a Key Vault reference, resolved by the app
    assert settings["TRAINGUARD_WEBHOOK_URL"] == (
        f"@Microsoft.KeyVault(VaultName={vault.vault_name};SecretName={vault.secret})")
    assert settings["TRAINGUARD_METRICS_RESOURCE_ID"] == \
        "${azurerm_application_insights.insights.id}"
    assert settings["TRAINGUARD_METRICS_REGION"] == "${azurerm_resource_group.group.location}"
    from trainguard.lambdas.azure.function_app import Settings

    # The Function accepts the stack's settings as they are (tokens stand for ids).
    parsed = Settings.from_env({**settings, "TRAINGUARD_METRICS_RESOURCE_ID":
                                "/subscriptions/x/resourceGroups/y/providers/z"})
    assert parsed.policy == "policy.yaml" and parsed.stop_enabled is env.spec.stop_enabled


def test_azure_metric_alerts_watch_the_metric_the_function_posts(
        stacks: dict[str, Stack]) -> None:
    from trainguard.checker.model import Finding, Severity
    from trainguard.lambdas.azure import sinks
    from trainguard.lambdas.tick import TickReport
    from trainguard.stacks.azure import ALERT_WINDOWS

    doc = sinks.metric_document(TickReport(
        time=0.0, findings=[Finding("j", "stall", Severity.WARNING, "x")]))
    assert doc is not None
    posted = doc["data"]["baseData"]
    stack = stacks["azure-research"]
    alerts = resources(stack, "azurerm_monitor_metric_alert").values()
    assert alerts
    env = load_environment(ROOT / "environments" / "azure-research.yaml")
    minutes = dict((iso, m) for m, iso in ALERT_WINDOWS)
    for alert in alerts:
        (crit,) = alert["criteria"]
        assert (crit["metric_namespace"], crit["metric_name"]) == (
            posted["namespace"], posted["metric"])
        assert [d["name"] for d in crit["dimension"]] == posted["dimNames"]
        assert alert["scopes"] == ["${azurerm_application_insights.insights.id}"]
        # a metric posted once a tick: the window must hold a tick
        assert minutes[alert["window_size"]] >= env.spec.tick.interval_minutes()
        assert minutes[alert["frequency"]] <= minutes[alert["window_size"]]


def test_azure_identity_may_publish_the_metric_and_read_what_the_adapter_reads(
        stacks: dict[str, Stack]) -> None:
    stack = stacks["azure-research"]
    fn = azure_function(stacks)
    publishers = [a for a in resources(stack, "azurerm_role_assignment").values()
                  if a.get("role_definition_name") == "Monitoring Metrics Publisher"]
    assert [a["scope"] for a in publishers] == [fn["app_settings"][
        "TRAINGUARD_METRICS_RESOURCE_ID"]]
    assert publishers[0]["principal_id"] == \
        "${azurerm_linux_function_app.watchdog.identity[0].principal_id}"
    text = (ROOT / "docs" / "permissions-azureml.md").read_text()
    block = re.search(r"```json\n(.*?)```", text, re.S)
    assert block, "docs/permissions-azureml.md lost its custom role"
    needed = set(json.loads(block.group(1))["Actions"])
    (role,) = resources(stack, "azurerm_role_definition").values()
    actions = set(role["permissions"][0]["actions"])
    cancel = {a for a in needed if a.endswith("/action")}
    assert needed - cancel <= actions, f"missing: {needed - cancel - actions}"
    env = load_environment(ROOT / "environments" / "azure-research.yaml")
    assert (cancel <= actions) is env.spec.stop_enabled
    assert all(a.endswith("/read") for a in actions - cancel)


def test_azure_function_package_runs_the_function(stacks: dict[str, Stack], outdir: Path,
                                                  tmp_path: Path) -> None:
    from trainguard.stacks import package

    fn = azure_function(stacks)
    # The app runs from the package blob, read with its identity: no publishing
    # credential (issue 16); the blob's source is the zip the stack built.
    assert fn["webdeploy_publish_basic_authentication_enabled"] is False
    assert fn["app_settings"]["WEBSITE_RUN_FROM_PACKAGE"] == (
        "${azurerm_storage_blob.package_blob.url}")
    assert fn["app_settings"]["WEBSITE_RUN_FROM_PACKAGE_BLOB_MI_RESOURCE_ID"] == "SystemAssigned"
    (blob,) = resources(stacks["azure-research"], "azurerm_storage_blob").values()
    assert blob["type"] == "Block" and blob["storage_container_id"] == (
        "${azurerm_storage_container.packages.id}")
    (container_,) = resources(stacks["azure-research"], "azurerm_storage_container").values()
    assert container_["container_access_type"] == "private"
    zipped = outdir / "stacks" / "azure-research" / blob["source"]
    # named by its content when Terraform plans: a new package is a new URL
    assert blob["name"] == f"function-${{filesha256(\"{blob['source']}\")}}.zip"
    assert zipped.is_file()
    env = load_environment(ROOT / "environments" / "azure-research.yaml")
    with zipfile.ZipFile(zipped) as zf:
        names = zf.namelist()
        assert names == sorted(names)
        assert zf.read("function_app.py") == (ROOT / "lambdas/azure/function_app.py").read_bytes()
        assert zf.read("host.json") == (ROOT / "lambdas/azure/host.json").read_bytes()
        assert zf.read("policy.yaml") == env.policy_path.read_bytes()
        for path in [*sorted((ROOT / "lambdas").rglob("*.py")),
                     *sorted((ROOT / "adapters").rglob("*.py")),
                     *sorted((ROOT / "config").rglob("*.py")),
                     ROOT / "config" / "default-policy.yaml"]:
            rel = f"trainguard/{path.relative_to(ROOT).as_posix()}"  # one namespace
            assert zf.read(rel) == path.read_bytes(), f"{rel} is not this commit's"
        site = package.FUNCTION_SITE
        for top in ("numpy/", "yaml/", "pydantic/", "azure/ai/ml/", "azure/identity/",
                    "azure/functions/", "azure/data/tables/"):
            assert any(n.startswith(f"{site}/{top}") for n in names), top
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        zf.extractall(tmp_path / "app")
    # The host imports function_app.py from the app root with the packaged site-packages
    # on the path: a clean interpreter, nothing from this venv.
    app = tmp_path / "app"
    probe = (f"import sys; sys.path[:0] = [{str(app)!r}, {str(app / site)!r}]\n"
             "import function_app, azure.ai.ml, azure.data.tables\n"
             "assert azure.ai.ml.__file__.startswith(sys.path[1])\n"
             "print(sorted(f.get_function_name() for f in function_app.app.get_functions()))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe], cwd=app,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['watchdog']"
    again = package.FUNCTION.build(env.policy_path, tmp_path / "again.zip")
    assert again.path.read_bytes() == zipped.read_bytes(), "the package is not reproducible"
    print(f"Function App package: {again.size / 2**20:.1f} MiB zipped, {again.files} files")


# ------------------------------------------------------------------------- OpenShift

#: options the CronJob's entry point reads that the stack leaves to their defaults, why
K8S_DEFAULTS = {
    "kinds": "both PyTorchJob and TrainJob, the kinds the Role grants",
    "kube_host": "tests and kubectl proxy only: the pod's ServiceAccount otherwise",
    "kubeconfig": "the pod's ServiceAccount",
    "kube_retries": "the adapter's default (5)",
    "kube_backoff": "the adapter's default (0.5 s)",
    "audit_keep": "the ConfigMap store's default (500 records)",
    "prometheus_mapping": "the adapter's default mapping of trainguard_* series",
    "prometheus_id": "{name}: jobs label their series with their own name",
    "alertmanager_retries": "the sink's default (3)",
}
#: options the stack sets only for some environments (checked with variants below)
K8S_CONDITIONAL = {"state_sqlite", "state_configmap", "console_url", "pushgateway_url"}


def openshift_spec(**update: Any) -> OpenshiftEnvironment:
    spec = load_environment(ROOT / "environments" / "openshift-onprem.yaml").spec
    assert isinstance(spec, OpenshiftEnvironment)
    return spec.model_copy(update=update)


def container(stack: Stack) -> dict[str, Any]:
    (cron,) = resources(stack, "kubernetes_cron_job_v1").values()
    (c,) = cron["spec"]["job_template"]["spec"]["template"]["spec"]["container"]
    return dict(c)


def synth_openshift(**update: Any) -> Stack:
    """One OpenShift stack in this process, from the sample with ``update`` applied."""
    import dataclasses

    from cdktn import Testing

    from trainguard.stacks.openshift import OpenshiftStack

    env = load_environment(ROOT / "environments" / "openshift-onprem.yaml")
    stack = OpenshiftStack(Testing.app(), dataclasses.replace(env, spec=openshift_spec(
        **update)), ROOT / "build" / "stacks")
    out: Stack = json.loads(Testing.synth(stack))
    return out


def test_cronjob_env_is_what_the_entry_point_reads(stacks: dict[str, Stack]) -> None:
    from trainguard.lambdas.k8s.cronjob import ENV_PREFIX, OPTIONS, load_options
    from trainguard.stacks.openshift import cron_env

    env = {e["name"]: e["value"] for e in container(stacks["openshift-onprem"])["env"]}
    variant = cron_env(openshift_spec(state="sqlite", console_url="https://console.example",
                                      pushgateway_url="http://pushgateway:9091"))
    options = {ENV_PREFIX + k.upper(): k for k in OPTIONS}
    defaults = {ENV_PREFIX + k.upper(): why for k, why in K8S_DEFAULTS.items()}
    stack_sets(set(env) | set(variant), set(options), defaults)
    assert not (set(env) | set(variant)) - set(options), "a setting the entry point ignores"
    assert {options[k] for k in set(variant) ^ set(env)} <= K8S_CONDITIONAL
    # the entry point parses every value the stack gives it
    for given in (env, variant):
        opts = load_options(given)
        assert opts.remind_every == 360 * 60.0
        assert opts.stop_enabled is True and opts.stop_mode == "suspend"
    assert env["TRAINGUARD_PROMETHEUS_TOKEN_FILE"] == \
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert env["TRAINGUARD_ALERTMANAGER_CA_FILE"] == \
        "/var/run/secrets/kubernetes.io/serviceaccount/service-ca.crt"
    assert env["TRAINGUARD_STATE_CONFIGMAP"] == "trainguard/trainguard-state"


def test_cronjob_runs_the_entry_point(stacks: dict[str, Stack]) -> None:
    command = container(stacks["openshift-onprem"])["command"]
    assert command[:2] == ["python", "-m"]
    main = importlib.import_module(f"{command[2]}.__main__")
    assert main.main.__module__ == "trainguard.lambdas.k8s.cronjob"
    entry = [line for line in (ROOT / "Containerfile").read_text().splitlines()
             if line.startswith("ENTRYPOINT")]
    assert entry and json.loads(entry[0].removeprefix("ENTRYPOINT").strip()) == command


def job_grants(stack: Stack) -> set[str]:
    return {v for role in resources(stack, "kubernetes_role_v1").values()
            for rule in role["rule"] if rule["resources"] != ["configmaps"]
            for res in rule["resources"] if res != "pods" for v in rule["verbs"]}


def test_stop_mode_grants_its_own_verb_only(stacks: dict[str, Stack]) -> None:
    from trainguard.adapters.kubeflow import from_options
    from trainguard.checker.model import Job

    read = {"get", "list"}  # get: the job read again just before its stop; never watch
    assert job_grants(stacks["openshift-onprem"]) == read | {"patch"}  # suspend, stops on
    assert job_grants(synth_openshift(stop_mode="delete")) == read | {"delete"}
    assert job_grants(synth_openshift(stop_mode="delete", stop_enabled=False)) == read
    # what the adapter does in each mode is what the verb allows
    for mode, verb in (("suspend", "patch"), ("delete", "delete")):
        adapter = from_options({"host": "http://127.0.0.1:9",
                                "delete": "true" if mode == "delete" else "false"})
        kube = RecordingClient()
        adapter.kube = kube  # type: ignore[assignment]
        adapter.stop(Job(id="ns/pytorchjob/j", provider="kubeflow"), "test")
        assert [name for name, _ in kube.calls] == [verb], mode


def test_sqlite_state_gets_its_volume() -> None:
    from trainguard.stacks.openshift import STATE_MOUNT

    stack = synth_openshift(state="sqlite")
    c = container(stack)
    env = {e["name"]: e["value"] for e in c["env"]}
    assert "TRAINGUARD_STATE_CONFIGMAP" not in env
    assert env["TRAINGUARD_STATE_SQLITE"].startswith(STATE_MOUNT + "/")
    assert {"mount_path": STATE_MOUNT, "name": "state"} in c["volume_mount"]
    (claim,) = resources(stack, "kubernetes_persistent_volume_claim_v1").values()
    (cron,) = resources(stack, "kubernetes_cron_job_v1").values()
    volumes = cron["spec"]["job_template"]["spec"]["template"]["spec"]["volume"]
    assert {"name": "state", "persistent_volume_claim": {
        "claim_name": claim["metadata"]["name"]}} in volumes
    # no ConfigMap to write, so no right to write one
    assert not any(r["resources"] == ["configmaps"]
                   for role in resources(stack, "kubernetes_role_v1").values()
                   for r in role["rule"])
    assert f'VOLUME ["{STATE_MOUNT}"]' in (ROOT / "Containerfile").read_text()


def heartbeat_names() -> set[str]:
    """The gauges lambdas/k8s/sinks.py pushes."""
    return {name for c in calls(tree("lambdas/k8s/sinks.py")) if isinstance(c.func, ast.Name)
            and c.func.id == "Gauge" and (name := first_str(c)) is not None}


def test_watchdog_silent_alert_reads_the_pushed_heartbeat(stacks: dict[str, Stack]) -> None:
    from trainguard.stacks.prometheus_rules import HEARTBEAT

    assert HEARTBEAT in heartbeat_names()
    # without a Pushgateway there is no heartbeat, so no alert on it
    bare = synth_openshift(pushgateway_url=None)
    assert not any(HEARTBEAT in json.dumps(m) for m in resources(bare, "kubernetes_manifest")
                   .values())
    # the sample pushes to one: the alert is there, on the grouping label it pushes
    stack = stacks["openshift-onprem"]
    (rule,) = [m["manifest"] for m in resources(stack, "kubernetes_manifest").values()
               if HEARTBEAT in json.dumps(m)]
    assert rule["kind"] == "PrometheusRule" and rule["metadata"]["namespace"] == "trainguard"
    (alert,) = rule["spec"]["groups"][0]["rules"]
    assert alert["expr"].endswith(f"> {3 * 5 * 60}")  # three 5-minute ticks
    assert alert["labels"]["trainguard_rule"]  # routed by the AlertmanagerConfig
    env = {e["name"]: e["value"] for e in container(stack)["env"]}
    assert env["TRAINGUARD_PUSHGATEWAY_URL"].startswith("http://prometheus-pushgateway.")
    assert env["TRAINGUARD_ENVIRONMENT"] in alert["expr"]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: prometheus)")
def test_promtool_watchdog_silent_fires_only_when_ticks_stop(tmp_path: Path) -> None:
    from trainguard.stacks.prometheus_rules import HEARTBEAT, watchdog_rules

    assert PROMTOOL is not None
    spec = watchdog_rules("onprem", 300)
    for rule in spec["groups"][0]["rules"]:
        rule.pop("annotations")  # promtool compares annotations; the test judges the expr
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(spec, sort_keys=False))
    checked = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True,
                             text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # a healthy watchdog pushes every 5 minutes; a stopped one last pushed at 10 min
    healthy = " ".join(f"{t * 300}x4" for t in range(12))
    tests = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": [
            {"series": f'{HEARTBEAT}{{environment="onprem", job="trainguard"}}',
             "values": healthy},
            {"series": f'{HEARTBEAT}{{environment="other", job="trainguard"}}',
             "values": "0x10 600x49"}],
        "alert_rule_test": [
            # two ticks missed: not yet (the other environment's is not this rule's)
            {"eval_time": "20m", "alertname": "TrainguardWatchdogSilent", "exp_alerts": []},
            {"eval_time": "25m", "alertname": "TrainguardWatchdogSilent", "exp_alerts": []},
            {"eval_time": "59m", "alertname": "TrainguardWatchdogSilent", "exp_alerts": []}]}, {
        "interval": "1m", "input_series": [
            {"series": f'{HEARTBEAT}{{environment="onprem", job="trainguard"}}',
             "values": "0x10 600x49"}],
        "alert_rule_test": [
            {"eval_time": "24m", "alertname": "TrainguardWatchdogSilent", "exp_alerts": []},
            {"eval_time": "26m", "alertname": "TrainguardWatchdogSilent", "exp_alerts": [
                {"exp_labels": {"severity": "warning", "trainguard_rule": "watchdog",
                                "environment": "onprem"}}]}]}]}
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run([PROMTOOL, "test", "rules", str(test_file)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


POLICY_WITH_TAG = """\
name: {name}
safety: {{dry_run: true, protect_tag: "{tag}"}}
"""
OPENSHIFT_ENV = """\
name: {name}
cloud: openshift
cluster: lab
watch_namespaces: [ml]
image: q.io/x/tg@sha256:abababababababababababababababababababababababababababababababab
policy: {policy}
"""


def test_openshift_protect_tag_must_be_a_label_key(tmp_path: Path) -> None:
    from trainguard.adapters.kubeflow.adapter import LABEL_PREFIX, TAG_PREFIX
    from trainguard.config import default_policy

    # the default is the tag the Kubeflow adapter reads from the label trainguard.io/protect
    assert default_policy().safety.protect_tag == DEFAULT_PROTECT_TAG
    label = LABEL_PREFIX + DEFAULT_PROTECT_TAG.removeprefix(TAG_PREFIX)
    assert label == "trainguard.io/protect" and label_safe(label)
    assert not label_safe(DEFAULT_PROTECT_TAG)

    def env_for(tag: str) -> Path:
        name = f"env-{abs(hash(tag)) % 10_000}"
        (tmp_path / f"{name}.policy.yaml").write_text(POLICY_WITH_TAG.format(name=name, tag=tag))
        path = tmp_path / f"{name}.yaml"
        path.write_text(OPENSHIFT_ENV.format(name=name, policy=f"{name}.policy.yaml"))
        return path

    for good in (DEFAULT_PROTECT_TAG, "example.com/protect", "protect"):
        env = load_environment(env_for(good), root=tmp_path)
        assert env.policy.safety.protect_tag == good
    for bad in ("trainguard:keep", "a/b/c", "-protect"):
        with pytest.raises(EnvironmentFileError) as err:
            load_environment(env_for(bad), root=tmp_path)
        (problem,) = err.value.problems
        assert problem.line == 6 and problem.field == "policy"
        assert f"safety.protect_tag {bad!r}" in problem.reason
        assert "trainguard.io/protect" in problem.reason


@pytest.mark.parametrize(("schedule", "minutes"), [
    ("rate(5 minutes)", 5), ("rate(2 hours)", 120), ("cron(*/10 * * * *)", 10),
    ("cron(0,30 8-17 * * *)", 14 * 60 + 30), ("cron(0 9 * * 1-5)", 3 * 1440),
    ("cron(0 0 1 * *)", 31 * 1440)])
def test_schedule_interval(schedule: str, minutes: int) -> None:
    """The interval the alert windows are sized from."""
    assert Schedule.parse(schedule).interval_minutes() == minutes


def test_alert_windows_span_a_tick() -> None:
    from trainguard.stacks.aws import alarm_period
    from trainguard.stacks.azure import alert_window

    assert alert_window(5) == ("PT5M", "PT5M") and alert_window(10) == ("PT5M", "PT15M")
    assert alert_window(1) == ("PT1M", "PT1M") and alert_window(3000) == ("PT5M", "P1D")
    assert alarm_period(5) == 300 and alarm_period(10) == 600 and alarm_period(1) == 300
    assert alarm_period(3 * 1440) == 86400
