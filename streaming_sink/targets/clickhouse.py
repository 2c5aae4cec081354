"""ClickHouse target: stock ClickHouse has no prepared transactions, so a staging table plays one.

* begin   = `CREATE TABLE <staging> AS <target>` (same columns, engine, partition key, order);
* write   = `insert_arrow` into the staging table (data stays Arrow all the way);
* prepare = the staging table holds exactly the rows written (counted);
* commit  = `ALTER TABLE <staging> MOVE PARTITION ID … TO TABLE <target>` for every partition it
  still holds (atomic per partition, a no-op when repeated), then a ledger row, then drop it;
* abort   = drop the staging table.

The ledger (`_streaming_sink_ledger` in the target database) is what tells "already committed"
from "lost" when a staging table is gone: commit writes the ledger row before it drops staging.
Never `ATTACH PARTITION FROM`: it copies, so a repeated commit would duplicate rows.

The same code speaks HTTP (`http://host:8123`) and embedded chdb (`chdb:///path`); chdb allows
one process per path, so with chdb the writers run in the driver.
"""
from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa

from ..committable import Committable, TxnRef
from .base import CommitOutcome, ConfigurationError, ExpiryLimit, NewRef, PreparedPart, RecordIntent, TableTransaction, Target, TargetError

LEDGER_TABLE = "_streaming_sink_ledger"
_MOVABLE_ENGINE_SUFFIX = "MergeTree"
_CHDB_CLIENTS: dict[str, Any] = {}  # one embedded engine per path per process
_CHDB_LOCK = threading.Lock()


def quote(identifier: str) -> str:
    return "`" + identifier.replace("\\", "\\\\").replace("`", "\\`") + "`"


def literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class ClickHouseTarget(Target):
    kind = "clickhouse"

    def __init__(
        self,
        url: str,
        database: str = "default",
        user: str | None = None,
        password: str | None = None,
        settings: dict[str, Any] | None = None,
        ledger_ttl_days: int = 30,
    ) -> None:
        parsed = urlparse(url)
        if parsed.scheme not in ("chdb", "http", "https"):
            raise ConfigurationError(f"ClickHouseTarget url {url!r}: use chdb:///path or http(s)://host:port")
        if parsed.scheme == "chdb" and not parsed.path:
            raise ConfigurationError(f"ClickHouseTarget url {url!r}: chdb needs a path, e.g. chdb:///var/data/ch")
        self.url, self.database = url, database
        self.user, self.password = user, password
        self.settings = dict(settings or {})
        self.ledger_ttl_days = ledger_ttl_days
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_local")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    @property
    def embedded(self) -> bool:
        return self.url.startswith("chdb:")

    @property
    def runs_writers_in_driver(self) -> bool:
        return self.embedded

    @property
    def commit_parallelism(self) -> int:
        return 1 if self.embedded else 8

    def client(self) -> Any:
        """A client for this thread (HTTP) or the process's one engine for the path (chdb)."""
        import clickhouse_connect

        if self.embedded:
            with _CHDB_LOCK:
                if self.url not in _CHDB_CLIENTS:
                    _CHDB_CLIENTS[self.url] = clickhouse_connect.get_client(dsn=self.url)
                return _CHDB_CLIENTS[self.url]
        if getattr(self._local, "client", None) is None:
            parsed = urlparse(self.url)
            self._local.client = clickhouse_connect.get_client(
                host=parsed.hostname,
                port=parsed.port or (8443 if parsed.scheme == "https" else 8123),
                secure=parsed.scheme == "https",
                username=self.user or "default",
                password=self.password or "",
                settings=self.settings,
            )
        return self._local.client

    def _table(self, name: str) -> str:
        return f"{quote(self.database)}.{quote(name)}"

    def routable_tables(self) -> set[str]:
        client = self.client()
        rows = client.query(
            "SELECT name, engine FROM system.tables WHERE database = {db:String}", parameters={"db": self.database}
        ).result_rows
        if not rows and not client.query(
            "SELECT count() FROM system.databases WHERE name = {db:String}", parameters={"db": self.database}
        ).result_rows[0][0]:
            raise ConfigurationError(f"ClickHouse database {self.database!r} does not exist at {self.url}")
        client.command(
            f"CREATE TABLE IF NOT EXISTS {self._table(LEDGER_TABLE)} "
            "(label String, target_table String, rows UInt64, committed_at DateTime DEFAULT now()) "
            f"ENGINE = MergeTree ORDER BY label TTL committed_at + INTERVAL {int(self.ledger_ttl_days)} DAY"
        )
        return {
            name
            for name, engine in rows
            if engine.endswith(_MOVABLE_ENGINE_SUFFIX) and name != LEDGER_TABLE and not name.startswith("ss_")
        }

    def expiry_limits(self) -> list[ExpiryLimit]:
        return [ExpiryLimit("prepared staging tables", None), ExpiryLimit("commit ledger", self.ledger_ttl_days * 86400.0)]

    def table_columns(self, table: str) -> list[str] | None:
        rows = self.client().query(
            "SELECT name FROM system.columns WHERE database = {db:String} AND table = {t:String} ORDER BY position",
            parameters={"db": self.database, "t": table},
        ).result_rows
        return [r[0] for r in rows]

    def create_table(self, table: str, schema: pa.Schema) -> None:
        """Create a MergeTree table for an Arrow schema if it is missing (the embedded quick start)."""
        columns = ", ".join(f"{quote(f.name)} {clickhouse_type(f.type, f.nullable)}" for f in schema)
        client = self.client()
        client.command(f"CREATE DATABASE IF NOT EXISTS {quote(self.database)}")
        client.command(f"CREATE TABLE IF NOT EXISTS {self._table(table)} ({columns}) ENGINE = MergeTree ORDER BY tuple()")

    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        return _StagingTransaction(self, table, new_ref, record_intent)

    def commit(self, committable: Committable) -> CommitOutcome:
        client = self.client()
        staging = committable.label
        if not self._exists(staging):
            return CommitOutcome.COMMITTED if self._in_ledger(committable.label) else CommitOutcome.LOST
        for partition_id in self._partitions(staging):
            client.command(
                f"ALTER TABLE {self._table(staging)} MOVE PARTITION ID {literal(partition_id)} "
                f"TO TABLE {self._table(committable.table)}"
            )
        client.command(
            f"INSERT INTO {self._table(LEDGER_TABLE)} (label, target_table, rows) VALUES "
            f"({literal(committable.label)}, {literal(committable.table)}, {int(committable.rows)})"
        )
        client.command(f"DROP TABLE IF EXISTS {self._table(staging)} SYNC")
        return CommitOutcome.COMMITTED

    def abort(self, ref: TxnRef) -> None:
        self.client().command(f"DROP TABLE IF EXISTS {self._table(ref.label)} SYNC")

    def staging_tables(self) -> list[str]:
        """Staging tables present now (for tests and the operator's status)."""
        rows = self.client().query(
            "SELECT name FROM system.tables WHERE database = {db:String} AND startsWith(name, 'ss_')",
            parameters={"db": self.database},
        ).result_rows
        return sorted(r[0] for r in rows)

    def _exists(self, table: str) -> bool:
        return bool(self.client().command(f"EXISTS TABLE {self._table(table)}"))

    def _in_ledger(self, label: str) -> bool:
        return bool(
            self.client().query(
                f"SELECT count() FROM {self._table(LEDGER_TABLE)} WHERE label = {{label:String}}",
                parameters={"label": label},
            ).result_rows[0][0]
        )

    def _partitions(self, table: str) -> list[str]:
        rows = self.client().query(
            "SELECT DISTINCT partition_id FROM system.parts WHERE database = {db:String} AND table = {t:String} AND active",
            parameters={"db": self.database, "t": table},
        ).result_rows
        return sorted(r[0] for r in rows)

    def count_rows(self, table: str) -> int:
        return int(self.client().query(f"SELECT count() FROM {self._table(table)}").result_rows[0][0])

    def close(self) -> None:
        """Close this thread's HTTP client, or the process's chdb engine (a process opens one path at a time)."""
        if self.embedded:
            with _CHDB_LOCK:
                client = _CHDB_CLIENTS.pop(self.url, None)
        else:
            client = getattr(self._local, "client", None)
            self._local.client = None
        if client is not None:
            client.close()


def clickhouse_type(arrow_type: pa.DataType, nullable: bool) -> str:
    """The ClickHouse column type that `insert_arrow` fills from an Arrow column of this type."""
    t = pa.types
    if t.is_boolean(arrow_type):
        name = "Bool"
    elif t.is_integer(arrow_type):
        name = f"{'UInt' if t.is_unsigned_integer(arrow_type) else 'Int'}{arrow_type.bit_width}"
    elif t.is_floating(arrow_type):
        name = f"Float{arrow_type.bit_width}"
    elif t.is_string(arrow_type) or t.is_large_string(arrow_type) or t.is_binary(arrow_type) or t.is_large_binary(arrow_type):
        name = "String"
    elif t.is_timestamp(arrow_type):
        name = f"DateTime64(6, {literal(arrow_type.tz or 'UTC')})"
    elif t.is_date(arrow_type):
        name = "Date32"
    elif t.is_decimal(arrow_type):
        name = f"Decimal({arrow_type.precision}, {arrow_type.scale})"
    else:
        raise ConfigurationError(f"no ClickHouse column type for Arrow type {arrow_type}; create the table yourself")
    return f"Nullable({name})" if nullable else name


class _StagingTransaction(TableTransaction):
    def __init__(self, target: ClickHouseTarget, table: str, new_ref: NewRef, record_intent: RecordIntent) -> None:
        self._target, self._table = target, table
        self._new_ref, self._record_intent = new_ref, record_intent
        self._ref: TxnRef | None = None
        self._rows = 0
        self._bytes = 0

    def write(self, chunk: pa.Table) -> None:
        target = self._target
        if self._ref is None:
            ref = self._new_ref(0)
            self._record_intent(ref)
            self._ref = ref
            target.client().command(f"CREATE TABLE {target._table(ref.label)} AS {target._table(self._table)}")
        target.client().insert_arrow(quote(self._ref.label), chunk, database=target.database)
        self._rows += chunk.num_rows
        self._bytes += chunk.nbytes

    def prepare(self) -> list[PreparedPart]:
        if self._ref is None:
            return []
        counted = self._target.count_rows(self._ref.label)
        if counted != self._rows:
            raise TargetError(
                f"staging table {self._ref.label} holds {counted} rows but {self._rows} were written; "
                "is insert deduplication or a TTL active on the target table?"
            )
        return [PreparedPart(self._ref, None, self._rows, self._bytes, {"staging": self._ref.label})]

    def abort(self) -> None:
        if self._ref is not None:
            self._target.abort(self._ref)
