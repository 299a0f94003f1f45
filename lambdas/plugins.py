"""The state stores and the sinks, by name: what the runtimes pick from their settings
(``sqlite``, ``configmap``, ``dynamodb``, ``table``, ``memory``; ``sns``, ``cloudwatch``,
``emf``, ``webhook``, ``azure_metrics``, ``alertmanager``, ``pushgateway``, ``console``).

A store is a class implementing ``state.StateStore`` in a module named ``state`` or
``*_state`` under ``trainguard.lambdas``, registered there with ``@stores.register(NAME)``.
A sink is a class in a module named ``sinks`` (or ``local``, the local loop's console)
registered with ``@sinks.register(NAME)``:
either an alarm sink (``send(event)``, the tick's ``AlarmSink``: an alarm it refuses is
said again next tick) or a metrics sink (it publishes each tick's report; the next tick
publishes the state again). The registries find the modules themselves, and the contract
suites (tests/test_store_contract.py, tests/test_sink_contract.py) run on every name they
hold, so a new store or sink cannot be left out of them.
"""

from __future__ import annotations

from typing import Any

from trainguard.checker.registry import Registry

PACKAGE = "trainguard.lambdas"


def _store_module(module: str) -> bool:
    leaf = module.rsplit(".", 1)[-1]
    return leaf == "state" or leaf.endswith("_state")


def _sink_module(module: str) -> bool:
    return module.rsplit(".", 1)[-1] in ("sinks", "local")


# Each class is built with its own arguments (a table name, a path, a client), so the
# registries hold classes as such; the contract suites hold what they do.
stores: Registry[type[Any]] = Registry("state store", PACKAGE, _store_module)
sinks: Registry[type[Any]] = Registry("sink", PACKAGE, _sink_module)
