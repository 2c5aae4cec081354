"""Running-transaction limits (issue 23): a batch that cannot fit fails at once, says why, and holds nothing.

A prepared StarRocks or pre-committed Doris transaction counts as running until the driver commits
the batch (max_running_txn_num_per_db: StarRocks 1000, Doris 100 in 2.0/2.1: docs/protocol.md). A
batch holds one per table per writer, so many tables times many writers may not fit. No Spark: the
real `ExactlyOnceSink` and `PartitionWriter`s over in-memory Arrow batches, the emulators over HTTP.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import MemoryStateStore
from streaming_sink.targets.base import Target, TransactionLimitError
from streaming_sink.targets.doris import DorisTarget
from streaming_sink.targets.starrocks import StarRocksTarget
from tests.integration.test_protocol_findings import InMemoryRunner
from tests.support.doubles.emulators.base_emulator import BaseEmulator
from tests.support.doubles.emulators.doris import DorisEmulator
from tests.support.doubles.emulators.starrocks import StarRocksEmulator

DB, JOB, QUERY = "db", "job", "query-1"
TABLES = [f"t{n}" for n in range(10)]


def batch(writers: int) -> list[list[pa.RecordBatch]]:
    """Every writer has one row for every table: writers x tables transactions."""
    return [[pa.record_batch({"__table": TABLES, "id": [w * 100 + n for n in range(len(TABLES))],
                              "name": [f"w{w}" for _ in TABLES]})] for w in range(writers)]


def expected(table: int, writers: int) -> list[tuple[Any, ...]]:
    return [(w * 100 + table, f"w{w}") for w in range(writers)]


def with_tables(emu: BaseEmulator) -> BaseEmulator:
    for table in TABLES:
        emu.create_table(DB, table, [("id", "INT"), ("name", "VARCHAR(32)")])
    return emu


@pytest.fixture
def doris(tmp_path: Path) -> Iterator[DorisEmulator]:
    with DorisEmulator(tmp_path / "doris") as emu:  # 2.1.8: max_running_txn_num_per_db is 100 by default
        yield with_tables(emu)  # type: ignore[misc]


@pytest.fixture
def starrocks(tmp_path: Path) -> Iterator[StarRocksEmulator]:
    with StarRocksEmulator(tmp_path / "sr", max_running_txn_num_per_db=25) as emu:
        yield with_tables(emu)  # type: ignore[misc]


def refused_then_fits(emu: BaseEmulator, target: Target, too_many: int, fits: int, needs: int, allows: int,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[object] = []
    monkeypatch.setattr("streaming_sink.retry.sleep", pauses.append)
    store = MemoryStateStore()
    sink = ExactlyOnceSink(target, store, JOB, table_column="__table", runner=InMemoryRunner())
    with pytest.raises(TransactionLimitError) as refused:
        sink.process(batch(too_many), 0, QUERY)
    message = str(refused.value)
    assert "\n" not in message, message
    assert f"needs at least {needs} transactions open at once" in message, message
    assert f"allows {allows} running transactions per database" in message, message
    assert "section 'Too many open transactions for the server'" in message
    assert pauses == [], "the refusal was retried"
    states = {t["state"] for t in emu.transactions(DB)}
    assert states == {"ABORTED"}, states  # everything the batch held is released
    assert all(emu.visible_rows(DB, table) == [] for table in TABLES)
    assert store.intents(JOB, QUERY, 0) == []

    assert sink.process(batch(fits), 0, QUERY).action == "written"  # the same batch, with fewer writers
    for n, table in enumerate(TABLES):
        assert sorted(emu.visible_rows(DB, table)) == expected(n, fits)


def test_a_doris_batch_past_100_running_transactions_fails_fast_and_releases_them(
        doris: DorisEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """10 tables x 16 writers on Doris 2.1 (100 running transactions at most): before, each refused load was
    retried with backoff, then the writer failed while the writers before it kept their slots."""
    target = DorisTarget(doris.fe_url, DB, "root", "", backoff_s=0.0)
    refused_then_fits(doris, target, too_many=16, fits=8, needs=101, allows=100, monkeypatch=monkeypatch)


def test_a_starrocks_batch_past_its_running_limit_fails_fast_and_releases_them(
        starrocks: StarRocksEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    target = StarRocksTarget(starrocks.fe_url, DB, "root", "", backoff_s=0.0, backoff_max_s=0.0, read_timeout=5.0)
    refused_then_fits(starrocks, target, too_many=3, fits=2, needs=26, allows=25, monkeypatch=monkeypatch)
