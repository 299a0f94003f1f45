"""The Kubernetes / OpenShift CronJob: one watchdog tick per run,
``python -m trainguard.lambdas.k8s``.

Jobs come from the Kubeflow adapter (PyTorchJob, TrainJob); each job's series come from
Prometheus through the adapter's ``metrics`` hook; alarms go to Alertmanager, the tick's
own metrics to a Pushgateway, and state to a ConfigMap (or SQLite on a volume).

Options come from a mounted YAML file (``--config`` or ``TRAINGUARD_CONFIG``; keys as in
``OPTIONS``) and from ``TRAINGUARD_<KEY>`` environment variables, which win. Stops need
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes.config import ConfigException

from trainguard.adapters.kubeflow import KubeflowAdapter
from trainguard.adapters.kubeflow import from_options as kubeflow_from_options
from trainguard.adapters.kubeflow.prometheus_hook import PrometheusHook
from trainguard.adapters.prometheus import Metrics, client_from_options, load_mapping
from trainguard.checker.model import Severity
from trainguard.checker.policy import Policy
from trainguard.lambdas.k8s.configmap_state import ConfigMapStore, StateStoreFull
from trainguard.lambdas.k8s.sinks import GRACE_S, AlertmanagerSink, PushError, push_tick_metrics
from trainguard.lambdas.sqlite_state import SQLiteStore
from trainguard.lambdas.state import FindingMemory, StateStore, StateStoreError
from trainguard.lambdas.tick import (
    REMIND_EVERY_S,
    AlarmEvent,
    AlarmSink,
    TickReport,
    effective_policy,
    tick,
)
from trainguard.policy import PolicyError, default_policy, load_policy

log = logging.getLogger("trainguard.k8s")

OK, ERRORS, BAD_CONFIG, STORE_DOWN = 0, 1, 2, 3
ENV_PREFIX = "TRAINGUARD_"


def _text(value: str) -> str:
    return value.strip()


def _flag(value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "yes", "1", "on"):
        return True
    if v in ("false", "no", "0", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def _seconds(value: str) -> float:
    seconds = float(value)
    if not seconds > 0:
        raise ValueError(f"must be > 0 seconds, got {value!r}")
    return seconds


def _count(value: str) -> int:
    n = int(value)
    if n < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return n


def _stop_mode(value: str) -> str:
    if value.strip() not in ("suspend", "delete"):
        raise ValueError(f"expected suspend or delete, got {value!r}")
    return value.strip()


#: option -> (parser, help). Each is ``TRAINGUARD_<OPTION upper>`` in the environment.
OPTIONS: dict[str, tuple[Callable[[str], Any], str]] = {
    "environment": (_text, "the deployment's name, a label on every alert and metric"),
    "policy": (_text, "policy YAML file (default: the embedded dry-run policy)"),
    "stop_enabled": (_flag, "true to let the policy stop jobs (default false)"),
    "stop_mode": (_stop_mode, "suspend (default) or delete a job to stop it"),
    "cluster": (_text, "the cluster's name in job scopes"),
    "namespaces": (_text, "comma-separated namespaces to watch, or * (default: the pod's)"),
    "kinds": (_text, "comma-separated job kinds: pytorchjob, trainjob (default both)"),
    "kube_host": (_text, "an API server URL used as is (kubectl proxy, tests)"),
    "kubeconfig": (_text, "a kubeconfig file (default: the pod's ServiceAccount)"),
    "kube_retries": (_count, "API attempts on throttling and 5xx (default 5)"),
    "kube_backoff": (float, "API retry backoff factor in seconds (default 0.5)"),
    "console_url": (_text, "OpenShift console URL, for links in alerts"),
    "state_configmap": (_text, "NAMESPACE/NAME of the state ConfigMap"),
    "state_sqlite": (_text, "an SQLite file on a volume, instead of the ConfigMap"),
    "audit_keep": (_count, "audit records kept in the ConfigMap (default 500)"),
    "prometheus_url": (_text, "Prometheus or Thanos querier URL for jobs' metrics"),
    "prometheus_mapping": (_text, "the metrics mapping file (adapters/prometheus/mapping.py)"),
    "prometheus_id": (_text, "a job's id in Prometheus, from {name} {namespace} {kind} "
                             "{id} (default {name})"),
    "prometheus_token_file": (_text, "bearer token file for Prometheus"),
    "prometheus_ca_file": (_text, "CA bundle for Prometheus's TLS"),
    "prometheus_tenancy": (_flag, "true when prometheus_url is a namespaced (tenancy) port"),
    "alertmanager_url": (_text, "Alertmanager URL (alerts go to /api/v2/alerts)"),
    "alertmanager_token_file": (_text, "bearer token file for Alertmanager"),
    "alertmanager_ca_file": (_text, "CA bundle for Alertmanager's TLS"),
    "alertmanager_retries": (_count, "attempts after the first on 5xx/429/no answer (default 3)"),
    "pushgateway_url": (_text, "Pushgateway URL for the watchdog's own metrics"),
    "remind_every": (_seconds, f"seconds between reminders of a lasting finding "
                               f"(default {REMIND_EVERY_S:g})"),
}


class ConfigError(ValueError):
    """An option that cannot be used; the message names where it came from."""


@dataclass
class Options:
    values: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        value = self.values.get(key)
        return default if value is None or value == "" else value


def load_options(env: Mapping[str, str], config: str | None = None) -> Options:
    """Options from the config file (when given), then the environment over it."""
    values: dict[str, Any] = {}
    path = config or env.get(f"{ENV_PREFIX}CONFIG")
    if path:
        try:
            doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"{path}: cannot read the config file: {e}") from e
        if not isinstance(doc, dict):
            raise ConfigError(f"{path}: expected a mapping of option to value")
        for key, raw in doc.items():
            values[key] = _parse(str(key), raw, f"{path}: {key}")
    for key in OPTIONS:
        raw = env.get(ENV_PREFIX + key.upper())
        if raw is not None:
            values[key] = _parse(key, raw, f"environment {ENV_PREFIX}{key.upper()}")
    return Options(values)


def _parse(key: str, raw: Any, where: str) -> Any:
    if key not in OPTIONS:
        raise ConfigError(f"{where}: unknown option (known: {', '.join(OPTIONS)})")
    if raw is None:
        return None
    try:
        text = (str(raw).lower() if isinstance(raw, bool) else
                ",".join(map(str, raw)) if isinstance(raw, list) else str(raw))
        return OPTIONS[key][0](text)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from e


@dataclass
class Runtime:
    adapter: KubeflowAdapter
    policy: Policy
    store: StateStore
    sinks: list[AlarmSink]
    opts: Options


def build(opts: Options, now: float) -> Runtime:
    """The adapter, policy, store and sinks the options describe (``ConfigError``,
    ``PolicyError`` or ``ValueError`` when they cannot be built)."""
    path = opts.get("policy")
    policy = effective_policy(load_policy(path) if path else default_policy(),
                              bool(opts.get("stop_enabled", False)))
    kube_opts = {"host": opts.get("kube_host"), "kubeconfig": opts.get("kubeconfig"),
                 "cluster": opts.get("cluster"), "namespaces": opts.get("namespaces"),
                 "kinds": opts.get("kinds"), "console": opts.get("console_url"),
                 "delete": "true" if opts.get("stop_mode") == "delete" else "false",
                 "retries": opts.get("kube_retries"), "backoff": opts.get("kube_backoff")}
    adapter = kubeflow_from_options({k: str(v) for k, v in kube_opts.items() if v is not None})
    if opts.get("prometheus_url"):
        prom = {"url": opts.get("prometheus_url"), "token_file": opts.get("prometheus_token_file"),
                "ca_file": opts.get("prometheus_ca_file"),
                "tenancy": "true" if opts.get("prometheus_tenancy") else None}
        client = client_from_options({k: v for k, v in prom.items() if v})
        adapter.metrics = PrometheusHook(Metrics(client, load_mapping(
            opts.get("prometheus_mapping"))), opts.get("prometheus_id", "{name}"), now)
    store: StateStore
    if opts.get("state_sqlite"):
        store = SQLiteStore(opts.get("state_sqlite"))
    elif opts.get("state_configmap"):
        store = ConfigMapStore.from_ref(adapter.kube.core, opts.get("state_configmap"),
                                        audit_keep=opts.get("audit_keep", 500))
    else:
        raise ConfigError("no state store: set TRAINGUARD_STATE_CONFIGMAP (NAMESPACE/NAME) "
                          "or TRAINGUARD_STATE_SQLITE (a file on a volume)")
    sinks: list[AlarmSink] = []
    if opts.get("alertmanager_url"):
        env = opts.get("environment")
        sinks.append(AlertmanagerSink(
            opts.get("alertmanager_url"), policy.safety.dry_run,
            expire_after_s=opts.get("remind_every", REMIND_EVERY_S) + GRACE_S,
            labels={"environment": env} if env else None,
            token_file=opts.get("alertmanager_token_file"),
            ca_file=opts.get("alertmanager_ca_file"),
            retries=opts.get("alertmanager_retries", 3)))
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
                      remind_every_s=runtime.opts.get("remind_every", REMIND_EVERY_S))
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
    gateway = runtime.opts.get("pushgateway_url")
    if gateway:
        env = runtime.opts.get("environment")
        try:
            push_tick_metrics(gateway, report, seconds, time.time(),
                              {"environment": env} if env else None)
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
