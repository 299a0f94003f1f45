"""``Runtime``: what one Lambda container keeps between invocations (clients, policy,
state store, idempotency records), built from ``Settings`` on first use."""

from __future__ import annotations

import os

import boto3
from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
)

from trainguard.adapters.sagemaker import SageMakerAdapter, from_options
from trainguard.checker.policy import Policy
from trainguard.config import runtime_policy
from trainguard.lambdas import plugins
from trainguard.lambdas.aws.dynamodb_state import DynamoDBStore  # registers "dynamodb"
from trainguard.lambdas.aws.settings import SERVICE, STOP_ENABLED_ENV, Settings, policy_path
from trainguard.lambdas.aws.sinks import EmfWriter, SnsAlarmSink
from trainguard.lambdas.tick import AlarmSink

logger = Logger(service=SERVICE)  # powertools reuses the handler's logger by service name


class Runtime:
    def __init__(self, settings: Settings, session: boto3.Session | None = None) -> None:
        self.settings = settings
        session = session or boto3.Session(region_name=settings.region)
        self.policy: Policy = runtime_policy(policy_path(settings), settings.stop_enabled,
                                             warn=logger.warning, switch=STOP_ENABLED_ENV)
        dynamodb = session.client("dynamodb", region_name=settings.region)
        self.store: DynamoDBStore = plugins.stores.get("dynamodb")(dynamodb, settings.table)
        self.adapter: SageMakerAdapter = from_options(
            {"region": settings.region, **settings.sagemaker})
        self.sns = (session.client("sns", region_name=settings.region)
                    if settings.topic_arn else None)
        self.metrics = EmfWriter()
        # EventBridge deliveries are processed once per event id; the records share the
        # state table under their own partition.
        self.idempotency = IdempotencyConfig(event_key_jmespath="id",
                                             raise_on_no_idempotency_key=True,
                                             expires_after_seconds=settings.idempotency_ttl_s)
        self.persistence = DynamoDBPersistenceLayer(
            table_name=settings.table, key_attr="pk", sort_key_attr="sk",
            static_pk_value="idempotency", expiry_attr="expires_at", boto3_client=dynamodb)

    def sinks(self) -> list[AlarmSink]:
        if self.sns is None or self.settings.topic_arn is None:
            return []
        sns: type[SnsAlarmSink] = plugins.sinks.get("sns")
        return [sns(self.sns, self.settings.topic_arn, self.policy.safety.dry_run)]


_RUNTIME: dict[str, Runtime] = {}


def runtime() -> Runtime:
    if "rt" not in _RUNTIME:
        _RUNTIME["rt"] = Runtime(Settings.from_env(os.environ))
    return _RUNTIME["rt"]


def reset() -> None:
    """Forget the container's runtime (tests; a changed environment)."""
    _RUNTIME.clear()
