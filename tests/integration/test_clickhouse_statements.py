"""What a ClickHouse batch sends, statement by statement (issue 26: fewer round trips, no check weakened).

The happy path of a move-mode transaction reads system.tables once (its refusal at commit: engine and views in one
row), never system.columns (the NOT NULL check reads it only for a chunk that holds a NULL, the mend of a staging
table only when its move is refused for a different structure) and checks the staging table's existence once.
Each check the cuts made lazy is pinned here where it still has to fire. Embedded and over HTTP (`clickhouse_url`).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink.committable import Committable, TxnRef
from streaming_sink.labels import make_label
from streaming_sink.targets.base import CommitOutcome, TargetError
from streaming_sink.targets.clickhouse import LEDGER_TABLE, ClickHouseTarget
from streaming_sink.targets.encoding import EncodingError

DB, TABLE, ROWS = "analytics", "orders", 10
TABLE_DDL = f"CREATE TABLE {DB}.{TABLE} (id Int64, name String) ENGINE = MergeTree PARTITION BY id % 2 ORDER BY id"


class Crash(BaseException):
    """A kill -9 right after a statement: nothing after it runs."""


@pytest.fixture
def target(clickhouse_url: str) -> Iterator[ClickHouseTarget]:
    target = ClickHouseTarget(clickhouse_url, database=DB)
    target.client().command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    target.client().command(TABLE_DDL)
    target.routable_tables()
    yield target
    target.close()


def record(monkeypatch: pytest.MonkeyPatch, target: ClickHouseTarget, crash_after: str | None = None) -> list[str]:
    """Every statement the target's client sends from here on, its staging label shown as <staging>; `crash_after`:
    a Crash right after the first statement that starts with it."""
    client, sent = target.client(), []

    def recorded(method: str) -> Callable[..., Any]:
        original = getattr(client, method)

        def call(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            text = re.sub(r"ss_\w+", "<staging>", str(args[0]))
            sent.append(f"insert_arrow {text}" if method == "insert_arrow" else text)
            if crash_after and text.startswith(crash_after):
                raise Crash(text)
            return result
        return call

    for method in ("command", "query", "insert_arrow"):
        monkeypatch.setattr(client, method, recorded(method))
    return sent


def prepare(target: ClickHouseTarget, names: list[str | None] | None = None) -> Committable:
    txn = TxnRef("clickhouse", DB, TABLE, make_label("job", "query-1", 7, TABLE, 0, "e1w0t0"), 0, "e1w0t0")
    transaction = target.begin(TABLE, lambda chunk: txn, lambda recorded: None)
    transaction.write(pa.table({"id": pa.array(range(ROWS), pa.int64()),
                                "name": names if names is not None else [f"n{i}" for i in range(ROWS)]}))
    [part] = transaction.prepare()
    return part.committable("checksum")


def rows(target: ClickHouseTarget, columns: str = "id") -> list[tuple[Any, ...]]:
    return sorted(target.client().query(f"SELECT {columns} FROM {DB}.{TABLE}").result_rows)


def test_a_move_transaction_reads_the_catalog_once_and_no_columns(target, monkeypatch):
    sent = record(monkeypatch, target)
    assert target.commit(prepare(target)) is CommitOutcome.COMMITTED
    heads = [re.split(r" WHERE| VALUES| TO TABLE| FROM `", statement)[0] for statement in sent]
    assert heads == [
        f"CREATE TABLE `{DB}`.`<staging>` AS `{DB}`.`{TABLE}`",
        "insert_arrow `<staging>`",
        "SELECT count()",  # prepare
        "SELECT engine FROM system.tables",  # the staging table is there, and whether it is replicated
        "SELECT DISTINCT state",
        heads[5],  # the refusal: engine, settings and views of the table in one row of system.tables
        "SELECT partition_id, sum(rows), sum(data_uncompressed_bytes) FROM system.parts",
        f"INSERT INTO `{DB}`.`{LEDGER_TABLE}` (label, target_table, rows, state, partition_id, series, batch)",  # moving 0
        f"ALTER TABLE `{DB}`.`<staging>` MOVE PARTITION ID '0'",
        f"INSERT INTO `{DB}`.`{LEDGER_TABLE}` (label, target_table, rows, state, partition_id, series, batch)",  # moving 1
        f"ALTER TABLE `{DB}`.`<staging>` MOVE PARTITION ID '1'",
        "SELECT partition_id, sum(rows), sum(data_uncompressed_bytes) FROM system.parts",  # nothing left in staging
        f"INSERT INTO `{DB}`.`{LEDGER_TABLE}` (label, target_table, rows, state, partition_id, series, batch)",
        f"DROP TABLE IF EXISTS `{DB}`.`<staging>` SYNC",
    ]
    assert "dependencies_table" in heads[5] and "system.tables" in heads[5]
    assert rows(target) == [(i,) for i in range(ROWS)] and target.staging_tables() == []


def test_a_null_for_a_column_that_is_not_nullable_is_still_refused_naming_it(target):
    with pytest.raises(EncodingError, match="column 'name' .* not Nullable"):
        prepare(target, names=[None, *(f"n{i}" for i in range(1, ROWS))])


@pytest.mark.parametrize("crash_after", [None, "ALTER TABLE `analytics`.`<staging>` ADD COLUMN"])
def test_a_column_added_after_prepare_reaches_the_staging_table_at_its_move(target, monkeypatch, crash_after):
    """The table gains a column between prepare and commit: the first move is refused (different structure), the
    staging table gets the column in the table's place, and every row lands once with NULL there, also when the
    commit is cut right after the mend and repeated."""
    committable = prepare(target)
    target.client().command(f"ALTER TABLE {DB}.{TABLE} ADD COLUMN email Nullable(String) AFTER id")
    sent = record(monkeypatch, target, crash_after)
    if crash_after:
        with pytest.raises(Crash):
            target.commit(committable)
        monkeypatch.undo()
        assert rows(target) == []
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert sum("system.columns" in statement for statement in sent) == 1
    assert rows(target, "id, email, name") == [(i, None, f"n{i}") for i in range(ROWS)]
    assert target.staging_tables() == []


def test_a_difference_the_commit_cannot_mend_stops_it_with_the_servers_error_and_moves_nothing(target):
    committable = prepare(target)
    target.client().command(f"ALTER TABLE {DB}.{TABLE} MODIFY COLUMN name Nullable(String)")
    with pytest.raises(TargetError, match="different structure"):
        target.commit(committable)
    assert rows(target) == [] and target.staging_tables() == [committable.label]
