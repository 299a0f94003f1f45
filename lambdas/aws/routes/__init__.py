"""The Lambda's routes, one module each; importing this package registers them (see
``base.register``). ``find`` gives an event's route; an event no route takes goes to
``MALFORMED``."""

from trainguard.lambdas.aws.routes import logs, schedule, state_change
from trainguard.lambdas.aws.routes.base import BY_DETAIL_TYPE, BY_KEY, MalformedEvent, Route, find
from trainguard.lambdas.aws.routes.malformed import MALFORMED

__all__ = ["BY_DETAIL_TYPE", "BY_KEY", "MALFORMED", "MalformedEvent", "Route", "find", "logs",
           "schedule", "state_change"]
