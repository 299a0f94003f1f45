"""The Lambda's settings: the environment variables it reads (docs/alarms-aws.md) and
``Settings``, read once per container. The names are constants so the stack and the
tests can use them instead of spelling them again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

STATE_TABLE_ENV = "TRAINGUARD_STATE_TABLE"  # state, audit and idempotency records; required
TOPIC_ARN_ENV = "TRAINGUARD_TOPIC_ARN"  # direct alarms; unset: metrics only
POLICY_ENV = "TRAINGUARD_POLICY"  # relative to the package root
STOP_ENABLED_ENV = "TRAINGUARD_STOP_ENABLED"  # "false" forces dry run whatever the policy
STOP_TAG_ENV = "TRAINGUARD_STOP_TAG"  # "KEY=VALUE": only jobs with this tag may be stopped
ENVIRONMENT_ENV = "TRAINGUARD_ENVIRONMENT"  # the environment's name, for the logs
IDEMPOTENCY_TTL_ENV = "TRAINGUARD_IDEMPOTENCY_TTL_S"  # how long an event id is remembered
SAGEMAKER_ENV_PREFIX = "TRAINGUARD_SAGEMAKER_"  # TRAINGUARD_SAGEMAKER_MAX_ATTEMPTS -> max_attempts
REGION_ENV = "AWS_REGION"  # set by Lambda
DEFAULT_REGION_ENV = "AWS_DEFAULT_REGION"  # the fallback outside Lambda

DEFAULT_POLICY = "policy.yaml"  # where stacks/package.py puts the environment's policy
DEFAULT_IDEMPOTENCY_TTL_S = 3600
SERVICE = "trainguard"  # the powertools service name (the stack sets POWERTOOLS_SERVICE_NAME)
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the zip's root: policy.yaml lies there


class ConfigError(ValueError):
    """A missing or bad environment variable; the message names it."""


@dataclass(frozen=True)
class Settings:
    table: str  # STATE_TABLE_ENV
    topic_arn: str | None  # TOPIC_ARN_ENV (none: metrics only)
    region: str  # REGION_ENV
    policy_path: Path  # POLICY_ENV, made absolute against the package root
    stop_enabled: bool  # STOP_ENABLED_ENV
    stop_tag: tuple[str, str] | None  # STOP_TAG_ENV as (key, value)
    environment: str  # ENVIRONMENT_ENV
    sagemaker: dict[str, str] = field(default_factory=dict)  # SAGEMAKER_ENV_PREFIX options
    idempotency_ttl_s: int = DEFAULT_IDEMPOTENCY_TTL_S  # IDEMPOTENCY_TTL_ENV

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        table = env.get(STATE_TABLE_ENV, "").strip()
        if not table:
            raise ConfigError(f"{STATE_TABLE_ENV} is not set (the DynamoDB state table)")
        region = env.get(REGION_ENV) or env.get(DEFAULT_REGION_ENV) or ""
        if not region:
            raise ConfigError(f"{REGION_ENV} is not set")
        stop = env.get(STOP_ENABLED_ENV, "false").strip().lower()
        if stop not in ("true", "false"):
            raise ConfigError(f"{STOP_ENABLED_ENV}={stop!r}: must be true or false")
        stop_tag = _stop_tag(env)
        policy = Path(env.get(POLICY_ENV) or DEFAULT_POLICY)
        ttl = env.get(IDEMPOTENCY_TTL_ENV, str(DEFAULT_IDEMPOTENCY_TTL_S))
        if not ttl.isdigit() or int(ttl) <= 0:
            raise ConfigError(f"{IDEMPOTENCY_TTL_ENV}={ttl!r}: must be a positive "
                              "whole number of seconds")
        opts = {k[len(SAGEMAKER_ENV_PREFIX):].lower(): v for k, v in env.items()
                if k.startswith(SAGEMAKER_ENV_PREFIX)}
        return cls(table=table, topic_arn=env.get(TOPIC_ARN_ENV) or None,
                   region=region,
                   policy_path=policy if policy.is_absolute() else PACKAGE_ROOT / policy,
                   stop_enabled=stop == "true", stop_tag=stop_tag,
                   environment=env.get(ENVIRONMENT_ENV, ""),
                   sagemaker={"region": region, **opts}, idempotency_ttl_s=int(ttl))


def _stop_tag(env: Mapping[str, str]) -> tuple[str, str] | None:
    tag = env.get(STOP_TAG_ENV, "").strip()
    if not tag:
        return None
    key, sep, value = tag.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{STOP_TAG_ENV}={tag!r}: must be KEY=VALUE")
    return (key.strip(), value.strip())
