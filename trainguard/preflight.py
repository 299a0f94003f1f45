"""``trainguard preflight ENVIRONMENT``: before a deploy, read (never write) what the
environment's stack assumes, with the user's own credentials, and say plainly what is
missing and how to fix it. Exit 1 when a blocker would fail the apply or leave an alarm
silent; warnings say what will work less well.

One small function per check, registered per cloud (``CHECKS``); each returns findings.
AWS is read with boto3 (``--endpoint-url`` points every client elsewhere: moto in the
tests, a proxy); OpenShift with the kubernetes client from the environment's kubeconfig
context (``--kube-api`` for another API server); Azure with GETs on Resource Manager
(``DefaultAzureCredential``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from trainguard.stacks.environment import (
    AwsEnvironment,
    AzureEnvironment,
    Environment,
    EnvironmentFileError,
    OpenshiftEnvironment,
    load_environment,
)

SAGEMAKER_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
MAX_SUBSCRIPTION_FILTERS = 2  # CloudWatch Logs' limit per log group
RECENT_JOBS = 10  # recent training jobs read for their metric definitions


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    BLOCKER = "blocker"


@dataclass(frozen=True)
class Finding:
    check: str
    status: Status
    message: str
    fix: str = ""


Check = Callable[[Environment, Any], list[Finding]]
CHECKS: dict[str, list[Check]] = {"aws": [], "azure": [], "openshift": []}


def check(cloud: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKS[cloud].append(fn)
        return fn
    return register


# --- AWS --------------------------------------------------------------------------------

@dataclass
class AwsClients:
    logs: Any
    sagemaker: Any


def aws_clients(env: Environment, endpoint_url: str | None = None) -> AwsClients:
    import boto3

    spec = env.spec
    assert isinstance(spec, AwsEnvironment)
    session = boto3.Session(region_name=spec.region)
    return AwsClients(logs=session.client("logs", endpoint_url=endpoint_url),
                      sagemaker=session.client("sagemaker", endpoint_url=endpoint_url))


def _log_group(clients: AwsClients) -> dict[str, Any] | None:
    pages = clients.logs.get_paginator("describe_log_groups").paginate(
        logGroupNamePrefix=SAGEMAKER_LOG_GROUP)
    return next((g for p in pages for g in p.get("logGroups", [])
                 if g["logGroupName"] == SAGEMAKER_LOG_GROUP), None)


@check("aws")
def log_group(env: Environment, clients: AwsClients) -> list[Finding]:
    spec = env.spec
    assert isinstance(spec, AwsEnvironment)
    group = _log_group(clients)
    want = spec.training_log_group
    name = "log group"
    if group is None and want.exists:
        return [Finding(name, Status.BLOCKER,
                        f"{SAGEMAKER_LOG_GROUP} does not exist, but training_log_group.exists "
                        "is true: the import fails",
                        "set training_log_group.exists: false (the stack creates it)")]
    if group is None:
        return [Finding(name, Status.OK, f"{SAGEMAKER_LOG_GROUP} does not exist yet: the "
                        f"stack creates it ({want.retention_days} days' retention)")]
    if not want.exists:
        return [Finding(name, Status.BLOCKER,
                        f"{SAGEMAKER_LOG_GROUP} exists already: creating it fails the apply",
                        "set training_log_group.exists: true (the stack adopts it)")]
    kept = group.get("retentionInDays")
    out = [Finding(name, Status.OK, f"{SAGEMAKER_LOG_GROUP} exists: the stack adopts it")]
    if kept is None or kept > want.retention_days:
        out.append(Finding("log retention", Status.WARN,
                           f"its logs are kept {kept or 'forever'} "
                           f"{'days' if kept else ''}; the stack sets "
                           f"{want.retention_days} days, deleting older logs".replace("  ", " "),
                           "raise training_log_group.retention_days to keep them"))
    return out


@check("aws")
def subscription_filters(env: Environment, clients: AwsClients) -> list[Finding]:
    if _log_group(clients) is None:
        return [Finding("subscription filters", Status.OK, "none yet (no log group)")]
    ours = f"trainguard-{env.name}-signatures"
    filters = clients.logs.describe_subscription_filters(
        logGroupName=SAGEMAKER_LOG_GROUP).get("subscriptionFilters", [])
    others = [f["filterName"] for f in filters if f["filterName"] != ours]
    if len(others) >= MAX_SUBSCRIPTION_FILTERS:
        return [Finding("subscription filters", Status.BLOCKER,
                        f"{SAGEMAKER_LOG_GROUP} already has {len(others)} subscription filters "
                        f"({', '.join(others)}); a log group takes at most "
                        f"{MAX_SUBSCRIPTION_FILTERS}",
                        "remove one, or fan one destination out through Kinesis or Firehose "
                        "(docs/deploy.md)")]
    return [Finding("subscription filters", Status.OK,
                    f"{len(others)} other filter(s): room for the watchdog's")]


@check("aws")
def metric_definitions(env: Environment, clients: AwsClients) -> list[Finding]:
    jobs = clients.sagemaker.list_training_jobs(
        MaxResults=RECENT_JOBS, SortBy="CreationTime", SortOrder="Descending"
    ).get("TrainingJobSummaries", [])
    if not jobs:
        return [Finding("metric definitions", Status.OK, "no training job yet to read")]
    bare = []
    for summary in jobs:
        doc = clients.sagemaker.describe_training_job(
            TrainingJobName=summary["TrainingJobName"])
        if not (doc.get("AlgorithmSpecification") or {}).get("MetricDefinitions"):
            bare.append(summary["TrainingJobName"])
    if bare:
        return [Finding("metric definitions", Status.WARN,
                        f"{len(bare)} of the {len(jobs)} latest jobs define no metrics "
                        f"({', '.join(bare[:3])}{', ...' if len(bare) > 3 else ''}): only "
                        "state, cost, GPU and logs are judged for them",
                        "add MetricDefinitions (loss, step) to the estimator, "
                        "docs/platforms/sagemaker.md")]
    return [Finding("metric definitions", Status.OK,
                    f"the {len(jobs)} latest jobs all define metrics")]


# --- Azure and OpenShift: what the environment file alone can tell -----------------------

ARM = "https://management.azure.com"
#: api-versions of the two ARM reads (Azure ML workspaces; Log Analytics tables)
ML_API, TABLES_API = "2024-04-01", "2022-10-01"


@dataclass
class Arm:
    """GETs on Azure Resource Manager with the user's credential."""

    client: Any
    base: str = ARM

    def get(self, path: str, api_version: str) -> tuple[int, dict[str, Any]]:
        from azure.core.rest import HttpRequest

        response = self.client.send_request(HttpRequest(
            "GET", f"{self.base}{path}", params={"api-version": api_version}))
        try:
            body = response.json()
        except ValueError:
            body = {}
        return response.status_code, body if isinstance(body, dict) else {}


def arm_client(endpoint: str | None = None, ca_file: str | None = None,
               credential: Any = None) -> Arm:
    from azure.core import PipelineClient
    from azure.core.pipeline.policies import BearerTokenCredentialPolicy, RetryPolicy

    if credential is None:
        from azure.identity import DefaultAzureCredential
        credential = DefaultAzureCredential()
    base = (endpoint or ARM).rstrip("/")
    client: PipelineClient[Any, Any] = PipelineClient(base, connection_verify=ca_file or True,
                                                      policies=[
        RetryPolicy(retry_total=2),
        BearerTokenCredentialPolicy(credential, f"{ARM}/.default")])
    return Arm(client, base)


@check("azure")
def ml_workspace(env: Environment, arm: Arm) -> list[Finding]:
    spec = env.spec
    assert isinstance(spec, AzureEnvironment)
    ws = spec.ml_workspace
    path = (f"/subscriptions/{spec.subscription}/resourceGroups/{ws.resource_group}"
            f"/providers/Microsoft.MachineLearningServices/workspaces/{ws.name}")
    status, body = arm.get(path, ML_API)
    if status == 404:
        return [Finding("ML workspace", Status.BLOCKER, f"no workspace {ws.name} in "
                        f"{ws.resource_group}: the role assignment fails",
                        "fix ml_workspace: {resource_group, name}")]
    if status >= 400:
        raise RuntimeError(f"GET workspace: HTTP {status}")
    return [Finding("ML workspace", Status.OK,
                    f"{ws.name} in {body.get('location', '?')}")]


@check("azure")
def log_table(env: Environment, arm: Arm) -> list[Finding]:
    spec = env.spec
    assert isinstance(spec, AzureEnvironment)
    query = spec.log_query
    if query is None:
        return [Finding("log signatures", Status.OK, "no log_query: the watchdog reads each "
                        "job's user_logs/std_log*.txt (compute clusters)")]
    status, body = arm.get(f"{query.workspace_id}/tables/{query.table}", TABLES_API)
    if status == 404:
        return [Finding("log signatures", Status.BLOCKER,
                        f"no table {query.table} in {query.workspace_id.rsplit('/', 1)[-1]}: "
                        "the query alert fails validation at deploy",
                        "enable Container Insights on the attached cluster with this "
                        "workspace, or leave log_query out (compute clusters)")]
    if status >= 400:
        raise RuntimeError(f"GET table: HTTP {status}")
    columns = {c.get("name") for part in ("columns", "standardColumns")
               for c in (body.get("properties", {}).get("schema", {}).get(part) or [])}
    if columns and query.column not in columns:
        return [Finding("log signatures", Status.BLOCKER,
                        f"{query.table} has no column {query.column}",
                        "fix log_query.column")]
    return [Finding("log signatures", Status.OK,
                    f"{query.table}.{query.column} exists in the named workspace")]


#: the CRDs the OpenShift stack's objects need (kubernetes_manifest reads them at plan)
#: -> the version used; the log shipping adds its own
CRDS = {"podmonitors.monitoring.coreos.com": "v1",
        "prometheusrules.monitoring.coreos.com": "v1",
        "alertmanagerconfigs.monitoring.coreos.com": "v1beta1"}
LOKI_CRDS = {"clusterlogforwarders.observability.openshift.io": "v1",
             "alertingrules.loki.grafana.com": "v1"}
JOB_CRDS = ("pytorchjobs.kubeflow.org", "trainjobs.trainer.kubeflow.org")


def k8s_client(env: Environment, host: str | None = None) -> Any:
    """An API client from the kubeconfig context the stack uses (or ``host``, no auth:
    a recorded API server in the tests)."""
    from kubernetes import client, config

    spec = env.spec
    assert isinstance(spec, OpenshiftEnvironment)
    if host:
        conf = client.Configuration()
        conf.host = host
        return client.ApiClient(conf)
    return config.new_client_from_config(context=spec.kube_context)  # type: ignore[no-untyped-call]


def _missing(api: Any) -> bool:
    from kubernetes.client.exceptions import ApiException

    return isinstance(api, ApiException) and api.status == 404


def _crd(ext: Any, name: str) -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException

    try:
        crd = ext.read_custom_resource_definition(name)
    except ApiException as e:
        if _missing(e):
            return None
        raise
    return {v.name: v.served for v in crd.spec.versions}


@check("openshift")
def crds(env: Environment, api: Any) -> list[Finding]:
    from kubernetes import client

    spec = env.spec
    assert isinstance(spec, OpenshiftEnvironment)
    ext = client.ApiextensionsV1Api(api)
    want = {**CRDS, **(LOKI_CRDS if spec.log_shipping == "loki" else {})}
    out = []
    for name, version in want.items():
        versions = _crd(ext, name)
        if versions is None:
            out.append(Finding("CRDs", Status.BLOCKER, f"{name} is not installed: the plan "
                               "fails", "install its operator before the deploy"))
        elif not versions.get(version):
            out.append(Finding("CRDs", Status.BLOCKER, f"{name} does not serve {version} "
                               f"(serves {', '.join(v for v, on in versions.items() if on)})",
                               "upgrade its operator"))
    if all(_crd(ext, n) is None for n in JOB_CRDS):
        out.append(Finding("CRDs", Status.WARN, "neither PyTorchJob nor TrainJob is "
                           "installed: there is nothing to watch yet",
                           "install the Kubeflow Training Operator or Trainer"))
    return out or [Finding("CRDs", Status.OK, f"{len(want)} CRDs served")]


@check("openshift")
def dcgm_exporter(env: Environment, api: Any) -> list[Finding]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from trainguard.stacks.openshift import DCGM

    name = "GPU metrics"
    try:
        ds = client.AppsV1Api(api).read_namespaced_daemon_set(DCGM["app"], DCGM["namespace"])
    except ApiException as e:
        if not _missing(e):
            raise
        return [Finding(name, Status.BLOCKER,
                        f"no DaemonSet {DCGM['app']} in {DCGM['namespace']}: the idle and "
                        "under-used GPU alerts would never fire",
                        "install the NVIDIA GPU Operator with its DCGM exporter there")]
    pod = ds.spec.template if ds.spec else None
    containers = (pod.spec.containers if pod and pod.spec else None) or []
    ports = {str(p.name) for c in containers for p in (c.ports or [])}
    labels = (pod.metadata.labels if pod and pod.metadata else None) or {}
    if DCGM["port"] not in ports or labels.get("app") != DCGM["app"]:
        return [Finding(name, Status.BLOCKER,
                        f"the exporter's pods have ports {sorted(ports)} and labels "
                        f"{labels}; the PodMonitor selects app={DCGM['app']}, port "
                        f"{DCGM['port']}: it would scrape nothing", "tell us: the stack "
                        "names what NVIDIA's manifests declare")]
    return [Finding(name, Status.OK, f"{DCGM['app']} in {DCGM['namespace']}, port "
                    f"{DCGM['port']}")]


@check("openshift")
def lokistack_selectors(env: Environment, api: Any) -> list[Finding]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    spec = env.spec
    assert isinstance(spec, OpenshiftEnvironment)
    if spec.log_shipping != "loki":
        return []
    loki, name = spec.lokistack, "LokiStack rules"
    try:
        stack = client.CustomObjectsApi(api).get_namespaced_custom_object(
            "loki.grafana.com", "v1", loki.namespace, "lokistacks", loki.name)
    except ApiException as e:
        if not _missing(e):
            raise
        return [Finding(name, Status.BLOCKER, f"no LokiStack {loki.name} in "
                        f"{loki.namespace}", "set lokistack: {name, namespace}")]
    body: dict[str, Any] = stack if isinstance(stack, dict) else {}
    rules = (body.get("spec") or {}).get("rules") or {}
    out = []
    if not rules.get("enabled"):
        out.append(Finding(name, Status.BLOCKER, "the LokiStack's ruler is off "
                           "(spec.rules.enabled): no log alert would fire",
                           "set spec.rules.enabled: true on the LokiStack"))
    for field, key, ours in (("selector", "rule_labels", loki.rule_labels),
                             ("namespaceSelector", "namespace_labels", loki.namespace_labels)):
        sel = rules.get(field) or {}
        need = sel.get("matchLabels") or {}
        if not need.items() <= ours.items():
            out.append(Finding(name, Status.BLOCKER,
                               f"spec.rules.{field} wants {need}; the stack labels with {ours}",
                               f"set lokistack.{key} to {need}"))
        if sel.get("matchExpressions"):
            out.append(Finding(name, Status.WARN, f"spec.rules.{field} has matchExpressions, "
                               "not compared", "check them by hand"))
    return out or [Finding(name, Status.OK, "the AlertingRules and namespaces match the "
                           "LokiStack's rules selectors")]


# --- running ----------------------------------------------------------------------------

def run(env: Environment, clients: Any) -> list[Finding]:
    out: list[Finding] = []
    for fn in CHECKS[env.cloud]:
        try:
            out += fn(env, clients)
        except Exception as e:  # a check that cannot read says so; it never passes silently
            out.append(Finding(fn.__name__.replace("_", " "), Status.BLOCKER,
                               f"could not check: {type(e).__name__}: {e}",
                               "check the credentials and region"))
    return out


def command(
    environment: Annotated[str, typer.Argument(help="an environments/*.yaml name or path")],
    endpoint_url: Annotated[str | None, typer.Option(
        help="AWS or Azure: send every call to this endpoint (a proxy, a test double)")
    ] = None,
    ca_file: Annotated[str | None, typer.Option(
        help="Azure: the CA bundle of --endpoint-url")] = None,
    kube_api: Annotated[str | None, typer.Option(
        help="OpenShift: this API server URL instead of the kubeconfig context")] = None,
) -> None:
    """Read-only checks of what the environment's stack assumes; exit 1 on a blocker."""
    path = Path(environment)
    if not path.suffix:
        path = Path("environments") / f"{environment}.yaml"
    try:
        env = load_environment(path)
    except (EnvironmentFileError, FileNotFoundError) as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    try:
        clients = (aws_clients(env, endpoint_url) if env.cloud == "aws" else
                   k8s_client(env, kube_api) if env.cloud == "openshift" else
                   arm_client(endpoint_url, ca_file))
        findings = run(env, clients)
    except Exception as e:  # no credentials, no kubeconfig: say so, never pass
        findings = [Finding("credentials", Status.BLOCKER,
                            f"cannot connect: {type(e).__name__}: {e}",
                            "log in (aws configure / oc login) and check the context")]
    # One line a finding: readable on a terminal, in a pipe and in a CI log alike.
    typer.echo(f"preflight {env.name} ({env.cloud})")
    for f in findings:
        typer.echo(f"{f.status.value.upper():8} {f.check}: {f.message}"
                   + (f"\n{'':8} fix: {f.fix}" if f.fix else ""))
    blockers = [f for f in findings if f.status is Status.BLOCKER]
    if blockers:
        typer.echo(f"{len(blockers)} blocker(s): fix them before `cdktn deploy {env.name}`",
                   err=True)
        raise typer.Exit(1)
