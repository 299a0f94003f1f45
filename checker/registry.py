"""Name to rule class. A rule module registers itself with ``@register``."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from trainguard.checker.rules.base import Rule

R = TypeVar("R", bound="type[Rule]")

RULES: dict[str, type[Rule]] = {}


def register(cls: R) -> R:
    if cls.name in RULES and RULES[cls.name] is not cls:
        raise ValueError(f"rule {cls.name!r} is registered twice")
    RULES[cls.name] = cls
    return cls


def rule_names() -> list[str]:
    import trainguard.checker.rules  # noqa: F401  (registers the built-in rules)

    return sorted(RULES)
