"""The adapter contract: each ``case_<provider>.py`` here registers a factory that
builds its adapter against a recorded or real service, and ``tests/test_contract.py``
holds every one of them to the same behaviour."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from trainguard.adapters.base import Adapter


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


Factory = Callable[[pytest.FixtureRequest], ContractCase]
CASES: dict[str, Factory] = {}


def case(name: str) -> Callable[[Factory], Factory]:
    def register(fn: Factory) -> Factory:
        CASES[name] = fn
        return fn
    return register


def load_cases() -> dict[str, Factory]:
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("case_"):
            importlib.import_module(f"{__name__}.{info.name}")
    return CASES
