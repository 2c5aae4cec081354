"""ClickHouse target: stock ClickHouse has no prepared transactions, so a staging table plays one.

* begin   = `CREATE TABLE <staging> AS <target>` (same columns, engine, partition key, order);
* write   = `insert_arrow` into the staging table (data stays Arrow all the way);
* prepare = the staging table holds exactly the rows written (counted);
* commit  = steps that a crash anywhere leaves resumable by repeating the commit:
  1. sync a replicated staging table's replica (`SYSTEM SYNC REPLICA … LIGHTWEIGHT`), then list its partitions in
     the same session (an error if the table is gone), and check that the rows listed, with those the ledger says
     moved before, are the prepared rows;
  2. for each partition, a ledger row (label, table, partition, its rows, state `moving`) before
     `ALTER TABLE <staging> MOVE PARTITION ID … TO TABLE <target>`: atomic per partition on the replica that runs
     it, and a moved partition is no longer listed, so a repeat moves only the rest (a move refused because the
     table gained columns since the staging table was made mends it and is sent again: `_move_partition`). A
     partition journaled `moving` and still listed is sent again only where the listing proves it never moved
     (one server); on replicas it may have moved elsewhere, so the commit stops (`CommitInterruptedError`);
  3. verify that the staging table holds no rows but those of moves that applied and answered UNFINISHED;
  4. a ledger row with state `committed`; 5. drop the staging table;
* abort   = drop the staging table; refused once the ledger names the label (its commit began).

The ledger (`_streaming_sink_ledger` in the target database) decides when the staging table is gone:
a `committed` row means COMMITTED; `moving` rows alone mean some partitions may have moved, which
no one can tell from here, so `CommitInterruptedError` (a `CommitAmbiguousError`, runbook "ClickHouse commit interrupted");
no row means nothing ever moved, so ABORTED. Ledgers made by older versions expire rows (a TTL),
so there "no row" is LOST. Rows are kept for the newest `ledger.HORIZON_BATCHES` batches of each job and query, far
more than the journal can still ask about: ~100 bytes each, one per staging partition (`moving`, or `inserted` after
the `inserting` one) and the `committed` one per transaction (docs/protocol.md, "ClickHouse: the commit ledger").
Never `ATTACH PARTITION FROM`: it copies, so a repeated commit would duplicate rows.

Replicas (Replicated*/Shared* tables, ClickHouse Cloud; conformance review 2026-11-24, C2 and C5): a
read may land on a replica that has not fetched the newest ledger rows yet, while the staging table's
DROP (database DDL) already reached it, and an ALTER returns before the other replicas ran it. So every
ledger read that decides something is consistent (ledger.py: the replica syncs the ledger first), so is the
staging listing a move commit starts from, each MOVE waits for every replica (`alter_sync = 2`; 3 only on
SharedMergeTree), and on a Replicated ledger or target table the ledger rows and the INSERT … SELECT wait for a
majority (`insert_quorum = 'auto'`) before the next step relies on them. A move that applied on one replica and then
failed leaves the partition in the other replicas' staging (conformance review 2026-11-27, C8): hence the
journal per partition. Facts and sources: docs/clickhouse-clusters.md, "Replicas behind a load balancer".

Materialized views fire on INSERT only, never on a partition move, so a table that feeds views is
refused in the default `commit_mode = "move"` (review R8). `commit_mode = "insert"` commits with
`INSERT INTO <target> SELECT … FROM <staging>` instead, which the views see; the ledger journals it
(`inserting` before the first INSERT, `inserted` with the staging partition after each), a resumed
commit skips the partitions already inserted, and a deduplication token per label and partition makes
a repeat of the one INSERT a crash cut a no-op, in the table and in its views. What that needs from
the tables, and why, is in insert_commit.py and docs/clickhouse-views.md.

Change rows (upserts and deletes, streaming_sink/changes.py) go into ReplacingMergeTree(version, is_deleted) tables
through the same steps: the staging transaction maps `__version` and `__op` onto the table's columns
(change_tables.py; docs/protocol.md, "ClickHouse: change tables").

The same code speaks HTTP (`http://host:8123`) and embedded chdb (`chdb:///path`); chdb allows
one process per path, so with chdb the writers run in the driver. Over HTTP the writers run in Spark
tasks (the target is pickled without its connection; one client per thread), and a commit or an abort
that meets a transport error or an error answer repeats itself (`retries`): docs/design.md, "ClickHouse
over HTTP".
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa

from ...changes import is_change_schema
from ...committable import Committable, TxnRef
from ...crash import crash_point, target_point
from ...errors import UnknownDatabaseError
from ...labels import LABEL_PATTERN
from ..base import (
    CommitAmbiguousError,
    CommitOutcome,
    CommittedNotChosenError,
    ConfigurationError,
    ExpiryKind,
    ExpiryLimit,
    NewRef,
    RecordIntent,
    TableTransaction,
    Target,
    TargetError,
)
from ..descriptor import NeededModule, TargetDescriptor, keyword_options
from .catalog import SUGGESTED_WINDOW, Catalog
from .change_tables import JOB_CREATED_COMMENT, change_refusal, created_columns, created_engine, sorting_key_columns
from .column_types import CLICKHOUSE_COLUMNS
from .connection import Connection, literal, quote
from .engines import COMMIT_MODES, DATABASE_FACTS_QUERY, INSERT, MOVE, REPLICATED_PREFIXES, TableFacts, engine_refusal
from .insert_commit import InsertCommit
from .ledger import COMMITTED, INSERTING, LEDGER_TABLE, MOVED, MOVING, Ledger
from .readiness import replica_readiness
from .staging import StagingTransaction

log = logging.getLogger(__name__)

#: commit_mode insert: the INSERTs ran, the ledger does not say so yet; the re-run must insert nothing twice
INSERT_CRASH_POINT = target_point("clickhouse-after-insert")
# A partition move returns once every replica ran it (alter_sync 0 waits for none, 1 for this replica: the defaults on
# Cloud and on a server). 3 waits for the active replicas on SharedMergeTree only, so a user's 3 is kept there; on
# ReplicatedMergeTree 3 waited for nothing until ClickHouse PR #117517 (docs/clickhouse-clusters.md).
_MOVE_SYNC = {"alter_sync": 2}
#: INCOMPATIBLE_COLUMNS: "Tables have different structure", a partition move refused before it moves anything (26.9)
_DIFFERENT_STRUCTURE = 122
#: UNFINISHED: a replicated move's wait for the other replicas gave up; the replica that ran it has moved the partition
#: (StorageReplicatedMergeTree::movePartitionToTable waits only after it committed the move: docs/protocol.md)
_UNFINISHED = 341


class CommitInterruptedError(CommitAmbiguousError):
    """A ClickHouse commit whose staging table is gone while the ledger says it began and never finished: some
    partitions may be in the table, and only a count there tells how many."""

    runbook = "ClickHouse commit interrupted"


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
        if parsed.scheme != "https" and (ca_bundle is not None or verify is not True):
            raise ConfigurationError(f"ClickHouseTarget url {url!r}: verify and ca_bundle are for https (clickhouses://) only")
        if commit_mode not in COMMIT_MODES:
            raise ConfigurationError(
                f"ClickHouseTarget commit_mode {commit_mode!r}: use {MOVE!r} (the default: partitions are moved, "
                f"materialized views do not see them) or {INSERT!r} (INSERT … SELECT, which fires them); "
                "see docs/clickhouse-views.md"
            )
        for name, value in (("connect_timeout_s", connect_timeout_s), ("read_timeout_s", read_timeout_s)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"ClickHouseTarget {name} {value!r}: seconds, at least 1 (the client counts whole seconds)")
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ConfigurationError(f"ClickHouseTarget retries {retries!r}: a whole number, 0 or more")
        if commit_parallelism is not None and (not isinstance(commit_parallelism, int) or commit_parallelism < 1):
            raise ConfigurationError(f"ClickHouseTarget commit_parallelism {commit_parallelism!r}: a whole number, 1 or more")
        self.url, self.database, self.commit_mode = url, database, commit_mode
        self.connection = Connection(url, database, user, password, dict(settings or {}), verify, ca_bundle,
                                     float(connect_timeout_s), float(read_timeout_s), retries, float(backoff_s), float(backoff_max_s))
        # None: 8 over HTTP, 1 embedded (one engine per process)
        self._commit_parallelism = 1 if self.embedded else commit_parallelism or 8
        self.ledger = Ledger(self.connection)
        self.catalog = Catalog(self.connection, commit_mode, self._commit_parallelism)
        self._insert = InsertCommit(self.connection, self.ledger, self.catalog)
        # table -> why the job may not load it in this commit mode (None: it may), found by `routable_tables`
        self._refusals: dict[str, str | None] = {}
        self._dedup_limit: ExpiryLimit | None = None  # insert mode: what the tables' deduplication logs forget

    @property
    def embedded(self) -> bool:
        return self.connection.embedded

    @property
    def runs_writers_in_driver(self) -> bool:
        return self.embedded

    @property
    def commit_parallelism(self) -> int:
        return self._commit_parallelism

    def client(self) -> Any:
        """A client for this thread (HTTP) or the process's one engine for the path (chdb)."""
        return self.connection.client()

    def server_readiness(self) -> str:
        """The server's release and, where the database is replicated, the sync every commit runs (readiness.py)."""
        return replica_readiness(self.connection)

    def routable_tables(self) -> set[str]:
        """The tables whose engine the sink commits atomically (engines.py); the others are left
        out, each with a warning that says why and what to load instead. Reads and DDL with IF NOT EXISTS
        only, so a failed attempt is repeated whole."""
        return self.connection.repeating("start-up checks", self._routable_tables)

    def _routable_tables(self) -> set[str]:
        client = self.client()
        facts = {
            row["name"]: TableFacts.from_row(row)
            for row in client.query(DATABASE_FACTS_QUERY, parameters={"db": self.database}).named_results()
            if row["name"] != LEDGER_TABLE and not LABEL_PATTERN.fullmatch(row["name"])
        }
        if not facts and not client.query(
            "SELECT count() FROM system.databases WHERE name = {db:String}", parameters={"db": self.database}
        ).result_rows[0][0]:
            raise UnknownDatabaseError(f"ClickHouse database {self.database!r} does not exist at {self.url}")
        self.ledger.ensure()
        tables = set()
        for name, table_facts in sorted(facts.items()):
            why = engine_refusal(table_facts, self.commit_mode)
            if why:
                log.warning("ClickHouse table %s.%s cannot be loaded: %s", self.database, name, why)
            else:
                tables.add(name)
                self.catalog.engines[name] = table_facts.engine
                self.catalog.facts[name] = table_facts
        self._refusals = {table: self.catalog.refusal(table) for table in sorted(tables)}
        refused = sorted(table for table, why in self._refusals.items() if why)
        if refused:
            log.warning("ClickHouse %s: the job refuses to load %s in commit_mode %r (materialized views or deduplication "
                        "settings; see docs/clickhouse-views.md)", self.database, refused, self.commit_mode)
        if self.commit_mode == INSERT:
            self._dedup_limit = self.catalog.deduplication_limit(sorted(set(tables) - set(refused)))
        return tables

    def engine_of(self, table: str) -> str:
        """The table's engine (from routable_tables, or asked now)."""
        return self.catalog.engine_of(table)

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
            self._refusals[table] = self.connection.repeating(f"engine check of {table}", lambda: self.catalog.refusal(table))
        return self._refusals[table]

    def expiry_limits(self) -> list[ExpiryLimit]:
        """Nothing expires, unless the ledger was made by an older version (as found by `routable_tables`);
        in insert mode, also the tables' deduplication logs, which a retried INSERT relies on."""
        limits = [ExpiryLimit("prepared staging tables", None, kind=ExpiryKind.PREPARED),
                  ExpiryLimit("commit ledger", self.ledger.ttl_s, kind=ExpiryKind.LEDGER)]
        return limits + ([self._dedup_limit] if self._dedup_limit is not None else [])

    def check_schema(self, table: str, schema: pa.Schema) -> None:
        """Refuse a table this commit mode cannot load, and change rows into a table that cannot take them
        (change_tables.py): before any data moves, one line naming what to create."""
        self.check_loadable(table)
        if is_change_schema(schema):
            def refusal() -> str | None:
                return change_refusal(self.catalog.facts_of(table, fresh=True), self.catalog.columns(table), schema)

            why = self.connection.repeating(f"change-table check of {table}", refusal)
            if why:
                raise ConfigurationError(why)

    def table_key(self, table: str) -> tuple[str, ...] | None:
        """A ReplacingMergeTree's sorting key (system.tables.sorting_key), made of plain columns; None for other tables."""
        facts = self.catalog.facts_of(table)
        if facts is None or not facts.engine.endswith("ReplacingMergeTree"):
            return None
        return sorting_key_columns(facts.sorting_key)

    def table_columns(self, table: str) -> dict[str, str] | None:
        """A column with a DEFAULT expression is spelled `<type> DEFAULT`: the job may leave it empty (catalog.py)."""
        return self.catalog.columns(table, defaults=True)

    def create_table(self, table: str, schema: pa.Schema, key: Sequence[str] = ()) -> None:
        """Create a table for an Arrow schema if it is missing (change_tables.py: MergeTree for appended rows, a
        ReplacingMergeTree ordered by `key` for change rows), marked as the job's (`add_columns` may alter it). In
        commit_mode "insert" it keeps a deduplication window, which a repeated INSERT … SELECT needs."""
        columns = ", ".join(f"{quote(name)} {kind}" for name, kind in created_columns(schema, key, clickhouse_type))
        engine = created_engine(schema, key, quote)
        window = f" SETTINGS non_replicated_deduplication_window = {SUGGESTED_WINDOW}" if self.commit_mode == INSERT else ""

        def create() -> None:
            client = self.client()
            client.command(f"CREATE DATABASE IF NOT EXISTS {quote(self.database)}")
            client.command(f"CREATE TABLE IF NOT EXISTS {self.connection.table(table)} ({columns}) ENGINE = {engine}"
                           f"{window} COMMENT {literal(JOB_CREATED_COMMENT)}")

        self.connection.repeating(f"creation of {table}", create)

    def add_columns(self, table: str, fields: Sequence[pa.Field]) -> None:
        """Add Nullable columns for `fields` to a table the job created (its comment says so), each unless it exists:
        called by the driver before the writers of the batch whose rows carry them begin (their staging tables are
        made `AS` the table, so they get the columns). A staging table prepared before (a batch the restart rolls
        forward) gets them at its commit, when its first move is refused (`_move_partition`). Safe to repeat; a table the
        job did not create is refused."""
        if not fields:
            return
        additions = ", ".join(f"ADD COLUMN IF NOT EXISTS {quote(f.name)} {clickhouse_type(f.type, True)}" for f in fields)

        def add() -> None:
            facts = self.catalog.facts_of(table, fresh=True)
            if facts is None or facts.comment != JOB_CREATED_COMMENT:
                raise ConfigurationError(
                    f"ClickHouse table {self.connection.table(table)} was not created by the job, so the sink does not add "
                    f"columns {[f.name for f in fields]} to it: add them yourself (ALTER TABLE … ADD COLUMN), or drop the "
                    "fields upstream (sink.on_unknown_field)")
            self.client().command(f"ALTER TABLE {self.connection.table(table)} {additions}", settings=_MOVE_SYNC)

        self.connection.repeating(f"columns added to {table}", add)

    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        self.check_loadable(table)
        return StagingTransaction(self.connection, self.catalog, self.abort, table, new_ref, record_intent)

    def commit(self, committable: Committable) -> CommitOutcome:
        """Finish the label's commit the way its ledger rows say it began; a label not begun, the way the mode says.

        Over HTTP, a transport error (connection refused or cut, answer lost, timeout) or an error answer of the
        server repeats the whole commit, up to `retries` times: every step is safe to repeat, and a repeat resumes
        where the statement that failed left it, applied or not. The sink's own verdicts (ambiguous, refused,
        rows that do not add up) are never repeated.
        """
        outcome = self.connection.repeating(f"commit of {committable.label}", lambda: self._commit_once(committable))
        try:
            self.ledger.forget_past_horizon(committable)
        except Exception as error:  # the commit stands; the rows are deleted at a later batch's try
            log.warning("ClickHouse: could not delete old rows of the commit ledger %s: %s", self.ledger.name, error)
        return outcome

    def _commit_once(self, c: Committable) -> CommitOutcome:
        self.ledger.ensure()
        connection, staging = self.connection, c.label
        engine = self._engine_of_staging(staging)
        if engine is None:
            return self._outcome_without_staging(c)
        states = self.ledger.states(c.label)
        # every partition moved, or every INSERT finished: a partition still listed is a lagging replica's view, and
        # the INSERTs are never sent again (the deduplication log may have forgotten them)
        if COMMITTED in states:
            connection.drop(staging)
            return CommitOutcome.COMMITTED
        by_insert = INSERTING in states or (not states and self.commit_mode == INSERT)
        if not states and not by_insert:
            self.catalog.refuse(c.table)  # a view created since the job started
        try:
            if by_insert:
                self._insert.insert(c, states, engine)
            else:
                self._move(c, states, engine)
        except Exception:
            if connection.exists(staging):
                raise
            return self._outcome_without_staging(c)  # dropped under us: the ledger decides
        if by_insert:
            crash_point(INSERT_CRASH_POINT, -1)  # target points take no @batch: the first insert commit
        self.ledger.write(c, COMMITTED)
        connection.drop(staging)
        return CommitOutcome.COMMITTED

    def _engine_of_staging(self, staging: str) -> str | None:
        """The staging table's engine (its table's, copied by `CREATE … AS`); None: the table is gone."""
        rows = self.client().query(
            "SELECT engine FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            parameters={"db": self.database, "t": staging}).result_rows
        return str(rows[0][0]) if rows else None

    def _move(self, c: Committable, states: set[str], engine: str) -> None:
        """Move every staging partition into the target once (commit_mode move), each journaled before its MOVE.

        What a repeat may trust: a partition journaled `moved` applied; one journaled `moving` and no longer listed
        moved (the listing is synced, and a move ends only once every replica dropped its copy); one journaled
        `moving` and still listed never moved, if the staging table lives on one server. On replicas the listing is
        one replica's, and a move that applied on another and failed (UNFINISHED, a lost answer) leaves the partition
        here until a DROP_RANGE that was never written: moving it again would duplicate it, so the commit stops."""
        connection, staging, replicated = self.connection, c.label, engine.startswith(REPLICATED_PREFIXES)
        if replicated:  # every part the log names, before this session lists them (conformance review 2026-11-27, C6)
            connection.sync_replica(staging)
        # a partition of 0 rows is the empty part a move leaves behind to cover what it took (ClickHouse 23.x and newer)
        sizes = {partition_id: rows for partition_id, (rows, _) in connection.partition_sizes(staging).items() if rows}
        began, moved = (self.ledger.partitions(c.label, MOVING), self.ledger.partitions(c.label, MOVED)) if states else ({}, {})
        unsure = {partition_id: rows for partition_id, rows in began.items() if partition_id in sizes and partition_id not in moved}
        if replicated and unsure:
            raise CommitInterruptedError(self._unsure_move(c, unsure))
        to_move = {partition_id: rows for partition_id, rows in sizes.items() if partition_id not in moved}
        done = sum(rows for partition_id, rows in {**began, **moved}.items() if partition_id not in to_move)
        legacy = MOVING in states and not began  # an older version's commit journaled no partition: trust the listing
        if not legacy and done + sum(to_move.values()) != c.rows:
            raise TargetError(
                f"ClickHouse commit of {c.label} into {connection.table(c.table)} stopped before moving anything: its "
                f"staging table lists {sum(to_move.values())} rows not moved yet and the ledger {done} moved before, "
                f"{done + sum(to_move.values())} rows in all, but {c.rows} were prepared (a replica that lacks staging "
                "parts, or a change to the staging table after prepare); the batch stays PREPARED")
        for partition_id, rows in sorted(to_move.items()):
            if partition_id not in began:
                self.ledger.write_partition(c, MOVING, partition_id, rows)
            self._move_partition(c, partition_id, rows, self._move_sync(engine))
        left = sum(rows for partition_id, (rows, _) in connection.partition_sizes(staging).items() if partition_id not in moved)
        if left:
            raise TargetError(
                f"staging table {staging} still holds {left} rows after its partitions were moved: "
                "something wrote into it during the commit"
            )

    def _move_sync(self, engine: str) -> dict[str, int]:
        """`alter_sync` for a move (see _MOVE_SYNC): 2, or the user's 3 on SharedMergeTree."""
        return {"alter_sync": 3} if engine.startswith("Shared") and str(self.connection.settings.get("alter_sync")) == "3" \
            else _MOVE_SYNC

    def _move_partition(self, c: Committable, partition_id: str, rows: int, move_sync: dict[str, int]) -> None:
        """One staging partition into the table. A move between tables of different structure is refused before
        anything moves (INCOMPATIBLE_COLUMNS): then the staging table is given the columns its table gained, and the
        move sent again; the columns are read only then, not at every commit. A move that answers UNFINISHED applied:
        journaled `moved` before the error repeats the commit, which then leaves the partition alone."""
        from clickhouse_connect.driver.exceptions import DatabaseError

        connection = self.connection
        move = (f"ALTER TABLE {connection.table(c.label)} MOVE PARTITION ID {literal(partition_id)} "
                f"TO TABLE {connection.table(c.table)}")
        try:
            try:
                connection.client().command(move, settings=move_sync)
            except DatabaseError as error:
                if getattr(error, "code", None) != _DIFFERENT_STRUCTURE or not self._match_staging(c):
                    raise
                connection.client().command(move, settings=move_sync)
        except DatabaseError as error:
            if getattr(error, "code", None) == _UNFINISHED:
                self.ledger.write_partition(c, MOVED, partition_id, rows)
            raise

    def _match_staging(self, c: Committable) -> bool:
        """Give a staging table the columns its table gained since it was made (`add_columns`, or a user's ALTER), each
        in the table's place: a partition moves only between tables of one structure. The rows take the column's
        default (NULL for an added Nullable column), as an INSERT without it would. Safe to repeat. False: nothing to
        add, or a difference this cannot mend (the move's error says it)."""
        connection, staging = self.connection, c.label
        found: dict[str, dict[str, str]] = {c.table: {}, staging: {}}
        for table, name, kind in connection.client().query(  # one round trip for both tables
            "SELECT table, name, type FROM system.columns WHERE database = {db:String} AND table IN ({t:String}, {s:String}) "
            "ORDER BY position", parameters={"db": self.database, "t": c.table, "s": staging},
        ).result_rows:
            found[table][name] = kind
        table_columns, staging_columns = found[c.table], found[staging]
        missing = [name for name in table_columns if name not in staging_columns]
        if not missing or [name for name in table_columns if name in staging_columns] != list(staging_columns):
            return False  # nothing to add, or a structure this cannot mend: the MOVE says how they differ
        names = list(table_columns)
        additions = ", ".join(
            f"ADD COLUMN IF NOT EXISTS {quote(name)} {table_columns[name]} "
            + (f"AFTER {quote(names[names.index(name) - 1])}" if names.index(name) else "FIRST")
            for name in missing)
        connection.client().command(f"ALTER TABLE {connection.table(staging)} {additions}", settings=_MOVE_SYNC)
        return True

    def abort(self, ref: TxnRef) -> None:
        """Drop the staging table, unless a commit of the label began: then only committing it is right.

        Repeated like `commit` after a transport error or an error answer of the server (dropping is idempotent)."""
        self.connection.repeating(f"abort of {ref.label}", lambda: self._abort_once(ref))

    def _abort_once(self, ref: TxnRef) -> None:
        self.ledger.ensure()
        state = self.ledger.state(ref.label)
        if state is not None:
            raise CommittedNotChosenError(
                f"refusing to abort {ref.label}: the ledger {self.database}.{LEDGER_TABLE} says its commit "
                f"{'finished (committed)' if state == COMMITTED else f'began ({state})'}; a transaction whose "
                f"commit began can only be committed, so whoever aborts it holds a stale view of the batch. "
                + CommittedNotChosenError.RUNBOOK
            )
        self.connection.drop(ref.label)

    def staging_tables(self) -> list[str]:
        """Staging tables present now (for tests and the operator's status)."""
        rows = self.connection.repeating("staging table listing", lambda: self.client().query(
            "SELECT name FROM system.tables WHERE database = {db:String} AND startsWith(name, 'ss_')",
            parameters={"db": self.database},
        ).result_rows)
        return sorted(r[0] for r in rows if LABEL_PATTERN.fullmatch(r[0]))

    def leftover_transactions(self, label_prefix: str) -> list[str]:
        """Staging tables whose label starts with `label_prefix` (e.g. one job's), for reconciling with the journal."""
        return [name for name in self.staging_tables() if name.startswith(label_prefix)]

    def count_rows(self, table: str) -> int:
        return self.connection.count_rows(table)

    def _outcome_without_staging(self, committable: Committable) -> CommitOutcome:
        """The verdict on a label whose staging table was seen gone; read after that, and consistently (the ledger
        syncs its replica first): a replica that applied the DROP but lags on the ledger would otherwise show no
        row, and a replay duplicate it."""
        state = self.ledger.state(committable.label)
        if state == COMMITTED:
            return CommitOutcome.COMMITTED
        if state in (MOVING, INSERTING):
            raise CommitInterruptedError(self._ambiguity(committable, state))
        if self.ledger.read_ttl_s() is not None:
            return CommitOutcome.LOST  # this ledger expires rows: the label's committed row may be gone
        return CommitOutcome.ABORTED  # every commit writes its ledger row before it moves anything

    def _unsure_move(self, c: Committable, unsure: dict[str, int]) -> str:
        ledger, table = self.ledger.name, self.connection.table(c.table)
        named = ", ".join(f"partition {literal(partition_id)} ({rows} rows)" for partition_id, rows in sorted(unsure.items()))
        return (
            f"ClickHouse commit of {c.label} into {table} stopped: the move of staging {named} was sent and no answer "
            "said how it ended, and this replica's staging table still holds it. On a replicated table another replica "
            "may have moved it (the replicas that did not run a move keep its partition until the move's DROP_RANGE, "
            "which a failed move may never write), so sending it again could duplicate its rows and dropping the "
            "staging table could lose them. Count the partition's rows in the target (the batch's offsets are in the "
            "checkpoint, the writer partition is "
            f"{c.partition}). There: INSERT INTO {ledger} (label, target_table, rows, state, partition_id) VALUES "
            f"({literal(c.label)}, {literal(c.table)}, <rows>, {literal(MOVED)}, <partition>). Not there: ALTER TABLE "
            f"{ledger} DELETE WHERE label = {literal(c.label)} AND partition_id = <partition> SETTINGS mutations_sync = 2, "
            "and the restarted commit moves it. Then restart. " + CommitInterruptedError.RUNBOOK
        )

    def _ambiguity(self, c: Committable, state: str = MOVING) -> str:
        ledger, table = self.ledger.name, self.connection.table(c.table)
        began = "its partition moves began" if state == MOVING else "its INSERT … SELECT into the table began"
        return (
            f"ClickHouse commit of {c.label} into {table} was interrupted and its staging table is "
            f"gone: the ledger says {began} but not that it finished, so between 0 and "
            f"{c.rows} rows of it are visible, and the sink cannot tell how many. It stops rather than lose or "
            "duplicate them. Count this transaction's rows in the target "
            f"(writer partition {c.partition} of the batch its label names, e.g. "
            f"SELECT count() FROM {table} WHERE kafka_partition = … AND kafka_offset >= … AND "
            f"kafka_offset < …, with the batch's offsets from the checkpoint) and compare with {c.rows}. "
            f"All there: INSERT INTO {ledger} (label, target_table, rows, state) VALUES ({literal(c.label)}, "
            f"{literal(c.table)}, {int(c.rows)}, {literal(COMMITTED)}). None there (delete any that are): "
            f"ALTER TABLE {ledger} DELETE WHERE label = {literal(c.label)}, and the batch is replayed when "
            "Spark re-runs it. Then restart. " + CommitInterruptedError.RUNBOOK
        )

    def close(self) -> None:
        """Close this thread's HTTP client, or the process's chdb engine (a process opens one path at a time)."""
        self.connection.close()


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
