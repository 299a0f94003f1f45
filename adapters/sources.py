"""Name to source factory, for ``trainguard check --source NAME --opt KEY=VALUE``.

Each provider module registers a factory taking the ``--opt`` pairs; its cloud SDK
is imported only when that source is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from trainguard.adapters.base import Adapter

Factory = Callable[[dict[str, str]], Adapter]

#: source name -> "module:function" building the adapter from options
SOURCES: dict[str, str] = {
    "sagemaker": "trainguard.adapters.sagemaker:from_options",
    "azureml": "trainguard.adapters.azureml:from_options",
    "kubeflow": "trainguard.adapters.kubeflow:from_options",
    "prometheus": "trainguard.adapters.prometheus:from_options",
}


def build(name: str, options: dict[str, str]) -> Adapter:
    if name not in SOURCES:
        raise ValueError(f"unknown source {name!r} (known: local, {', '.join(sorted(SOURCES))})")
    module, func = SOURCES[name].split(":")
    factory: Factory = getattr(importlib.import_module(module), func)
    return factory(options)
