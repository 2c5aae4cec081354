"""ClickHouse in the tests: `ClickHouseAdapter`, the one adapter of the pipeline and the crash matrix, on the real
engine embedded (chdb, writers in the driver) or behind the test front (ClickHouse's HTTP interface over chdb,
tests/support/doubles/clickhouse_front; writers in Spark tasks).

The front runs in the pytest process; the driver child and its Spark tasks (local, or executors on the standalone
cluster's hosts 127.0.0.2/127.0.0.3) reach it over loopback as they would a server, and its fault knobs act on
the statements they send.

Task-side faults cannot come from the server, so over HTTP the driver child registers `HOOKED`: the ClickHouse
descriptor building `HookedClickHouseTarget`, which obeys the task hooks of tests/support/crash.py:
`SS_TEST_DIE_AFTER_PREPARE=<batch>:<partition>` (the first attempt of that task hard-exits its Python worker right
after its staging tables are prepared) and `SS_TEST_TWIN=<batch>:<partition>` (that task also writes and prepares a
twin attempt whose result is thrown away: a speculative copy that lost). A twin's label keeps the shape of a staging
table's name (`ss_…_<12 hex>`), so a twin left behind is found like any other staging table.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from streaming_sink.targets import clickhouse
from streaming_sink.targets.base import NewRef, RecordIntent, TableTransaction
from streaming_sink.targets.clickhouse import COMMITTED as LEDGER_COMMITTED
from streaming_sink.targets.clickhouse import LEDGER_TABLE, ClickHouseTarget
from tests.support.crash import DIE_AFTER_PREPARE, TWIN, hooked_begin, hooked_descriptor
from tests.support.doubles.clickhouse_front import ClickHouseFront
from tests.support.pipeline import DB, TABLE_DDL, LocalPipeline, table_rows
from tests.support.targets.base import COMMITTED, OPEN, TargetAdapter, label_batch
from tests.support.tls import issue_certificates

__all__ = ["DIE_AFTER_PREPARE", "HOOKED", "TWIN", "ClickHouseAdapter", "ClickHouseHttpAdapter", "HookedClickHouseTarget",
           "clickhouse_adapter", "twin_label"]


class ClickHouseAdapter(TargetAdapter):
    """The real engine at `path`, embedded (chdb; opened and closed per call so that the driver can open it too), or
    reached over HTTP through `front` like any client. In the matrix: embedded, the pipeline's defaults (its engine
    at `<root>/ch`); prepared parts are staging tables named by label, the commit ledger names the committed."""

    name = "clickhouse"
    chain_stores = ("file", "redis")
    #: target options over HTTP (under the instance's); the embedded engine takes the target's defaults
    http_defaults: ClassVar[dict[str, Any]] = {"read_timeout_s": 30.0, "backoff_s": 0.05, "backoff_max_s": 0.5}

    def __init__(self, path: Path | None = None, front: ClickHouseFront | None = None,
                 options: dict[str, Any] | None = None) -> None:
        self.path, self.front, self.options = path, front, dict(options or {})

    @classmethod
    @contextmanager
    def started(cls, root: Path) -> Iterator[Any]:
        yield cls()  # embedded: nothing to start, the pipeline's root holds the engine

    def for_pipeline(self, root: Path, options: dict[str, Any]) -> ClickHouseAdapter:
        if self.front is None:
            assert not options, "the chdb pipeline takes the target's defaults"
        adapter = self.with_options(options)
        if adapter.front is None and adapter.path is None:
            adapter.path = root / "ch"
        return adapter

    # -- the pipeline's side -----------------------------------------------------------------------------------------

    def target_url(self) -> str:
        return f"chdb://{self.path}" if self.front is None else self.front.target_url

    def target_options(self) -> dict[str, Any]:
        return dict(self.options) if self.front is None else {**self.http_defaults, **self.options}

    def target(self, database: str) -> ClickHouseTarget:
        """A target for reading and setting up, with the job's options (TLS ones too); close it after use."""
        if self.front is None:
            return ClickHouseTarget(f"chdb://{self.path}", database=database)
        return ClickHouseTarget(self.front.url, database=database, **self.target_options())

    @contextmanager
    def opened(self, database: str) -> Iterator[ClickHouseTarget]:
        """`target(database)`, closed afterwards (so that the next driver can open the chdb path)."""
        target = self.target(database)
        try:
            yield target
        finally:
            target.close()

    def create_tables(self, database: str, tables: list[str]) -> None:
        with self.opened(database) as target:
            client = target.client()
            client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
            for table in tables:
                client.command(TABLE_DDL.format(db=database, table=table))

    def rows(self, database: str, table: str) -> list[tuple]:
        with self.opened(database) as target:
            return table_rows(target, table)

    def ledger(self, database: str) -> dict[str, set[str]]:
        """label -> the states the commit ledger holds for it."""
        with self.opened(database) as target:
            rows = target.client().query(f"SELECT label, state FROM {database}.{LEDGER_TABLE}").result_rows
        states: dict[str, set[str]] = {}
        for label, state in rows:
            states.setdefault(label, set()).add(state)
        return states

    def problems(self, database: str) -> list[str]:
        """Staging tables left; over HTTP also commits the ledger says began but never finished."""
        with self.opened(database) as target:
            found = [f"staging table left: {name}" for name in target.staging_tables()]
        if self.front is not None:
            found += [f"{label}: commit began ({sorted(states)}), never finished"
                      for label, states in self.ledger(database).items() if LEDGER_COMMITTED not in states]
        return found

    # -- the crash matrix's side -------------------------------------------------------------------------------------

    def transactions(self, pipeline: LocalPipeline, batch: int) -> dict[str, str]:
        """Staging tables are open; the commit ledger names the committed (an aborted label leaves no trace)."""
        assert isinstance(pipeline.adapter, ClickHouseAdapter)
        with pipeline.adapter.opened(DB) as target:
            found = {name: OPEN for name in target.staging_tables()}
            ledger = target.client().query(f"SELECT label, state FROM {DB}.{LEDGER_TABLE}").result_rows
        found.update({label: COMMITTED for label, state in ledger if state == LEDGER_COMMITTED})
        return {label: state for label, state in found.items() if label_batch(label) == batch}


class ClickHouseHttpAdapter(ClickHouseAdapter):
    """`ClickHouseAdapter` over the front, as the matrix runs it (its knobs only): 180 messages, 30 a trigger over 3
    partitions (3 tasks a batch), writers in Spark tasks that may retry (`local[2,3]`), the hooked driver."""

    name = "clickhouse-http"
    chain_stores = ("redis",)
    chain_options = {"commit_parallelism": 1}  # so "after-first-commit" leaves exactly one of the batch's commits done
    pipeline_defaults = {"messages_per_partition": 60, "max_offsets_per_trigger": 30,
                         "spark_conf": {"spark.master": "local[2,3]"}}
    hooked_module = __name__

    def __init__(self, front: ClickHouseFront, options: dict[str, Any] | None = None) -> None:
        super().__init__(None, front, options)

    @classmethod
    @contextmanager
    def started(cls, root: Path) -> Iterator[Any]:
        with ClickHouseFront(root / "clickhouse") as front:
            yield cls(front)


@contextmanager
def clickhouse_adapter(transport: str, path: Path) -> Iterator[ClickHouseAdapter]:
    """The pipeline's ClickHouse on the real engine at `path`, reached as `transport` says: "chdb" (embedded, writers
    in the driver), "http" or "https" (a front started on the path, writers in Spark tasks; https: a certificate of
    a test CA made here, which the job trusts through `ca_bundle`)."""
    if transport == "chdb":
        yield ClickHouseAdapter(path)
        return
    tls, options = None, {}
    if transport == "https":
        certificates = path.parent / "tls"
        certificates.mkdir()
        ca, cert, key = issue_certificates(certificates)
        tls, options = (cert, key), {"ca_bundle": ca}
    with ClickHouseFront(path, tls=tls) as front:
        yield ClickHouseHttpAdapter(front, options)


# -- the hooked target (built in the driver child and, pickled, in its Spark tasks) ----------------------------------


def twin_label(label: str) -> str:
    """Another staging table name of the same shape: `…_c<chunk>_twin_<12 hex>`."""
    return f"{label[:-13]}_twin_{hashlib.sha256(label.encode()).hexdigest()[:12]}"


class HookedClickHouseTarget(ClickHouseTarget):
    """A ClickHouseTarget whose transactions obey the task hooks (see the module docstring)."""

    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        return hooked_begin(super().begin, table, new_ref, record_intent, twin_label)


HOOKED = hooked_descriptor(clickhouse.DESCRIPTOR, HookedClickHouseTarget)
