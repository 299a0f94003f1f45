"""The Azure stack: the watchdog Function App (Linux, Python 3.11, timer trigger) with a
system-assigned identity, its storage account and state Table, Application Insights on
a Log Analytics workspace, a custom role on the Azure ML workspace holding only the job
read (and, with stops enabled, cancel) actions, an Action Group with the environment's
receivers, metric alerts on the findings metrics, scheduled query alerts from the log
signatures and a consumption budget per policy budget. The app's code is deployed by
the stack: a reproducible zip (``stacks/package.py``'s ``FUNCTION``) as a blob in its
own storage that the app runs from (``WEBSITE_RUN_FROM_PACKAGE``, read with its
managed identity)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from cdktn import (
    AssetType,
    Fn,
    TerraformAsset,
    TerraformOutput,
    TerraformResourceLifecycle,
    TerraformStack,
)
from cdktn_provider_azurerm.application_insights import ApplicationInsights
from cdktn_provider_azurerm.application_insights_workbook import ApplicationInsightsWorkbook
from cdktn_provider_azurerm.consumption_budget_subscription import (
    ConsumptionBudgetSubscription,
    ConsumptionBudgetSubscriptionNotification,
    ConsumptionBudgetSubscriptionTimePeriod,
)
from cdktn_provider_azurerm.data_azurerm_key_vault_secret import DataAzurermKeyVaultSecret
from cdktn_provider_azurerm.linux_function_app import (
    LinuxFunctionApp,
    LinuxFunctionAppIdentity,
    LinuxFunctionAppSiteConfig,
    LinuxFunctionAppSiteConfigApplicationStack,
)
from cdktn_provider_azurerm.log_analytics_workspace import LogAnalyticsWorkspace
from cdktn_provider_azurerm.monitor_action_group import (
    MonitorActionGroup,
    MonitorActionGroupEmailReceiver,
    MonitorActionGroupWebhookReceiver,
)
from cdktn_provider_azurerm.monitor_metric_alert import (
    MonitorMetricAlert,
    MonitorMetricAlertAction,
    MonitorMetricAlertCriteria,
    MonitorMetricAlertCriteriaDimension,
)
from cdktn_provider_azurerm.monitor_scheduled_query_rules_alert_v2 import (
    MonitorScheduledQueryRulesAlertV2,
    MonitorScheduledQueryRulesAlertV2Action,
    MonitorScheduledQueryRulesAlertV2Criteria,
    MonitorScheduledQueryRulesAlertV2CriteriaDimension,
    MonitorScheduledQueryRulesAlertV2CriteriaFailingPeriods,
)
from cdktn_provider_azurerm.provider import AzurermProvider, AzurermProviderFeatures
from cdktn_provider_azurerm.resource_group import ResourceGroup
from cdktn_provider_azurerm.role_assignment import RoleAssignment
from cdktn_provider_azurerm.role_definition import RoleDefinition, RoleDefinitionPermissions
from cdktn_provider_azurerm.service_plan import ServicePlan
from cdktn_provider_azurerm.storage_account import (
    StorageAccount,
    StorageAccountBlobProperties,
    StorageAccountBlobPropertiesDeleteRetentionPolicy,
)
from cdktn_provider_azurerm.storage_blob import StorageBlob
from cdktn_provider_azurerm.storage_container import StorageContainer
from cdktn_provider_azurerm.storage_table import StorageTable
from constructs import Construct

from trainguard.checker.logship import kql_query
from trainguard.checker.model import Action, Severity
from trainguard.checker.registry import rule_names
from trainguard.checker.signatures import SIGNATURES
from trainguard.config.settings.azure import Settings as AzureSettings
from trainguard.stacks import package
from trainguard.stacks.base import covers, local_state
from trainguard.stacks.dashboards import workbook
from trainguard.stacks.environment import AzureEnvironment, Environment, Webhook

#: the custom metric lambdas/azure posts (Azure Monitor custom metrics REST API) on the
#: Application Insights resource: dimensions rule and severity (tests/test_seams.py
#: holds these equal to lambdas/azure/sinks.py)
METRIC_NAMESPACE = "trainguard"
FINDINGS = "Findings"
DIMENSIONS = ("rule", "severity")
AZURE_SEVERITY = {Severity.CRITICAL: 1, Severity.WARNING: 2}  # 0 is kept for outages
ML_READ = (
    "Microsoft.MachineLearningServices/workspaces/read",
    "Microsoft.MachineLearningServices/workspaces/jobs/read",
    "Microsoft.MachineLearningServices/workspaces/experiments/read",
    "Microsoft.MachineLearningServices/workspaces/experiments/runs/read",  # MLflow metrics
    # the adapter reads a job's compute for its VM size and count (the price)
    "Microsoft.MachineLearningServices/workspaces/computes/read",
)
ML_CANCEL = "Microsoft.MachineLearningServices/workspaces/jobs/cancel/action"
MAX_BUDGET_NOTIFICATIONS = 5  # Azure's limit per budget
#: the window sizes a metric alert may have (minutes -> ISO 8601), shortest first
ALERT_WINDOWS = ((1, "PT1M"), (5, "PT5M"), (15, "PT15M"), (30, "PT30M"), (60, "PT1H"),
                 (360, "PT6H"), (720, "PT12H"), (1440, "P1D"))


def alert_window(interval_minutes: int) -> tuple[str, str]:
    """(frequency, window) of a metric alert on a metric published once a tick: the
    window spans at least one tick, so the alert neither misses a finding nor resolves
    between two ticks that both saw it (the longest window when ticks are further
    apart than a day)."""
    window = next((iso for m, iso in ALERT_WINDOWS if m >= interval_minutes),
                  ALERT_WINDOWS[-1][1])
    return ("PT1M" if window == "PT1M" else "PT5M"), window


def key_vault_reference(hook: Webhook) -> str:
    """An App Service Key Vault reference to the webhook's URL secret."""
    assert hook.key_vault is not None
    return (f"@Microsoft.KeyVault(VaultName={hook.key_vault.vault_name};"
            f"SecretName={hook.key_vault.secret})")


def _suffix(*parts: str) -> str:
    """A short stable suffix for globally unique names (storage account, function app)."""
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:6]


class AzureStack(TerraformStack):
    def __init__(self, scope: Construct, env: Environment, build_dir: Path) -> None:
        super().__init__(scope, env.name)
        spec = env.spec
        assert isinstance(spec, AzureEnvironment)
        self.env, self.spec = env, spec
        local_state(self, env.name)
        AzurermProvider(self, "azurerm", features=[AzurermProviderFeatures()],
                        subscription_id=spec.subscription, storage_use_azuread=True)
        tags = {"app": "trainguard", "trainguard-environment": spec.name, **spec.tags}
        self.tags = tags
        suffix = _suffix(spec.subscription, spec.name)
        compact = "".join(c for c in spec.name if c.isalnum())
        self.group = ResourceGroup(self, "group", name=spec.group, location=spec.region,
                                   tags=tags)
        rg, loc = self.group.name, self.group.location
        self.logs = LogAnalyticsWorkspace(
            self, "logs", name=f"trainguard-{spec.name}", resource_group_name=rg,
            location=loc, sku="PerGB2018", retention_in_days=spec.log_retention_days,
            daily_quota_gb=1, tags=tags)
        self.insights = ApplicationInsights(
            self, "insights", name=f"trainguard-{spec.name}", resource_group_name=rg,
            location=loc, application_type="other", workspace_id=self.logs.id,
            retention_in_days=spec.log_retention_days, tags=tags)
        self.storage = StorageAccount(
            self, "storage", name=f"tg{compact}{suffix}"[:24], resource_group_name=rg,
            location=loc, account_tier="Standard", account_replication_type="GRS",
            min_tls_version="TLS1_2", https_traffic_only_enabled=True,
            allow_nested_items_to_be_public=False,
            # The function reaches its storage with its identity: no keys to leak.
            shared_access_key_enabled=False, default_to_oauth_authentication=True,
            blob_properties=StorageAccountBlobProperties(
                delete_retention_policy=StorageAccountBlobPropertiesDeleteRetentionPolicy(
                    days=7)),
            tags=tags)
        self.table = StorageTable(self, "state", name="trainguardstate",
                                  storage_account_id=self.storage.id)
        self.function = self._function(f"trainguard-{spec.name}-{suffix}", build_dir)
        self._roles()
        self.action_group = self._action_group()
        self._metric_alerts()
        self._log_alerts()
        self._budgets()
        self._workbook()
        TerraformOutput(self, "function_app", value=self.function.name)
        TerraformOutput(self, "action_group_id", value=self.action_group.id)

    # --- the function -------------------------------------------------------------------

    def _function(self, name: str, build_dir: Path) -> LinuxFunctionApp:
        spec = self.spec
        zipped = package.FUNCTION.build(self.env.policy_path,
                                        build_dir / f"{spec.name}-function.zip")
        asset = TerraformAsset(self, "package", path=str(zipped.path), type=AssetType.FILE)
        # The app runs from the zip in its own storage, read with its managed identity
        # (the only way Linux Consumption runs a package, and no publishing credential:
        # basic authentication stays off). The blob is named by its content, so a new
        # package is a new URL and the app restarts on it.
        packages = StorageContainer(self, "packages", name="function-packages",
                                    storage_account_id=self.storage.id,
                                    container_access_type="private")
        blob = StorageBlob(self, "package_blob",
                           name=f"function-{Fn.filesha256(asset.path)}.zip",
                           storage_container_id=packages.id, type="Block", source=asset.path)
        webhooks = spec.alarms.webhooks
        plan = ServicePlan(self, "plan", name=f"trainguard-{spec.name}",
                           resource_group_name=self.group.name,
                           location=self.group.location, os_type="Linux", sku_name="Y1",
                           tags=self.tags)
        return LinuxFunctionApp(
            self, "watchdog", name=name, resource_group_name=self.group.name,
            location=self.group.location, service_plan_id=plan.id,
            storage_account_name=self.storage.name, storage_uses_managed_identity=True,
            identity=LinuxFunctionAppIdentity(type="SystemAssigned"),
            https_only=True,
            # Its own site denies every request (a timer needs none); no FTP, no basic
            # publishing credentials for the SCM site either (the package is a blob).
            public_network_access_enabled=True, ftp_publish_basic_authentication_enabled=False,
            webdeploy_publish_basic_authentication_enabled=False,
            functions_extension_version="~4",
            site_config=LinuxFunctionAppSiteConfig(
                application_stack=LinuxFunctionAppSiteConfigApplicationStack(
                    python_version="3.11"),
                application_insights_connection_string=self.insights.connection_string,
                ftps_state="Disabled", minimum_tls_version="1.2", http2_enabled=True,
                ip_restriction_default_action="Deny", scm_minimum_tls_version="1.2"),
            app_settings={
                # The zip is complete (wheels under .python_packages): no build on deploy.
                "SCM_DO_BUILD_DURING_DEPLOYMENT": "false",
                "ENABLE_ORYX_BUILD": "false",
                "WEBSITE_RUN_FROM_PACKAGE": blob.url,
                "WEBSITE_RUN_FROM_PACKAGE_BLOB_MI_RESOURCE_ID": "SystemAssigned",
                **AzureSettings(
                    policy=package.POLICY_NAME,
                    # The timer trigger reads its NCRONTAB schedule from this setting.
                    schedule=spec.tick.ncrontab(),
                    interval_s=spec.tick.tick_seconds(),
                    table_url=f"{self.storage.primary_table_endpoint}{self.table.name}",
                    stop_enabled=spec.stop_enabled, subscription=spec.subscription,
                    resource_group=spec.ml_workspace.resource_group,
                    workspace=spec.ml_workspace.name,
                    # Findings are posted as custom metrics on Application Insights, which
                    # the metric alerts watch.
                    metrics_resource_id=self.insights.id,
                    metrics_region=self.group.location,
                    # The message a person reads, to the environment's first webhook (the
                    # Action Group's alerts say which rule fires, this says which job).
                    # A Key Vault reference: the app resolves it with its identity; the
                    # URL itself is in neither the repository nor the app's settings.
                    webhook_url=key_vault_reference(webhooks[0]) if webhooks else None,
                ).to_env(),
            },
            tags=self.tags)

    def _roles(self) -> None:
        spec = self.spec
        ws = spec.ml_workspace
        scope = (f"/subscriptions/{spec.subscription}/resourceGroups/{ws.resource_group}"
                 f"/providers/Microsoft.MachineLearningServices/workspaces/{ws.name}")
        actions = [*ML_READ, *([ML_CANCEL] if spec.stop_enabled else [])]
        role = RoleDefinition(
            self, "ml_role", name=f"trainguard watchdog ({spec.name})", scope=scope,
            description="Read Azure ML jobs and their metrics"
                        + (", cancel jobs" if spec.stop_enabled else ""),
            permissions=[RoleDefinitionPermissions(actions=actions)],
            assignable_scopes=[scope])
        principal = self.function.identity.principal_id
        RoleAssignment(self, "ml_role_assignment", scope=scope, principal_id=principal,
                       role_definition_id=role.role_definition_resource_id,
                       principal_type="ServicePrincipal")
        RoleAssignment(self, "metrics_publisher", scope=self.insights.id,
                       principal_id=principal, role_definition_name="Monitoring Metrics Publisher",
                       principal_type="ServicePrincipal")
        # Its own storage: the Functions host keeps timer leases in blobs; state in the
        # Table, and only that table (not every table of the account).
        RoleAssignment(self, "storage_role_0", scope=self.storage.id,
                       principal_id=principal, role_definition_name="Storage Blob Data Owner",
                       principal_type="ServicePrincipal")
        RoleAssignment(self, "storage_role_1", scope=self.table.resource_manager_id,
                       principal_id=principal,
                       role_definition_name="Storage Table Data Contributor",
                       principal_type="ServicePrincipal")
        # The webhook URL's secret, and only it, for the app's Key Vault reference.
        for hook in spec.alarms.webhooks[:1]:
            assert hook.key_vault is not None  # the environment's validation says so
            RoleAssignment(self, f"webhook_secret_{hook.name}",
                           scope=f"{hook.key_vault.vault_id}/secrets/{hook.key_vault.secret}",
                           principal_id=principal, role_definition_name="Key Vault Secrets User",
                           principal_type="ServicePrincipal")

    # --- alarms -------------------------------------------------------------------------

    def _action_group(self) -> MonitorActionGroup:
        alarms = self.spec.alarms
        return MonitorActionGroup(
            self, "action_group", name=f"trainguard-{self.spec.name}",
            resource_group_name=self.group.name, short_name="trainguard",
            email_receiver=[MonitorActionGroupEmailReceiver(
                name=f"email-{i}", email_address=e, use_common_alert_schema=True)
                for i, e in enumerate(alarms.emails)],
            webhook_receiver=[MonitorActionGroupWebhookReceiver(
                name=h.name, service_uri=self._secret_url(h), use_common_alert_schema=True)
                for h in alarms.webhooks],
            tags=self.tags)

    def _secret_url(self, hook: Webhook) -> str:
        """The webhook's URL from Key Vault at deploy time (the Action Group has no Key
        Vault reference; Terraform state holds it: keep the state encrypted)."""
        assert hook.key_vault is not None
        secret = DataAzurermKeyVaultSecret(self, f"webhook_{hook.name}_url",
                                           name=hook.key_vault.secret,
                                           key_vault_id=hook.key_vault.vault_id)
        return secret.value

    def _acted_on(self) -> list[Severity]:
        """Severities some enabled rule of the policy notifies or stops on."""
        policy = self.env.policy
        return [s for s in (Severity.CRITICAL, Severity.WARNING)
                if any(policy.rule(r).enabled and policy.rule(r).actions.get(s, Action.NONE)
                       is not Action.NONE for r in rule_names())]

    def _metric_alerts(self) -> None:
        """One alert per severity, split by rule (each rule's series alerts on its own)."""
        policy = self.env.policy
        frequency, window = alert_window(self.spec.tick.interval_minutes())
        for severity in self._acted_on():
            rules = [r for r in rule_names() if policy.rule(r).enabled
                     and policy.rule(r).actions.get(severity, Action.NONE) is not Action.NONE]
            MonitorMetricAlert(
                self, f"findings_{severity.value}",
                name=f"trainguard-{self.spec.name}-findings-{severity.value}",
                resource_group_name=self.group.name, scopes=[self.insights.id],
                description=f"trainguard: {severity.value} findings per rule",
                severity=AZURE_SEVERITY[severity], frequency=frequency, window_size=window,
                criteria=[MonitorMetricAlertCriteria(
                    metric_namespace=METRIC_NAMESPACE, metric_name=FINDINGS,
                    aggregation="Maximum", operator="GreaterThan", threshold=0,
                    skip_metric_validation=True,  # the metric exists once first published
                    dimension=[
                        MonitorMetricAlertCriteriaDimension(
                            name=DIMENSIONS[0], operator="Include", values=rules),
                        MonitorMetricAlertCriteriaDimension(
                            name=DIMENSIONS[1], operator="Include",
                            values=[severity.value])])],
                action=[MonitorMetricAlertAction(action_group_id=self.action_group.id)],
                tags=self.tags)

    def _log_alerts(self) -> None:
        """Query alerts on the workspace the environment names, where Container Insights
        fills the table (AKS or Arc attached compute); none without one (compute
        clusters: the adapter reads the jobs' std_log files)."""
        spec = self.spec
        query = spec.log_query
        if query is None:
            return
        # ContainerLogV2.LogMessage is dynamic (a JSON line stays an object): as text.
        column = f"tostring({query.column})"
        for severity in (Severity.CRITICAL, Severity.WARNING):
            if not any(s.severity is severity for s in SIGNATURES):
                continue
            MonitorScheduledQueryRulesAlertV2(
                self, f"signatures_{severity.value}",
                name=f"trainguard-{spec.name}-log-signatures-{severity.value}",
                resource_group_name=self.group.name, location=self.group.location,
                scopes=[query.workspace_id], severity=AZURE_SEVERITY[severity],
                description=f"trainguard: {severity.value} failure signatures in training logs",
                evaluation_frequency="PT5M", window_duration="PT5M",
                criteria=[MonitorScheduledQueryRulesAlertV2Criteria(
                    query=kql_query(query.table, column, severity),
                    time_aggregation_method="Total", metric_measure_column="lines",
                    operator="GreaterThan", threshold=0,
                    dimension=[MonitorScheduledQueryRulesAlertV2CriteriaDimension(
                        name="signature", operator="Include", values=["*"])],
                    failing_periods=MonitorScheduledQueryRulesAlertV2CriteriaFailingPeriods(
                        minimum_failing_periods_to_trigger_alert=1,
                        number_of_evaluation_periods=1))],
                action=MonitorScheduledQueryRulesAlertV2Action(
                    action_groups=[self.action_group.id]),
                # validated at deploy: a workspace without the table fails the apply
                skip_query_validation=False,
                tags=self.tags)

    def _workbook(self) -> None:
        """The fleet views and one tile per rule (stacks/dashboards/workbook.py)."""
        spec = self.spec
        ml = (f"/subscriptions/{spec.subscription}/resourceGroups/"
              f"{spec.ml_workspace.resource_group}/providers/"
              f"Microsoft.MachineLearningServices/workspaces/{spec.ml_workspace.name}")
        ApplicationInsightsWorkbook(
            self, "workbook", name=workbook.workbook_name(spec.name),
            resource_group_name=self.group.name, location=self.group.location,
            display_name=f"trainguard {spec.name}", source_id=Fn.lower(self.insights.id),
            data_json=workbook.dumps(self.insights.id, ml), tags=self.tags)

    def _budgets(self) -> None:
        """A consumption budget per monthly policy budget covering this subscription
        (Azure budgets have no day or week grain: the watchdog's budget rule covers those)."""
        spec, policy = self.spec, self.env.policy
        thresholds = sorted({round(f * 100, 2) for f in policy.budget.alert_at})
        for i, acct in enumerate(policy.budget.accounts):
            if acct.period != "month" or not covers(acct.scope, spec.subscription):
                continue
            notes = [ConsumptionBudgetSubscriptionNotification(
                enabled=True, threshold=t, operator="GreaterThan", threshold_type="Actual",
                contact_groups=[self.action_group.id]) for t in thresholds]
            notes.append(ConsumptionBudgetSubscriptionNotification(
                enabled=True, threshold=100, operator="GreaterThan",
                threshold_type="Forecasted", contact_groups=[self.action_group.id]))
            ConsumptionBudgetSubscription(
                self, f"budget_{i}", name=f"trainguard-{spec.name}-{acct.period}-{i}",
                subscription_id=f"/subscriptions/{spec.subscription}",
                amount=acct.limit_usd, time_grain="Monthly",
                time_period=ConsumptionBudgetSubscriptionTimePeriod(
                    start_date=f"{spec.budget_start_date.isoformat()}T00:00:00Z"),
                notification=notes[:MAX_BUDGET_NOTIFICATIONS],
                # The start is this month at the first synth; a later synth's month must
                # not replace the budget (and its spend history).
                lifecycle=TerraformResourceLifecycle(
                    ignore_changes=["time_period[0].start_date"]))
