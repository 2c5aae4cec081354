"""The change-data stack delivers real change events: PostgreSQL -> Debezium on Kafka Connect -> Kafka.

The change-stream tests of the sink stand on this stack, so here its output is checked on its own, exactly: every
row change of a known workload arrives once with the right op (``r`` snapshot, ``c``, ``u``, ``d``), each delete is
followed by a tombstone, ``source.lsn`` orders each key's changes, and replaying the topics onto an empty table
gives exactly the rows PostgreSQL holds. Both JSON forms the sink must read are covered: with the converter's
schemas (``{"schema", "payload"}``) and without (the bare envelope).

One PostgreSQL and one Connect worker serve the module; each test adds a connector with its own slot and topics.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.support.change_data import (
    ChangeWorkload,
    add_connector,
    await_last_transaction,
    change_topics,
    create_tables,
    current_rows,
)
from tests.support.services._proc import wait_until
from tests.support.services.kafka import KafkaBroker
from tests.support.services.kafka_connect import KafkaConnect
from tests.support.services.postgres import PostgresServer

pytestmark = pytest.mark.slow

PARTITIONS = 2  # keys spread over partitions: a key's order holds within its partition only


@dataclass(frozen=True)
class Event:
    """One record of a change topic: its place, its key, and its envelope (None for a tombstone)."""

    partition: int
    offset: int
    key: int
    envelope: dict[str, Any] | None


def _json(raw: bytes, schemas: bool) -> dict[str, Any]:
    document = json.loads(raw)
    assert isinstance(document, dict)
    if schemas:
        assert set(document) == {"schema", "payload"}, sorted(document)
        assert isinstance(document["payload"], dict)
        return document["payload"]
    assert "schema" not in document and "payload" not in document, sorted(document)
    return document


def _read(broker: KafkaBroker, topic: str, schemas: bool) -> list[Event]:
    events = []
    for partition, offset, key, value in broker.consume_all(topic):
        assert key is not None, f"{topic}[{partition}]@{offset} has no key"
        envelope = None if value is None else _json(value, schemas)
        events.append(Event(partition, offset, int(_json(key, schemas)["id"]), envelope))
    return sorted(events, key=lambda e: (e.partition, e.offset))


def _row(values: dict[str, Any]) -> dict[str, Any]:
    # decimal.handling.mode=string: numeric arrives as its exact decimal text.
    return {column: Decimal(value) if column == "balance" and value is not None else value
            for column, value in values.items()}


def _replay(events: list[Event]) -> dict[int, dict[str, Any]]:
    """A table rebuilt from its change topic: upsert `after`, delete `before`'s key, in (partition, offset) order."""
    replayed: dict[int, dict[str, Any]] = {}
    for event in events:  # a key lives in one partition, so its changes are in order
        if event.envelope is None:
            continue  # a tombstone: log compaction's marker, the delete event before it already applied
        if event.envelope["op"] == "d":  # a delete re-sent after a crash finds its key gone already
            replayed.pop(int(event.envelope["before"]["id"]), None)
        else:
            replayed[event.key] = _row(event.envelope["after"])
    return replayed


@pytest.mark.parametrize("schemas", [True, False], ids=["with-schemas", "schemaless"])
def test_debezium_delivers_every_change_of_the_workload_once_and_in_order(
    postgres: PostgresServer, kafka_connect: KafkaConnect, kafka_broker: KafkaBroker, schemas: bool
) -> None:
    workload = ChangeWorkload(seed=27 if schemas else 28)
    with postgres.connect() as conn:
        workload.run(conn, 12)  # before the connector: its snapshot (ops `r`)
        snapshot = current_rows(conn)
        prefix, _ = add_connector(kafka_connect, postgres, schemas=schemas, partitions=PARTITIONS)
        applied = workload.run(conn, 60)
        truth = current_rows(conn)
    assert {op for _, op in applied.changes} == {"c", "u", "d"}, applied.changes
    assert sum(applied.reinserted.values()) > 0, "the workload re-inserted no deleted key"
    topics = change_topics(prefix)
    await_last_transaction(kafka_broker, topics, applied, kafka_connect)
    events = {table: _read(kafka_broker, topic, schemas) for table, topic in topics.items()}

    deleted_then_inserted = 0
    for table, table_events in events.items():
        changes = [e for e in table_events if e.envelope is not None]
        ops = Counter(e.envelope["op"] for e in changes if e.envelope)
        expected = Counter({"r": len(snapshot[table]), **{op: applied.changes[(table, op)] for op in "cud"}})
        assert ops == +expected, f"{table}: ops {dict(ops)}, workload made {dict(expected)}"

        by_place = {(e.partition, e.offset): e for e in table_events}
        lsns: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for event in changes:
            envelope = event.envelope
            assert envelope is not None and envelope["source"]["table"] == table
            lsn = envelope["source"]["lsn"]
            assert isinstance(lsn, int) and lsn > 0, envelope["source"]
            lsns[event.key].append((envelope["op"], lsn))
            if envelope["op"] == "r":
                assert _row(envelope["after"]) == snapshot[table][event.key]
            if envelope["op"] == "d":
                after = by_place.get((event.partition, event.offset + 1))
                assert after is not None and after.envelope is None and after.key == event.key, (
                    f"{table}: no tombstone right after the delete of key {event.key} at "
                    f"{event.partition}@{event.offset}")
        deleted_then_inserted += sum("dc" in "".join(op for op, _ in history) for history in lsns.values())
        for key, history in lsns.items():
            streamed = [lsn for op, lsn in history if op != "r"]
            assert streamed == sorted(set(streamed)), f"{table} key {key}: streamed lsns not increasing {history}"
            # A snapshot row carries the snapshot's LSN: the next WAL record, the key's first streamed change
            # perhaps, may start at that very LSN, so here the order is only "not after".
            assert all(lsn <= streamed[0] for op, lsn in history if op == "r" and streamed), history

        replayed = _replay(table_events)
        assert replayed == truth[table], f"{table}: replaying the topic does not give PostgreSQL's rows"
    assert deleted_then_inserted > 0, "no key was deleted and inserted again while the connector streamed"


def test_postgres_runs_unprivileged_with_logical_replication(postgres: PostgresServer) -> None:
    """initdb refuses root: the server runs as an ordinary account, with what Debezium's pgoutput needs."""
    with postgres.connect() as conn:
        settings = {str(name): str(value) for name, value in conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN ('wal_level', 'listen_addresses')").fetchall()}
        replication = conn.execute("SELECT rolreplication FROM pg_roles WHERE rolname = current_user").fetchone()
    assert settings == {"wal_level": "logical", "listen_addresses": "127.0.0.1"}
    assert replication == (True,)
    assert Path(postgres.data_dir).stat().st_uid != 0


def test_postgres_comes_back_after_a_kill_with_its_committed_rows(tmp_path: Path) -> None:
    """A crash test kills the server and starts it again: same port, same data (recovered from the WAL)."""
    with PostgresServer(tmp_path / "pg") as server:
        with server.connect() as conn:
            create_tables(conn)
            ChangeWorkload(seed=5).run(conn, 20)
            before = current_rows(conn)
        port, data = server.port, server.data_dir
        server.kill()
        server.start()
        assert (server.port, server.data_dir) == (port, data)
        with server.connect() as conn:
            assert current_rows(conn) == before
    assert not data.exists()


def test_a_killed_worker_restarts_from_its_offsets_and_loses_no_change(
    postgres: PostgresServer, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """Connect delivers at least once: after a crash it re-sends what it had not recorded, never skips a change.

    Killed while it streams (its offsets recorded once, the newest changes in flight), then changes made while it
    is down (PostgreSQL keeps them in the slot), then it comes back: every change arrives, re-sent ones are whole
    copies, and replaying the topics still gives PostgreSQL's rows.
    """
    workload = ChangeWorkload(seed=29)
    with KafkaConnect(tmp_path / "connect", kafka_broker.bootstrap) as worker, postgres.connect() as conn:
        snapshot = current_rows(conn)
        prefix, slot = add_connector(worker, postgres)
        topics = change_topics(prefix)
        config = worker.config(prefix)
        made = [workload.run(conn, 20)]
        await_last_transaction(kafka_broker, topics, made[-1], worker)
        # A worker killed before it ever recorded a streaming offset starts over with a new snapshot on restart
        # (snapshot.mode=initial): then the changes in between arrive as that snapshot, not one by one.
        wait_until(lambda: b'"lsn_proc"' in worker.offsets_path.read_bytes(), timeout=60,
                   what="the worker's first recorded streaming offset")
        made.append(workload.run(conn, 30))
        worker.kill()  # at once: the newest changes are in flight, their offsets not recorded
        wait_until(lambda: not postgres.replication_slots()[slot], timeout=60, what=f"slot {slot} released")
        made.append(workload.run(conn, 30))  # while the worker is down: kept in the slot
        worker.start()
        worker.add_connector(prefix, config)  # a standalone worker keeps connectors in memory only; offsets on disk
        made.append(workload.run(conn, 10))
        truth = current_rows(conn)
        await_last_transaction(kafka_broker, topics, made[-1], worker)
    for table, topic in topics.items():
        events = _read(kafka_broker, topic, schemas=True)
        distinct = {(e.key, e.envelope["op"], e.envelope["source"]["lsn"]) for e in events if e.envelope}
        expected = Counter({"r": len(snapshot[table])})
        for applied in made:
            expected.update({op: applied.changes[(table, op)] for op in "cud"})
        assert Counter(op for _, op, _ in distinct) == +expected, f"{table}: changes lost or invented"
        assert _replay(events) == truth[table], f"{table}: replaying the topic does not give PostgreSQL's rows"
