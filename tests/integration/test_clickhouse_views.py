"""ClickHouse tables that feed materialized views (review R8), end to end: real Kafka, the packaged job, the real engine.

Views fire on INSERT only, so the default commit (partition moves) is refused at start for a table
with a view, and `commit_mode = "insert"` loads it with INSERT … SELECT from staging, deduplicated by
a token per label so a commit repeated after a kill neither adds rows nor feeds the views twice.
Every view here sums its table (count and sum of `amount`), so its totals must equal the rows loaded.
Each test runs embedded (chdb, writers in the driver) and over HTTP through the test front (writers in
Spark tasks, one staging table per table and task attempt, commits from the driver over HTTP).
"""
from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from streaming_sink.crash import TARGET_POINTS
from streaming_sink.targets import target_from_url
from streaming_sink.targets.base import CommitOutcome
from streaming_sink.targets.clickhouse import LEDGER_TABLE, ClickHouseTarget
from tests.support.pipeline import DB, TABLES
from tests.support.pipeline import LocalPipeline as Scenario
from tests.support.targets.clickhouse import ClickHouseAdapter, ClickHouseHttpAdapter, clickhouse_adapter

pytestmark = pytest.mark.slow

CRASH_POINT = "clickhouse-after-insert"
ROLLUP = "rollup"
assert CRASH_POINT in TARGET_POINTS


@dataclass
class ViewsAdapter:
    """The pipeline's ClickHouse (`base`: embedded or the HTTP front) with its tables each feeding `<table>_mv`,
    which sums it into `rollup.<table>_totals`.

    The totals live in another database: the job routes by a field, so every loadable table of its own
    database is one it may write (and checks the columns of)."""

    base: ClickHouseAdapter | ClickHouseHttpAdapter
    mode: str = "insert"

    def target_url(self) -> str:
        return self.base.target_url()

    def target_options(self) -> dict[str, Any]:
        return self.base.target_options() if self.mode == "move" else {**self.base.target_options(), "commit_mode": self.mode}

    def env(self) -> dict[str, str]:
        return self.base.env()

    def rows(self, database: str, table: str) -> list[tuple]:
        return self.base.rows(database, table)

    def problems(self, database: str) -> list[str]:
        return self.base.problems(database)

    @contextmanager
    def opened(self, database: str) -> Iterator[ClickHouseTarget]:
        """A target as the job makes it, closed afterwards (an embedded one, so a driver can open the path)."""
        target = target_from_url(self.target_url(), database, self.target_options())
        assert isinstance(target, ClickHouseTarget)
        try:
            yield target
        finally:
            target.close()

    def create_tables(self, database: str, tables: list[str]) -> None:
        self.base.create_tables(database, tables)
        window = "non_replicated_deduplication_window = 10000"
        with self.opened(database) as target:
            client = target.client()
            client.command(f"CREATE DATABASE IF NOT EXISTS {ROLLUP}")
            for table in tables:
                client.command(f"ALTER TABLE {database}.{table} MODIFY SETTING {window}")
                client.command(
                    f"CREATE TABLE {ROLLUP}.{table}_totals (k UInt8, n UInt64, amount Float64) "
                    f"ENGINE = SummingMergeTree ORDER BY k SETTINGS {window}"
                )
                client.command(
                    f"CREATE MATERIALIZED VIEW {database}.{table}_mv TO {ROLLUP}.{table}_totals "
                    f"AS SELECT 0 AS k, count() AS n, sum(amount) AS amount FROM {database}.{table}"
                )

    def totals(self, database: str, table: str) -> tuple[int, float]:
        with self.opened(database) as target:
            n, amount = target.client().query(f"SELECT sum(n), sum(amount) FROM {ROLLUP}.{table}_totals").result_rows[0]
            return int(n), float(amount)


# What views see is the engine's doing, the same behind either client: CI runs chdb, the HTTP variant is extended.
@pytest.fixture(params=["chdb", pytest.param("http", marks=pytest.mark.extended)])
def base(request, tmp_path) -> Iterator[ClickHouseAdapter | ClickHouseHttpAdapter]:
    with clickhouse_adapter(request.param, tmp_path / "ch") as adapter:
        yield adapter


def _scenario(tmp_path, kafka_broker, base, mode: str) -> tuple[Scenario, ViewsAdapter]:
    adapter = ViewsAdapter(base, mode=mode)
    scenario = Scenario(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}", adapter=adapter)
    scenario.produce()
    return scenario, adapter


def _assert_views_match_rows(scenario: Scenario, adapter: ViewsAdapter) -> None:
    for table in TABLES:
        expected = (len(scenario.source[table]), sum(row[2] for row in scenario.source[table]))
        assert adapter.totals(DB, table) == expected, f"{table}_mv totals differ from the rows loaded"


def test_default_mode_refuses_a_table_that_feeds_a_view_at_start(tmp_path, kafka_broker, base):
    scenario, adapter = _scenario(tmp_path, kafka_broker, base, mode="move")
    code = scenario.run_driver(run=0)
    log = scenario.log_tail(0, lines=200)
    assert code not in (0, -signal.SIGKILL), f"the job should have refused to start, exited {code}:\n{log}"
    assert "configuration error" in log and "analytics.orders_mv" in log and 'commit_mode = "insert"' in log, log
    assert adapter.rows(DB, "orders") == [] and adapter.totals(DB, "orders") == (0, 0.0)


def test_insert_mode_killed_between_insert_and_ledger_then_restarted_is_exact_in_tables_and_views(tmp_path, kafka_broker, base):
    scenario, adapter = _scenario(tmp_path, kafka_broker, base, mode="insert")
    code = scenario.run_driver(crash_at=CRASH_POINT, run=0)
    assert code == -signal.SIGKILL, f"driver should have been killed at {CRASH_POINT}, exited {code}:\n{scenario.log_tail(0)}"
    with adapter.opened(DB) as target:  # the kill landed between an INSERT and the ledger's final row
        states = dict(target.client().query(f"SELECT label, groupArray(state) FROM {DB}.{LEDGER_TABLE} GROUP BY label").result_rows)
        # begun, not finished: its `inserting` row, one `inserted` row per partition whose INSERT finished, no `committed`
        cut = [label for label, seen in states.items() if "inserting" in seen and "committed" not in seen]
        # embedded, one commit at a time: exactly one; over HTTP the batch's commits run in parallel, so others
        # may be cut between their own INSERTs and ledger rows too: each keeps its staging table for the restart
        assert cut and (len(cut) == 1 or not target.embedded) and set(cut) <= set(target.staging_tables()), states
        assert target.count_rows("orders") + target.count_rows("payments") > 0  # its rows are in, and the views saw them
    scenario.run_to_completion()
    scenario.verify()  # every table equals the source row by row, nothing left behind, every batch COMMITTED
    _assert_views_match_rows(scenario, adapter)

    store = scenario.store()  # committing every committable again changes nothing
    with adapter.opened(DB) as target:
        target.routable_tables()
        for key in store.batch_keys(scenario.job_id):
            for committable in store.get_batch(scenario.job_id, *key).committables:
                assert target.commit(committable) is CommitOutcome.COMMITTED
    scenario.verify()
    _assert_views_match_rows(scenario, adapter)
