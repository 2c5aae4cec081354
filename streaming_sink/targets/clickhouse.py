"""ClickHouse target: stock ClickHouse has no prepared transactions, so a staging table plays one.

* begin   = `CREATE TABLE <staging> AS <target>` (same columns, engine, partition key, order);
* write   = `insert_arrow` into the staging table (data stays Arrow all the way);
* prepare = the staging table holds exactly the rows written (counted);
* commit  = steps that a crash anywhere leaves resumable by repeating the commit:
  1. list the staging table's partitions (an error if the table is gone);
  2. a ledger row (label, table, rows, state `moving`), unless the label has one;
  3. `ALTER TABLE <staging> MOVE PARTITION ID … TO TABLE <target>` for each partition: atomic per
     partition, and a moved partition is no longer listed, so a repeat moves only the rest;
  4. verify that the staging table still exists and holds 0 rows;
  5. a ledger row with state `committed`; 6. drop the staging table;
* abort   = drop the staging table; refused once the ledger names the label (its commit began).

The ledger (`_streaming_sink_ledger` in the target database) decides when the staging table is gone:
a `committed` row means COMMITTED; a `moving` row alone means some partitions may have moved, which
no one can tell from here, so `CommitAmbiguousError` (runbook "ClickHouse commit interrupted");
no row means nothing ever moved, so ABORTED. Ledgers made by older versions expire rows (a TTL),
so there "no row" is LOST. Rows are kept for good: two of ~100 bytes per transaction.
Never `ATTACH PARTITION FROM`: it copies, so a repeated commit would duplicate rows.

The same code speaks HTTP (`http://host:8123`) and embedded chdb (`chdb:///path`); chdb allows
one process per path, so with chdb the writers run in the driver.
"""
from __future__ import annotations

import re
import threading
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa

from ..committable import Committable, TxnRef
from .base import (
    CommitAmbiguousError, CommitOutcome, CommittedNotChosenError, ConfigurationError, ExpiryLimit, NewRef, PreparedPart, RecordIntent,
    TableTransaction, Target, TargetError,
)

LEDGER_TABLE = "_streaming_sink_ledger"
MOVING, COMMITTED = "moving", "committed"  # ledger states of a label
# Rows written before the ledger had `state` were written after the moves: they read as committed.
_STATE_COLUMN = f"state String DEFAULT '{COMMITTED}'"
# make_label's shape: "ss_", sanitised parts joined by "_", then "_" and 12 hex digits of a hash.
_LABEL_SHAPE = re.compile(r"ss_\w*_[0-9a-f]{12}", re.ASCII)
_MOVABLE_ENGINE_SUFFIX = "MergeTree"
_CHDB_CLIENTS: dict[str, Any] = {}  # one embedded engine per path per process
_CHDB_LOCK = threading.Lock()


def quote(identifier: str) -> str:
    return "`" + identifier.replace("\\", "\\\\").replace("`", "\\`") + "`"


def literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class ClickHouseTarget(Target):
    kind = "clickhouse"

    @classmethod
    def option_names(cls) -> set[str]:
        """The keyword options the constructor takes besides the address and credentials."""
        return {"settings", "verify", "ca_bundle"}

    def __init__(
        self,
        url: str,
        database: str = "default",
        user: str | None = None,
        password: str | None = None,
        settings: dict[str, Any] | None = None,
        verify: bool = True,
        ca_bundle: str | None = None,
    ) -> None:
        parsed = urlparse(url)
        if parsed.scheme not in ("chdb", "http", "https"):
            raise ConfigurationError(f"ClickHouseTarget url {url!r}: use chdb:///path or http(s)://host:port")
        if parsed.scheme == "chdb" and not parsed.path:
            raise ConfigurationError(f"ClickHouseTarget url {url!r}: chdb needs a path, e.g. chdb:///var/data/ch")
        self.url, self.database = url, database
        self.user, self.password = user, password
        self.settings = dict(settings or {})
        if parsed.scheme != "https" and (ca_bundle is not None or verify is not True):
            raise ConfigurationError(f"ClickHouseTarget url {url!r}: verify and ca_bundle are for https (clickhouses://) only")
        self.verify, self.ca_bundle = verify, ca_bundle  # https: check the certificate, against these CAs
        self._local = threading.local()
        self._ledger_ready = False
        self._ledger_ttl_s: float | None = None  # a legacy ledger's TTL, found when the ledger is checked

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
                verify=self.verify,
                ca_cert=self.ca_bundle,
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
        self._ensure_ledger()
        return {
            name
            for name, engine in rows
            if engine.endswith(_MOVABLE_ENGINE_SUFFIX) and name != LEDGER_TABLE and not _LABEL_SHAPE.fullmatch(name)
        }

    def expiry_limits(self) -> list[ExpiryLimit]:
        """Nothing expires, unless the ledger was made by an older version (as found by `routable_tables`)."""
        return [ExpiryLimit("prepared staging tables", None), ExpiryLimit("commit ledger", self._ledger_ttl_s)]

    def table_columns(self, table: str) -> dict[str, str] | None:
        rows = self.client().query(
            "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String} ORDER BY position",
            parameters={"db": self.database, "t": table},
        ).result_rows
        return {name: kind for name, kind in rows}

    def create_table(self, table: str, schema: pa.Schema) -> None:
        """Create a MergeTree table for an Arrow schema if it is missing (the embedded quick start)."""
        columns = ", ".join(f"{quote(f.name)} {clickhouse_type(f.type, f.nullable)}" for f in schema)
        client = self.client()
        client.command(f"CREATE DATABASE IF NOT EXISTS {quote(self.database)}")
        client.command(f"CREATE TABLE IF NOT EXISTS {self._table(table)} ({columns}) ENGINE = MergeTree ORDER BY tuple()")

    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        return _StagingTransaction(self, table, new_ref, record_intent)

    def commit(self, committable: Committable) -> CommitOutcome:
        self._ensure_ledger()
        client, staging = self.client(), committable.label
        if not self._exists(staging):
            return self._outcome_without_staging(committable)
        state = self._ledger_state(committable.label)
        try:
            partitions = self._partitions(staging)
            if state is None:
                self._write_ledger(committable, MOVING)
            for partition_id in partitions:
                client.command(
                    f"ALTER TABLE {self._table(staging)} MOVE PARTITION ID {literal(partition_id)} "
                    f"TO TABLE {self._table(committable.table)}"
                )
            left = self.count_rows(staging)
            if left:
                raise TargetError(
                    f"staging table {staging} still holds {left} rows after its partitions were moved: "
                    "something wrote into it during the commit"
                )
        except Exception:
            if self._exists(staging):
                raise
            return self._outcome_without_staging(committable)  # dropped under us: the ledger decides
        if state != COMMITTED:
            self._write_ledger(committable, COMMITTED)
        client.command(f"DROP TABLE IF EXISTS {self._table(staging)} SYNC")
        return CommitOutcome.COMMITTED

    def abort(self, ref: TxnRef) -> None:
        """Drop the staging table, unless a commit of the label began: then only committing it is right."""
        self._ensure_ledger()
        state = self._ledger_state(ref.label)
        if state is not None:
            raise CommittedNotChosenError(
                f"refusing to abort {ref.label}: the ledger {self.database}.{LEDGER_TABLE} says its commit "
                f"{'finished (committed)' if state == COMMITTED else 'began (moving)'}; a transaction whose "
                f"commit began can only be committed, so whoever aborts it holds a stale view of the batch. "
                + CommittedNotChosenError.RUNBOOK
            )
        self.client().command(f"DROP TABLE IF EXISTS {self._table(ref.label)} SYNC")

    def staging_tables(self) -> list[str]:
        """Staging tables present now (for tests and the operator's status)."""
        rows = self.client().query(
            "SELECT name FROM system.tables WHERE database = {db:String} AND startsWith(name, 'ss_')",
            parameters={"db": self.database},
        ).result_rows
        return sorted(r[0] for r in rows if _LABEL_SHAPE.fullmatch(r[0]))

    def leftover_transactions(self, label_prefix: str) -> list[str]:
        """Staging tables whose label starts with `label_prefix` (e.g. one job's), for reconciling with the journal."""
        return [name for name in self.staging_tables() if name.startswith(label_prefix)]

    def _outcome_without_staging(self, committable: Committable) -> CommitOutcome:
        state = self._ledger_state(committable.label)
        if state == COMMITTED:
            return CommitOutcome.COMMITTED
        if state == MOVING:
            raise CommitAmbiguousError(self._ambiguity(committable))
        if self._read_ledger_ttl_s() is not None:
            return CommitOutcome.LOST  # this ledger expires rows: the label's committed row may be gone
        return CommitOutcome.ABORTED  # every commit writes its ledger row before it moves anything

    def _ambiguity(self, c: Committable) -> str:
        ledger = self._table(LEDGER_TABLE)
        return (
            f"ClickHouse commit of {c.label} into {self._table(c.table)} was interrupted and its staging table is "
            f"gone: the ledger says its partition moves began but not that they finished, so between 0 and "
            f"{c.rows} rows of it are visible, and the sink cannot tell how many. It stops rather than lose or "
            "duplicate them. See docs/runbook.md, section 11 'ClickHouse commit interrupted': count this transaction's rows "
            f"in the target (writer partition {c.partition} of the batch its label names, e.g. "
            f"SELECT count() FROM {self._table(c.table)} WHERE kafka_partition = … AND kafka_offset >= … AND "
            f"kafka_offset < …, with the batch's offsets from the checkpoint) and compare with {c.rows}. "
            f"All there: INSERT INTO {ledger} (label, target_table, rows, state) VALUES ({literal(c.label)}, "
            f"{literal(c.table)}, {int(c.rows)}, {literal(COMMITTED)}). None there (delete any that are): "
            f"ALTER TABLE {ledger} DELETE WHERE label = {literal(c.label)}, and the batch is replayed when "
            "Spark re-runs it. Then restart."
        )

    def _ensure_ledger(self) -> None:
        """Create the ledger, or give one made by an older version the `state` column (once per target)."""
        if self._ledger_ready:
            return
        client = self.client()
        client.command(
            f"CREATE TABLE IF NOT EXISTS {self._table(LEDGER_TABLE)} (label String, target_table String, "
            f"rows UInt64, {_STATE_COLUMN}, committed_at DateTime DEFAULT now()) ENGINE = MergeTree ORDER BY label"
        )
        client.command(f"ALTER TABLE {self._table(LEDGER_TABLE)} ADD COLUMN IF NOT EXISTS {_STATE_COLUMN}")
        self._ledger_ttl_s = self._read_ledger_ttl_s()
        self._ledger_ready = True

    def _read_ledger_ttl_s(self) -> float | None:
        """The ledger's TTL (legacy ledgers had `TTL committed_at + INTERVAL n DAY`); None: rows are kept."""
        engine = self.client().query(
            "SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            parameters={"db": self.database, "t": LEDGER_TABLE},
        ).result_rows[0][0]
        if not re.search(r"\bTTL\b", engine):
            return None
        days = re.search(r"toIntervalDay\((\d+)\)", engine)
        return float(days.group(1)) * 86400.0 if days else 0.0  # a TTL of another shape: assume the worst

    def _write_ledger(self, committable: Committable, state: str) -> None:
        self.client().command(
            f"INSERT INTO {self._table(LEDGER_TABLE)} (label, target_table, rows, state) VALUES "
            f"({literal(committable.label)}, {literal(committable.table)}, {int(committable.rows)}, {literal(state)})"
        )

    def _ledger_state(self, label: str) -> str | None:
        """How far the label's commit got: COMMITTED, MOVING, or None (never begun)."""
        states = {
            r[0]
            for r in self.client().query(
                f"SELECT DISTINCT state FROM {self._table(LEDGER_TABLE)} WHERE label = {{label:String}}",
                parameters={"label": label},
            ).result_rows
        }
        return COMMITTED if COMMITTED in states else MOVING if MOVING in states else None

    def _exists(self, table: str) -> bool:
        return bool(self.client().command(f"EXISTS TABLE {self._table(table)}"))

    def _partitions(self, table: str) -> list[str]:
        """The table's partitions; checked after the listing, so an empty one means empty, not gone."""
        rows = self.client().query(
            "SELECT DISTINCT partition_id FROM system.parts WHERE database = {db:String} AND table = {t:String} AND active",
            parameters={"db": self.database, "t": table},
        ).result_rows
        if not self._exists(table):
            raise TargetError(f"staging table {self._table(table)} does not exist")
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
            target.client().command(f"CREATE TABLE {target._table(ref.label)} AS {target._table(self._table)}")
            self._ref = ref  # only now: a writer whose CREATE failed (the label's table exists) must not drop it
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
