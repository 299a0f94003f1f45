"""The OpenShift stack (kubernetes and helm providers): the watchdog CronJob in its own
namespace with a ServiceAccount and namespaced RBAC, the policy as a ConfigMap, the
state ConfigMap (or a volume for SQLite state), and per watched namespace the
PrometheusRules, PodMonitors and an AlertmanagerConfig; an alert on the watchdog's own
heartbeat when it pushes to a Pushgateway; log shipping through OpenShift Logging to a
LokiStack (with Loki ruler alerts from the signatures) or through a Fluent Bit Helm
release.

The CronJob runs ``python -m trainguard.lambdas.k8s`` (``COMMAND``) with the settings
``lambdas/k8s/cronjob.py`` reads (``cron_env``); tests/test_seams.py holds the two
sides together."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cdktn import TerraformResourceLifecycle, TerraformStack
from cdktn_provider_helm.provider import HelmProvider, HelmProviderKubernetes
from cdktn_provider_helm.release import Release
from cdktn_provider_kubernetes import cron_job_v1 as cj
from cdktn_provider_kubernetes.cluster_role_binding_v1 import (
    ClusterRoleBindingV1,
    ClusterRoleBindingV1Metadata,
    ClusterRoleBindingV1RoleRef,
    ClusterRoleBindingV1Subject,
)
from cdktn_provider_kubernetes.config_map_v1 import ConfigMapV1, ConfigMapV1Metadata
from cdktn_provider_kubernetes.labels import Labels, LabelsMetadata
from cdktn_provider_kubernetes.manifest import Manifest
from cdktn_provider_kubernetes.namespace_v1 import NamespaceV1, NamespaceV1Metadata
from cdktn_provider_kubernetes.persistent_volume_claim_v1 import (
    PersistentVolumeClaimV1,
    PersistentVolumeClaimV1Metadata,
    PersistentVolumeClaimV1Spec,
    PersistentVolumeClaimV1SpecResources,
)
from cdktn_provider_kubernetes.provider import KubernetesProvider
from cdktn_provider_kubernetes.role_binding_v1 import (
    RoleBindingV1,
    RoleBindingV1Metadata,
    RoleBindingV1RoleRef,
    RoleBindingV1Subject,
)
from cdktn_provider_kubernetes.role_v1 import RoleV1, RoleV1Metadata, RoleV1Rule
from cdktn_provider_kubernetes.service_account_v1 import (
    ServiceAccountV1,
    ServiceAccountV1Metadata,
)
from constructs import Construct

from trainguard.checker.logship import fluentbit_rewrite_rules, logql_rule
from trainguard.checker.signatures import SIGNATURES
from trainguard.config.settings.k8s import Settings as K8sSettings
from trainguard.stacks import admission
from trainguard.stacks.base import local_state
from trainguard.stacks.dashboards import kubernetes as dashboards
from trainguard.stacks.environment import Environment, OpenshiftEnvironment
from trainguard.stacks.prometheus_rules import SCRAPE_SECONDS, rule_groups, watchdog_rules

WATCHDOG = "trainguard"
STATE_CONFIGMAP = "trainguard-state"
POLICY_CONFIGMAP = "trainguard-policy"
POLICY_MOUNT = "/etc/trainguard"
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"  # token, and OpenShift's service CA
STATE_MOUNT = "/var/lib/trainguard"  # the Containerfile's volume, for SQLite state
STATE_FILE = "state.sqlite"
STATE_CLAIM = "trainguard-state"  # the PersistentVolumeClaim of SQLite state
# the entry point, said here, not left to the image
COMMAND = ["python", "-m", "trainguard.lambdas.k8s"]
METRICS_LABEL = "trainguard.io/metrics"  # training pods with this label are scraped
#: the kinds the watchdog reads, and suspends (patch) when stops are enabled
JOB_KINDS = (("kubeflow.org", "pytorchjobs"), ("trainer.kubeflow.org", "trainjobs"))
FLUENT_BIT_CHART = ("https://fluent.github.io/helm-charts", "fluent-bit", "0.47.10")
#: NVIDIA gpu-operator's DCGM exporter: a PodMonitor names the *container* port, which
#: the operator's DaemonSet calls ``metrics`` (``gpu-metrics`` is its Service's port);
#: tests/reference/gpu-operator holds the DaemonSet it is checked against
DCGM = {"namespace": "nvidia-gpu-operator", "app": "nvidia-dcgm-exporter",
        "port": "metrics"}
#: the record key Fluent Bit's ``cri`` multiline parser puts a line's text under
#: (fluent-bit src/multiline/flb_ml_parser_cri.c; tests/reference/fluent-bit)
CRI_LOG_KEY = "log"
#: the verb each stop mode uses on the job kinds (adapters/kubeflow: a merge patch that
#: suspends, or a delete)
STOP_VERBS = {"suspend": "patch", "delete": "delete"}


def job_verbs(spec: OpenshiftEnvironment) -> list[str]:
    """What the watchdog may do to the job kinds: read them, and with stops enabled the
    one verb its stop mode needs."""
    # get: a job is read again just before its stop (lambdas/trust.py); no watch.
    return ["get", "list", *([STOP_VERBS[spec.stop_mode]] if spec.stop_enabled else [])]


def cron_env(spec: OpenshiftEnvironment) -> dict[str, str]:
    """The CronJob's environment: every option of ``lambdas/k8s/cronjob.py`` the
    deployment decides (the rest keep the entry point's defaults)."""
    sqlite = spec.state == "sqlite"
    return K8sSettings(
        environment=spec.name, policy=f"{POLICY_MOUNT}/policy.yaml", cluster=spec.cluster,
        namespaces=",".join(spec.watch_namespaces),
        state_sqlite=f"{STATE_MOUNT}/{STATE_FILE}" if sqlite else None,
        state_configmap=None if sqlite else f"{spec.namespace}/{STATE_CONFIGMAP}",
        stop_enabled=spec.stop_enabled, stop_mode=spec.stop_mode,
        interval_s=spec.tick.tick_seconds(),
        remind_every=spec.remind_every_minutes * 60.0,
        prometheus_url=spec.prometheus_url, alertmanager_url=spec.alertmanager_url,
        # The ServiceAccount's token and OpenShift's service CA, mounted in every pod.
        prometheus_token_file=f"{SA_MOUNT}/token",
        prometheus_ca_file=f"{SA_MOUNT}/service-ca.crt",
        # the querier's namespaced port (9092) answers from the job's namespace only
        prometheus_tenancy=spec.prometheus_tenancy,
        alertmanager_token_file=f"{SA_MOUNT}/token",
        alertmanager_ca_file=f"{SA_MOUNT}/service-ca.crt",
        pushgateway_url=spec.pushgateway_url, console_url=spec.console_url,
    ).to_env()


def fluentbit_config(spec: OpenshiftEnvironment) -> dict[str, str]:
    """The Fluent Bit chart's ``config`` sections: tail the watched namespaces' container
    logs through the ``cri`` parser (the text lands under ``CRI_LOG_KEY``), copy lines
    matching a signature under ``trainguard.<severity>.<signature>`` and send those to
    Loki."""
    out = spec.fluentbit
    assert out is not None  # the environment's validation requires it
    paths = ",".join(f"/var/log/containers/*_{ns}_*.log" for ns in spec.watch_namespaces)
    rewrite = "\n".join(f"    Rule {r}" for r in fluentbit_rewrite_rules(f"${CRI_LOG_KEY}"))
    return {
        "inputs": ("[INPUT]\n    Name tail\n    Tag kube.*\n    multiline.parser cri\n"
                   f"    Path {paths}\n    Mem_Buf_Limit 16MB\n    Skip_Long_Lines On\n"),
        "filters": ("[FILTER]\n    Name kubernetes\n    Match kube.*\n    Merge_Log On\n"
                    "[FILTER]\n    Name rewrite_tag\n    Match kube.*\n"
                    f"{rewrite}\n    Emitter_Name trainguard_signatures\n"),
        "outputs": ("[OUTPUT]\n    Name loki\n    Match trainguard.*\n"
                    f"    Host {out.host}\n    Port {out.port}\n"
                    f"    tls {'On' if out.tls else 'Off'}\n"
                    "    labels job=trainguard, signature=$TAG[2], severity=$TAG[1], "
                    "namespace=$kubernetes['namespace_name'], "
                    "pod=$kubernetes['pod_name']\n"),
    }


class OpenshiftStack(TerraformStack):
    def __init__(self, scope: Construct, env: Environment, build_dir: Path) -> None:
        super().__init__(scope, env.name)
        spec = env.spec
        assert isinstance(spec, OpenshiftEnvironment)
        self.env, self.spec = env, spec
        local_state(self, env.name)
        KubernetesProvider(self, "kubernetes", config_path="~/.kube/config",
                           config_context=spec.kube_context)
        HelmProvider(self, "helm", kubernetes=HelmProviderKubernetes(
            config_path="~/.kube/config", config_context=spec.kube_context))
        self.labels = {"app.kubernetes.io/name": WATCHDOG,
                       "app.kubernetes.io/managed-by": "cdktn",
                       "trainguard.io/environment": spec.name}
        # namespace_v1 takes a list of metadata blocks, the other resources a single one.
        self.ns = NamespaceV1(self, "namespace", metadata=[NamespaceV1Metadata(
            name=spec.namespace, labels=self.labels)]).metadata.get(0).name
        self.sa = ServiceAccountV1(self, "service_account", metadata=ServiceAccountV1Metadata(
            name=WATCHDOG, namespace=self.ns, labels=self.labels),
            automount_service_account_token=True)
        self._config_maps()
        self._rbac()
        self._cron_job()
        self._monitoring()
        self._dashboards()
        if spec.log_shipping == "loki":
            self._loki()
        else:
            self._fluent_bit()

    # --- the watchdog -------------------------------------------------------------------

    def _config_maps(self) -> None:
        ConfigMapV1(self, "policy", metadata=ConfigMapV1Metadata(
            name=POLICY_CONFIGMAP, namespace=self.ns, labels=self.labels),
            data={"policy.yaml": self.env.policy_path.read_text(encoding="utf-8")})
        if self.spec.state == "sqlite":
            # The state file's volume; not bound until the first pod (WaitForFirstConsumer).
            vol = self.spec.state_volume
            PersistentVolumeClaimV1(self, "state", metadata=PersistentVolumeClaimV1Metadata(
                name=STATE_CLAIM, namespace=self.ns, labels=self.labels),
                spec=PersistentVolumeClaimV1Spec(
                    access_modes=["ReadWriteOnce"], storage_class_name=vol.storage_class,
                    resources=PersistentVolumeClaimV1SpecResources(
                        requests={"storage": vol.size})),
                wait_until_bound=False)
            return
        # The watchdog may only get and update this one object (RBAC cannot limit
        # "create" by name), so the stack creates it; its data is the watchdog's.
        ConfigMapV1(self, "state", metadata=ConfigMapV1Metadata(
            name=STATE_CONFIGMAP, namespace=self.ns, labels=self.labels), data={},
            lifecycle=TerraformResourceLifecycle(ignore_changes=["data"]))

    def _rbac(self) -> None:
        spec = self.spec
        rules = [RoleV1Rule(api_groups=[group], resources=[plural], verbs=job_verbs(spec))
                 for group, plural in JOB_KINDS]
        # Pods are listed (by label selector), never read one by one nor watched.
        rules.append(RoleV1Rule(api_groups=[""], resources=["pods"], verbs=["list"]))
        subject = {"kind": "ServiceAccount", "name": WATCHDOG, "namespace": spec.namespace}
        for ns in spec.watch_namespaces:
            self._role(f"jobs_{ns}", ns, rules, subject)
        if spec.admission_policy and spec.stop_enabled and spec.stop_mode == "suspend":
            self._manifest("admission_policy", "admissionregistration.k8s.io/v1",
                           "ValidatingAdmissionPolicy", admission.NAME, None,
                           admission.policy(WATCHDOG, spec.namespace))
            self._manifest("admission_binding", "admissionregistration.k8s.io/v1",
                           "ValidatingAdmissionPolicyBinding", admission.NAME, None,
                           admission.binding(spec.watch_namespaces))
        if spec.state == "configmap":
            self._role("state", self.ns, [RoleV1Rule(
                api_groups=[""], resources=["configmaps"], resource_names=[STATE_CONFIGMAP],
                verbs=["get", "update"])], subject)

    def _role(self, rid: str, ns: str, rules: list[RoleV1Rule], subject: dict[str, str]
              ) -> None:
        name = f"{WATCHDOG}-{self.spec.name}"
        role = RoleV1(self, f"role_{rid}", metadata=[RoleV1Metadata(
            name=name, namespace=ns, labels=self.labels)], rule=rules)
        RoleBindingV1(self, f"binding_{rid}", metadata=RoleBindingV1Metadata(
            name=name, namespace=ns, labels=self.labels),
            role_ref=RoleBindingV1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role",
                                          name=role.metadata.get(0).name),
            subject=[RoleBindingV1Subject(**subject)])

    def _cron_job(self) -> None:
        spec = self.spec
        env = cron_env(spec)
        mounts = [cj.CronJobV1SpecJobTemplateSpecTemplateSpecContainerVolumeMount(
                      name="policy", mount_path=POLICY_MOUNT, read_only=True),
                  cj.CronJobV1SpecJobTemplateSpecTemplateSpecContainerVolumeMount(
                      name="tmp", mount_path="/tmp")]
        volumes = [
            cj.CronJobV1SpecJobTemplateSpecTemplateSpecVolume(
                name="policy",
                config_map=cj.CronJobV1SpecJobTemplateSpecTemplateSpecVolumeConfigMap(
                    name=POLICY_CONFIGMAP)),
            cj.CronJobV1SpecJobTemplateSpecTemplateSpecVolume(
                name="tmp",
                empty_dir=cj.CronJobV1SpecJobTemplateSpecTemplateSpecVolumeEmptyDir(
                    size_limit="64Mi"))]
        if spec.state == "sqlite":
            mounts.append(cj.CronJobV1SpecJobTemplateSpecTemplateSpecContainerVolumeMount(
                name="state", mount_path=STATE_MOUNT))
            volumes.append(cj.CronJobV1SpecJobTemplateSpecTemplateSpecVolume(
                name="state",
                persistent_volume_claim=cj.CronJobV1SpecJobTemplateSpecTemplateSpecVolumePersistentVolumeClaim(
                    claim_name=STATE_CLAIM)))
        seccomp = cj.CronJobV1SpecJobTemplateSpecTemplateSpecSecurityContextSeccompProfile(
            type="RuntimeDefault")
        container = cj.CronJobV1SpecJobTemplateSpecTemplateSpecContainer(
            name="watchdog", image=spec.image, image_pull_policy="IfNotPresent",
            command=COMMAND,
            env=[cj.CronJobV1SpecJobTemplateSpecTemplateSpecContainerEnv(name=k, value=v)
                 for k, v in env.items()],
            security_context=cj.CronJobV1SpecJobTemplateSpecTemplateSpecContainerSecurityContext(
                run_as_non_root=True, allow_privilege_escalation=False, privileged=False,
                read_only_root_filesystem=True,
                capabilities=cj.CronJobV1SpecJobTemplateSpecTemplateSpecContainerSecurityContextCapabilities(
                    drop=["ALL"]),
                seccomp_profile=cj.CronJobV1SpecJobTemplateSpecTemplateSpecContainerSecurityContextSeccompProfile(
                    type="RuntimeDefault")),
            resources=cj.CronJobV1SpecJobTemplateSpecTemplateSpecContainerResources(
                requests={"cpu": "100m", "memory": "256Mi"},
                limits={"cpu": "1", "memory": "1Gi"}),
            volume_mount=mounts)
        pod = cj.CronJobV1SpecJobTemplateSpecTemplateSpec(
            service_account_name=self.sa.metadata.name, restart_policy="Never",
            # No runAsUser: OpenShift's restricted-v2 SCC assigns an arbitrary one.
            security_context=cj.CronJobV1SpecJobTemplateSpecTemplateSpecSecurityContext(
                run_as_non_root=True, seccomp_profile=seccomp),
            container=[container], volume=volumes)
        cj.CronJobV1(self, "watchdog", metadata=cj.CronJobV1Metadata(
            name=WATCHDOG, namespace=self.ns, labels=self.labels),
            spec=cj.CronJobV1Spec(
                schedule=spec.tick.standard_cron(),  # the controller's zone: UTC on OpenShift
                # One tick at a time: two concurrent ticks could both stop a job.
                concurrency_policy="Forbid", starting_deadline_seconds=120,
                successful_jobs_history_limit=1, failed_jobs_history_limit=3,
                job_template=cj.CronJobV1SpecJobTemplate(
                    metadata=cj.CronJobV1SpecJobTemplateMetadata(labels=self.labels),
                    spec=cj.CronJobV1SpecJobTemplateSpec(
                        backoff_limit=0, active_deadline_seconds=600,
                        ttl_seconds_after_finished="3600",
                        template=cj.CronJobV1SpecJobTemplateSpecTemplate(
                            metadata=cj.CronJobV1SpecJobTemplateSpecTemplateMetadata(
                                labels=self.labels),
                            spec=pod)))))

    # --- alerts and metrics -------------------------------------------------------------

    def _manifest(self, rid: str, api: str, kind: str, name: str, ns: str | None,
                  spec: dict[str, Any], labels: dict[str, str] | None = None) -> None:
        metadata: dict[str, Any] = {"name": name, "labels": {**self.labels, **(labels or {})}}
        if ns is not None:
            metadata["namespace"] = ns
        Manifest(self, rid, manifest={"apiVersion": api, "kind": kind, "metadata": metadata,
                                      "spec": spec})

    def _receiver(self) -> dict[str, Any]:
        spec = self.spec
        receiver: dict[str, Any] = {"name": WATCHDOG}
        if spec.alarms.emails:
            smtp = ({"smarthost": spec.smtp.smarthost, "from": spec.smtp.sender}
                    if spec.smtp else {})
            receiver["emailConfigs"] = [{"to": e, "sendResolved": True, **smtp}
                                        for e in spec.alarms.emails]
        if spec.alarms.webhooks:
            # urlSecret: the URL stays in a Secret (in each namespace with an
            # AlertmanagerConfig), never in the repository or the manifests.
            receiver["webhookConfigs"] = [
                {"urlSecret": {"name": h.secret.name, "key": h.secret.key}, "sendResolved": True}
                for h in spec.alarms.webhooks if h.secret is not None]
        return receiver

    def _monitoring(self) -> None:
        spec = self.spec
        groups = rule_groups(self.env.policy)
        route = {"receiver": WATCHDOG, "groupBy": ["alertname", "pod"], "groupWait": "30s",
                 "groupInterval": "5m", "repeatInterval": "4h",
                 "matchers": [{"name": "trainguard_rule", "matchType": "=~", "value": ".+"}]}
        amc = {"route": route, "receivers": [self._receiver()]}
        # AlertmanagerConfig routes only its own namespace's alerts: one per namespace.
        self._manifest("alertmanager_config", "monitoring.coreos.com/v1beta1",
                       "AlertmanagerConfig", WATCHDOG, spec.namespace, amc)
        for ns in spec.watch_namespaces:
            rid = ns.replace("-", "_")
            self._manifest(f"rules_{rid}", "monitoring.coreos.com/v1", "PrometheusRule",
                           WATCHDOG, ns, groups)
            self._manifest(f"training_metrics_{rid}", "monitoring.coreos.com/v1",
                           "PodMonitor", f"{WATCHDOG}-training", ns, {
                               "selector": {"matchLabels": {METRICS_LABEL: "true"}},
                               "podMetricsEndpoints": [{"port": "metrics",
                                                        "interval": f"{SCRAPE_SECONDS}s"}]})
            self._manifest(f"alertmanager_config_{rid}", "monitoring.coreos.com/v1beta1",
                           "AlertmanagerConfig", WATCHDOG, ns, amc)
        if spec.pushgateway_url:
            # The watchdog's heartbeat: its Pushgateway metrics, scraped by the user
            # workload monitoring in its own namespace, stop moving when it stops.
            self._manifest("watchdog_rules", "monitoring.coreos.com/v1", "PrometheusRule",
                           f"{WATCHDOG}-watchdog", spec.namespace,
                           watchdog_rules(spec.name, spec.tick.interval_minutes() * 60))
        self._manifest("dcgm_metrics", "monitoring.coreos.com/v1", "PodMonitor",
                       f"{WATCHDOG}-dcgm", DCGM["namespace"], {
                           "selector": {"matchLabels": {"app": DCGM["app"]}},
                           "podMetricsEndpoints": [{"port": DCGM["port"],
                                                    "interval": f"{SCRAPE_SECONDS}s",
                                                    "honorLabels": True}]})

    def _dashboards(self) -> None:
        """The Grafana dashboard (stacks/dashboards): in the console, and for the
        grafana-operator's Grafanas the environment names."""
        spec = self.spec
        if spec.console_dashboard:
            ConfigMapV1(self, "console_dashboard", metadata=ConfigMapV1Metadata(
                name=dashboards.NAME, namespace=dashboards.CONSOLE_NAMESPACE,
                labels={**self.labels, dashboards.CONSOLE_LABEL: "true"}),
                data=dashboards.console_data())
        if spec.grafana_instance_labels:
            self._manifest("grafana_dashboard", dashboards.OPERATOR_API, "GrafanaDashboard",
                           dashboards.NAME, spec.namespace,
                           dashboards.operator_spec(spec.grafana_instance_labels))

    # --- log shipping -------------------------------------------------------------------

    def _loki(self) -> None:
        spec = self.spec
        collector = f"{WATCHDOG}-log-collector"
        ServiceAccountV1(self, "log_collector", metadata=ServiceAccountV1Metadata(
            name=collector, namespace=self.ns, labels=self.labels))
        for i, role in enumerate(("collect-application-logs", "logging-collector-logs-writer")):
            ClusterRoleBindingV1(self, f"log_collector_{i}", metadata=ClusterRoleBindingV1Metadata(
                name=f"{collector}-{spec.name}-{role}", labels=self.labels),
                role_ref=ClusterRoleBindingV1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
                subject=[ClusterRoleBindingV1Subject(kind="ServiceAccount", name=collector,
                                                     namespace=spec.namespace)])
        loki = spec.lokistack
        self._manifest("log_forwarder", "observability.openshift.io/v1", "ClusterLogForwarder",
                       WATCHDOG, spec.namespace, {
                           "serviceAccount": {"name": collector},
                           "inputs": [{"name": "training", "type": "application",
                                       "application": {"includes": [
                                           {"namespace": ns} for ns in spec.watch_namespaces]}}],
                           "outputs": [{"name": "lokistack", "type": "lokiStack", "lokiStack": {
                               "target": {"name": loki.name, "namespace": loki.namespace},
                               "authentication": {"token": {"from": "serviceAccount"}}},
                               "tls": {"ca": {"key": "service-ca.crt",
                                              "configMapName": "openshift-service-ca.crt"}}}],
                           "pipelines": [{"name": "training-to-loki", "inputRefs": ["training"],
                                          "outputRefs": ["lokistack"]}]})
        for ns in spec.watch_namespaces:
            selector = f'{{kubernetes_namespace_name="{ns}"}}'
            rules = [{"alert": f"TrainguardLog_{s.name}", "expr": logql_rule(s, selector),
                      "labels": {"severity": s.severity.value, "trainguard_rule": "logs",
                                 "signature": s.name},
                      "annotations": {"summary": f"{s.meaning} in "
                                                 "{{ $labels.kubernetes_pod_name }}",
                                      "description": f"training log line matching the "
                                                     f"'{s.name}' signature"}}
                     for s in SIGNATURES]
            rid = ns.replace("-", "_")
            # The LokiStack's ruler loads only AlertingRules matching its
            # rules.selector, in namespaces matching its rules.namespaceSelector.
            self._manifest(f"log_alerts_{rid}", "loki.grafana.com/v1",
                           "AlertingRule", WATCHDOG, ns, {
                               "tenantID": "application",
                               "groups": [{"name": "trainguard-signatures", "interval": "1m",
                                           "rules": rules}]}, labels=loki.rule_labels)
            # The watched namespace exists already: only these labels are added (and
            # removed again on destroy), the namespace's other labels stay its owner's.
            Labels(self, f"log_alerts_namespace_{rid}", api_version="v1", kind="Namespace",
                   metadata=LabelsMetadata(name=ns), labels=loki.namespace_labels,
                   field_manager="trainguard")

    def _fluent_bit(self) -> None:
        spec = self.spec
        out = spec.fluentbit
        assert out is not None  # the environment's validation requires it
        repo, chart, version = FLUENT_BIT_CHART
        config = fluentbit_config(spec)
        Release(self, "fluent_bit", name=f"{WATCHDOG}-fluent-bit", repository=repo,
                chart=chart, version=version, namespace=spec.namespace,
                values=[json.dumps({"config": config, "kind": "DaemonSet",
                                    # by digest: the chart's default is a tag
                                    "image": {"repository": out.image.split("@")[0],
                                              "digest": out.image.split("@")[1]},
                                    "securityContext": {"readOnlyRootFilesystem": True,
                                                        "allowPrivilegeEscalation": False,
                                                        "capabilities": {"drop": ["ALL"]}}},
                                   sort_keys=True)])
