"""The Kubernetes / OpenShift CronJob: one watchdog tick per run,
``python -m trainguard.lambdas.k8s``.

Jobs come from the Kubeflow adapter (PyTorchJob, TrainJob); each job's series come from
Prometheus through the adapter's ``metrics`` hook; alarms go to Alertmanager, the tick's
own metrics to a Pushgateway, and state to a ConfigMap (or SQLite on a volume).

Options come from a mounted YAML file (``--config`` or ``TRAINGUARD_CONFIG``; keys as in
``OPTIONS``) and from ``TRAINGUARD_<KEY>`` environment variables, which win: the names,
their parsing and the stack's side are ``trainguard.config.settings.k8s.Settings``. Stops need
both a policy that allows them (``safety.dry_run: false``) and ``stop_enabled: true``
here: the deployment's switch can only make the policy more careful, never less.

Exit codes: 0 the tick ran clean; 1 it ran, but a source, a job read, a sink or the
Pushgateway failed (the log says which); 2 bad options, policy or mapping; 3 the state
store failed (no stop was made).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.config import ConfigException

from trainguard.adapters.kubeflow import KubeflowAdapter
from trainguard.adapters.kubeflow import from_options as kubeflow_from_options
from trainguard.adapters.kubeflow.prometheus_hook import PrometheusHook
from trainguard.adapters.prometheus import Metrics, client_from_options, load_mapping
from trainguard.checker.model import Severity
from trainguard.checker.policy import Policy
from trainguard.config import ConfigError, PolicyError, runtime_policy
from trainguard.config.settings.base import PREFIX
from trainguard.config.settings.k8s import OPTIONS, Settings
from trainguard.lambdas import plugins
from trainguard.lambdas.k8s.configmap_state import StateStoreFull
from trainguard.lambdas.k8s.sinks import GRACE_S, PushError
from trainguard.lambdas.sqlite_state import SQLiteStore
from trainguard.lambdas.state import FindingMemory, StateStore, StateStoreError
from trainguard.lambdas.tick import REMIND_EVERY_S, AlarmEvent, AlarmSink, TickReport, tick

log = logging.getLogger("trainguard.k8s")

OK, ERRORS, BAD_CONFIG, STORE_DOWN = 0, 1, 2, 3
ENV_PREFIX = PREFIX
__all__ = ["ENV_PREFIX", "OPTIONS", "ConfigError", "Settings", "build", "load_options", "main",
           "run"]


def load_options(env: Mapping[str, str], config: str | None = None) -> Settings:
    """The options from the config file (when given), then the environment over it."""
    return Settings.load(env, config)


@dataclass
class Runtime:
    adapter: KubeflowAdapter
    policy: Policy
    store: StateStore
    sinks: list[AlarmSink]
    opts: Settings


def _given(**kw: Any) -> dict[str, Any]:
    """The keyword arguments the settings give (None leaves the callee's default)."""
    return {k: v for k, v in kw.items() if v is not None}


def build(opts: Settings, now: float) -> Runtime:
    """The adapter, policy, store and sinks the options describe (``ConfigError``,
    ``PolicyError`` or ``ValueError`` when they cannot be built)."""
    policy = runtime_policy(opts.policy, opts.stop_enabled, warn=log.warning,
                            switch=f"{ENV_PREFIX}STOP_ENABLED")
    kube_opts = _given(host=opts.kube_host, kubeconfig=opts.kubeconfig, cluster=opts.cluster,
                       namespaces=opts.namespaces, kinds=opts.kinds, console=opts.console_url,
                       delete="true" if opts.stop_mode == "delete" else "false",
                       retries=opts.kube_retries, backoff=opts.kube_backoff)
    adapter = kubeflow_from_options({k: str(v) for k, v in kube_opts.items()})
    if opts.prometheus_url:
        prom = _given(url=opts.prometheus_url, token_file=opts.prometheus_token_file,
                      ca_file=opts.prometheus_ca_file,
                      tenancy="true" if opts.prometheus_tenancy else None)
        client = client_from_options(prom)
        adapter.metrics = PrometheusHook(
            Metrics(client, load_mapping(opts.prometheus_mapping)), now=now,
            **_given(id_template=opts.prometheus_id))
    store: StateStore
    if opts.state_sqlite:  # stores and sinks by their registered names (lambdas/plugins.py)
        store = plugins.stores.get("sqlite")(opts.state_sqlite)
    elif opts.state_configmap:
        store = plugins.stores.get("configmap").from_ref(
            adapter.kube.core, opts.state_configmap, **_given(audit_keep=opts.audit_keep))
    else:
        raise ConfigError("no state store: set TRAINGUARD_STATE_CONFIGMAP (NAMESPACE/NAME) "
                          "or TRAINGUARD_STATE_SQLITE (a file on a volume)")
    sinks: list[AlarmSink] = []
    if opts.alertmanager_url:
        env = opts.environment
        sinks.append(plugins.sinks.get("alertmanager")(
            opts.alertmanager_url, policy.safety.dry_run,
            expire_after_s=(opts.remind_every or REMIND_EVERY_S) + GRACE_S,
            labels={"environment": env} if env else None,
            token_file=opts.alertmanager_token_file, ca_file=opts.alertmanager_ca_file,
            **_given(retries=opts.alertmanager_retries)))
    return Runtime(adapter, policy, store, sinks, opts)


def run(runtime: Runtime, now: float) -> tuple[int, TickReport | None]:
    """One tick; the exit code and the report (None when the store failed)."""
    try:
        return _run(runtime, now)
    finally:
        if isinstance(runtime.store, SQLiteStore):
            runtime.store.close()


def _store_full_alarm(runtime: Runtime, why: str, now: float) -> None:
    """A full ConfigMap blinds the watchdog: say so, loudly, where alarms go, each tick."""
    fm = FindingMemory("trainguard/state_store_full", "state_store_full",
                       Severity.CRITICAL.value, why, now, now)
    event = AlarmEvent("raise", None, None, "trainguard", "trainguard:state:store", now,
                       now, 1, fm)
    for sink in runtime.sinks:
        try:
            sink.send(event)
        except Exception as e:  # the log line above still says it
            log.error("cannot raise the state-store-full alarm: %s", e)


def _run(runtime: Runtime, now: float) -> tuple[int, TickReport | None]:
    started = time.monotonic()
    try:
        report = tick([runtime.adapter], runtime.policy, runtime.store, runtime.sinks, now,
                      remind_every_s=runtime.opts.remind_every or REMIND_EVERY_S,
                      interval_s=runtime.opts.interval_s)
    except StateStoreFull as e:
        log.error("state store full, no stop was made: %s", e)
        _store_full_alarm(runtime, str(e), now)
        return STORE_DOWN, None
    except StateStoreError as e:
        log.error("state store failed, no stop was made: %s", e)
        return STORE_DOWN, None
    seconds = time.monotonic() - started
    problems = [f"source {k}: {v}" for k, v in report.source_errors.items()]
    problems += [f"job {e.ref}: {e.reason}" for e in runtime.adapter.errors]
    problems += [f"sink {e}" for e in report.sink_errors]
    problems += [f"malformed job {ref}: {why}" for ref, why in report.skipped.items()]
    gateway = runtime.opts.pushgateway_url
    if gateway:
        env = runtime.opts.environment
        try:
            plugins.sinks.get("pushgateway")(gateway, {"environment": env} if env else None
                                             ).publish(report, seconds, time.time())
        except PushError as e:
            problems.append(str(e))
    for a in report.audit:  # the durable audit trail: cluster logging keeps the pod's log
        print(json.dumps({"audit": a.to_dict()}, sort_keys=True), flush=True)
    for p in problems:
        log.error("%s", p)
    print(json.dumps({"tick": {
        "time": now, "seconds": round(seconds, 3), "dry_run": runtime.policy.safety.dry_run,
        "jobs": report.jobs, "findings": len(report.findings),
        "alarms": [e.to_dict() for e in report.events],
        "stops": [a.job_id for a in report.stops], "problems": problems,
        "metrics": getattr(runtime.adapter.metrics, "read", None)}}, sort_keys=True),
        flush=True)
    return (ERRORS if problems else OK), report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainguard.lambdas.k8s",
                                     description="One trainguard tick over Kubeflow jobs.")
    parser.add_argument("--config", help="a YAML file of options (or TRAINGUARD_CONFIG)")
    parser.add_argument("--now", type=float, help="the tick's time, epoch seconds (replays)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    now = args.now if args.now is not None else time.time()
    try:
        runtime = build(load_options(os.environ, args.config), now)
    except PolicyError as e:
        log.error("bad policy: %s", e)
        return BAD_CONFIG
    except (ValueError, StateStoreError, ConfigException) as e:
        log.error("bad configuration: %s", e)
        return BAD_CONFIG
    return run(runtime, now)[0]
