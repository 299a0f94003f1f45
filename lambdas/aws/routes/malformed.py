"""Malformed or unknown events: any event no registered route takes, or one a route found
malformed, is logged and acknowledged (a retry would fail the same way), never a stop. It
needs no runtime: an unknown event is acknowledged even when the settings are broken."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from trainguard.lambdas.aws.settings import SERVICE
from trainguard.lambdas.aws.sinks import NAMESPACE

# The handler's logger and metric set: powertools shares them by service name.
logger = Logger(service=SERVICE)
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)


def describe(event: Any) -> str:
    """Enough of an event to recognise it in the log, without its whole payload."""
    if not isinstance(event, Mapping):
        return f"a {type(event).__name__}, not an object"
    return (f"detail-type {event.get('detail-type')!r}, id {event.get('id')!r}, "
            f"keys {sorted(map(str, event))[:8]}")


class Malformed:
    """The fallback when ``find`` has no route, and for an event a route rejected."""

    def unknown(self, event: Any) -> dict[str, Any]:
        return self.ignore(f"no route for this event ({describe(event)})")

    def ignore(self, reason: str) -> dict[str, Any]:
        metrics.add_metric(name="MalformedEvents", unit=MetricUnit.Count, value=1)
        logger.error("malformed event ignored (nothing was stopped)", extra={"reason": reason})
        return {"status": "ignored", "reason": reason}


MALFORMED = Malformed()
