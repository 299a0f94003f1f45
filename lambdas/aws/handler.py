"""The AWS Lambda entry point: ``lambdas.aws.handler`` (or ``lambdas.aws.handler.handler``).

One function; the event's shape picks its route (``lambdas.aws.routes``, one module each):
the scheduled tick, a SageMaker state-change event, a CloudWatch Logs subscription batch,
and the fallback for a malformed or unknown event.

EventBridge deliveries are idempotent (powertools, DynamoDB persistence, keyed on the
event id): a duplicate delivery is processed once. A malformed event is logged and
acknowledged (a retry would fail the same way), never a stop. A state store failure
raises ``StateStoreError`` with no stop made, so Lambda retries the delivery.

Environment: see ``lambdas.aws.settings`` and docs/alarms-aws.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.idempotency import idempotent_function
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyPersistenceLayerError,
)

from trainguard.adapters.sagemaker import MalformedJob
from trainguard.lambdas.aws.routes import MALFORMED, MalformedEvent, Route, find
from trainguard.lambdas.aws.runtime import Runtime, reset, runtime
from trainguard.lambdas.aws.settings import PACKAGE_ROOT, SERVICE
from trainguard.lambdas.aws.sinks import NAMESPACE
from trainguard.lambdas.state import StateStoreError

# ``reset`` and ``PACKAGE_ROOT`` stay importable from here, as before the split.
__all__ = ["PACKAGE_ROOT", "handler", "reset"]

logger = Logger(service=SERVICE)
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)


@metrics.log_metrics
def handler(event: Any, context: Any) -> dict[str, Any]:
    """The Lambda entry point."""
    correlation = (event.get("id") if isinstance(event, Mapping) else None) or getattr(
        context, "aws_request_id", None)
    logger.set_correlation_id(correlation)
    metrics.add_metric(name="Invocations", unit=MetricUnit.Count, value=1)
    route = find(event)
    if route is None:
        return MALFORMED.unknown(event)
    try:
        return _run(runtime(), event, route, context)
    except (MalformedEvent, MalformedJob) as e:
        return MALFORMED.ignore(f"{route.name}: {e}")
    except StateStoreError as e:
        metrics.add_metric(name="StateStoreErrors", unit=MetricUnit.Count, value=1)
        logger.error("state store failed: nothing was stopped; the delivery will be retried",
                     extra={"reason": str(e), "table": runtime().settings.table})
        raise


def _run(rt: Runtime, event: Mapping[str, Any], route: Route, context: Any) -> dict[str, Any]:
    now = time.time()
    if not route.idempotent:
        return route.handle(rt, event, now)
    if not isinstance(event.get("id"), str) or not event["id"]:
        raise MalformedEvent("an EventBridge event without an id")
    if context is not None:
        rt.idempotency.register_lambda_context(context)

    def run(event: dict[str, Any]) -> dict[str, Any]:
        return route.handle(rt, event, now)

    once: Callable[..., dict[str, Any]] = idempotent_function(
        run, data_keyword_argument="event", persistence_store=rt.persistence,
        config=rt.idempotency, key_prefix=f"trainguard.{route.name}")

    try:
        result: dict[str, Any] = once(event=dict(event))
    except IdempotencyAlreadyInProgressError:
        logger.info("a duplicate delivery of an event still being processed: acknowledged")
        return {"route": route.name, "duplicate": True}
    except IdempotencyPersistenceLayerError as e:
        raise StateStoreError(f"DynamoDB table {rt.settings.table}: the idempotency record "
                              f"failed: {e}") from e
    return result
