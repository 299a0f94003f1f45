"""``Route``: one kind of event the Lambda handles, registered by the event's shape.

A route class implements ``handle`` and is registered with ``register``, by its
EventBridge ``detail-type`` or by the top-level key that holds its payload (CloudWatch
Logs: ``awslogs``). ``find`` looks an event up: its detail-type first, then the keys."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from trainguard.lambdas.aws.runtime import Runtime


class MalformedEvent(ValueError):
    """An event this function cannot use; the message says which part and why."""


class Route(ABC):
    # Names the route in malformed-event reasons and in the idempotency records' key
    # prefix ("trainguard.<name>"): renaming it would forget the event ids already seen.
    name: ClassVar[str]
    # Processed once per EventBridge event id: the handler wraps ``handle`` for that.
    idempotent: ClassVar[bool] = True

    @abstractmethod
    def handle(self, rt: Runtime, event: Mapping[str, Any], now: float) -> dict[str, Any]:
        """Do the work; return the invocation's summary (also the Lambda's result)."""


BY_DETAIL_TYPE: dict[str, Route] = {}  # EventBridge events, by their "detail-type"
BY_KEY: dict[str, Route] = {}  # other events, by the top-level key holding an object

R = TypeVar("R", bound=Route)


def register(*, detail_type: str = "", key: str = "") -> Callable[[type[R]], type[R]]:
    """Class decorator: route the events of this shape (one of the two) to the class."""
    if bool(detail_type) == bool(key):
        raise ValueError("register a route by detail_type or by key, not both or neither")
    table, shape = (BY_DETAIL_TYPE, detail_type) if detail_type else (BY_KEY, key)

    def add(cls: type[R]) -> type[R]:
        if shape in table:
            raise ValueError(f"{cls.__name__}: {shape!r} is already routed to "
                             f"{type(table[shape]).__name__}")
        table[shape] = cls()
        return cls

    return add


def find(event: Any) -> Route | None:
    """The route for ``event``; None when no route takes it (or it is not an object)."""
    if not isinstance(event, Mapping):
        return None
    detail_type = event.get("detail-type")
    if isinstance(detail_type, str) and detail_type in BY_DETAIL_TYPE:
        return BY_DETAIL_TYPE[detail_type]
    return next((r for k, r in BY_KEY.items() if isinstance(event.get(k), Mapping)), None)
