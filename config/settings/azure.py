"""The Azure Function's app settings (every name starts with ``TRAINGUARD_``; the table
in ``lambdas/azure/function_app.py`` says what each does). The stack writes them with
``Settings(...).to_env()``, the Function reads them with ``Settings.from_env``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from trainguard.config.problems import ConfigError
from trainguard.config.settings.base import (
    PREFIX,
    bool_text,
    flag,
    number_text,
    positive_float,
    refuse_unknown,
    text,
    unknown,
)

DEFAULT_TABLE = "trainguardstate"
DEFAULT_WEBHOOK_MIN_SEVERITY = "critical"

#: field -> its app setting, after ``PREFIX``
NAMES = {
    "schedule": "SCHEDULE", "subscription": "SUBSCRIPTION",
    "resource_group": "ML_RESOURCE_GROUP", "workspace": "ML_WORKSPACE",
    "ml_endpoint": "ML_ENDPOINT", "ml_ca_file": "ML_CA_FILE", "ml_retries": "ML_RETRIES",
    "ml_backoff": "ML_BACKOFF", "policy": "POLICY", "stop_enabled": "STOP_ENABLED",
    "interval_s": "INTERVAL_S", "table_url": "STATE_TABLE_URL",
    "table_connection": "STATE_CONNECTION", "table": "STATE_TABLE",
    "metrics_resource_id": "METRICS_RESOURCE_ID", "metrics_region": "METRICS_REGION",
    "metrics_endpoint": "METRICS_ENDPOINT", "metrics_ca_file": "METRICS_CA_FILE",
    "webhook_url": "WEBHOOK_URL", "webhook_min_severity": "WEBHOOK_MIN_SEVERITY",
}


@dataclass(frozen=True)
class Settings:
    subscription: str
    resource_group: str
    workspace: str
    schedule: str | None = None  # NCRONTAB; read by the Functions host, not by the app
    ml_endpoint: str | None = None
    ml_ca_file: str | None = None
    ml_retries: str | None = None
    ml_backoff: str | None = None
    policy: str | None = None  # relative to the app root; None: the default policy
    stop_enabled: bool = False
    interval_s: float | None = None  # the schedule's interval; None: the tick learns it
    table_url: str | None = None
    table_connection: str | None = None
    table: str = DEFAULT_TABLE
    metrics_resource_id: str | None = None
    metrics_region: str | None = None
    metrics_endpoint: str | None = None
    metrics_ca_file: str | None = None
    webhook_url: str | None = None
    webhook_min_severity: str = DEFAULT_WEBHOOK_MIN_SEVERITY

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        refuse_unknown(env, _KNOWN, "the Function")

        def get(name: str) -> str | None:
            return text(env, PREFIX + name)

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
        values: dict[str, object] = {}
        for f in fields(cls):
            name = PREFIX + NAMES[f.name]
            if f.name in ("subscription", "resource_group", "workspace"):
                values[f.name] = need(NAMES[f.name])
            elif f.name == "stop_enabled":
                values[f.name] = flag(env, name)
            elif f.name == "interval_s":
                values[f.name] = positive_float(env, name)
            elif (value := text(env, name)) is not None:
                values[f.name] = value
        return cls(**values)  # type: ignore[arg-type]

    def to_env(self) -> dict[str, str]:
        """The app settings for these settings (those left at None are not written)."""
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            out[PREFIX + NAMES[f.name]] = (
                bool_text(value) if isinstance(value, bool) else
                number_text(value) if isinstance(value, float) else str(value))
        return out

    @staticmethod
    def unknown(env: Mapping[str, str]) -> set[str]:
        """``TRAINGUARD_`` app settings in ``env`` the Function never reads."""
        return unknown(env, _KNOWN)


_KNOWN = {PREFIX + n for n in NAMES.values()}
