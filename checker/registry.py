"""Name to class, for every kind of plug-in: rules here, sources, state stores and sinks
elsewhere (``adapters.sources``, ``lambdas.plugins``). One ``Registry`` per kind.

A plug-in registers itself where it is defined (``@rules.register``-style decorators) and
the registry finds the modules itself: on the first lookup of a name it does not hold, it
imports every module of its package that its ``match`` accepts (a ``pkgutil`` walk), so a
new rule file, source package, store or sink module is picked up with no list to edit.

A module that cannot be imported because a third-party package is absent (the Azure SDK in
the AWS Lambda zip) is not an error until one of its names is asked for: the lookup then
says which module and why. Standard library only: ``checker`` imports with numpy alone.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from trainguard.checker.rules.base import Rule

T = TypeVar("T")


def _every(module: str) -> bool:
    return True


class UnknownName(ValueError):
    """No plug-in of that kind has that name; the message lists the known ones."""


class Registry(Generic[T]):
    """Plug-ins of one ``kind`` (rule, source, store, sink), by name, found under the
    Python package ``package`` in the modules ``match`` accepts (their dotted names).
    ``collect``, when given, registers what it finds in each imported module (for plug-ins
    known by a convention rather than a decorator)."""

    def __init__(self, kind: str, package: str, match: Callable[[str], bool] = _every,
                 collect: Callable[[Registry[T], ModuleType], None] | None = None) -> None:
        self.kind, self.package, self.match, self.collect = kind, package, match, collect
        self.entries: dict[str, T] = {}
        self.unavailable: dict[str, str] = {}  # module -> why it could not be imported
        self._loaded = False

    def add(self, name: str, item: T) -> T:
        if name in self.entries and self.entries[name] is not item:
            raise ValueError(f"{self.kind} {name!r} is registered twice: "
                             f"{self.entries[name]!r} and {item!r}")
        self.entries[name] = item
        return item

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator: ``@stores.register("sqlite")`` above the class."""
        def add(item: T) -> T:
            return self.add(name, item)
        return add

    def load(self) -> None:
        """Import every module of the package that ``match`` accepts (once)."""
        if self._loaded:
            return
        root = importlib.import_module(self.package)
        for info in pkgutil.walk_packages(root.__path__, f"{self.package}.",
                                          onerror=self._unimportable):
            if self.match(info.name):
                self.load_module(info.name)
        self._loaded = True

    def load_module(self, module: str) -> bool:
        """Import one module (and collect from it); False when a package it needs is
        not installed (kept in ``unavailable``)."""
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as e:
            self._missing(module, e)
            return False
        if self.collect is not None:
            self.collect(self, found)
        return True

    def _unimportable(self, module: str) -> None:
        # walk_packages calls this inside its ``except ImportError`` when a subpackage's
        # __init__ fails to import: the same rule as for a module
        error = sys.exc_info()[1]
        if not isinstance(error, ModuleNotFoundError):
            raise error if error is not None else ImportError(module)
        self._missing(module, error)

    def _missing(self, module: str, e: ModuleNotFoundError) -> None:
        if (e.name or "").split(".")[0] == "trainguard":
            raise e  # a broken import of our own is a bug, never a missing extra
        self.unavailable[module] = f"needs {e.name!r}, not installed here"

    def get(self, name: str) -> T:
        if name not in self.entries:
            self.load()
        if name not in self.entries:
            missing = "".join(f"; not loadable here: {m} ({why})"
                              for m, why in sorted(self.unavailable.items()))
            raise UnknownName(f"unknown {self.kind} {name!r} (known: "
                              f"{', '.join(self.names()) or 'none'}{missing})")
        return self.entries[name]

    def names(self) -> list[str]:
        self.load()
        return sorted(self.entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


rules: Registry[type[Rule]] = Registry("rule", "trainguard.checker.rules")
RULES = rules.entries  # name -> rule class (every rule once ``rule_names`` has run)

R = TypeVar("R", bound="type[Rule]")


def register(cls: R) -> R:
    """The rule decorator: a rule registers under its own ``name``."""
    rules.add(cls.name, cls)
    return cls


def rule_names() -> list[str]:
    return rules.names()
