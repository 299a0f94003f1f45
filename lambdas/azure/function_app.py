"""The Azure Function (Python v2 programming model): the shared tick on a timer over one
Azure ML workspace, with the Function App's managed identity.

State goes to Azure Table Storage (``TableStore``), findings to the ``trainguard/Findings``
custom metric (the stack's metric alerts send the Action Group) and, optionally, each
alarm to a webhook. App settings (every name starts with ``TRAINGUARD_``):

==========================  ==================================================================
``SCHEDULE``                NCRONTAB of the timer, e.g. ``0 */10 * * * *`` (read by the host)
``SUBSCRIPTION``            the Azure ML workspace's subscription (required)
``ML_RESOURCE_GROUP``       its resource group (required)
``ML_WORKSPACE``            its name (required)
``ML_ENDPOINT``             optional https URL replacing Resource Manager and MLflow (proxies,
                            tests); ``ML_CA_FILE`` the CA bundle that signs it
``ML_RETRIES``              retries on 408/429/5xx (default 4), ``ML_BACKOFF`` their backoff
                            in seconds (default 0.8)
``POLICY``                  the policy YAML, relative to the app root; unset: the default policy
``STOP_ENABLED``            ``true`` lets the policy stop jobs; anything else forces dry run
``STATE_TABLE_URL``         ``https://ACCOUNT.table.core.windows.net/TABLE`` (managed identity)
``STATE_CONNECTION``        or a connection string (Azurite, local runs) with ``STATE_TABLE``
``METRICS_RESOURCE_ID``     the resource the metric is published on (the alerts' scope);
``METRICS_REGION``          its region; unset: no metric (``METRICS_ENDPOINT``/``_CA_FILE``:
                            tests)
``WEBHOOK_URL``             optional direct webhook; ``WEBHOOK_MIN_SEVERITY`` (default
                            ``critical``) the least severity sent
==========================  ==================================================================

A store failure fails the invocation (no stop is made; Application Insights shows the
failure); so does a tick whose only source could not list its jobs.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import azure.functions as func
from azure.core.credentials import TokenCredential

from trainguard.adapters.azureml import from_options
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Rule
from trainguard.lambdas.azure.sinks import FindingsMetrics, WebhookSink
from trainguard.lambdas.azure.table_state import TableStore
from trainguard.lambdas.tick import AlarmSink, TickReport, effective_policy, tick

log = logging.getLogger("trainguard.azure")

PREFIX = "TRAINGUARD_"
DEFAULT_TABLE = "trainguardstate"


class ConfigError(ValueError):
    """An app setting is missing or wrong; the message names it."""


class TickFailed(RuntimeError):
    """The tick ran but could not see the jobs: the invocation is marked failed."""


@dataclass(frozen=True)
class Settings:
    subscription: str
    resource_group: str
    workspace: str
    ml_endpoint: str | None = None
    ml_ca_file: str | None = None
    ml_retries: str | None = None
    ml_backoff: str | None = None
    policy: str | None = None
    stop_enabled: bool = False
    table_url: str | None = None
    table_connection: str | None = None
    table: str = DEFAULT_TABLE
    metrics_resource_id: str | None = None
    metrics_region: str | None = None
    metrics_endpoint: str | None = None
    metrics_ca_file: str | None = None
    webhook_url: str | None = None
    webhook_min_severity: str = "critical"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        def get(name: str) -> str | None:
            value = env.get(PREFIX + name, "").strip()
            return value or None

        def need(name: str) -> str:
            value = get(name)
            if value is None:
                raise ConfigError(f"app setting {PREFIX}{name} is required")
            return value

        if get("STATE_TABLE_URL") is None and get("STATE_CONNECTION") is None:
            raise ConfigError(f"app setting {PREFIX}STATE_TABLE_URL (or "
                              f"{PREFIX}STATE_CONNECTION) is required: where state is kept")
        has_place = get("METRICS_REGION") or get("METRICS_ENDPOINT")
        if get("METRICS_RESOURCE_ID") and not has_place:
            raise ConfigError(f"app setting {PREFIX}METRICS_REGION is required with "
                              f"{PREFIX}METRICS_RESOURCE_ID (the metric resource's region)")
        if has_place and not get("METRICS_RESOURCE_ID"):
            raise ConfigError(f"app setting {PREFIX}METRICS_RESOURCE_ID is required with "
                              f"{PREFIX}METRICS_REGION (the resource the metric is posted on)")
        return cls(
            subscription=need("SUBSCRIPTION"), resource_group=need("ML_RESOURCE_GROUP"),
            workspace=need("ML_WORKSPACE"), ml_endpoint=get("ML_ENDPOINT"),
            ml_ca_file=get("ML_CA_FILE"), ml_retries=get("ML_RETRIES"),
            ml_backoff=get("ML_BACKOFF"), policy=get("POLICY"),
            stop_enabled=(get("STOP_ENABLED") or "").lower() == "true",
            table_url=get("STATE_TABLE_URL"), table_connection=get("STATE_CONNECTION"),
            table=get("STATE_TABLE") or DEFAULT_TABLE,
            metrics_resource_id=get("METRICS_RESOURCE_ID"), metrics_region=get("METRICS_REGION"),
            metrics_endpoint=get("METRICS_ENDPOINT"), metrics_ca_file=get("METRICS_CA_FILE"),
            webhook_url=get("WEBHOOK_URL"),
            webhook_min_severity=get("WEBHOOK_MIN_SEVERITY") or "critical")

    def load_policy(self) -> Policy:
        """The policy; without ``STOP_ENABLED=true`` it is forced into dry run (the
        identity then holds no cancel right, and a refused stop is never retried)."""
        from trainguard.policy import default_policy, load_policy

        if self.policy is None:
            policy = default_policy()
        else:
            path = Path(self.policy)
            if not path.is_absolute():  # the app root: the host names it (mixed case)
                root = os.environ.get("AzureWebJobsScriptRoot")  # noqa: SIM112
                path = Path(root or Path.cwd()) / path
            policy = load_policy(path)
        if not self.stop_enabled and not policy.safety.dry_run:
            log.warning("%sSTOP_ENABLED is not true: policy %r runs in dry run", PREFIX,
                        policy.name)
        return effective_policy(policy, self.stop_enabled)

    def store(self, credential: TokenCredential) -> TableStore:
        if self.table_connection is not None:
            return TableStore.from_connection_string(self.table_connection, self.table)
        assert self.table_url is not None  # checked in from_env
        return TableStore.from_table_url(self.table_url, credential)


def credential() -> TokenCredential:
    """The Function App's managed identity (``DefaultAzureCredential`` finds it)."""
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential()


def run(settings: Settings, now: float, cred: TokenCredential,
        rules: list[Rule] | None = None) -> TickReport:
    """One tick: Azure ML jobs -> the shared tick -> Table state, webhook, metric."""
    policy = settings.load_policy()
    opts = {"subscription": settings.subscription, "resource_group": settings.resource_group,
            "workspace": settings.workspace}
    optional = {"endpoint": settings.ml_endpoint, "ca_file": settings.ml_ca_file,
                "retries": settings.ml_retries, "backoff": settings.ml_backoff}
    opts.update({k: v for k, v in optional.items() if v is not None})
    try:
        source = from_options(opts, credential=cred)
    except ValueError as err:  # name the app setting, not the CLI option
        raise ConfigError(f"app settings {PREFIX}ML_*: {err}") from err
    sinks: list[AlarmSink] = []
    if settings.webhook_url:
        sinks.append(WebhookSink(settings.webhook_url, policy.safety.dry_run,
                                 settings.webhook_min_severity))
    store = settings.store(cred)
    try:
        report = tick([source], policy, store, sinks, now, rules)
    finally:
        store.close()
    for skipped in source.errors:  # jobs the adapter skipped: worth a look, not a failure
        report.warnings.append(f"{source.name}: job {skipped.ref}: {skipped.reason}")
    if settings.metrics_resource_id:
        metrics = FindingsMetrics(settings.metrics_resource_id, settings.metrics_region or "",
                                  cred, endpoint=settings.metrics_endpoint,
                                  ca_file=settings.metrics_ca_file)
        try:
            metrics.publish(report)
        except Exception as e:  # the alarms already sent must still count
            log.exception("publishing the findings metric failed")
            report.sink_errors.append(f"FindingsMetrics: {type(e).__name__}: {e}")
    return report


def summary(report: TickReport) -> dict[str, Any]:
    """What the invocation logs: counts, and every stop or error in full."""
    return {"time": report.time, "jobs": report.jobs, "findings": len(report.findings),
            "events": [f"{e.kind} {e.memory.rule}/{e.memory.severity} {e.job_key}"
                       for e in report.events],
            "stops": [a.to_dict() for a in report.stops],
            "source_errors": report.source_errors, "sink_errors": report.sink_errors,
            "skipped": report.skipped,
            "warnings": report.warnings}


clock: Callable[[], float] = time.time  # the tick's "now" (tests hold it still)
app = func.FunctionApp()


@app.timer_trigger(schedule="%TRAINGUARD_SCHEDULE%", arg_name="timer", run_on_startup=False)
def watchdog(timer: func.TimerRequest) -> None:
    if timer.past_due:
        log.warning("the timer is past due: this tick runs late")
    settings = Settings.from_env(os.environ)
    report = run(settings, clock(), credential())
    log.info("trainguard tick: %s", json.dumps(summary(report), default=str))
    if report.source_errors:
        raise TickFailed("no jobs could be listed: " + "; ".join(
            f"{k}: {v}" for k, v in report.source_errors.items()))
