"""A change-data workload on a real PostgreSQL database, and its ground truth.

Two tables, ``customers`` and ``orders``, take deterministic random inserts, updates, deletes and re-inserts of
deleted keys, in small transactions (one change or several, sometimes several of one key). What a change-data test
compares its target with is :func:`current_rows`: the rows PostgreSQL holds now.

The workload picks its keys from what the tables hold when a run starts (plus its seed), so several runs, and
several workloads, can follow each other on one database, e.g. rows before a connector starts (its snapshot) and
changes after.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import dict_row

#: Table name -> its DDL. Primary keys are the keys of the change events; types cover what Debezium maps
#: differently (int32/int64, text with nulls, numeric as a decimal string, boolean).
TABLES = {
    "customers": "CREATE TABLE IF NOT EXISTS customers ("
    "id integer PRIMARY KEY, name text, balance numeric(12,2), active boolean NOT NULL)",
    "orders": "CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, customer_id integer, note text)",
}
SCHEMA = "public"

#: Debezium's op codes for the changes the workload makes.
INSERT, UPDATE, DELETE = "c", "u", "d"


def create_tables(conn: psycopg.Connection[Any]) -> None:
    """Create the workload's tables if missing (the connecting user owns them: Debezium's publication needs it)."""
    with conn.transaction():
        for ddl in TABLES.values():
            conn.execute(ddl)


def qualified_tables() -> list[str]:
    """``schema.table`` names, as Debezium's ``table.include.list`` and topic names spell them."""
    return [f"{SCHEMA}.{table}" for table in TABLES]


def current_rows(conn: psycopg.Connection[Any]) -> dict[str, dict[int, dict[str, Any]]]:
    """The ground truth: table -> primary key -> row (column -> value; numeric as Decimal), read in one snapshot."""
    result: dict[str, dict[int, dict[str, Any]]] = {}
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        for table in TABLES:
            with conn.cursor(row_factory=dict_row) as cursor:
                rows = cursor.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
            result[table] = {int(row["id"]): dict(row) for row in rows}
    return result


@dataclass
class Applied:
    """What one :meth:`ChangeWorkload.run` did: its row changes, and the id of its last transaction."""

    changes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (table, op) -> count
    last_txid: int = 0
    last_transaction: Counter[str] = field(default_factory=Counter)  # table -> row changes of the last transaction
    reinserted: Counter[str] = field(default_factory=Counter)  # table -> inserts of a key deleted before

    def count(self, table: str | None = None, op: str | None = None) -> int:
        return sum(n for (t, o), n in self.changes.items() if table in (None, t) and op in (None, o))


@dataclass
class _Keys:
    live: list[int]
    deleted: list[int]
    next_id: int


class ChangeWorkload:
    """Deterministic random changes: the same seed on the same starting rows makes the same changes."""

    def __init__(self, seed: int = 27, *, max_changes_per_transaction: int = 4) -> None:
        self.rng = random.Random(seed)
        self.max_changes = max_changes_per_transaction

    def run(self, conn: psycopg.Connection[Any], transactions: int, *, inserts_only: bool = False) -> Applied:
        """Make ``transactions`` committed transactions of 1..max changes each; ``inserts_only`` for seeding."""
        keys = {table: self._keys(conn, table) for table in TABLES}
        applied = Applied()
        for _ in range(transactions):
            last: Counter[str] = Counter()
            with conn.transaction():
                for _ in range(self.rng.randint(1, self.max_changes)):
                    table = self.rng.choice(sorted(TABLES))
                    op = INSERT if inserts_only else self._pick_op(keys[table])
                    if self._apply(conn, table, op, keys[table]):
                        applied.reinserted[table] += 1
                    applied.changes[(table, op)] += 1
                    last[table] += 1
                txid = conn.execute("SELECT txid_current()").fetchone()
            assert txid is not None
            applied.last_txid, applied.last_transaction = int(txid[0]), last
        return applied

    def _keys(self, conn: psycopg.Connection[Any], table: str) -> _Keys:
        live = [int(row[0]) for row in conn.execute(f"SELECT id FROM {table} ORDER BY id").fetchall()]
        conn.commit()
        top = max(live, default=0)
        # Every key up to the highest was inserted once by a workload; the missing ones were deleted.
        deleted = sorted(set(range(1, top + 1)) - set(live))
        return _Keys(live, deleted, top + 1)

    def _pick_op(self, keys: _Keys) -> str:
        if not keys.live:
            return INSERT
        roll = self.rng.random()
        if roll < 0.30:
            return INSERT
        if roll < 0.70:
            return UPDATE
        return DELETE

    def _apply(self, conn: psycopg.Connection[Any], table: str, op: str, keys: _Keys) -> bool:
        """Make one change; True when it re-inserted a deleted key."""
        if op == INSERT:
            # A deleted key comes back now and then: the sink must end with the row present.
            reinsert = bool(keys.deleted) and self.rng.random() < 0.4
            if reinsert:
                key = keys.deleted.pop(self.rng.randrange(len(keys.deleted)))
            else:
                key, keys.next_id = keys.next_id, keys.next_id + 1
            values = self._values(table, key)
            columns = ", ".join(values)
            marks = ", ".join(["%s"] * len(values))
            conn.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", list(values.values()))
            keys.live.append(key)
            return reinsert
        if op == UPDATE:
            key = self.rng.choice(keys.live)
            values = self._values(table, key)
            del values["id"]
            changed = dict(self.rng.sample(sorted(values.items()), self.rng.randint(1, len(values))))
            assignments = ", ".join(f"{column} = %s" for column in changed)
            conn.execute(f"UPDATE {table} SET {assignments} WHERE id = %s", [*changed.values(), key])
        else:
            key = keys.live.pop(self.rng.randrange(len(keys.live)))
            conn.execute(f"DELETE FROM {table} WHERE id = %s", [key])
            keys.deleted.append(key)
        return False

    def _values(self, table: str, key: int) -> dict[str, Any]:
        rng = self.rng
        if table == "customers":
            return {
                "id": key,
                "name": None if rng.random() < 0.1 else rng.choice(["Ana", "Bo", "Chloé", "Dāvis", "Eun-ji"]) + f" {rng.randint(1, 999)}",
                "balance": Decimal(rng.randint(-10**6, 10**8)) / 100,
                "active": rng.random() < 0.7,
            }
        return {
            "id": key,
            "customer_id": rng.randint(1, 50),
            "note": None if rng.random() < 0.2 else rng.choice(["gift", "express, fragile", 'say "hi"', "見本", ""]),
        }


# -- the stack around the workload: a connector per test, and waiting for its events ----------------------------


def add_connector(worker: Any, postgres: Any, *, schemas: bool = True, partitions: int = 2) -> tuple[str, str]:
    """A Debezium connector (KafkaConnect `worker`, PostgresServer `postgres`) with a slot and topics of its own;
    returns (its name = topic prefix, its slot). `partitions`: of each topic (a key's order holds within one)."""
    import uuid

    from tests.support.services._proc import wait_until
    from tests.support.services.kafka_connect import debezium_postgres_config

    run = uuid.uuid4().hex[:8]
    prefix, slot = f"cdc-{run}", f"cdc_{run}"
    worker.add_connector(prefix, debezium_postgres_config(
        postgres.debezium_properties(), topic_prefix=prefix, slot_name=slot, tables=qualified_tables(),
        schemas_enable=schemas, partitions=partitions))
    # The slot is where streaming starts: changes made once it exists are streamed, not snapshotted.
    wait_until(lambda: slot in postgres.replication_slots(), timeout=60, what=f"replication slot {slot}")
    return prefix, slot


def change_topics(prefix: str) -> dict[str, str]:
    """Table -> the topic Debezium writes its changes to, under a connector's prefix."""
    return {table: f"{prefix}.{SCHEMA}.{table}" for table in TABLES}


def await_last_transaction(broker: Any, topics: dict[str, str], applied: Applied, worker: Any) -> None:
    """Wait until every event of the workload's last transaction is in the topics (in commit order: all before it).

    On a timeout the error carries the connector's status and the worker's log.
    """
    import json

    from tests.support.services._proc import ServiceError, log_tail, wait_until

    def arrived() -> bool:
        # Only looks for the transaction id, in either JSON form: the events are checked strictly afterwards.
        for table, count in applied.last_transaction.items():
            values = [json.loads(value) for _, _, _, value in broker.consume_all(topics[table]) if value]
            txids = [value.get("payload", value)["source"]["txId"] for value in values]
            if txids.count(applied.last_txid) < count:
                return False
        return True

    try:
        wait_until(arrived, timeout=90, what=f"the last transaction's events on {sorted(topics.values())}")
    except ServiceError as exc:
        prefix = next(iter(topics.values())).split(".")[0]
        raise ServiceError(f"{exc}\nconnector status: {worker.status(prefix) if worker.running else 'worker down'}\n"
                           f"--- last lines of {worker.log_path} ---\n{log_tail(worker.log_path, 80)}") from None
