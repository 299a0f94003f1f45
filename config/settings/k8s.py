"""The Kubernetes CronJob's options: a mounted YAML file (``--config`` or
``TRAINGUARD_CONFIG``; keys as in ``OPTIONS``) and ``TRAINGUARD_<KEY>`` environment
variables, which win. The stack writes the environment with ``Settings(...).to_env()``;
the CronJob reads it with ``Settings.load`` (file and environment) or ``from_env``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from trainguard.config.problems import ConfigError
from trainguard.config.settings.base import (
    PREFIX,
    bool_text,
    number_text,
    parse_bool,
    refuse_unknown,
    unknown,
)

CONFIG_ENV = f"{PREFIX}CONFIG"  # the options file, when not given with --config
STOP_MODES = ("suspend", "delete")


def _text(where: str, value: str) -> str:
    return value.strip()


def _flag(where: str, value: str) -> bool:
    return parse_bool(where, value)


def _number(where: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{where}={value!r}: expected a number") from None


def _seconds(where: str, value: str) -> float:
    seconds = _number(where, value)
    if not 0 < seconds < float("inf"):
        raise ConfigError(f"{where}={value!r}: must be > 0 seconds")
    return seconds


def _count(where: str, value: str) -> int:
    if not value.strip().isdigit():
        raise ConfigError(f"{where}={value!r}: expected a whole number >= 0")
    return int(value)


def _stop_mode(where: str, value: str) -> str:
    if value.strip() not in STOP_MODES:
        raise ConfigError(f"{where}={value!r}: expected {' or '.join(STOP_MODES)}")
    return value.strip()


#: option -> (parser, help). Each is ``TRAINGUARD_<OPTION upper>`` in the environment and
#: a field of ``Settings``.
OPTIONS: dict[str, tuple[Callable[[str, str], Any], str]] = {
    "environment": (_text, "the deployment's name, a label on every alert and metric"),
    "policy": (_text, "policy YAML file (default: the embedded dry-run policy)"),
    "stop_enabled": (_flag, "true to let the policy stop jobs (default false)"),
    "stop_mode": (_stop_mode, "suspend (default) or delete a job to stop it"),
    "interval_s": (_seconds, "the schedule's interval in seconds (default: learnt from the "
                             "ticks)"),
    "cluster": (_text, "the cluster's name in job scopes"),
    "namespaces": (_text, "comma-separated namespaces to watch, or * (default: the pod's)"),
    "kinds": (_text, "comma-separated job kinds: pytorchjob, trainjob (default both)"),
    "kube_host": (_text, "an API server URL used as is (kubectl proxy, tests)"),
    "kubeconfig": (_text, "a kubeconfig file (default: the pod's ServiceAccount)"),
    "kube_retries": (_count, "API attempts on throttling and 5xx (default: the adapter's)"),
    "kube_backoff": (_number, "API retry backoff factor in seconds (default: the adapter's)"),
    "console_url": (_text, "OpenShift console URL, for links in alerts"),
    "state_configmap": (_text, "NAMESPACE/NAME of the state ConfigMap"),
    "state_sqlite": (_text, "an SQLite file on a volume, instead of the ConfigMap"),
    "audit_keep": (_count, "audit records kept in the ConfigMap (default: the store's)"),
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
    "alertmanager_retries": (_count, "attempts after the first on 5xx/429/no answer "
                                     "(default: the sink's)"),
    "pushgateway_url": (_text, "Pushgateway URL for the watchdog's own metrics"),
    "remind_every": (_seconds, "seconds between reminders of a lasting finding "
                               "(default: the tick's)"),
}


def env_name(option: str) -> str:
    return PREFIX + option.upper()


@dataclass(frozen=True)
class Settings:
    """Every option; ``None`` leaves it to the default of whatever uses it."""

    environment: str | None = None
    policy: str | None = None
    stop_enabled: bool = False
    stop_mode: str = STOP_MODES[0]
    interval_s: float | None = None
    cluster: str | None = None
    namespaces: str | None = None
    kinds: str | None = None
    kube_host: str | None = None
    kubeconfig: str | None = None
    kube_retries: int | None = None
    kube_backoff: float | None = None
    console_url: str | None = None
    state_configmap: str | None = None
    state_sqlite: str | None = None
    audit_keep: int | None = None
    prometheus_url: str | None = None
    prometheus_mapping: str | None = None
    prometheus_id: str | None = None
    prometheus_token_file: str | None = None
    prometheus_ca_file: str | None = None
    prometheus_tenancy: bool = False
    alertmanager_url: str | None = None
    alertmanager_token_file: str | None = None
    alertmanager_ca_file: str | None = None
    alertmanager_retries: int | None = None
    pushgateway_url: str | None = None
    remind_every: float | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """The options the environment gives (blank is unset); a ``TRAINGUARD_`` variable
        the CronJob never reads is refused."""
        refuse_unknown(env, _KNOWN, "the CronJob")
        return cls(**_from_env(env))

    @classmethod
    def load(cls, env: Mapping[str, str], config: str | None = None) -> Settings:
        """Options from the config file (``config`` or ``TRAINGUARD_CONFIG``), then the
        environment over it."""
        refuse_unknown(env, _KNOWN, "the CronJob")
        values: dict[str, Any] = {}
        path = config or env.get(CONFIG_ENV)
        if path:
            values.update(_from_file(path))
        values.update(_from_env(env))
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """The environment for these settings (options left at None are not written)."""
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[env_name(f.name)] = (
                    bool_text(value) if isinstance(value, bool) else
                    number_text(value) if isinstance(value, float) else str(value))
        return out

    @staticmethod
    def unknown(env: Mapping[str, str]) -> set[str]:
        """``TRAINGUARD_`` variables in ``env`` the CronJob never reads."""
        return unknown(env, _KNOWN)


_KNOWN = {env_name(k) for k in OPTIONS} | {CONFIG_ENV}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key in OPTIONS:
        raw = env.get(env_name(key))
        if raw is not None and raw.strip():
            values[key] = OPTIONS[key][0](env_name(key), raw)
    return values


def _from_file(path: str) -> dict[str, Any]:
    import yaml  # the file form only: the environment needs nothing beyond the stdlib

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read the config file: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping of option to value")
    values: dict[str, Any] = {}
    for key, raw in doc.items():
        where = f"{path}: {key}"
        if key not in OPTIONS:
            raise ConfigError(f"{where}: unknown option (known: {', '.join(OPTIONS)})")
        if raw is None:
            continue
        text = (str(raw).lower() if isinstance(raw, bool) else
                ",".join(map(str, raw)) if isinstance(raw, list) else str(raw))
        values[key] = OPTIONS[key][0](where, text)
    return values


if set(OPTIONS) != {f.name for f in fields(Settings)}:  # one list, one dataclass: kept in step
    raise RuntimeError("trainguard.config.settings.k8s: OPTIONS and Settings differ")
