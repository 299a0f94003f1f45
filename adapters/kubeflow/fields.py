"""Reading a Kubernetes object's fields with errors that say which object, which
field and why, so that a malformed job is skipped with a message a user can act on."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


class Malformed(ValueError):
    """An object whose fields are not what the API defines."""


class Reader:
    """Typed access to one JSON object; ``label`` names it in errors
    (``PyTorchJob ml-team/bert-ft``), ``prefix`` is where it sits inside that object."""

    def __init__(self, label: str, obj: Any, prefix: tuple[str, ...] = ()) -> None:
        if not isinstance(obj, dict):
            raise Malformed(f"{label}: {'.'.join(prefix) or 'object'}: "
                            f"expected an object, got {_show(obj)}")
        self.label = label
        self.obj: dict[str, Any] = obj
        self.prefix = prefix

    def fail(self, path: tuple[str, ...], expected: str, got: Any) -> Malformed:
        where = ".".join(self.prefix + path)
        return Malformed(f"{self.label}: {where}: expected {expected}, got {_show(got)}")

    def raw(self, *path: str) -> Any:
        """The value at ``path``, or None where any part of it is absent."""
        node: Any = self.obj
        for i, key in enumerate(path):
            if node is None:
                return None
            if not isinstance(node, dict):
                raise self.fail(path[:i], "an object", node)
            node = node.get(key)
        return node

    def child(self, *path: str) -> Reader:
        value = self.raw(*path)
        return Reader(self.label, {} if value is None else value, self.prefix + path)

    def mapping(self, *path: str) -> dict[str, Any]:
        value = self.raw(*path)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, "an object", value)
        return value

    def items(self, *path: str) -> list[Any]:
        value = self.raw(*path)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(path, "a list", value)
        return value

    def children(self, *path: str) -> list[Reader]:
        return [Reader(self.label, v, (*self.prefix, *path, str(i)))
                for i, v in enumerate(self.items(*path))]

    def text(self, *path: str) -> str | None:
        value = self.raw(*path)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(path, "a string", value)
        return value

    def integer(self, *path: str) -> int | None:
        value = self.raw(*path)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, "an integer", value)
        return value

    def flag(self, *path: str) -> bool:
        value = self.raw(*path)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.fail(path, "true or false", value)
        return value

    def quantity(self, *path: str) -> int | None:
        """A whole-number resource quantity (``"8"`` or ``8``), as GPUs are counted."""
        value = self.raw(*path)
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
        raise self.fail(path, "a whole-number quantity", value)

    def time(self, *path: str) -> float | None:
        """An RFC 3339 timestamp as epoch seconds."""
        value = self.text(*path)
        if value is None or value == "":
            return None
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise self.fail(path, "an RFC 3339 time", value) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
