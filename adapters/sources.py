"""Name to source factory, for ``trainguard check --source NAME --opt KEY=VALUE``.

A source is a provider package of ``trainguard.adapters`` whose top level defines
``from_options(options) -> Adapter``; its name is the package's name. The registry finds
them by walking the package (no list to keep): a new provider package is a new source.
``build`` imports the named package first, so a source's cloud SDK is imported only when
that source is used (and the others' not at all).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from types import ModuleType

from trainguard.adapters.base import Adapter
from trainguard.checker.registry import Registry

Factory = Callable[[dict[str, str]], Adapter]
PACKAGE = "trainguard.adapters"


def _provider_package(module: str) -> bool:
    return module.count(".") == PACKAGE.count(".") + 1  # trainguard.adapters.NAME only


def _collect(registry: Registry[Factory], module: ModuleType) -> None:
    factory = getattr(module, "from_options", None)
    if callable(factory) and getattr(module, "__path__", None) is not None:
        registry.add(module.__name__.rsplit(".", 1)[-1], factory)


sources: Registry[Factory] = Registry("source", PACKAGE, _provider_package, _collect)
SOURCES = sources.entries  # name -> factory (every source once ``sources.names()`` ran)


def build(name: str, options: dict[str, str]) -> Adapter:
    module = f"{PACKAGE}.{name}"
    if (name not in SOURCES and name.isidentifier()
            and importlib.util.find_spec(module) is not None):
        sources.load_module(module)  # this source's package alone
    try:
        factory = sources.get(name)
    except ValueError as e:
        raise ValueError(f"{e} (and local)") from None
    return factory(options)
