"""Values a ClickHouse column would alter silently (wrap, clamp, default, truncate, round) or refuse
(wedging the batch) go to the dead-letter table with a reason naming the column; the rest arrive
exactly as sent. Real engine (chdb), embedded (writers in the driver) and over HTTP through the test
front (writers in Spark tasks); the packaged job's frame, one batch through the sink."""
from __future__ import annotations

import base64
import datetime as dt
import decimal
import json

import pytest

from streaming_sink.frame import build_frame, check_columns, resolve_tables, table_schemas, table_slots
from streaming_sink.job_spec import JobSpec
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import FileStateStore
from streaming_sink.targets import descriptor_for

DB = "analytics"
SCHEMA = "id BIGINT NOT NULL, small INT, day DATE, at TIMESTAMP, code STRING, ratio DOUBLE, note STRING, price DECIMAL(10,3)"
KAFKA = "value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP"
GOOD = {"table": "readings", "id": 1, "small": -128, "day": "1970-01-01", "at": "2024-03-31T01:30:00Z", "code": "abc",
        "ratio": 0.5, "note": "", "price": "1234.56"}


def message(**changes: object) -> dict:
    return {**GOOD, **changes}


# (message, the dead-letter reason's distinguishing words; None: arrives as sent)
CASES: list[tuple[object, str | None]] = [
    (GOOD, None),
    (message(id=2, small=127, day="2149-06-06", code="xyz", ratio=-0.25, note="é𝄞", price="-9999.99"), None),
    (message(id=3, small=300), "column 'small' of readings (Int8): integer out of range [-128, 127]"),
    (message(id=4, note=None), "column 'note' of readings (String): NULL, which the column cannot hold"),
    (message(id=5, day="1960-01-01"), "column 'day' of readings (Date): date outside 1970-01-01 .. 2149-06-06"),
    (message(id=6, at="2024-01-01T00:00:00.5Z"), "column 'at' of readings (DateTime('UTC')): keeps 0 digits of a second"),
    (message(id=7, code="abcd"), "column 'code' of readings (FixedString(3)): longer than 3 bytes"),
    (message(id=8, ratio=0.1), "column 'ratio' of readings (Float32): a double that FLOAT would round"),
    (message(id=9, price="1.005"), "column 'price' of readings (Decimal(6, 2)): more than 2 decimal places"),
    (message(id=10, price="10000"), "column 'price' of readings (Decimal(6, 2)): too many integer digits"),
]
NOT_UTF8 = b'\xff\xfe{"table": "readings", "id": 11}'


@pytest.fixture
def target(clickhouse_target):
    client = clickhouse_target.client()
    client.command(
        f"CREATE TABLE {DB}.readings (id Int64, small Int8, day Date, at DateTime('UTC'), code FixedString(3), "
        "ratio Float32, note String, price Decimal(6, 2), kafka_partition Int32, kafka_offset Int64) "
        "ENGINE = MergeTree ORDER BY id")
    client.command(f"CREATE TABLE {DB}.dead_letters (raw_value Nullable(String), topic String, partition Int32, "
                   "offset Int64, kafka_timestamp DateTime64(6), reason String) ENGINE = MergeTree ORDER BY offset")
    return clickhouse_target


def run_one_batch(spark, target, tmp_path, target_url: str, schema: str, messages: list[bytes]) -> None:
    """What the packaged job does with one batch: column types read at start, the frame, the sink."""
    job = JobSpec(
        job_id="values", bootstrap="unused", topics=["events"], target_url=target_url, database=DB,
        state_url=f"file://{tmp_path / 'state'}", checkpoint=str(tmp_path / "ckpt"), tables={"readings": schema},
        table_field="table", dead_letter_table="dead_letters",
    )
    sink = ExactlyOnceSink(target=target, state=FileStateStore(tmp_path / "state"), job_id=job.job_id,
                           table_column="__table", dead_letter_table=job.dead_letter_table)
    sink.start()
    tables = resolve_tables(job, sink.known_tables)
    sink.route_by_slots(table_slots(job, tables))
    columns = check_columns(target, descriptor_for(job.target_url).columns, table_schemas(job, tables))
    rows = [(bytearray(value), "events", 0, offset, dt.datetime(2026, 1, 1)) for offset, value in enumerate(messages)]
    sink.process(build_frame(spark.createDataFrame(rows, KAFKA), job, tables, columns), 0, "q")


def test_values_a_column_cannot_hold_are_dead_letters_naming_the_column(spark_session, target, tmp_path):
    messages = [json.dumps(m).encode() for m, _ in CASES] + [NOT_UTF8]
    run_one_batch(spark_session, target, tmp_path, target.url, SCHEMA, messages)

    client = target.client()
    loaded = client.query(
        f"SELECT id, small, day, toString(at), toString(code), ratio, note, price FROM {DB}.readings ORDER BY id").result_rows
    assert loaded == [
        (1, -128, dt.date(1970, 1, 1), "2024-03-31 01:30:00", "abc", 0.5, "", decimal.Decimal("1234.56")),
        (2, 127, dt.date(2149, 6, 6), "2024-03-31 01:30:00", "xyz", -0.25, "é𝄞", decimal.Decimal("-9999.99")),
    ]
    dead = dict(client.query(f"SELECT offset, reason FROM {DB}.dead_letters").result_rows)
    for offset, (_, reason) in enumerate(CASES):
        if reason is None:
            assert offset not in dead
        else:
            assert reason in dead.pop(offset)
    (reason,) = [dead.pop(len(CASES))]
    assert reason.startswith("message is not valid UTF-8")
    assert dead == {}
    (stored,) = client.query(f"SELECT raw_value FROM {DB}.dead_letters WHERE offset = {len(CASES)}").result_rows[0]
    assert base64.b64decode(stored) == NOT_UTF8  # the bytes, losslessly


OLAP_SCHEMA = "id BIGINT NOT NULL, small INT, ratio DOUBLE, at TIMESTAMP, price DECIMAL(10,3)"
OLAP_GOOD = {"table": "readings", "id": 1, "small": 127, "ratio": 0.5, "at": "2024-03-31T01:30:00Z", "price": "1.5"}
PAD = "x" * 70_000  # a message longer than StarRocks' STRING (65,533 bytes), which `_schema` calls VARCHAR


@pytest.mark.parametrize("product", ["starrocks", "doris"])
def test_starrocks_and_doris_columns_read_from_schema_send_misfits_to_dead_letters(spark_session, tmp_path, product):
    """The same checks through the FE's `_schema` (no lengths there): TINYINT range, NaN, Doris DATETIME's
    whole seconds, decimal places; and a dead letter whose message is longer than StarRocks' STRING keeps
    its coordinates instead of wedging the batch."""
    from streaming_sink.targets.doris import DorisTarget
    from streaming_sink.targets.starrocks import StarRocksTarget
    from tests.support.doubles.emulators.doris import DorisEmulator
    from tests.support.doubles.emulators.starrocks import StarRocksEmulator

    cases: list[tuple[object, str | None]] = [
        (OLAP_GOOD, None),
        ({**OLAP_GOOD, "id": 2, "small": 300}, "column 'small' of readings (TINYINT): integer out of range [-128, 127]"),
        ({**OLAP_GOOD, "id": 3, "ratio": float("nan")}, "column 'ratio' of readings (DOUBLE): NaN or infinity"),
        ({**OLAP_GOOD, "id": 4, "price": "1.005"}, "column 'price' of readings (DECIMAL(6,2)): more than 2 decimal places"),
        ({**OLAP_GOOD, "id": 5, "at": "2024-01-01T00:00:00.5Z"},
         "column 'at' of readings (DATETIME): keeps 0 digits of a second" if product == "doris" else None),
    ]
    if product == "starrocks":
        cases.append(({**OLAP_GOOD, "id": 6, "small": 999, "pad": PAD},
                      "integer out of range [-128, 127]; raw_value left empty: the message is longer than the 65533 bytes"))
    emulator = StarRocksEmulator(tmp_path / "sr") if product == "starrocks" else DorisEmulator(tmp_path / "doris")
    with emulator as emu:
        emu.create_table(DB, "readings", [("id", "BIGINT"), ("small", "TINYINT"), ("ratio", "DOUBLE"),
                                          ("at", "DATETIME"), ("price", "DECIMAL(6,2)"), ("kafka_partition", "INT"),
                                          ("kafka_offset", "BIGINT")])
        emu.create_table(DB, "dead_letters", [("raw_value", "STRING"), ("topic", "VARCHAR(100)"), ("partition", "INT"),
                                              ("offset", "BIGINT"), ("kafka_timestamp", "DATETIME(6)"), ("reason", "STRING")])
        target_class = StarRocksTarget if product == "starrocks" else DorisTarget
        target = target_class(emu.fe_url, DB, "root", "", tables=["readings", "dead_letters"])
        run_one_batch(spark_session, target, tmp_path, f"{product}://unused", OLAP_SCHEMA, [json.dumps(m).encode() for m, _ in cases])

        loaded = sorted(row["id"] for row in emu.visible_dicts(DB, "readings"))
        assert loaded == [m["id"] for m, reason in cases if reason is None]
        dead = {row["offset"]: row for row in emu.visible_dicts(DB, "dead_letters")}
        assert set(dead) == {offset for offset, (_, reason) in enumerate(cases) if reason is not None}
        for offset, (_, reason) in enumerate(cases):
            if reason is not None:
                assert reason in dead[offset]["reason"], dead[offset]["reason"]
        if product == "starrocks":
            assert dead[len(cases) - 1]["raw_value"] is None  # the message stays in Kafka, at this row's offset
