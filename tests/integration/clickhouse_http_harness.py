"""ClickHouse over HTTP, writers in Spark tasks: the test front as a `devstack.pipeline.TargetAdapter`, and task hooks.

The front (tests/clickhouse_front: ClickHouse's HTTP interface over the real engine, chdb) runs in the
pytest process; the driver child and its Spark tasks (local, or executors on the standalone cluster's
hosts 127.0.0.2/127.0.0.3) reach it over loopback as they would a server, and its fault knobs act on
the statements they send.

Task-side faults cannot come from the server, so the driver child runs `tests.integration.clickhouse_http_driver`:
the packaged job with the ClickHouse target wrapped by `HookedClickHouseTarget`, which obeys the task
hooks shared with the StarRocks harness (tests/integration/exactly_once.py): `SS_TEST_DIE_AFTER_PREPARE=<batch>:<partition>`
(the first attempt of that task hard-exits its Python worker right after its staging tables are prepared)
and `SS_TEST_TWIN=<batch>:<partition>` (that task also writes and prepares a twin attempt whose result is
thrown away: a speculative copy that lost). A twin's label keeps the shape of a staging table's name
(`ss_…_<12 hex>`), so a twin left behind is found like any other staging table.
"""
from __future__ import annotations

import hashlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from devstack.pipeline import DB, TABLE_DDL, ClickHouseAdapter, LocalPipeline, table_rows
from streaming_sink import job
from streaming_sink.targets.base import NewRef, RecordIntent, TableTransaction
from streaming_sink.targets.clickhouse import COMMITTED, LEDGER_TABLE, ClickHouseTarget
from tests.clickhouse_front import ClickHouseFront
from tests.infra.tls import issue_certificates
from tests.integration.crash_targets import ClickHouseCrashTarget
from tests.integration.exactly_once import DIE_AFTER_PREPARE, TWIN, hooked_begin

__all__ = ["DIE_AFTER_PREPARE", "TWIN", "ClickHouseFrontAdapter", "ClickHouseHttpCrashTarget", "HookedClickHouseTarget",
           "clickhouse_adapter", "hooked_target_from_url", "twin_label"]


@dataclass
class ClickHouseFrontAdapter:
    """Reads the front over HTTP like any client (its engine is in this process); the driver reaches it over HTTP."""

    front: ClickHouseFront
    options: dict[str, Any] = field(default_factory=dict)

    def target_url(self) -> str:
        return self.front.target_url

    def target_options(self) -> dict[str, Any]:
        return {"read_timeout_s": 30.0, "backoff_s": 0.05, "backoff_max_s": 0.5, **self.options}

    def env(self) -> dict[str, str]:
        return {}

    def target(self, database: str) -> ClickHouseTarget:
        """A target over HTTP for reading and setting up, with the job's options (TLS ones too); close it after use."""
        return ClickHouseTarget(self.front.url, database=database, **self.target_options())

    def create_tables(self, database: str, tables: list[str]) -> None:
        target = self.target(database)
        try:
            client = target.client()
            client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
            for table in tables:
                client.command(TABLE_DDL.format(db=database, table=table))
        finally:
            target.close()

    def rows(self, database: str, table: str) -> list[tuple]:
        target = self.target(database)
        try:
            return table_rows(target, table)
        finally:
            target.close()

    def ledger(self, database: str) -> dict[str, set[str]]:
        """label -> the states the commit ledger holds for it."""
        target = self.target(database)
        try:
            rows = target.client().query(f"SELECT label, state FROM {database}.{LEDGER_TABLE}").result_rows
        finally:
            target.close()
        states: dict[str, set[str]] = {}
        for label, state in rows:
            states.setdefault(label, set()).add(state)
        return states

    def problems(self, database: str) -> list[str]:
        """Staging tables left, and commits the ledger says began but never finished."""
        target = self.target(database)
        try:
            found = [f"staging table left: {name}" for name in target.staging_tables()]
        finally:
            target.close()
        found += [f"{label}: commit began ({sorted(states)}), never finished"
                  for label, states in self.ledger(database).items() if COMMITTED not in states]
        return found


@contextmanager
def clickhouse_adapter(transport: str, path: Path) -> Iterator[ClickHouseAdapter | ClickHouseFrontAdapter]:
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
        yield ClickHouseFrontAdapter(front, options)


class ClickHouseHttpCrashTarget(ClickHouseCrashTarget):
    """The crash matrix over the front: 180 messages, 30 a trigger over 3 partitions (3 tasks a batch), writers in
    Spark tasks that may retry (`local[2,3]`), the hooked driver; read over HTTP like any client."""

    name = "clickhouse-http"
    chain_stores = ("redis",)
    chain_options = {"commit_parallelism": 1}  # so "after-first-commit" leaves exactly one of the batch's commits done

    def __init__(self, front: ClickHouseFront) -> None:
        self.front = front

    @classmethod
    @contextmanager
    def started(cls, root: Path) -> Iterator[ClickHouseCrashTarget]:
        with ClickHouseFront(root / "clickhouse") as front:
            yield cls(front)

    def pipeline_settings(self, options: dict[str, Any]) -> dict[str, Any]:
        return {
            "messages_per_partition": 60, "max_offsets_per_trigger": 30,
            "adapter": ClickHouseFrontAdapter(self.front, dict(options)),
            "driver_module": "tests.integration.clickhouse_http_driver",
            "spark_conf": {"spark.master": "local[2,3]"},
        }

    @contextmanager
    def reader(self, pipeline: LocalPipeline) -> Iterator[ClickHouseTarget]:
        assert isinstance(pipeline.adapter, ClickHouseFrontAdapter)
        target = pipeline.adapter.target(DB)
        try:
            yield target
        finally:
            target.close()


def twin_label(label: str) -> str:
    """Another staging table name of the same shape: `…_c<chunk>_twin_<12 hex>`."""
    return f"{label[:-13]}_twin_{hashlib.sha256(label.encode()).hexdigest()[:12]}"


class HookedClickHouseTarget(ClickHouseTarget):
    """A ClickHouseTarget whose transactions obey the task hooks (see the module docstring)."""

    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        return hooked_begin(super().begin, table, new_ref, record_intent, twin_label)


def hooked_target_from_url(url: str, database: str, options: dict[str, Any] | None = None) -> Any:
    """`target_from_url`, with the ClickHouse target swapped for the hooked one (same state)."""
    target = _real_target_from_url(url, database, options)
    if not isinstance(target, ClickHouseTarget):
        return target
    hooked = HookedClickHouseTarget.__new__(HookedClickHouseTarget)
    hooked.__dict__.update(target.__dict__)
    return hooked


_real_target_from_url = job.target_from_url
