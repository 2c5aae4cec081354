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
so there "no row" is LOST. Rows are kept for good: two of ~100 bytes per transaction, and in insert
mode one more per staging partition.
Never `ATTACH PARTITION FROM`: it copies, so a repeated commit would duplicate rows.

Replicas (Replicated*/Shared* tables, ClickHouse Cloud; conformance review 2026-11-24, C2 and C5): a
read may land on a replica that has not fetched the newest ledger rows yet, while the staging table's
DROP (database DDL) already reached it, and an ALTER returns before the other replicas ran it. So every
ledger read that decides something is consistent (`_ledger_rows`: the replica syncs the ledger first), each
MOVE waits for every replica (`alter_sync = 2`), and on a Replicated ledger or target table the ledger rows
and the INSERT … SELECT wait for a majority (`insert_quorum = 'auto'`) before the next step relies on them.
Facts and sources: docs/clickhouse-clusters.md, "Replicas behind a load balancer".

Materialized views fire on INSERT only, never on a partition move, so a table that feeds views is
refused in the default `commit_mode = "move"` (review R8). `commit_mode = "insert"` commits with
`INSERT INTO <target> SELECT … FROM <staging>` instead, which the views see; the ledger journals it
(`inserting` before the first INSERT, `inserted` with the staging partition after each), a resumed
commit skips the partitions already inserted, and a deduplication token per label and partition makes
a repeat of the one INSERT a crash cut a no-op, in the table and in its views. What that needs from
the tables, and why, is in `_commit_by_insert` and docs/clickhouse-views.md.

The same code speaks HTTP (`http://host:8123`) and embedded chdb (`chdb:///path`); chdb allows
one process per path, so with chdb the writers run in the driver. Over HTTP the writers run in Spark
tasks (the target is pickled without its connection; one client per thread), and a commit or an abort
that meets a transport error or an error answer repeats itself (`retries`): docs/design.md, "ClickHouse
over HTTP".
"""
from __future__ import annotations

import logging
import math
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, TypeVar
from urllib.parse import urlparse

import pyarrow as pa

from .encoding import EncodingError
from ..committable import Committable, TxnRef
from ..crash import crash_point, target_point
from ..errors import UnknownDatabaseError
from ..retry import RetryPolicy
from .base import (
    CommitAmbiguousError, CommitOutcome, CommittedNotChosenError, ConfigurationError, ExpiryKind, ExpiryLimit, NewRef, PreparedPart,
    RecordIntent, TableTransaction, Target, TargetError,
)
from .clickhouse_types import CLICKHOUSE_COLUMNS
from .descriptor import NeededModule, TargetDescriptor, keyword_options
from .clickhouse_engines import DATABASE_FACTS_QUERY, FACTS_QUERY, TableFacts, engine_refusal

log = logging.getLogger(__name__)
_T = TypeVar("_T")

LEDGER_TABLE = "_streaming_sink_ledger"
# Ledger states of a label: its partition moves began (moving) or its INSERT … SELECT began (inserting), or it finished.
MOVING, INSERTING, COMMITTED = "moving", "inserting", "committed"
# Insert mode: one staging partition's INSERT finished (a row per partition, naming it), so a resumed commit skips it.
INSERTED = "inserted"
MOVE, INSERT = "move", "insert"  # commit modes (the `commit_mode` option)
COMMIT_MODES = (MOVE, INSERT)
#: commit_mode insert: the INSERTs ran, the ledger does not say so yet; the re-run must insert nothing twice
INSERT_CRASH_POINT = target_point("clickhouse-after-insert")
# Rows written before the ledger had `state` were written after the moves: they read as committed.
_STATE_COLUMN = f"state String DEFAULT '{COMMITTED}'"
# The staging partition an `inserted` row is about; '' in every other row (and in rows of older ledgers).
_PARTITION_COLUMN = "partition_id String DEFAULT ''"
# make_label's shape: "ss_", sanitised parts joined by "_", then "_" and 12 hex digits of a hash.
_LABEL_SHAPE = re.compile(r"ss_\w*_[0-9a-f]{12}", re.ASCII)
_MOVABLE_ENGINE_SUFFIX = "MergeTree"
_REPLICATED_PREFIXES = ("Replicated", "Shared")  # engines whose replicas can lag: a ledger read syncs first
# A partition move returns once every replica ran it (alter_sync 0 waits for none, 1 for this replica: the defaults on
# Cloud and on a server; 3 for the active replicas only, kept when the target's `settings` ask for it).
_MOVE_SYNC = {"alter_sync": 2}
_QUORUM = {"insert_quorum": "auto"}  # a majority of a Replicated table's replicas hold the rows before the INSERT returns
_CANNOT_ORDER_BY = 44  # ILLEGAL_COLUMN: a column type ORDER BY cannot compare (AggregateFunction, ...)
_CHDB_CLIENTS: dict[str, Any] = {}  # one embedded engine per path per process


class ClickHouseError(TargetError):
    """clickhouse-connect's error (unreachable, refused, failing) as the sink's own, past the target's edge."""

    headline = "ClickHouse failed: {error}; check that it runs and that target.url (or --target) names it"
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
        verify: bool = True,
        ca_bundle: str | None = None,
        commit_mode: str = MOVE,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 300.0,
        retries: int = 5,
        backoff_s: float = 0.2,
        backoff_max_s: float = 5.0,
        commit_parallelism: int | None = None,
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
        if commit_mode not in COMMIT_MODES:
            raise ConfigurationError(
                f"ClickHouseTarget commit_mode {commit_mode!r}: use {MOVE!r} (the default: partitions are moved, "
                f"materialized views do not see them) or {INSERT!r} (INSERT … SELECT, which fires them); "
                "see docs/clickhouse-views.md"
            )
        self.commit_mode = commit_mode
        for name, value in (("connect_timeout_s", connect_timeout_s), ("read_timeout_s", read_timeout_s)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"ClickHouseTarget {name} {value!r}: seconds, at least 1 (the client counts whole seconds)")
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ConfigurationError(f"ClickHouseTarget retries {retries!r}: a whole number, 0 or more")
        # HTTP: how long the client waits to connect and for an answer, and how often a commit or an abort is
        # repeated after a transport error or an error answer of the server (each repeat resumes where it stopped)
        self.connect_timeout_s, self.read_timeout_s = float(connect_timeout_s), float(read_timeout_s)
        self.retries, self.backoff_s, self.backoff_max_s = retries, float(backoff_s), float(backoff_max_s)
        if commit_parallelism is not None and (not isinstance(commit_parallelism, int) or commit_parallelism < 1):
            raise ConfigurationError(f"ClickHouseTarget commit_parallelism {commit_parallelism!r}: a whole number, 1 or more")
        self._commit_parallelism = commit_parallelism  # None: 8 over HTTP, 1 embedded (one engine per process)
        self._local = threading.local()
        # table -> why the job may not load it in this commit mode (None: it may), found by `routable_tables`
        self._refusals: dict[str, str | None] = {}
        self._engines: dict[str, str] = {}  # table -> engine, as routable_tables found it (travels to tasks)
        self._insert_settings: dict[str, str] | None = None  # the deduplication settings this server knows
        self._dedup_limit: ExpiryLimit | None = None  # insert mode: what the tables' deduplication logs forget
        self._ledger_ready = False
        self._ledger_ttl_s: float | None = None  # a legacy ledger's TTL, found when the ledger is checked
        self._ledger_engine = ""  # the ledger's engine, found when the ledger is checked: replicated ones are synced

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
        if self.embedded:
            return 1
        return self._commit_parallelism or 8

    def client(self) -> Any:
        """A client for this thread (HTTP) or the process's one engine for the path (chdb)."""
        import clickhouse_connect
        from clickhouse_connect.driver.exceptions import Error

        try:
            return self._client(clickhouse_connect)
        except Error as error:
            raise ClickHouseError(str(error)) from error

    def _client(self, clickhouse_connect: Any) -> Any:
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
                connect_timeout=math.ceil(self.connect_timeout_s),  # clickhouse-connect takes whole seconds
                send_receive_timeout=math.ceil(self.read_timeout_s),
            )
        return self._local.client

    def _table(self, name: str) -> str:
        return f"{quote(self.database)}.{quote(name)}"

    def routable_tables(self) -> set[str]:
        """The tables whose engine the sink commits atomically (clickhouse_engines.py); the others are left
        out, each with a warning that says why and what to load instead. Reads and DDL with IF NOT EXISTS
        only, so a failed attempt is repeated whole."""
        return self._repeating("start-up checks", self._routable_tables)

    def _routable_tables(self) -> set[str]:
        client = self.client()
        facts = {
            row["name"]: TableFacts.from_row(row)
            for row in client.query(DATABASE_FACTS_QUERY, parameters={"db": self.database}).named_results()
            if row["name"] != LEDGER_TABLE and not _LABEL_SHAPE.fullmatch(row["name"])
        }
        if not facts and not client.query(
            "SELECT count() FROM system.databases WHERE name = {db:String}", parameters={"db": self.database}
        ).result_rows[0][0]:
            raise UnknownDatabaseError(f"ClickHouse database {self.database!r} does not exist at {self.url}")
        self._ensure_ledger()
        tables = set()
        for name, table_facts in sorted(facts.items()):
            why = engine_refusal(table_facts, self.commit_mode)
            if why:
                log.warning("ClickHouse table %s.%s cannot be loaded: %s", self.database, name, why)
            else:
                tables.add(name)
                self._engines[name] = table_facts.engine
        self._refusals = {table: self._refusal(table) for table in sorted(tables)}
        refused = sorted(table for table, why in self._refusals.items() if why)
        if refused:
            log.warning("ClickHouse %s: the job refuses to load %s in commit_mode %r (materialized views or deduplication "
                        "settings; see docs/clickhouse-views.md)", self.database, refused, self.commit_mode)
        if self.commit_mode == INSERT:
            self._dedup_limit = self._deduplication_limit(sorted(set(tables) - set(refused)))
        return tables

    def engine_of(self, table: str) -> str:
        """The table's engine (from routable_tables, or asked now)."""
        if table not in self._engines:
            self._repeating(f"engine check of {table}", lambda: self._refusal(table))
        return self._engines.get(table, "")

    def check_loadable(self, table: str) -> None:
        """Refuse (ConfigurationError) a table this commit mode cannot load exactly once, with the views involved.

        Checked per table the job writes, when it starts: `check_schema` (the job calls it for each of
        its tables before Spark reads anything) and `begin` (before any intent), not for every table of
        the database in `routable_tables`, so a view on a table the job never writes stops nothing.
        """
        why = self.refusal(table)
        if why:
            raise ConfigurationError(why)

    def refusal(self, table: str) -> str | None:
        if table not in self._refusals:
            self._refusals[table] = self._repeating(f"engine check of {table}", lambda: self._refusal(table))
        return self._refusals[table]

    def expiry_limits(self) -> list[ExpiryLimit]:
        """Nothing expires, unless the ledger was made by an older version (as found by `routable_tables`);
        in insert mode, also the tables' deduplication logs, which a retried INSERT relies on."""
        limits = [ExpiryLimit("prepared staging tables", None, kind=ExpiryKind.PREPARED),
                  ExpiryLimit("commit ledger", self._ledger_ttl_s, kind=ExpiryKind.LEDGER)]
        return limits + ([self._dedup_limit] if self._dedup_limit is not None else [])

    def check_schema(self, table: str, schema: pa.Schema) -> None:
        self.check_loadable(table)

    def table_columns(self, table: str) -> dict[str, str] | None:
        rows = self._repeating(f"column read of {table}", lambda: self.client().query(
            "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String} ORDER BY position",
            parameters={"db": self.database, "t": table},
        ).result_rows)
        return {name: kind for name, kind in rows}

    def create_table(self, table: str, schema: pa.Schema) -> None:
        """Create a MergeTree table for an Arrow schema if it is missing (the embedded quick start)."""
        columns = ", ".join(f"{quote(f.name)} {clickhouse_type(f.type, f.nullable)}" for f in schema)

        def create() -> None:
            client = self.client()
            client.command(f"CREATE DATABASE IF NOT EXISTS {quote(self.database)}")
            client.command(f"CREATE TABLE IF NOT EXISTS {self._table(table)} ({columns}) ENGINE = MergeTree ORDER BY tuple()")

        self._repeating(f"creation of {table}", create)

    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        self.check_loadable(table)
        return _StagingTransaction(self, table, new_ref, record_intent)

    def commit(self, committable: Committable) -> CommitOutcome:
        """Finish the label's commit the way its ledger rows say it began; a label not begun, the way the mode says.

        Over HTTP, a transport error (connection refused or cut, answer lost, timeout) or an error answer of the
        server repeats the whole commit, up to `retries` times: every step is safe to repeat, and a repeat resumes
        where the statement that failed left it, applied or not. The sink's own verdicts (ambiguous, refused,
        rows that do not add up) are never repeated.
        """
        return self._repeating(f"commit of {committable.label}", lambda: self._commit_once(committable))

    def _repeating(self, what: str, step: Callable[[], _T]) -> _T:
        """`step()`, repeated with the retry policy after a transport error or an error answer of the server
        (clickhouse-connect's DatabaseError, OperationalError included), each time on a fresh connection; the
        sink's own errors raise at once. Embedded chdb has no transport: nothing is repeated."""
        from clickhouse_connect.driver.exceptions import DatabaseError

        def repeatable(error: BaseException) -> bool:
            if not isinstance(error, (DatabaseError, ClickHouseError)):
                return False
            self.close()
            return True

        try:
            return RetryPolicy(0 if self.embedded else self.retries, self.backoff_s, self.backoff_max_s).run(
                f"ClickHouse {what}", step, repeatable)
        except DatabaseError as error:  # the last one, as the sink's own
            raise ClickHouseError(str(error)) from error

    def _commit_once(self, committable: Committable) -> CommitOutcome:
        self._ensure_ledger()
        client, staging = self.client(), committable.label
        if not self._exists(staging):
            return self._outcome_without_staging(committable)
        states = self._ledger_states(committable.label)
        if INSERTING in states or (not states and self.commit_mode == INSERT):
            return self._commit_by_insert(committable, states)
        if not states:
            self._refuse_before_first_commit(committable)  # a view created since the job started
        state = _summary(states)
        if state == COMMITTED:  # every partition moved: a partition still listed is a lagging replica's view, never moved again
            client.command(f"DROP TABLE IF EXISTS {self._table(staging)} SYNC")
            return CommitOutcome.COMMITTED
        try:
            partitions = self._partitions(staging)
            if state is None:
                self._write_ledger(committable, MOVING)
            move_sync = {"alter_sync": 3} if str(self.settings.get("alter_sync")) == "3" else _MOVE_SYNC  # see _MOVE_SYNC
            for partition_id in partitions:
                client.command(
                    f"ALTER TABLE {self._table(staging)} MOVE PARTITION ID {literal(partition_id)} "
                    f"TO TABLE {self._table(committable.table)}",
                    settings=move_sync,
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
        self._write_ledger(committable, COMMITTED)
        client.command(f"DROP TABLE IF EXISTS {self._table(staging)} SYNC")
        return CommitOutcome.COMMITTED

    def abort(self, ref: TxnRef) -> None:
        """Drop the staging table, unless a commit of the label began: then only committing it is right.

        Repeated like `commit` after a transport error or an error answer of the server (dropping is idempotent)."""
        self._repeating(f"abort of {ref.label}", lambda: self._abort_once(ref))

    def _abort_once(self, ref: TxnRef) -> None:
        self._ensure_ledger()
        state = self._ledger_state(ref.label)
        if state is not None:
            raise CommittedNotChosenError(
                f"refusing to abort {ref.label}: the ledger {self.database}.{LEDGER_TABLE} says its commit "
                f"{'finished (committed)' if state == COMMITTED else f'began ({state})'}; a transaction whose "
                f"commit began can only be committed, so whoever aborts it holds a stale view of the batch. "
                + CommittedNotChosenError.RUNBOOK
            )
        self.client().command(f"DROP TABLE IF EXISTS {self._table(ref.label)} SYNC")

    def staging_tables(self) -> list[str]:
        """Staging tables present now (for tests and the operator's status)."""
        rows = self._repeating("staging table listing", lambda: self.client().query(
            "SELECT name FROM system.tables WHERE database = {db:String} AND startsWith(name, 'ss_')",
            parameters={"db": self.database},
        ).result_rows)
        return sorted(r[0] for r in rows if _LABEL_SHAPE.fullmatch(r[0]))

    def leftover_transactions(self, label_prefix: str) -> list[str]:
        """Staging tables whose label starts with `label_prefix` (e.g. one job's), for reconciling with the journal."""
        return [name for name in self.staging_tables() if name.startswith(label_prefix)]

    def _outcome_without_staging(self, committable: Committable) -> CommitOutcome:
        """The verdict on a label whose staging table was seen gone; read after that, and consistently (`_ledger_rows`):
        a replica that applied the DROP but lags on the ledger would otherwise show no row, and a replay duplicate it."""
        state = self._ledger_state(committable.label)
        if state == COMMITTED:
            return CommitOutcome.COMMITTED
        if state in (MOVING, INSERTING):
            raise CommitAmbiguousError(self._ambiguity(committable, state))
        if self._read_ledger_ttl_s() is not None:
            return CommitOutcome.LOST  # this ledger expires rows: the label's committed row may be gone
        return CommitOutcome.ABORTED  # every commit writes its ledger row before it moves anything

    def _ambiguity(self, c: Committable, state: str = MOVING) -> str:
        ledger = self._table(LEDGER_TABLE)
        began = "its partition moves began" if state == MOVING else "its INSERT … SELECT into the table began"
        return (
            f"ClickHouse commit of {c.label} into {self._table(c.table)} was interrupted and its staging table is "
            f"gone: the ledger says {began} but not that it finished, so between 0 and "
            f"{c.rows} rows of it are visible, and the sink cannot tell how many. It stops rather than lose or "
            "duplicate them. See docs/runbook.md, section 'ClickHouse commit interrupted': count this transaction's rows "
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
            f"rows UInt64, {_STATE_COLUMN}, committed_at DateTime DEFAULT now(), {_PARTITION_COLUMN}) ENGINE = MergeTree ORDER BY label"
        )
        client.command(f"ALTER TABLE {self._table(LEDGER_TABLE)} ADD COLUMN IF NOT EXISTS {_STATE_COLUMN}")
        client.command(f"ALTER TABLE {self._table(LEDGER_TABLE)} ADD COLUMN IF NOT EXISTS {_PARTITION_COLUMN}")
        self._ledger_engine = self._ledger_definition()[0]
        self._ledger_ttl_s = self._read_ledger_ttl_s()
        self._ledger_ready = True

    def _ledger_definition(self) -> tuple[str, str]:
        """The ledger's engine and full engine clause, as system.tables shows them."""
        engine, engine_full = self.client().query(
            "SELECT engine, engine_full FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            parameters={"db": self.database, "t": LEDGER_TABLE},
        ).result_rows[0]
        return str(engine), str(engine_full)

    def _read_ledger_ttl_s(self) -> float | None:
        """The ledger's TTL (legacy ledgers had `TTL committed_at + INTERVAL n DAY`); None: rows are kept."""
        engine = self._ledger_definition()[1]
        if not re.search(r"\bTTL\b", engine):
            return None
        days = re.search(r"toIntervalDay\((\d+)\)", engine)
        return float(days.group(1)) * 86400.0 if days else 0.0  # a TTL of another shape: assume the worst

    def _write_ledger(self, committable: Committable, state: str) -> None:
        self.client().command(
            f"INSERT INTO {self._table(LEDGER_TABLE)} (label, target_table, rows, state) VALUES "
            f"({literal(committable.label)}, {literal(committable.table)}, {int(committable.rows)}, {literal(state)})",
            settings=self._ledger_write_settings(),
        )

    def _ledger_write_settings(self) -> dict[str, str]:
        """A Replicated ledger's row is on a majority of replicas before the next step relies on it. Not on
        SharedMergeTree (every insert is a quorum insert there) nor on a single server (nothing to wait for)."""
        return _QUORUM if self._ledger_engine.startswith("Replicated") else {}

    def _write_inserted(self, committable: Committable, partition_id: str, rows: int) -> None:
        """Journal that one staging partition's INSERT finished, so a resumed commit never sends it again."""
        self.client().command(
            f"INSERT INTO {self._table(LEDGER_TABLE)} (label, target_table, rows, state, partition_id) VALUES "
            f"({literal(committable.label)}, {literal(committable.table)}, {int(rows)}, {literal(INSERTED)}, "
            f"{literal(partition_id)})",
            settings=self._ledger_write_settings(),
        )

    def _inserted_partitions(self, label: str) -> set[str]:
        """The staging partitions whose INSERT the ledger says finished (none in ledgers of older versions)."""
        return {
            r[0]
            for r in self._ledger_rows(
                f"SELECT DISTINCT partition_id FROM {self._table(LEDGER_TABLE)} WHERE label = {{label:String}} "
                f"AND state = {literal(INSERTED)}",
                label,
            )
        }

    def _ledger_state(self, label: str) -> str | None:
        """How far the label's commit got: COMMITTED, INSERTING, MOVING, or None (never begun)."""
        return _summary(self._ledger_states(label))

    def _ledger_states(self, label: str) -> set[str]:
        """Every state the ledger holds for the label: which way its commit began, and whether it finished."""
        return {
            r[0]
            for r in self._ledger_rows(f"SELECT DISTINCT state FROM {self._table(LEDGER_TABLE)} WHERE label = {{label:String}}", label)
        }

    def _ledger_rows(self, sql: str, label: str) -> list[Any]:
        """A ledger query's rows, holding every ledger row written before it was sent, whichever replica answers.

        A replica behind a load balancer may not have fetched the newest ledger parts yet (ClickHouse KB "read
        consistency"). On a Replicated*/Shared* ledger this replica first fetches every part the ledger's
        replication log names (`SYSTEM SYNC REPLICA … LIGHTWEIGHT`, same session, so the same replica), and on
        SharedMergeTree the read is also sequentially consistent; on a Replicated one that setting would cover
        only inserts with a sequential quorum, which the ledger does not use. A single server is always current.
        """
        client, settings = self.client(), {}
        if self._ledger_engine.startswith(_REPLICATED_PREFIXES):
            client.command(f"SYSTEM SYNC REPLICA {self._table(LEDGER_TABLE)} LIGHTWEIGHT")
            if self._ledger_engine.startswith("Shared"):
                settings = {"select_sequential_consistency": 1}
        return list(client.query(sql, parameters={"label": label}, settings=settings).result_rows)

    def _exists(self, table: str) -> bool:
        return bool(self.client().command(f"EXISTS TABLE {self._table(table)}"))

    def _partitions(self, table: str) -> list[str]:
        """The table's partitions; checked after the listing, so an empty one means empty, not gone."""
        return sorted(self._partition_sizes(table))

    def _partition_sizes(self, table: str) -> dict[str, tuple[int, int]]:
        """partition id -> (rows, uncompressed bytes) of the table's active parts; an error if the table is gone."""
        rows = self.client().query(
            "SELECT partition_id, sum(rows), sum(data_uncompressed_bytes) FROM system.parts "
            "WHERE database = {db:String} AND table = {t:String} AND active GROUP BY partition_id",
            parameters={"db": self.database, "t": table},
        ).result_rows
        if not self._exists(table):
            raise TargetError(f"staging table {self._table(table)} does not exist")
        return {str(r[0]): (int(r[1]), int(r[2])) for r in rows}

    def count_rows(self, table: str) -> int:
        return int(self.client().query(f"SELECT count() FROM {self._table(table)}").result_rows[0][0])

    # -- commit by INSERT … SELECT (commit_mode "insert") --------------------------------------------

    def _commit_by_insert(self, c: Committable, states: set[str]) -> CommitOutcome:
        """Copy the staging table into the target with INSERTs the views see; a repeat inserts nothing twice.

        ClickHouse facts this relies on (in our words; sources below, behaviour checked on chdb 4.4 = ClickHouse 26.9):

        * A materialized view is a trigger on INSERT into its source table; a partition move is not an
          INSERT, so views miss moved rows (review R8; the INSERT SELECT here fires them).
        * An INSERT is not atomic across a table and its views: an interrupted one may have written the
          table and some views; retrying it with deduplication on is the documented way to complete it
          exactly once (docs: guides/developer/deduplicating-inserts-on-retries, "Uncertain insert
          status"; reference/settings/session-settings/materialized-views, materialized_views_ignore_errors).
        * Deduplication needs the table to keep a log of inserted blocks: `non_replicated_deduplication_window`
          > 0 on a plain *MergeTree (its default is 0: no deduplication), `replicated_deduplication_window`
          (and `_seconds`) on Replicated/Shared ones (same guide, "Insert deduplication for tables"; merge-tree
          settings reference). A block older than the window is forgotten, and inserted again.
        * `insert_deduplication_token` replaces the content hash; it is kept per partition, and each block of a
          multi-block insert gets its own id from the token and the block's number, so a retry must cut the rows
          into the same blocks (settings reference, insert_deduplication_token; we saw a retry with another
          block size skip rows it had never inserted). Hence one INSERT per staging partition (rows of one target
          partition), rows in a total order (ORDER BY every column), one thread, and fixed block sizes.
        * INSERT … SELECT deduplicates only when its SELECT is stable or a token is given
          (`deduplicate_insert_select`, newer releases; `insert_select_deduplicate` before): we give a token and
          ask for `force_enable` where the server knows the setting, so it fails rather than silently not dedupe.
        * Views: a block deduplicated in the table still flows into its views on current releases, and each
          view's table drops it only with `deduplicate_blocks_in_dependent_materialized_views` = 1 and its own
          deduplication window (guide, "Insert deduplication with materialized views"; measured: a view whose
          table has no window counted the repeat twice). Older releases skipped the views of a deduplicated block
          (ClickHouse/ClickHouse PR #54184 changed parts of it). Requiring a window on every view's table is
          right under both, so `check_loadable` refuses a view whose table cannot deduplicate.
        * The log is a count: each new block adds its id and the oldest beyond the window is forgotten; a block
          found in the log adds nothing (MergeTreeDeduplicationLog in ClickHouse's source; merge-tree settings
          reference, replicated_deduplication_window). So a repeat is a no-op only while fewer than `window`
          newer blocks reached the table, from this label or any other.

        Hence the ledger gets an `inserted` row after each partition's INSERT, and a resumed commit skips the
        partitions it names: only the INSERT in flight at a crash is repeated and relies on the log. The first
        step still refuses a table (or view's table) whose window is below the label's blocks times
        `commit_parallelism`, the most that can reach it between that INSERT and its repeat
        (`_refuse_a_window_below_the_label`; reliability review 2026-11-24, F1).
        """
        client, staging = self.client(), c.label
        if COMMITTED in states:  # its INSERTs finished: never again (the deduplication log may have forgotten them)
            client.command(f"DROP TABLE IF EXISTS {self._table(staging)} SYNC")
            return CommitOutcome.COMMITTED
        try:
            sizes = self._partition_sizes(staging)
            held = self.count_rows(staging)
            if held != c.rows:
                raise TargetError(
                    f"staging table {staging} holds {held} rows but {c.rows} were prepared: something changed it after prepare"
                )
            if not states:
                self._refuse_before_first_commit(c)
                self._refuse_a_window_below_the_label(c, sizes)
                self._write_ledger(c, INSERTING)  # journaled before the first INSERT: from here it is never aborted
                done: set[str] = set()
            else:
                done = self._inserted_partitions(c.label)  # empty for a label an older version began: all repeated
            columns = ", ".join(quote(name) for name in self._insertable_columns(staging))
            quorum = self.engine_of(c.table).startswith("Replicated")  # Shared*: every insert is a quorum insert already
            for partition_id in sorted(set(sizes) - done):
                settings = self._insert_settings_sql(f"{staging}:{partition_id}", quorum)
                client.command(
                    f"INSERT INTO {self._table(c.table)} ({columns}) SETTINGS {settings} "
                    f"SELECT {columns} FROM {self._table(staging)} WHERE _partition_id = {literal(partition_id)} ORDER BY {columns}"
                )
                self._write_inserted(c, partition_id, sizes[partition_id][0])
        except Exception:
            if self._exists(staging):
                raise
            return self._outcome_without_staging(c)  # dropped under us: the ledger decides
        crash_point(INSERT_CRASH_POINT, -1)  # target points take no @batch: the first insert commit
        self._write_ledger(c, COMMITTED)
        client.command(f"DROP TABLE IF EXISTS {self._table(staging)} SYNC")
        return CommitOutcome.COMMITTED

    def _refuse_before_first_commit(self, c: Committable) -> None:
        """A view created, or a setting changed, since the job started: refuse before the label's first step."""
        why = self._refusal(c.table)
        if why:
            raise ConfigurationError(why)

    def _refuse_a_window_below_the_label(self, c: Committable, sizes: dict[str, tuple[int, int]]) -> None:
        """Refuse, before the `inserting` row, a label a crash could leave for a repeat its tables' logs no longer match.

        Between an INSERT cut by a crash and its repeat, each of the `commit_parallelism` commits running at
        once may add about as many blocks as this label to the same table and views; a window below that
        could forget the cut INSERT's blocks and insert them twice.
        """
        entry = self._entry(self.database, c.table)
        if entry is None:
            return  # gone: the INSERT fails and says so
        blocks = sum(_insert_blocks(rows, size) for rows, size in sizes.values())
        least = blocks * self.commit_parallelism
        why = (f"the label inserts {len(sizes)} partition(s) in about {blocks} block(s) and up to "
               f"{self.commit_parallelism} commit(s) run at once (commit_parallelism)")
        tables, _ = self._deduplicating_tables(entry)
        short = [problem for table in tables if (problem := self._window_shortfall(table, least, why))]
        if short:
            raise ConfigurationError(
                f"ClickHouse commit of {c.label} into {entry.qualified} refused before anything was inserted (the batch "
                f"stays PREPARED and is committed at the next start once the window is raised): " + "; ".join(short)
                + ". See docs/clickhouse-views.md"
            )

    def _window_shortfall(self, table: _Entry, least: int, why: str) -> str | None:
        """Why `table`'s deduplication window is too small for `least` blocks (None: it is not), and how to raise it."""
        setting, window = self._dedup_window(table)
        if window >= least:
            return None
        return (
            f"{table.qualified}'s {setting} is {window}{' (no deduplication)' if not window else ''}, it must be at least "
            f"{least} ({why}): ALTER TABLE {quote(table.database)}.{quote(table.name)} MODIFY SETTING {setting} = "
            f"{max(least, _SUGGESTED_WINDOW)}"
        )

    def _insert_settings_sql(self, token: str, quorum: bool = False) -> str:
        if self._insert_settings is None:
            known = {
                r[0]
                for r in self.client().query(
                    "SELECT name FROM system.settings WHERE has({names:Array(String)}, name)",
                    parameters={"names": list(_INSERT_SETTINGS)},
                ).result_rows
            }
            self._insert_settings = {name: value for name, value in _INSERT_SETTINGS.items() if name in known}
        settings = {**self._insert_settings, "insert_deduplication_token": literal(token)}
        if quorum:
            settings.update({name: literal(value) for name, value in _QUORUM.items()})
        return ", ".join(f"{name} = {value}" for name, value in settings.items())

    def _insertable_columns(self, table: str) -> list[str]:
        """Stored columns an INSERT may set (not MATERIALIZED, ALIAS or EPHEMERAL), in table order."""
        rows = self.client().query(
            "SELECT name FROM system.columns WHERE database = {db:String} AND table = {t:String} "
            "AND default_kind IN ('', 'DEFAULT') ORDER BY position",
            parameters={"db": self.database, "t": table},
        ).result_rows
        return [r[0] for r in rows]

    # -- what each mode refuses ---------------------------------------------------------------------

    def _refusal(self, table: str) -> str | None:
        """Why this commit mode cannot load `table` exactly once, its engine and views included; None when it can."""
        rows = list(self.client().query(FACTS_QUERY, parameters={"db": self.database, "t": table}).named_results())
        if rows:
            self._engines[table] = str(rows[0]["engine"])
            why = engine_refusal(TableFacts.from_row(rows[0]), self.commit_mode)
            if why:
                return f"ClickHouse table {self.database}.{table}: {why}"
        entry = self._entry(self.database, table)
        if entry is None:
            return None  # no such table: the job's own checks name it
        if self.commit_mode == MOVE:
            if not entry.feeds:
                return None
            views = ", ".join(f"{db}.{name}" for db, name in entry.feeds)
            return (
                f"ClickHouse table {entry.qualified} feeds materialized view(s) {views}: commit_mode 'move' (the default) "
                "moves partitions into the table, which views never see, so they would silently miss every row the sink "
                "loads. Set the target option commit_mode = \"insert\" (an INSERT … SELECT from staging, which fires the "
                "views; the table and each view's table need a deduplication window), or load another table. "
                "See docs/clickhouse-views.md"
            )
        problems = self._insert_problems(entry)
        if not problems:
            return None
        return (
            f"ClickHouse table {entry.qualified} cannot be loaded exactly once with commit_mode 'insert': "
            + "; ".join(problems) + ". See docs/clickhouse-views.md"
        )

    def _insert_problems(self, entry: _Entry) -> list[str]:
        """What keeps a repeated INSERT into `entry` from being deduplicated in the table and every view's table."""
        from clickhouse_connect.driver.exceptions import DatabaseError

        tables, problems = self._deduplicating_tables(entry)
        why = (f"one INSERT in flight per commit running at once, commit_parallelism {self.commit_parallelism}; "
               "each commit checks its own partitions too")
        problems = [problem for table in tables if (problem := self._window_shortfall(table, self.commit_parallelism, why))] + problems
        columns = ", ".join(quote(name) for name in self._insertable_columns(entry.name))
        try:
            self.client().query(f"SELECT {columns} FROM {self._table(entry.name)} ORDER BY {columns} LIMIT 0")
        except DatabaseError as error:
            if getattr(error, "code", None) != _CANNOT_ORDER_BY:
                raise  # a lost connection or a failing server says nothing about the table: repeated, or stops loudly
            problems.append(f"its rows cannot be put in a total order, which repeatable INSERT blocks need ({error})")
        return problems

    def _deduplicating_tables(self, entry: _Entry) -> tuple[list[_Entry], list[str]]:
        """The table and each table a materialized view it fires writes into (through views of views), whose
        deduplication windows a repeated INSERT relies on; and what an INSERT fires that cannot deduplicate."""
        tables, problems = [entry], []
        seen: set[tuple[str, str]] = set()
        pending = list(entry.feeds)
        while pending:
            key = pending.pop(0)
            if key in seen:
                continue
            seen.add(key)
            view = self._entry(*key)
            if view is None:
                continue
            if view.engine != "MaterializedView":
                problems.append(f"{view.qualified} ({view.engine}) fires on INSERT but cannot deduplicate a repeated one")
                continue
            destination = self._entry(*view.writes_to) if view.writes_to else None
            if destination is None:
                problems.append(f"the table materialized view {view.qualified} writes into was not found")
                continue
            if not destination.engine.endswith(_MOVABLE_ENGINE_SUFFIX):
                problems.append(
                    f"materialized view {view.qualified} writes into {destination.qualified} ({destination.engine}), "
                    "which cannot deduplicate a repeated INSERT"
                )
                continue
            tables.append(destination)
            pending.extend(destination.feeds)
        return tables, problems

    def _dedup_window(self, entry: _Entry) -> tuple[str, int]:
        """The deduplication setting that governs the table, and its value (the table's own, else the server's)."""
        replicated = entry.engine.startswith(("Replicated", "Shared"))
        setting = "replicated_deduplication_window" if replicated else "non_replicated_deduplication_window"
        own = re.search(rf"\b{setting}\s*=\s*(\d+)", entry.engine_full)
        return setting, int(own.group(1)) if own else self._server_merge_tree_setting(setting)

    def _server_merge_tree_setting(self, name: str) -> int:
        rows = self.client().query(
            "SELECT value FROM system.merge_tree_settings WHERE name = {n:String}", parameters={"n": name}
        ).result_rows
        return int(rows[0][0]) if rows else 0

    def _deduplication_limit(self, tables: list[str]) -> ExpiryLimit | None:
        """For `doctor`: a commit retried after its tables took more newer blocks than their windows hold inserts twice."""
        counts, seconds = [], []
        for table in tables:
            entry = self._entry(self.database, table)
            if entry is None:
                continue
            setting, window = self._dedup_window(entry)
            counts.append(window)
            if setting.startswith("replicated"):
                own = re.search(r"\breplicated_deduplication_window_seconds\s*=\s*(\d+)", entry.engine_full)
                seconds.append(int(own.group(1)) if own else self._server_merge_tree_setting("replicated_deduplication_window_seconds"))
        if not counts:
            return None
        return ExpiryLimit(
            "insert deduplication log (commit_mode insert)", float(min(seconds)) if seconds else None, min(counts),
            note="an INSERT commit retried after the table took more newer blocks than its deduplication window (or, "
                 "Replicated, newer inserts over replicated_deduplication_window_seconds) is inserted twice; raise the window",
            kind=ExpiryKind.DEDUP,
        )

    def _entry(self, database: str, name: str) -> _Entry | None:
        """The table or view as system.tables describes it (None: no such object)."""
        result = self.client().query(
            "SELECT * FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            parameters={"db": database, "t": name},
        )
        if not result.result_rows:
            return None
        row = dict(zip(result.column_names, result.result_rows[0]))
        feeds = tuple(zip(row.get("dependencies_database") or [], row.get("dependencies_table") or []))
        writes_to = _view_destination(row) if row["engine"] == "MaterializedView" else None
        return _Entry(database, name, row["engine"], row.get("engine_full") or "", feeds, writes_to)

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


# Fixed for every INSERT of a commit, so that a retry cuts the same rows into the same blocks (their
# deduplication ids depend on it); settings the server does not know are left out.
_INSERT_SETTINGS = {
    "insert_deduplicate": "1",
    "deduplicate_insert": "'enable'",
    "deduplicate_insert_select": "'force_enable'",
    "deduplicate_blocks_in_dependent_materialized_views": "1",
    "max_threads": "1",
    "max_insert_threads": "1",
    "max_block_size": "65536",
    "max_insert_block_size": "1048576",
    "min_insert_block_size_rows": "1048576",
    "min_insert_block_size_bytes": "268435456",
    "min_insert_block_size_rows_for_materialized_views": "1048576",
    "min_insert_block_size_bytes_for_materialized_views": "268435456",
    "use_strict_insert_block_limits": "0",
}
_SUGGESTED_WINDOW = 10000  # what refusals propose: far above a batch's blocks (a much larger window slows INSERTs)


def _insert_blocks(rows: int, size: int) -> int:
    """At most how many blocks (each one id in the deduplication log) one partition's INSERT … SELECT forms: the
    INSERT squashes rows into a block until it reaches the fixed row or byte minimum of _INSERT_SETTINGS."""
    if rows <= 0:
        return 0
    return 1 + rows // int(_INSERT_SETTINGS["min_insert_block_size_rows"]) + size // int(_INSERT_SETTINGS["min_insert_block_size_bytes"])


_IDENT = r"(?:`(?:[^`\\]|\\.)*`|[A-Za-z_][A-Za-z0-9_]*)"
_VIEW_TO = re.compile(
    rf"CREATE MATERIALIZED VIEW\s+(?:IF NOT EXISTS\s+)?(?:{_IDENT}\.)?{_IDENT}\s+(?:ON CLUSTER\s+\S+\s+)?"
    rf"TO\s+(?:(?P<db>{_IDENT})\.)?(?P<table>{_IDENT})"
)


@dataclass(frozen=True)
class _Entry:
    """A table or view of system.tables, with what an INSERT into it fires."""

    database: str
    name: str
    engine: str
    engine_full: str
    feeds: tuple[tuple[str, str], ...]  # (database, view) of each view an INSERT into it fires
    writes_to: tuple[str, str] | None  # a materialized view's destination table

    @property
    def qualified(self) -> str:
        return f"{self.database}.{self.name}"


def _summary(states: set[str]) -> str | None:
    """How far a label's commit got: COMMITTED, INSERTING, MOVING, or None (never begun)."""
    for state in (COMMITTED, INSERTING, MOVING):
        if state in states:
            return state
    return None


def _unquote(identifier: str) -> str:
    if identifier.startswith("`"):
        return re.sub(r"\\(.)", r"\1", identifier[1:-1])
    return identifier


def _view_destination(row: dict[str, Any]) -> tuple[str, str]:
    """Where a materialized view writes: system.tables says so on newer servers; else its `TO` clause, or its inner table."""
    if row.get("target_table"):
        return row.get("target_database") or row["database"], row["target_table"]
    found = _VIEW_TO.match(row.get("create_table_query") or "")
    if found:
        return _unquote(found.group("db")) if found.group("db") else row["database"], _unquote(found.group("table"))
    uuid = str(row.get("uuid") or "")
    inner = f".inner_id.{uuid}" if uuid.strip("0-") else f".inner.{row['name']}"
    return row["database"], inner


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


_NULLABLE_PREFIXES = ("Nullable(", "LowCardinality(Nullable(")
_KEEPS_EVERY_ROW = frozenset({"MergeTree", "ReplicatedMergeTree", "SharedMergeTree"})  # merges fold no rows


class _StagingTransaction(TableTransaction):
    def __init__(self, target: ClickHouseTarget, table: str, new_ref: NewRef, record_intent: RecordIntent) -> None:
        self._target, self._table = target, table
        self._new_ref, self._record_intent = new_ref, record_intent
        self._ref: TxnRef | None = None
        self._rows = 0
        self._bytes = 0
        self._not_nullable: set[str] | None = None

    def write(self, chunk: pa.Table) -> None:
        target = self._target
        self._refuse_nulls_where_defaults_would_land(chunk)
        if self._ref is None:
            ref = self._new_ref(0)
            self._record_intent(ref)
            target.client().command(f"CREATE TABLE {target._table(ref.label)} AS {target._table(self._table)}")
            self._ref = ref  # only now: a writer whose CREATE failed (the label's table exists) must not drop it
            if target.engine_of(self._table) not in _KEEPS_EVERY_ROW:
                # A Replacing/Summing/Collapsing... staging table would fold rows of equal keys in a background
                # merge before prepare counts them; the target's own merges apply once the rows are moved.
                target.client().command(f"SYSTEM STOP MERGES {target._table(ref.label)}")
        target._repeating(f"insert into {self._ref.label}", lambda: self._insert(chunk))
        self._rows += chunk.num_rows
        self._bytes += chunk.nbytes

    def _insert(self, chunk: pa.Table) -> None:
        """One insert into the staging table, which only this writer writes: after an error its row count
        tells whether the insert landed (done), did not (raised again, so it is repeated), or neither."""
        from clickhouse_connect.driver.exceptions import DatabaseError

        target, label = self._target, self._ref.label if self._ref else ""
        try:
            target.client().insert_arrow(quote(label), chunk, database=target.database)
        except DatabaseError:
            target.close()
            landed = target._repeating(f"row count of {label}", lambda: target.count_rows(label))
            if landed == self._rows + chunk.num_rows:
                return
            if landed != self._rows:
                raise TargetError(
                    f"staging table {label} holds {landed} rows after an insert whose answer was lost; "
                    f"{self._rows} or {self._rows + chunk.num_rows} were expected"
                ) from None
            raise

    def _refuse_nulls_where_defaults_would_land(self, chunk: pa.Table) -> None:
        """ClickHouse stores a NULL sent to a column that is not Nullable (Array, Map and Tuple columns never
        are) as the type's default: 0, '', [], {}. Refused instead, naming the column (docs/types.md)."""
        if self._not_nullable is None:
            columns = self._target.table_columns(self._table) or {}
            self._not_nullable = {name for name, kind in columns.items() if not kind.startswith(_NULLABLE_PREFIXES)}
        for name in chunk.column_names:
            if name in self._not_nullable and chunk.column(name).null_count:
                raise EncodingError(
                    f"column {name!r} of {self._target.database}.{self._table} has NULLs, but its ClickHouse type is not "
                    "Nullable: ClickHouse would store the type's default (0, '', [], {}) instead; make the column "
                    "Nullable(...) or send no NULLs"
                )

    def prepare(self) -> list[PreparedPart]:
        if self._ref is None:
            return []
        label = self._ref.label
        counted = self._target._repeating(f"row count of {label}", lambda: self._target.count_rows(label))
        if counted != self._rows:
            raise TargetError(
                f"staging table {self._ref.label} holds {counted} rows but {self._rows} were written; "
                "is insert deduplication or a TTL active on the target table?"
            )
        return [PreparedPart(self._ref, None, self._rows, self._bytes, {"staging": self._ref.label})]

    def abort(self) -> None:
        if self._ref is not None:
            self._target.abort(self._ref)


DESCRIPTOR = TargetDescriptor(
    product=ClickHouseTarget.kind,
    display_name="ClickHouse",
    schemes={"chdb": "chdb", "clickhouse": "http", "clickhouses": "https", "http": "http", "https": "https"},
    url_forms=("chdb:///path", "clickhouse://host:8123", "clickhouses://host:8443"),
    factory=lambda url, database, user, password, options: ClickHouseTarget(
        url, database=database, user=user, password=password, **options),
    option_names=keyword_options(ClickHouseTarget, "url", "database", "user", "password"),
    columns=CLICKHOUSE_COLUMNS,
    creates_tables=True,
    needs_module={"chdb": NeededModule("chdb", "embedded", "ClickHouse embedded in the driver")},
    path_transports=frozenset({"chdb"}),
    embedded_url=lambda data_dir: f"chdb://{data_dir}/clickhouse",
)
