"""The adapter contract: each ``case_<provider>.py`` here registers a factory that
builds its adapter against a recorded or real service, and ``tests/test_contract.py``
holds every one of them to the same behaviour."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pytest

from trainguard.adapters.base import Adapter
from trainguard.checker.registry import Registry


@dataclass
class ContractCase:
    adapter: Adapter
    now: float
    running: set[str]  # ids of the well-formed running jobs the service lists
    with_metrics: str  # a running job whose metrics the service holds
    metric: str  # a series that job must have, with points
    unknown_state: str  # a job whose provider state is none the adapter knows
    unknown_raw: str  # that state, as the provider wrote it
    broken: str | None  # a listed job whose payload is malformed: skipped and reported
    stops: Callable[[], list[str]]  # ids of the jobs the service was asked to stop


F = TypeVar("F", bound=Callable[..., Any])


class Cases(Generic[F]):
    """Test-case factories by name, one per implementation a contract suite runs on.
    With ``names`` (the plug-in registry's names), a registered implementation with no
    factory fails the suite instead of being left out."""

    def __init__(self, kind: str, where: str, plugins: str | None = None) -> None:
        """``plugins``: the registry in ``trainguard.lambdas.plugins`` whose names these
        cases must cover (``stores``, ``sinks``)."""
        self.kind, self.where, self.plugins = kind, where, plugins
        self.factories: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def add(fn: F) -> F:
            self.factories[name] = fn
            return fn
        return add

    def names(self) -> list[str]:
        if self.plugins is None:
            return sorted(self.factories)
        from trainguard.lambdas import plugins

        registry: Registry[Any] = getattr(plugins, self.plugins)
        return registry.names()

    def factory(self, name: str) -> F:
        if name not in self.factories:
            pytest.fail(f"{self.kind} {name!r} is registered but has no contract case: add "
                        f"a factory with @{self.kind.split()[-1]}({name!r}) in {self.where}")
        return self.factories[name]


Factory = Callable[[pytest.FixtureRequest], ContractCase]
_ADAPTERS: Cases[Factory] = Cases("case", "tests/contract/case_<provider>.py")
CASES = _ADAPTERS.factories
case = _ADAPTERS.register


def load_cases() -> dict[str, Factory]:
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("case_"):
            importlib.import_module(f"{__name__}.{info.name}")
    return CASES
