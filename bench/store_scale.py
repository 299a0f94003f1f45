"""A steady tick of the shared tick on each state store, at 1,000 and 10,000 jobs.

    python bench/store_scale.py --jobs 1000 10000 --stores memory sqlite dynamodb table configmap

"Steady": the fleet is unchanged since the tick before. A fraction of the jobs
(``--lasting``, one in ten by default) has a lasting warning (notify only); the others
are healthy (nothing to remember). Findings come from one cheap
rule (the last loss above a limit), so the figure is the store's cost, not the rules'.
Two warm-up ticks, then the median of ``--repeat`` steady ticks, in seconds; the ratio
is to the in-memory store at the same size.

DynamoDB runs on moto in server mode over HTTP (loopback), Table Storage on Azurite (if
installed: .tools), the ConfigMap on the recorded API server of the tests (loopback).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from tests.test_tick import LossAbove  # the tick tests' rule: a last loss above a limit
from trainguard.checker.model import Action, Job, Series, Severity
from trainguard.checker.policy import Policy, RuleConfig, Safety
from trainguard.checker.rules.base import Rule
from trainguard.lambdas.state import MemoryStore, StateStore
from trainguard.lambdas.tick import tick

T0 = 1_750_000_000.0
INTERVAL = 300.0


POLICY = Policy(rules={"loss_above": RuleConfig(actions={Severity.WARNING: Action.NOTIFY})},
                safety=Safety(dry_run=True))


class Fleet:
    name = "fleet"

    def __init__(self, n: int, lasting: float) -> None:
        every = round(1 / lasting) if lasting > 0 else 0
        t = np.array([T0 - 600.0, T0 - 300.0])
        self.jobs = [Job(id=f"ml-team/pytorchjob/job-{i:05d}", provider="bench",
                         scope="lab/ml-team", hourly_price=32.0, start_time=T0 - 3600,
                         series={"loss": Series("loss", t, np.array([1.0, 2.0]),
                                                np.array([2.0, 50.0 if every and i % every == 0
                                                          else 1.5]))})
                     for i in range(n)]

    def list_jobs(self, now: float) -> list[Job]:
        return self.jobs

    def stop(self, job: Job, reason: str) -> None:
        raise AssertionError("dry run: never called")


# --- stores ----------------------------------------------------------------------------

@contextlib.contextmanager
def memory() -> Iterator[StateStore]:
    yield MemoryStore()


@contextlib.contextmanager
def sqlite() -> Iterator[StateStore]:
    from trainguard.lambdas.sqlite_state import SQLiteStore

    with tempfile.TemporaryDirectory() as d:
        store = SQLiteStore(Path(d) / "state.sqlite")
        yield store
        store.close()


@contextlib.contextmanager
def dynamodb() -> Iterator[StateStore]:
    import boto3
    from moto.server import ThreadedMotoServer

    from trainguard.lambdas.aws.dynamodb_state import DynamoDBStore, create_table

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    session: Any = boto3.Session(aws_access_key_id="x", aws_secret_access_key="x",
                                 region_name="us-east-1")
    client = session.client("dynamodb", endpoint_url=f"http://{host}:{port}")
    name = f"state-{uuid.uuid4().hex[:8]}"  # moto's backend is one per process
    create_table(client, name)
    try:
        yield DynamoDBStore(client, name)
    finally:
        server.stop()


@contextlib.contextmanager
def table() -> Iterator[StateStore]:
    from tests.servers import azurite_connection, azurite_table
    from trainguard.lambdas.azure.table_state import TableStore

    with azurite_table() as server:
        yield TableStore.from_connection_string(azurite_connection(server),
                                                f"state{uuid.uuid4().hex[:8]}")


@contextlib.contextmanager
def configmap() -> Iterator[StateStore]:
    from kubernetes import client

    from tests.k8s_configmap import ConfigMapReplay
    from tests.k8s_replay import serve
    from trainguard.adapters.kubeflow.client import api_client, retry_policy
    from trainguard.lambdas.k8s.configmap_state import ConfigMapStore

    with serve(ConfigMapReplay()) as replay:
        assert isinstance(replay, ConfigMapReplay)
        core = client.CoreV1Api(api_client(client.Configuration(host=replay.host),
                                           retry_policy(attempts=1, backoff=0.0)))
        yield ConfigMapStore.from_ref(core, replay.ref)


STORES: dict[str, Callable[[], contextlib.AbstractContextManager[StateStore]]] = {
    "memory": memory, "sqlite": sqlite, "dynamodb": dynamodb, "table": table,
    "configmap": configmap}


def steady(store: StateStore, n: int, repeat: int, lasting: float) -> tuple[float, int]:
    """Median seconds of a steady tick, and job memories written per steady tick."""
    fleet = Fleet(n, lasting)
    rules: list[Rule] = [LossAbove()]
    for k in range(2):  # warm up: findings seen, alarms decided, memories written
        tick([fleet], POLICY, store, [], now=T0 + INTERVAL * k, rules=rules)
    times, writes = [], []
    for k in range(2, 2 + repeat):
        started = time.perf_counter()
        report = tick([fleet], POLICY, store, [], now=T0 + INTERVAL * k, rules=rules)
        times.append(time.perf_counter() - started)
        writes.append(report.writes)
    return statistics.median(times), int(statistics.median(writes))


def main() -> None:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--stores", nargs="+", default=list(STORES), choices=list(STORES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--lasting", type=float, default=0.1,
                    help="fraction of jobs with a lasting finding")
    args = ap.parse_args()
    print(f"{'store':<10} {'jobs':>6} {'steady tick s':>14} {'x memory':>9} {'writes':>7}")
    base: dict[int, float] = {}
    for n in args.jobs:
        for name in ["memory", *[s for s in args.stores if s != "memory"]]:
            try:
                with STORES[name]() as store:
                    seconds, writes = steady(store, n, args.repeat, args.lasting)
            except BaseException as e:  # a missing server (pytest's skip) or a full store
                if isinstance(e, KeyboardInterrupt):
                    raise
                print(f"{name:<10} {n:>6} {'-':>14} {'-':>9} {'-':>7}  "
                      f"({type(e).__name__}: {str(e)[:90]})")
                continue
            base.setdefault(n, seconds)
            print(f"{name:<10} {n:>6} {seconds:>14.3f} {seconds / base[n]:>9.1f} {writes:>7}",
                  flush=True)


if __name__ == "__main__":
    main()
