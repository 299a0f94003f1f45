"""The AWS Lambda's settings: the environment variables it reads (docs/alarms-aws.md).
The stack writes them with ``Settings(...).to_env()``, the Lambda reads them once per
container with ``Settings.from_env(os.environ)``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainguard.config.problems import ConfigError
from trainguard.config.settings.base import (
    bool_text,
    flag,
    number_text,
    positive_float,
    positive_int,
    refuse_unknown,
    text,
    unknown,
)

STATE_TABLE_ENV = "TRAINGUARD_STATE_TABLE"  # state, audit and idempotency records; required
TOPIC_ARN_ENV = "TRAINGUARD_TOPIC_ARN"  # direct alarms; unset: metrics only
POLICY_ENV = "TRAINGUARD_POLICY"  # relative to the package root
STOP_ENABLED_ENV = "TRAINGUARD_STOP_ENABLED"  # false forces dry run whatever the policy
STOP_TAG_ENV = "TRAINGUARD_STOP_TAG"  # "KEY=VALUE": only jobs with this tag may be stopped
ENVIRONMENT_ENV = "TRAINGUARD_ENVIRONMENT"  # the environment's name, for the logs
IDEMPOTENCY_TTL_ENV = "TRAINGUARD_IDEMPOTENCY_TTL_S"  # how long an event id is remembered
INTERVAL_ENV = "TRAINGUARD_INTERVAL_S"  # the schedule's interval, for the tick's persistence
SAGEMAKER_ENV_PREFIX = "TRAINGUARD_SAGEMAKER_"  # TRAINGUARD_SAGEMAKER_MAX_ATTEMPTS -> max_attempts
REGION_ENV = "AWS_REGION"  # set by Lambda (a reserved name: the stack cannot set it)
DEFAULT_REGION_ENV = "AWS_DEFAULT_REGION"  # the fallback outside Lambda

DEFAULT_POLICY = "policy.yaml"  # where stacks/package.py puts the environment's policy
DEFAULT_IDEMPOTENCY_TTL_S = 3600
SERVICE = "trainguard"  # the powertools service name (the stack sets POWERTOOLS_SERVICE_NAME)

KNOWN = {STATE_TABLE_ENV, TOPIC_ARN_ENV, POLICY_ENV, STOP_ENABLED_ENV, STOP_TAG_ENV,
         ENVIRONMENT_ENV, IDEMPOTENCY_TTL_ENV, INTERVAL_ENV}


@dataclass(frozen=True)
class Settings:
    table: str  # STATE_TABLE_ENV
    region: str  # REGION_ENV (Lambda's own: never written by to_env)
    topic_arn: str | None = None  # TOPIC_ARN_ENV (none: metrics only)
    policy: str = DEFAULT_POLICY  # POLICY_ENV, relative to the package root
    stop_enabled: bool = False  # STOP_ENABLED_ENV
    stop_tag: tuple[str, str] | None = None  # STOP_TAG_ENV as (key, value)
    environment: str = ""  # ENVIRONMENT_ENV
    sagemaker: dict[str, str] = field(default_factory=dict)  # SAGEMAKER_ENV_PREFIX options
    idempotency_ttl_s: int = DEFAULT_IDEMPOTENCY_TTL_S  # IDEMPOTENCY_TTL_ENV
    interval_s: float | None = None  # INTERVAL_ENV; unset: the tick learns it

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        refuse_unknown(env, KNOWN, "the Lambda", (SAGEMAKER_ENV_PREFIX,))
        table = text(env, STATE_TABLE_ENV)
        if table is None:
            raise ConfigError(f"{STATE_TABLE_ENV} is not set (the DynamoDB state table)")
        region = text(env, REGION_ENV) or text(env, DEFAULT_REGION_ENV)
        if region is None:
            raise ConfigError(f"{REGION_ENV} is not set")
        opts = {k[len(SAGEMAKER_ENV_PREFIX):].lower(): v for k, v in env.items()
                if k.startswith(SAGEMAKER_ENV_PREFIX)}
        return cls(table=table, region=region, topic_arn=text(env, TOPIC_ARN_ENV),
                   policy=text(env, POLICY_ENV) or DEFAULT_POLICY,
                   stop_enabled=flag(env, STOP_ENABLED_ENV), stop_tag=_stop_tag(env),
                   environment=text(env, ENVIRONMENT_ENV) or "", sagemaker=opts,
                   idempotency_ttl_s=positive_int(env, IDEMPOTENCY_TTL_ENV,
                                                  DEFAULT_IDEMPOTENCY_TTL_S),
                   interval_s=positive_float(env, INTERVAL_ENV))

    def to_env(self) -> dict[str, str]:
        """The Lambda's environment for these settings (``region`` is Lambda's own)."""
        env = {STATE_TABLE_ENV: self.table, POLICY_ENV: self.policy,
               STOP_ENABLED_ENV: bool_text(self.stop_enabled),
               IDEMPOTENCY_TTL_ENV: str(self.idempotency_ttl_s)}
        if self.topic_arn:
            env[TOPIC_ARN_ENV] = self.topic_arn
        if self.stop_tag is not None:
            env[STOP_TAG_ENV] = "=".join(self.stop_tag)
        if self.environment:
            env[ENVIRONMENT_ENV] = self.environment
        if self.interval_s is not None:
            env[INTERVAL_ENV] = number_text(self.interval_s)
        env.update({SAGEMAKER_ENV_PREFIX + k.upper(): v for k, v in self.sagemaker.items()})
        return env

    @staticmethod
    def unknown(env: Mapping[str, str]) -> set[str]:
        """``TRAINGUARD_`` variables in ``env`` this Lambda never reads."""
        return unknown(env, KNOWN, (SAGEMAKER_ENV_PREFIX,))


def _stop_tag(env: Mapping[str, str]) -> tuple[str, str] | None:
    tag = text(env, STOP_TAG_ENV)
    if tag is None:
        return None
    key, sep, value = tag.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{STOP_TAG_ENV}={tag!r}: must be KEY=VALUE")
    return (key.strip(), value.strip())
