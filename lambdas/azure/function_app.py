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
``STOP_ENABLED``            ``true`` lets the policy stop jobs (``false``, unset: dry run; a
                            value not a boolean is a configuration error)
``INTERVAL_S``              the schedule's interval in seconds (the stack sets it), so that
                            a finding persists over time, not only over retried ticks
``STATE_TABLE_URL``         ``https://ACCOUNT.table.core.windows.net/TABLE`` (managed identity)
``STATE_CONNECTION``        or a connection string (Azurite, local runs) with ``STATE_TABLE``
``METRICS_RESOURCE_ID``     the resource the metric is published on (the alerts' scope);
``METRICS_REGION``          its region; unset: no metric (``METRICS_ENDPOINT``/``_CA_FILE``:
                            tests)
``WEBHOOK_URL``             optional direct webhook; ``WEBHOOK_MIN_SEVERITY`` (default
                            ``critical``) the least severity sent
==========================  ==================================================================

The names and their parsing are ``trainguard.config.settings.azure.Settings``.

A store failure fails the invocation (no stop is made; Application Insights shows the
failure); so does a tick whose only source could not list its jobs.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import azure.functions as func
from azure.core.credentials import TokenCredential

from trainguard.adapters.azureml import from_options
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Rule
from trainguard.config import ConfigError, runtime_policy
from trainguard.config.settings.azure import Settings
from trainguard.config.settings.base import PREFIX
from trainguard.lambdas import plugins
from trainguard.lambdas.azure.sinks import acted_pairs  # registers the Azure sinks
from trainguard.lambdas.azure.table_state import TableStore  # registers "table"
from trainguard.lambdas.tick import AlarmSink, TickReport, tick

log = logging.getLogger("trainguard.azure")

__all__ = ["PREFIX", "ConfigError", "Settings", "TickFailed", "app", "run", "watchdog"]


class TickFailed(RuntimeError):
    """The tick ran but could not see the jobs: the invocation is marked failed."""


def policy_for(settings: Settings) -> Policy:
    """The settings' policy as the Function runs it: without ``STOP_ENABLED=true`` in
    dry run (the identity then holds no cancel right, and a refused stop is never
    retried). A relative path is against the app root, which the host names."""
    path: Path | None = None
    if settings.policy is not None:
        path = Path(settings.policy)
        if not path.is_absolute():
            root = os.environ.get("AzureWebJobsScriptRoot")  # noqa: SIM112
            path = Path(root or Path.cwd()) / path
    return runtime_policy(path, settings.stop_enabled, warn=log.warning,
                          switch=f"{PREFIX}STOP_ENABLED")


def table_store(settings: Settings, credential: TokenCredential) -> TableStore:
    table: type[TableStore] = plugins.stores.get("table")
    if settings.table_connection is not None:
        return table.from_connection_string(settings.table_connection, settings.table)
    assert settings.table_url is not None  # checked in from_env
    return table.from_table_url(settings.table_url, credential)


def credential() -> TokenCredential:
    """The Function App's managed identity (``DefaultAzureCredential`` finds it)."""
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential()


def run(settings: Settings, now: float, cred: TokenCredential,
        rules: list[Rule] | None = None) -> TickReport:
    """One tick: Azure ML jobs -> the shared tick -> Table state, webhook, metric."""
    policy = policy_for(settings)
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
        sinks.append(plugins.sinks.get("webhook")(settings.webhook_url, policy.safety.dry_run,
                                                  settings.webhook_min_severity))
    store = table_store(settings, cred)
    try:
        report = tick([source], policy, store, sinks, now, rules, interval_s=settings.interval_s)
    finally:
        store.close()
    for skipped in source.errors:  # jobs the adapter skipped: worth a look, not a failure
        report.warnings.append(f"{source.name}: job {skipped.ref}: {skipped.reason}")
    if settings.metrics_resource_id:
        # every pair the policy acts on is said each tick: a refused resolve is said again
        metrics = plugins.sinks.get("azure_metrics")(
            settings.metrics_resource_id, settings.metrics_region or "", cred,
            endpoint=settings.metrics_endpoint, ca_file=settings.metrics_ca_file,
            watched=acted_pairs(policy))
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
            "warnings": report.warnings,
            "fleet": report.fleet.to_dict()}  # what the workbook's fleet tiles read


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
