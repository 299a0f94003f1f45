"""``DynamoDBStore``: the tick's state in the stack's one DynamoDB table (``pk``/``sk``
strings, TTL on ``expires_at``), plus what the event-driven invocations leave for the
next tick.

Items, by partition:

* ``job`` / job_key: one ``JobMemory`` as JSON, with a ``version`` number. Every write is
  conditional on the version this store read, so two invocations that both decided to
  stop a job cannot both record (and so make) the stop: the second write fails with
  ``StateConflict`` and that tick stops nothing. Memories are written in transactions of
  up to 100 (``TransactWriteItems``), new stop intents last: a conflict anywhere before
  means no new intent is stored. A job key longer than a sort key may be (1,024 bytes)
  is cut and hashed (``fit_key``); the full key stays in the memory's JSON.
* ``audit`` / time#id: one ``AuditRecord`` each, expiring after ``audit_ttl_s``, written
  in ``BatchWriteItem`` batches of 25. The sort key comes from the record's id, so a
  record written twice (a retry after a failure) is one item.
* ``event`` / job name: the newest "SageMaker Training Job State Change" event for a job
  since the last tick (an older event arriving late never replaces a newer one).
* ``logs`` / job name: failure lines a CloudWatch Logs subscription delivered, and which
  critical signatures were already alarmed on at once.

The table's IAM policy grants item, batch-write and query calls only (no Scan).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from trainguard.lambdas.plugins import stores
from trainguard.lambdas.state import AuditRecord, JobMemory, StateConflict, StateStoreError, fit_key

JOB, AUDIT, EVENT, LOGS = "job", "audit", "event", "logs"
AUDIT_TTL_S = 90 * 86400.0
PENDING_TTL_S = 2 * 86400.0  # left-over events and log lines: long after any tick used them
MAX_LINES = 50  # log lines kept per job between ticks
TRANSACTION_MAX = 100  # items in one TransactWriteItems
BATCH_MAX = 25  # items in one BatchWriteItem
KEY_MAX = 1024  # bytes in a sort key
BATCH_TRIES = 5  # BatchWriteItem calls for the items DynamoDB left unprocessed

T = TypeVar("T")


__all__ = ["DynamoDBStore", "PendingEvent", "PendingLogs", "StateConflict", "create_table"]


@dataclass
class PendingEvent:
    job_name: str
    event: dict[str, Any]
    modified: float


@dataclass
class PendingLogs:
    job_name: str
    scope: str  # account/region, as the SageMaker adapter scopes a job
    lines: list[tuple[float, str]]
    alarmed: dict[str, float] = field(default_factory=dict)  # signature -> alarmed at
    count: int = 0  # appends so far: the delete after a tick is conditional on it


def _conditional_failed(e: Exception) -> bool:
    return isinstance(e, ClientError) and e.response.get("Error", {}).get("Code") in (
        "ConditionalCheckFailedException", "TransactionCanceledException")


@stores.register("dynamodb")
class DynamoDBStore:
    """A ``StateStore`` on DynamoDB. ``client`` is a boto3 DynamoDB client."""

    def __init__(self, client: Any, table: str, audit_ttl_s: float = AUDIT_TTL_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.table = table
        self.audit_ttl_s = audit_ttl_s
        self.clock = clock
        self._versions: dict[str, int] = {}  # job_key -> version last read or written

    # --- plumbing ---------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (ClientError, BotoCoreError) as e:
            if _conditional_failed(e):
                raise StateConflict(f"DynamoDB table {self.table}: cannot {what}: another "
                                    f"invocation changed it first") from e
            raise StateStoreError(f"DynamoDB table {self.table}: cannot {what}: "
                                  f"{type(e).__name__}: {e}") from e

    def _query(self, pk: str, what: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table, "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": pk}}, "ConsistentRead": True}
        while True:
            page = self._call(what, lambda: self.client.query(**kwargs))
            items.extend(page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _expires(self, ttl_s: float) -> dict[str, str]:
        return {"N": str(int(self.clock() + ttl_s))}

    # --- StateStore -------------------------------------------------------------------

    def load_all(self) -> dict[str, JobMemory]:
        out: dict[str, JobMemory] = {}
        versions: dict[str, int] = {}
        for item in self._query(JOB, "read job memory"):
            memory = JobMemory.from_json(item["data"]["S"])
            out[memory.job_key] = memory
            versions[memory.job_key] = int(item["version"]["N"])
        self._versions = versions
        return out

    def _put_job(self, m: JobMemory) -> dict[str, Any]:
        """The conditional Put of one memory, as both PutItem and a transaction take it."""
        known = self._versions.get(m.job_key)
        put: dict[str, Any] = {
            "TableName": self.table,
            "Item": {"pk": {"S": JOB}, "sk": {"S": fit_key(m.job_key, KEY_MAX)},
                     "data": {"S": m.to_json()},
                     "version": {"N": str((known or 0) + 1)},
                     "last_seen": {"N": repr(m.last_seen)}},
        }
        if known is None:
            put["ConditionExpression"] = "attribute_not_exists(pk)"
        else:
            put["ConditionExpression"] = "#v = :v"
            put["ExpressionAttributeNames"] = {"#v": "version"}
            put["ExpressionAttributeValues"] = {":v": {"N": str(known)}}
        return put

    def save(self, memories: list[JobMemory]) -> None:
        # A memory with a stop intent not yet carried out goes last, after every other
        # write succeeded: a conflict anywhere means no new intent is stored.
        latest = list({m.job_key: m for m in memories}.values())
        intents = [m for m in latest if m.stop is not None and m.stop.done_at is None]
        others = [m for m in latest if m not in intents]
        for group in (others, intents):
            for i in range(0, len(group), TRANSACTION_MAX):
                self._transact(group[i:i + TRANSACTION_MAX])

    def _transact(self, chunk: list[JobMemory]) -> None:
        keys = ", ".join(m.job_key for m in chunk[:3]) + (" ..." if len(chunk) > 3 else "")
        if len(chunk) == 1:  # one item: a plain conditional put is the cheaper call
            put = self._put_job(chunk[0])
            self._call(f"save job memory {keys}", lambda: self.client.put_item(**put))
        else:
            items = [{"Put": self._put_job(m)} for m in chunk]
            self._call(f"save job memory {keys}",
                       lambda: self.client.transact_write_items(TransactItems=items))
        for m in chunk:
            self._versions[m.job_key] = self._versions.get(m.job_key, 0) + 1

    def delete(self, job_keys: list[str]) -> None:
        for key in job_keys:
            known = self._versions.get(key)
            kwargs: dict[str, Any] = {"TableName": self.table,
                                      "Key": {"pk": {"S": JOB},
                                              "sk": {"S": fit_key(key, KEY_MAX)}}}
            if known is not None:
                kwargs["ConditionExpression"] = "attribute_not_exists(pk) OR #v = :v"
                kwargs["ExpressionAttributeNames"] = {"#v": "version"}
                kwargs["ExpressionAttributeValues"] = {":v": {"N": str(known)}}
            self._call(f"delete job memory {key}",
                       lambda kw=kwargs: self.client.delete_item(**kw))  # type: ignore[misc]
            self._versions.pop(key, None)

    def append_audit(self, records: list[AuditRecord]) -> None:
        items = {}
        for r in records:  # the record's id makes its key: written twice, one item
            sk = fit_key(f"{r.time:017.6f}#{r.id}", KEY_MAX)
            items[sk] = {"PutRequest": {"Item": {
                "pk": {"S": AUDIT}, "sk": {"S": sk}, "job_key": {"S": r.job_key},
                "action": {"S": r.action.value}, "data": {"S": json.dumps(r.to_dict())},
                "expires_at": {"N": str(int(r.time + self.audit_ttl_s))}}}}
        requests = list(items.values())
        for i in range(0, len(requests), BATCH_MAX):
            self._batch(requests[i:i + BATCH_MAX])

    def _batch(self, requests: list[dict[str, Any]]) -> None:
        left = requests
        for attempt in range(BATCH_TRIES):
            page = self._call("append to the audit log", lambda: self.client.batch_write_item(
                RequestItems={self.table: left}))  # noqa: B023
            left = page.get("UnprocessedItems", {}).get(self.table, [])
            if not left:
                return
            time.sleep(0.05 * 2 ** attempt)  # throttled: back off, then the rest again
        raise StateStoreError(f"DynamoDB table {self.table}: cannot append to the audit log: "
                              f"{len(left)} records still unprocessed after {BATCH_TRIES} tries")

    def audit_log(self, job_key: str | None = None) -> list[AuditRecord]:
        items = self._query(AUDIT, "read the audit log")
        return [AuditRecord.from_dict(json.loads(i["data"]["S"])) for i in items
                if job_key is None or i["job_key"]["S"] == job_key]

    # --- left by event-driven invocations for the next tick ----------------------------

    def put_event(self, job_name: str, event: dict[str, Any], modified: float) -> bool:
        """Keep ``event`` for the next tick unless a newer one is already kept. False when
        the stored event is newer (this one arrived out of order)."""
        try:
            self._call(f"keep the state-change event of {job_name}", lambda: self.client.put_item(
                TableName=self.table,
                Item={"pk": {"S": EVENT}, "sk": {"S": job_name},
                      "data": {"S": json.dumps(event, default=str)},
                      "modified": {"N": repr(modified)},
                      "expires_at": self._expires(PENDING_TTL_S)},
                ConditionExpression="attribute_not_exists(pk) OR #m <= :m",
                ExpressionAttributeNames={"#m": "modified"},
                ExpressionAttributeValues={":m": {"N": repr(modified)}}))
        except StateConflict:
            return False
        return True

    def pending_events(self) -> list[PendingEvent]:
        return [PendingEvent(i["sk"]["S"], json.loads(i["data"]["S"]),
                             float(i["modified"]["N"]))
                for i in self._query(EVENT, "read kept state-change events")]

    def consume_event(self, pending: PendingEvent) -> None:
        """Drop an event the tick used, unless a newer one replaced it meanwhile."""
        with contextlib.suppress(StateConflict):  # a newer event: the next tick reads it
            self._call(f"drop the used event of {pending.job_name}",
                       lambda: self.client.delete_item(
                           TableName=self.table,
                           Key={"pk": {"S": EVENT}, "sk": {"S": pending.job_name}},
                           ConditionExpression="#m = :m",
                           ExpressionAttributeNames={"#m": "modified"},
                           ExpressionAttributeValues={":m": {"N": repr(pending.modified)}}))

    def add_log_lines(self, job_name: str, scope: str, lines: list[tuple[float, str]]) -> None:
        values = [{"M": {"t": {"N": repr(t)}, "text": {"S": text}}} for t, text in lines]
        self._call(f"keep log lines of {job_name}", lambda: self.client.update_item(
            TableName=self.table, Key={"pk": {"S": LOGS}, "sk": {"S": job_name}},
            UpdateExpression="SET #l = list_append(if_not_exists(#l, :empty), :new), "
                             "#a = if_not_exists(#a, :nomap), #sc = :scope, #e = :exp "
                             "ADD #n :one",
            ExpressionAttributeNames={"#l": "lines", "#a": "alarmed", "#sc": "scope",
                                      "#e": "expires_at", "#n": "appends"},
            ExpressionAttributeValues={":empty": {"L": []}, ":new": {"L": values},
                                       ":nomap": {"M": {}}, ":scope": {"S": scope},
                                       ":one": {"N": "1"},
                                       ":exp": self._expires(PENDING_TTL_S)}))

    def claim_log_alarm(self, job_name: str, signature: str, at: float) -> bool:
        """True for the first caller only: that one sends the immediate alarm. Call after
        ``add_log_lines`` (which creates the item and its ``alarmed`` map)."""
        try:
            self._call(f"claim the {signature} alarm of {job_name}",
                       lambda: self.client.update_item(
                           TableName=self.table, Key={"pk": {"S": LOGS}, "sk": {"S": job_name}},
                           UpdateExpression="SET #a.#s = :at",
                           ConditionExpression="attribute_not_exists(#a.#s)",
                           ExpressionAttributeNames={"#a": "alarmed", "#s": signature},
                           ExpressionAttributeValues={":at": {"N": repr(at)}}))
        except StateConflict:
            return False
        return True

    def release_log_alarm(self, job_name: str, signature: str, at: float) -> None:
        """Undo this caller's claim (its alarm reached no sink): the next tick, seeing no
        claim, raises the finding itself."""
        with contextlib.suppress(StateConflict):  # claimed again since: theirs now
            self._call(f"release the {signature} alarm of {job_name}",
                       lambda: self.client.update_item(
                           TableName=self.table, Key={"pk": {"S": LOGS}, "sk": {"S": job_name}},
                           UpdateExpression="REMOVE #a.#s",
                           ConditionExpression="#a.#s = :at",
                           ExpressionAttributeNames={"#a": "alarmed", "#s": signature},
                           ExpressionAttributeValues={":at": {"N": repr(at)}}))

    def load_job(self, job_key: str) -> JobMemory | None:
        item = self._call(f"read job memory {job_key}", lambda: self.client.get_item(
            TableName=self.table, Key={"pk": {"S": JOB}, "sk": {"S": fit_key(job_key, KEY_MAX)}},
            ConsistentRead=True)).get("Item")
        if item is None:
            return None
        self._versions[job_key] = int(item["version"]["N"])
        return JobMemory.from_json(item["data"]["S"])

    def pending_logs(self) -> list[PendingLogs]:
        out = []
        for i in self._query(LOGS, "read kept log lines"):
            lines = [(float(v["M"]["t"]["N"]), v["M"]["text"]["S"])
                     for v in i.get("lines", {}).get("L", [])]
            alarmed = {k: float(v["N"]) for k, v in i.get("alarmed", {}).get("M", {}).items()}
            out.append(PendingLogs(i["sk"]["S"], i.get("scope", {}).get("S", ""),
                                   lines[-MAX_LINES:], alarmed,
                                   int(i.get("appends", {}).get("N", "0"))))
        return out

    def consume_logs(self, pending: PendingLogs) -> None:
        """Drop lines the tick used, unless more arrived meanwhile."""
        with contextlib.suppress(StateConflict):  # new lines: the next tick reads them
            self._call(f"drop the used log lines of {pending.job_name}",
                       lambda: self.client.delete_item(
                           TableName=self.table,
                           Key={"pk": {"S": LOGS}, "sk": {"S": pending.job_name}},
                           ConditionExpression="#n = :n",
                           ExpressionAttributeNames={"#n": "appends"},
                           ExpressionAttributeValues={":n": {"N": str(pending.count)}}))


def create_table(client: Any, table: str) -> None:
    """The table as the stack creates it (for tests and local runs)."""
    client.create_table(
        TableName=table, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                   {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                              {"AttributeName": "sk", "AttributeType": "S"}])
    client.get_waiter("table_exists").wait(TableName=table)
    client.update_time_to_live(TableName=table, TimeToLiveSpecification={
        "Enabled": True, "AttributeName": "expires_at"})
