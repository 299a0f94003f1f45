"""The state-store contract: one factory per store, each opening views onto one fresh,
empty backend. ``tests/test_store_contract.py`` holds every store to the same behaviour
(compare-and-set, idempotent audit, the tick's safety under injected faults and
overlapping ticks). The stores it runs on are those of the store registry
(``trainguard.lambdas.plugins.stores``): a registered store with no factory here fails
the suite, it is never skipped.

Backends: memory and SQLite in-process; DynamoDB on moto in server mode over HTTP;
Azure Table Storage on Azurite; the ConfigMap on the recorded API server
(``tests/k8s_configmap.py``, with the API server's resourceVersion rules), the boundary
for Kubernetes since no real API server can run here.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.contract import Cases
from tests.servers import shared
from trainguard.lambdas.state import MemoryStore, StateStore


@dataclass
class StoreCase:
    name: str
    open: Callable[[], StateStore]  # a new view (its own versions) onto the one backend


Factory = Callable[[pytest.FixtureRequest, Path], StoreCase]


CASES: Cases[Factory] = Cases("state store", "tests/contract/stores.py", "stores")
STORES, store, store_names = CASES.factories, CASES.register, CASES.names


def open_case(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> StoreCase:
    return CASES.factory(name)(request, tmp_path)


@store("memory")
def memory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreCase:
    first = MemoryStore()
    views = iter([first])
    return StoreCase("memory", lambda: next(views, None) or MemoryStore(shared=first))


@store("sqlite")
def sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> StoreCase:
    from trainguard.lambdas.sqlite_state import SQLiteStore

    path = tmp_path / f"state-{uuid.uuid4().hex[:6]}.sqlite"
    opened: list[SQLiteStore] = []

    def view() -> StateStore:
        opened.append(SQLiteStore(path))
        return opened[-1]

    def close() -> None:
        for s in opened:
            s.close()

    request.addfinalizer(close)
    return StoreCase("sqlite", view)


@contextlib.contextmanager
def _moto() -> Iterator[Any]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()

    @dataclass
    class Url:
        url: str

    try:
        yield Url(f"http://{host}:{port}")
    finally:
        server.stop()


def dynamodb_client(url: str) -> Any:
    import boto3

    session: Any = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                 region_name="us-east-1")
    return session.client("dynamodb", endpoint_url=url)


@store("dynamodb")
def dynamodb(request: pytest.FixtureRequest, tmp_path: Path) -> StoreCase:
    from trainguard.lambdas.aws.dynamodb_state import DynamoDBStore, create_table

    url = shared(request.config, "moto-server", _moto).url
    table = f"state-{uuid.uuid4().hex[:8]}"
    create_table(dynamodb_client(url), table)
    return StoreCase("dynamodb", lambda: DynamoDBStore(dynamodb_client(url), table))


@store("table")
def table(request: pytest.FixtureRequest, tmp_path: Path) -> StoreCase:
    from tests.servers import azurite_connection, azurite_table
    from trainguard.lambdas.azure.table_state import TableStore

    server = shared(request.config, "azurite-table", azurite_table)
    name = f"state{uuid.uuid4().hex[:10]}"
    conn = azurite_connection(server)
    return StoreCase("table", lambda: TableStore.from_connection_string(
        conn, name, retries=0, timeout=10.0))


@store("configmap")
def configmap(request: pytest.FixtureRequest, tmp_path: Path) -> StoreCase:
    from kubernetes import client

    from tests.k8s_configmap import ConfigMapReplay
    from tests.k8s_replay import serve
    from trainguard.adapters.kubeflow.client import api_client, retry_policy
    from trainguard.lambdas.k8s.configmap_state import ConfigMapStore

    stack = contextlib.ExitStack()
    replay = stack.enter_context(serve(ConfigMapReplay()))
    request.addfinalizer(stack.close)
    assert isinstance(replay, ConfigMapReplay)

    def view() -> StateStore:
        cfg = client.Configuration(host=replay.host)
        core = client.CoreV1Api(api_client(cfg, retry_policy(attempts=1, backoff=0.0)))
        return ConfigMapStore.from_ref(core, replay.ref)

    return StoreCase("configmap", view)
