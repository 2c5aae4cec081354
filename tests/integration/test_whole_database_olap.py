"""A whole database into the StarRocks and Doris emulators through the packaged job (issue 26): tables not listed in
job.toml take their columns (and, with change events, their key) from the target's own table; wide types at their
edges load exactly, and a value the column cannot hold is a dead letter with its reason, never rounded or wrapped; the
driver is SIGKILLed after a batch's PREPARED record and restarted; every table then equals the source row by row.
"""
from __future__ import annotations

import datetime as dt
import json
import signal
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from streaming_sink.targets import PASSWORD_ENV, USER_ENV
from tests.support.jobs import DEAD_LETTERS, ConfigJob, job_toml, local_spark

pytestmark = pytest.mark.slow

DB = "shop"
#: the target's tables; the job lists none of them, so it takes these columns (and keys) from the emulator
MEASURES = [("id", "BIGINT NOT NULL"), ("counter", "BIGINT"), ("big", "LARGEINT"), ("amount", "DECIMAL(10,2)"),
            ("at", "DATETIME"), ("note", "VARCHAR(64)")]
#: `name` NOT NULL, as most real tables have a column: a delete's `before` carries the key alone (replica identity)
ACCOUNTS = [("id", "BIGINT NOT NULL"), ("balance", "DECIMAL(12,2)"), ("big", "LARGEINT"), ("name", "VARCHAR(64) NOT NULL")]
DEAD_COLUMNS = [("raw_value", "STRING"), ("topic", "VARCHAR(256)"), ("partition", "INT"), ("offset", "BIGINT"),
                ("kafka_timestamp", "DATETIME"), ("reason", "VARCHAR(1024)")]
KEYED = {"starrocks": "PRIMARY_KEYS", "doris": "UNIQUE_KEYS"}
#: CI runs the change-events job into StarRocks; into Doris (the same frame and writers, its own load format:
#: test_doris_target.py) in the extended suite
PRODUCTS = ["starrocks", pytest.param("doris", marks=pytest.mark.extended)]
BIGINT_MAX, LARGEINT_38 = 2**63 - 1, 10**38 - 1  # LARGEINT as far as Spark's DECIMAL(38,0) carries it
MESSAGES, BAD_EVERY = 40, 7  # per partition of `measures`; every 7th a value its column cannot hold
START = dt.datetime(2026, 1, 2, 3, 4, 5)


def _emulator(product: str, root: Path) -> Any:
    from tests.support.doubles.emulators.doris import DorisEmulator
    from tests.support.doubles.emulators.starrocks import StarRocksEmulator

    emulator = (StarRocksEmulator if product == "starrocks" else DorisEmulator)(root / product).start()
    emulator.create_database(DB)
    emulator.create_table(DB, "measures", MEASURES)
    emulator.create_table(DB, "accounts", ACCOUNTS, keys_type=KEYED[product], key=("id",))
    emulator.create_table(DB, DEAD_LETTERS, DEAD_COLUMNS)
    return emulator


def _job(tmp_path: Path, broker: Any, product: str, emulator: Any, prefix: str, debezium: bool) -> ConfigJob:
    job = ConfigJob(tmp_path / "job", broker.bootstrap, "unused", env={USER_ENV: "root", PASSWORD_ENV: ""})
    job.config_path.write_text(job_toml(
        job_id="demo-ingest", data_dir="data",
        kafka={"bootstrap_servers": broker.bootstrap, "topic_pattern": rf"^{prefix}\..+$", "max_offsets_per_trigger": 25,
               **({"format": "debezium"} if debezium else {})},
        routing={"topic_table": rf"^{prefix}\.public\.(.+)$"}, tables=None,
        target={"url": f"{product}://127.0.0.1:{emulator.fe_port}", "database": DB, "options": {"backoff_s": 0.05}},
        dead_letters={"table": DEAD_LETTERS}, sink={"metadata_columns": False}, spark=local_spark(),
    ))
    return job


def _bad(offset: int) -> tuple[dict[str, Any], str]:
    """A message one of whose values its column cannot hold, and the reason its dead letter must give."""
    where = "column {!r} of measures ({})"
    unparsed = "not valid JSON for the schema of measures: field "  # a value Spark's parser cannot read as its type
    kinds = [
        ({"counter": BIGINT_MAX + 1}, f"{unparsed}'counter' holds {BIGINT_MAX + 1}, which does not parse as BIGINT "
                                      "(column type BIGINT)"),
        ({"amount": 1.234}, where.format("amount", "DECIMAL(10,2)") + ": more than 2 decimal places, would be rounded"),
        ({"amount": 123456789.5}, f"{unparsed}'amount' holds 1.234567895E8, which does not parse as DECIMAL(10,2) "
                                  "(column type DECIMAL(10,2))"),
        ({"at": "10000-01-01 00:00:00"}, where.format("at", "DATETIME") + ": time outside 0000-01-01 .. 9999-12-31 (UTC)"),
        ({"at": "2026-01-02 03:04:05.5"}, None),  # StarRocks keeps the fraction; Doris' DATETIME is DATETIME(0)
    ]
    return kinds[(offset // BAD_EVERY) % len(kinds)]


def _measures(product: str, topic: str) -> tuple[dict[int, list[str]], list[tuple], list[tuple]]:
    """(partition -> messages, the rows `measures` must hold, the dead letters they must make)."""
    messages: dict[int, list[str]] = {0: [], 1: []}
    rows, dead = [], []
    for partition in (0, 1):
        for offset in range(MESSAGES):
            ident = partition * 1000 + offset
            sign = 1 if ident % 2 else -1
            counter = BIGINT_MAX - ident if sign > 0 else -BIGINT_MAX - 1 + ident  # BIGINT at both bounds
            big = sign * (LARGEINT_38 - ident)
            amount = sign * Decimal(ident * 1_000_003 % 99_999_999) / 100  # up to 8 integer digits, 2 places
            at = START + dt.timedelta(seconds=ident)
            body = {"id": ident, "counter": counter, "big": big, "amount": float(amount), "at": f"{at:%Y-%m-%d %H:%M:%S}",
                    "note": f"n{ident}"}
            if offset % BAD_EVERY == BAD_EVERY - 1:
                change, reason = _bad(offset)
                body.update(change)
                if reason is None and product == "doris":
                    reason = "column 'at' of measures (DATETIME): keeps 0 digits of a second, would truncate"
                if reason is None:
                    at = dt.datetime.fromisoformat(body["at"])
            else:
                reason = None
            raw = json.dumps(body)
            messages[partition].append(raw)
            if reason is None:
                rows.append((ident, counter, big, amount, at, f"n{ident}"))
            else:
                dead.append((raw, topic, partition, offset, reason))
    return messages, rows, dead


def _verify(job: ConfigJob, emulator: Any, expected: dict[str, list[tuple]]) -> None:
    for table, want in expected.items():
        got = sorted(_normal(row) for row in emulator.visible_rows(DB, table))
        if table == DEAD_LETTERS:  # kafka_timestamp is the broker's: compared as present
            assert all(row[4] is not None for row in got), got[:3]
            got = sorted(row[:4] + row[5:] for row in got)
        want = sorted(_normal(row) for row in want)
        assert len(got) == len(want), f"{table}: {len(got)} rows, the source says {len(want)}: {sorted(set(got) ^ set(want))[:4]}"
        assert got == want, f"{table}: rows differ from the source: {sorted(set(got) ^ set(want))[:4]}"
    job.verify_journal()


def _normal(row: tuple) -> tuple:
    """A row as both sides compare it: decimals by value with two places, times without a zone."""
    return tuple(f"{value + 0:.2f}" if isinstance(value, Decimal) else value for value in row)  # + 0: -0.00 is 0.00


@pytest.mark.extended  # CI: a JSON whole database through a kill (test_whole_database.py), changes into StarRocks below
@pytest.mark.parametrize("product", ["starrocks", "doris"])
def test_json_into_derived_tables_with_wide_values_through_a_kill(tmp_path, kafka_broker, product):
    prefix = f"wdo{tmp_path.name[-6:].replace('_', '')}"
    emulator = _emulator(product, tmp_path)
    try:
        job = _job(tmp_path, kafka_broker, product, emulator, prefix, debezium=False)
        topic = f"{prefix}.public.measures"
        kafka_broker.create_topic(topic, 2)
        messages, rows, dead = _measures(product, topic)
        for partition, values in messages.items():
            kafka_broker.produce(topic, values, partition=partition)
        missing = f"{prefix}.public.refunds"  # the target has no such table: its messages are dead letters
        kafka_broker.create_topic(missing, 1)
        kafka_broker.produce(missing, ['{"id": 1}'], partition=0)

        assert job.run(0, crash_at="after-prepared-record@2") == -signal.SIGKILL, job.log_tail(0)
        record, done = job.batch(2)
        assert record.state.value == "PREPARED" and not done
        assert job.run(1) == 0, job.log_tail(1)

        [(raw, _, partition, offset, _, reason)] = [row for row in emulator.visible_rows(DB, DEAD_LETTERS)
                                                    if row[1] == missing]
        assert (raw, partition, offset) == ('{"id": 1}', 0, 0) and reason.startswith(f"topic {missing} maps to table refunds: ")
        dead.append((raw, missing, partition, offset, reason))
        _verify(job, emulator, {"measures": rows, DEAD_LETTERS: dead})
    finally:
        emulator.stop()


def _event(op: str, row: dict[str, Any] | None, before: dict[str, Any] | None = None) -> str:
    return json.dumps({"before": before, "after": row, "op": op, "source": {"connector": "postgresql"}})


def _accounts(topic: str) -> tuple[dict[int, list[str]], list[tuple], list[tuple]]:
    """Hand-made Debezium events (inserts, updates, deletes, re-inserts; tombstones after deletes) keyed by id, each
    key in one partition as Debezium keys them: (partition -> messages, the rows `accounts` must end with, the dead
    letters)."""
    messages: dict[int, list[str | None]] = {0: [], 1: []}
    current: dict[int, tuple] = {}
    dead = []
    for step in range(4):
        for key in range(20):
            partition = key % 2
            sign = 1 if key % 3 else -1
            row = {"id": key, "balance": f"{sign * (key * 1000 + step)}.{step}5", "big": sign * (LARGEINT_38 - key - step),
                   "name": f"k{key} v{step}"}
            if step == 0 or (step == 3 and key % 5 == 0):
                messages[partition].append(_event("c" if step else "r", row))
            elif step == 1 and key % 4 == 0:
                messages[partition] += [_event("d", None, {"id": key}), None]
                current.pop(key, None)
                continue
            elif key % 3 == step % 3:
                messages[partition].append(_event("u", row, {"id": key}))
            else:
                continue
            current[key] = (key, Decimal(row["balance"]), row["big"], row["name"])
    bad = _event("u", {"id": 7, "balance": "1.234", "big": 1, "name": "x"})  # one place too many: not rounded
    messages[1].append(bad)
    dead.append((bad, topic, 1, len(messages[1]) - 1,
                 "column 'balance' of accounts (DECIMAL(12,2)): more than 2 decimal places, would be rounded"))
    return messages, sorted(current.values()), dead  # type: ignore[arg-type]


def _produce_with_tombstones(broker: Any, topic: str, partition: int, values: list[str | None]) -> None:
    """In order; a tombstone (None) keyed by the id of the delete before it, as Debezium sends it."""
    run: list[str] = []
    for value in [*values, ""]:
        if value:
            run.append(value)
            continue
        if run:
            broker.produce(topic, run, partition=partition)
        if value is None:
            broker.produce(topic, [None], key=json.dumps({"id": json.loads(run[-1])["before"]["id"]}), partition=partition)
        run = []


@pytest.mark.parametrize("product", PRODUCTS)
def test_change_events_into_derived_keyed_tables_through_a_kill(tmp_path, kafka_broker, product):
    prefix = f"wdc{tmp_path.name[-6:].replace('_', '')}"
    emulator = _emulator(product, tmp_path)
    try:
        job = _job(tmp_path, kafka_broker, product, emulator, prefix, debezium=True)
        topic = f"{prefix}.public.accounts"
        kafka_broker.create_topic(topic, 2)
        messages, rows, dead = _accounts(topic)
        for partition, values in messages.items():
            _produce_with_tombstones(kafka_broker, topic, partition, values)

        assert job.run(0, crash_at="after-prepared-record@2") == -signal.SIGKILL, job.log_tail(0)
        assert job.run(1) == 0, job.log_tail(1)
        got = sorted(_normal(row[:len(ACCOUNTS)]) for row in emulator.visible_rows(DB, "accounts"))
        assert got == sorted(_normal(row) for row in rows), f"accounts differ from the source: {got[:4]}"
        _verify(job, emulator, {DEAD_LETTERS: dead})
    finally:
        emulator.stop()
