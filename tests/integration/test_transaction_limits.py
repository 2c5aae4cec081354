"""Running-transaction limits (issues 23 and 26): a batch of many tables commits in waves that fit the server; what
still cannot fit (one table alone wider than the server allows) fails at once, says why, and holds nothing.

A prepared StarRocks or pre-committed Doris transaction counts as running until the driver commits
the batch (max_running_txn_num_per_db: StarRocks 1000 in 3.x, Doris 1000 in 2.0-3.x: docs/protocol.md). A
batch holds one per table per writer, so many tables times many writers may not fit one round. No Spark: the
real `ExactlyOnceSink` and `PartitionWriter`s over in-memory Arrow batches (unspread: this runner keeps rows in
their partition, so the sink is told `spread="never"`), the emulators over HTTP.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink.labels import partition_wave
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import MemoryStateStore
from streaming_sink.targets.base import Target, TransactionLimitError
from streaming_sink.targets.doris import DorisTarget
from streaming_sink.targets.starrocks import StarRocksTarget
from tests.support.batches import InMemoryRunner
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
    # a Doris FE that does not tell its release to the loading user (not ADMIN), set to the least default, 100
    with DorisEmulator(tmp_path / "doris", max_running_txn_num_per_db=100, user_is_admin=False) as emu:
        yield with_tables(emu)  # type: ignore[misc]


@pytest.fixture
def starrocks(tmp_path: Path) -> Iterator[StarRocksEmulator]:
    with StarRocksEmulator(tmp_path / "sr", max_running_txn_num_per_db=25) as emu:
        yield with_tables(emu)  # type: ignore[misc]


def wave_sizes(store: MemoryStateStore) -> list[int]:
    """The transactions each wave of batch 0 held open, from its record (writer partitions number the waves)."""
    record = store.get_batch(JOB, QUERY, 0)
    assert record is not None
    sizes: dict[int, int] = {}
    for c in record.committables:
        sizes[partition_wave(c.partition)] = sizes.get(partition_wave(c.partition), 0) + 1
    return [sizes[w] for w in sorted(sizes)]


def fits_in_waves(emu: BaseEmulator, target: Target, writers: int, waves: int,
                  monkeypatch: pytest.MonkeyPatch) -> list[int]:
    pauses: list[object] = []
    monkeypatch.setattr("streaming_sink.retry.sleep", pauses.append)
    store = MemoryStateStore()
    sink = ExactlyOnceSink(target, store, JOB, table_column="__table", runner=InMemoryRunner(), spread="never")
    report = sink.process(batch(writers), 0, QUERY)
    assert (report.action, report.waves, report.transactions) == ("written", waves, len(TABLES) * writers)
    assert pauses == [], "a begin was refused and retried"
    for n, table in enumerate(TABLES):
        assert sorted(emu.visible_rows(DB, table)) == expected(n, writers)
    assert {t["state"] for t in emu.transactions(DB)} == {"VISIBLE"}
    assert store.intents(JOB, QUERY, 0) == []
    return wave_sizes(store)


@pytest.mark.parametrize("product, version, admin, limit, said", [
    ("doris", "1.2.7", True, 100, "Doris 1.2.7, read from /api/fe_version_info: its release default"),
    ("doris", "2.1.8", True, 1000, "Doris 2.1.8, read from /api/fe_version_info: its release default"),
    ("doris", "4.0.1", True, 10000, "Doris 4.0.1, read from /api/fe_version_info: its release default"),
    ("doris", "2.1.8", False, 100, "Doris did not tell its release to user 'root' (/api/fe_version_info needs ADMIN"),
    ("starrocks", "3.3.5", True, 1000, "StarRocks 3.3.5, read from the HTTP SQL API: its release default"),
    ("starrocks", "3.1.11", True, 100, "StarRocks before 3.2 (no HTTP SQL API tells the release): the least release "
                                       "default; set the option to the server's value"),
])
def test_the_running_limit_is_the_default_of_the_release_the_fe_runs(
        tmp_path: Path, product: str, version: str, admin: bool, limit: int, said: str) -> None:
    """The FE's release is read once at start (Doris `/api/fe_version_info`, ADMIN only; StarRocks' HTTP SQL API, 3.2+)
    and the budget takes that release's default; where the FE does not tell, the least default of any release, never
    more than the server allows. `doctor` says which limit and why in its budget line."""
    from streaming_sink.doctor import budget

    emulator: BaseEmulator = (DorisEmulator(tmp_path, version=version, user_is_admin=admin) if product == "doris"
                              else StarRocksEmulator(tmp_path, version=version))
    with emulator as emu:
        with_tables(emu)
        target: DorisTarget | StarRocksTarget = (DorisTarget if product == "doris" else StarRocksTarget)(
            emu.fe_url, DB, "root", "", backoff_s=0.0)
        target.routable_tables()
        assert target.server_limits().running_transactions == limit
        assert limit <= emu.profile.max_running_txn_num_per_db  # type: ignore[attr-defined]
        assert f"max_running_txn_num_per_db {limit} ({said}" in budget(target, [])


def test_a_doris_batch_past_100_running_transactions_commits_in_waves(
        doris: DorisEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """10 tables x 16 writers on a Doris FE at 100 running transactions at most: 160 transactions, in waves of at most
    half the limit (transaction_share 0.5): 3 tables (48 transactions) a wave."""
    target = DorisTarget(doris.fe_url, DB, "root", "", backoff_s=0.0)
    assert fits_in_waves(doris, target, writers=16, waves=4, monkeypatch=monkeypatch) == [48, 48, 48, 16]


def test_a_starrocks_batch_past_its_running_limit_commits_in_waves(
        starrocks: StarRocksEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's own limit (25) given as the target option of its name: waves of 12 transactions."""
    target = StarRocksTarget(starrocks.fe_url, DB, "root", "", backoff_s=0.0, backoff_max_s=0.0, read_timeout=5.0,
                             max_running_txn_num_per_db=25)
    assert fits_in_waves(starrocks, target, writers=3, waves=3, monkeypatch=monkeypatch) == [12, 12, 6]


def test_one_table_wider_than_the_server_allows_fails_fast_and_releases_everything(
        starrocks: StarRocksEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Waves cannot split a table: one table over 30 writers, unspread, on a server that allows 25."""
    pauses: list[object] = []
    monkeypatch.setattr("streaming_sink.retry.sleep", pauses.append)
    target = StarRocksTarget(starrocks.fe_url, DB, "root", "", backoff_s=0.0, backoff_max_s=0.0, read_timeout=5.0,
                             max_running_txn_num_per_db=25)
    store = MemoryStateStore()
    sink = ExactlyOnceSink(target, store, JOB, table_column="__table", runner=InMemoryRunner(), spread="never",
                           transaction_share=1.0)
    one_table = [[pa.record_batch({"__table": ["t0"], "id": [w], "name": [f"w{w}"]})] for w in range(30)]
    with pytest.raises(TransactionLimitError) as refused:
        sink.process(one_table, 0, QUERY)
    message = str(refused.value)
    assert "\n" not in message, message
    assert "needs at least 30 transactions open at once" in message, message  # the wave's plan: 30 writers
    assert "allows 25 running transactions per database" in message, message
    assert "section 'Too many open transactions for the server'" in message
    assert pauses == [], "the refusal was retried"
    assert {t["state"] for t in starrocks.transactions(DB)} == {"ABORTED"}  # everything the batch held is released
    assert starrocks.visible_rows(DB, "t0") == []
    assert store.intents(JOB, QUERY, 0) == []


def test_a_doris_batch_whose_writers_flush_often_still_holds_the_transactions_its_plan_counted(
        doris: DorisEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: the plan counts one transaction per (table, writer); a Doris writer that flushes a table several
    times (here: about every 3 rows, 12 rows per table per writer) must still hold one, or a wave the plan sized at 48
    transactions (10 tables x 16 writers, the Doris FE's 100 running at most) holds four times that and the server
    refuses its begins. Every table still equals the source row by row."""
    pauses: list[object] = []
    monkeypatch.setattr("streaming_sink.retry.sleep", pauses.append)
    per_table = 12
    frames = [[pa.record_batch({"__table": [table], "id": [w * 100 + n], "name": [f"w{w}"]})
               for n in range(per_table) for table in TABLES] for w in range(16)]
    routed_row_bytes = 15  # one (id, name) row as the router hands it to the writer
    target = DorisTarget(doris.fe_url, DB, "root", "", backoff_s=0.0)
    store = MemoryStateStore()
    sink = ExactlyOnceSink(target, store, JOB, table_column="__table", runner=InMemoryRunner(), spread="never",
                           flush_bytes=3 * 3 * routed_row_bytes)  # a wave's 3 tables: one flush per ~3 rows
    report = sink.process(frames, 0, QUERY)
    assert (report.action, report.waves) == ("written", 4)
    assert wave_sizes(store) == [48, 48, 48, 16]
    assert pauses == [], "a begin was refused and retried"
    assert len(doris.transactions(DB)) == len(TABLES) * 16, "one server transaction per (table, writer)"
    for table in TABLES:
        assert sorted(doris.visible_rows(DB, table)) == sorted(
            (w * 100 + k, f"w{w}") for w in range(16) for k in range(per_table)), table
    assert {t["state"] for t in doris.transactions(DB)} == {"VISIBLE"}
    assert store.intents(JOB, QUERY, 0) == []
