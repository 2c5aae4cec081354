"""The commit ledger: a table in the target database that says how far each label's commit got, so a
commit cut anywhere is finished, or judged, from what the server holds (the target's docstring has the
steps; docs/clickhouse-clusters.md the replica facts)."""
from __future__ import annotations

import re
from typing import Any

from ...committable import Committable
from ...labels import label_batch
from .connection import Connection, literal
from .engines import REPLICATED_PREFIXES

LEDGER_TABLE = "_streaming_sink_ledger"
# Ledger states of a label: its partition moves began (moving) or its INSERT … SELECT began (inserting), or it finished.
MOVING, INSERTING, COMMITTED = "moving", "inserting", "committed"
# Insert mode: one staging partition's INSERT finished (a row per partition, naming it), so a resumed commit skips it.
INSERTED = "inserted"
# Move mode journals each staging partition, with its rows, in a `moving` row before its MOVE is sent; a `moved` row
# says a move applied although its answer was an error (UNFINISHED), so a resumed commit never sends it again.
MOVED = "moved"
# Rows written before the ledger had `state` were written after the moves: they read as committed.
_STATE_COLUMN = f"state String DEFAULT '{COMMITTED}'"
# The staging partition an `inserted` row is about; '' in every other row (and in rows of older ledgers).
_PARTITION_COLUMN = "partition_id String DEFAULT ''"
# The job and query (the labels' common beginning) and the batch of a row's label; '' and 0 in rows of older ledgers
# and for a label cut short of them, which are never forgotten.
_SERIES_COLUMNS = ("series String DEFAULT ''", "batch UInt64 DEFAULT 0")
#: a majority of a Replicated table's replicas hold the rows before the INSERT returns
QUORUM = {"insert_quorum": "auto"}
#: The ledger keeps the rows of this many batches of a job and query, counted back from the newest one it commits. A
#: row is read only about a label the journal still names, and the journal keeps the newest `retain_batches` (100 by
#: default) of the current query and the newest one of each older query: every row it can still ask about is kept,
#: with a tenfold margin (docs/protocol.md, "ClickHouse: the commit ledger").
HORIZON_BATCHES = 1000
#: Rows past the horizon are deleted by one mutation every this many batches (and at a driver's first commit).
FORGET_EVERY = 100


def _summary(states: set[str]) -> str | None:
    """How far a label's commit got: COMMITTED, INSERTING, MOVING, or None (never begun)."""
    for state in (COMMITTED, INSERTING, MOVING):
        if state in states:
            return state
    return None


class Ledger:
    """The ledger of one target database; made, or brought up to date, once per target."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._ready = False
        self.ttl_s: float | None = None  # a legacy ledger's TTL, found when the ledger is checked
        self._engine = ""  # the ledger's engine, found when the ledger is checked: replicated ones are synced
        self._forgot: dict[str, int] = {}  # series -> the batch below which this process deleted its rows

    @property
    def name(self) -> str:
        return self._connection.table(LEDGER_TABLE)

    def ensure(self) -> None:
        """Create the ledger, or give one made by an older version the `state` column (once per target)."""
        if self._ready:
            return
        client = self._connection.client()
        client.command(
            f"CREATE TABLE IF NOT EXISTS {self.name} (label String, target_table String, "
            f"rows UInt64, {_STATE_COLUMN}, committed_at DateTime DEFAULT now(), {_PARTITION_COLUMN}, {', '.join(_SERIES_COLUMNS)}) "
            "ENGINE = MergeTree ORDER BY label"
        )
        client.command(f"ALTER TABLE {self.name} ADD COLUMN IF NOT EXISTS {_STATE_COLUMN}")
        for column in (_PARTITION_COLUMN, *_SERIES_COLUMNS):
            client.command(f"ALTER TABLE {self.name} ADD COLUMN IF NOT EXISTS {column}")
        self._engine = self._definition()[0]
        self.ttl_s = self.read_ttl_s()
        self._ready = True

    def _definition(self) -> tuple[str, str]:
        """The ledger's engine and full engine clause, as system.tables shows them."""
        engine, engine_full = self._connection.client().query(
            "SELECT engine, engine_full FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            parameters={"db": self._connection.database, "t": LEDGER_TABLE},
        ).result_rows[0]
        return str(engine), str(engine_full)

    def read_ttl_s(self) -> float | None:
        """The ledger's TTL (legacy ledgers had `TTL committed_at + INTERVAL n DAY`); None: rows are kept."""
        engine = self._definition()[1]
        if not re.search(r"\bTTL\b", engine):
            return None
        days = re.search(r"toIntervalDay\((\d+)\)", engine)
        return float(days.group(1)) * 86400.0 if days else 0.0  # a TTL of another shape: assume the worst

    def write(self, committable: Committable, state: str) -> None:
        self._insert(committable, state, int(committable.rows))

    def write_partition(self, committable: Committable, state: str, partition_id: str, rows: int) -> None:
        """Journal how far one staging partition got (MOVING, MOVED, INSERTED), so a resumed commit never sends it twice."""
        self._insert(committable, state, rows, partition_id)

    def _insert(self, c: Committable, state: str, rows: int, partition_id: str = "") -> None:
        series, batch = label_batch(c.label, c.table, c.partition) or ("", 0)
        self._connection.client().command(
            f"INSERT INTO {self.name} (label, target_table, rows, state, partition_id, series, batch) VALUES "
            f"({literal(c.label)}, {literal(c.table)}, {int(rows)}, {literal(state)}, {literal(partition_id)}, "
            f"{literal(series)}, {int(batch)})",
            settings=self._write_settings(),
        )

    def forget_past_horizon(self, committable: Committable) -> None:
        """Delete the rows of the committed label's job and query that are more than `HORIZON_BATCHES` batches older
        than it, so the ledger stays bounded; at most once per `FORGET_EVERY` batches in a process."""
        found = label_batch(committable.label, committable.table, committable.partition)
        if found is None:
            return
        series, batch = found
        below, last = batch - HORIZON_BATCHES, self._forgot.get(series)
        if below < 1 or (last is not None and below < last + FORGET_EVERY):
            return
        self._forgot[series] = below  # set first: parallel commits of one batch send one mutation, not one each
        self._connection.client().command(
            f"ALTER TABLE {self.name} DELETE WHERE series = {literal(series)} AND batch < {int(below)}",
            settings={"mutations_sync": 1},  # done on this replica when it returns; the others replay it
        )

    def _write_settings(self) -> dict[str, str]:
        """A Replicated ledger's row is on a majority of replicas before the next step relies on it. Not on
        SharedMergeTree (every insert is a quorum insert there) nor on a single server (nothing to wait for)."""
        return QUORUM if self._engine.startswith("Replicated") else {}

    def partitions(self, label: str, state: str) -> dict[str, int]:
        """Staging partition -> rows, for the label's partitions the ledger journals in `state` (none in older ledgers)."""
        return {
            str(r[0]): int(r[1])
            for r in self._rows(
                f"SELECT partition_id, max(rows) FROM {self.name} WHERE label = {{label:String}} AND state = {literal(state)} "
                "AND partition_id != '' GROUP BY partition_id",
                label,
            )
        }

    def state(self, label: str) -> str | None:
        """How far the label's commit got: COMMITTED, INSERTING, MOVING, or None (never begun)."""
        return _summary(self.states(label))

    def states(self, label: str) -> set[str]:
        """Every state the ledger holds for the label: which way its commit began, and whether it finished."""
        return {r[0] for r in self._rows(f"SELECT DISTINCT state FROM {self.name} WHERE label = {{label:String}}", label)}

    def _rows(self, sql: str, label: str) -> list[Any]:
        """A ledger query's rows, holding every ledger row written before it was sent, whichever replica answers.

        A replica behind a load balancer may not have fetched the newest ledger parts yet (ClickHouse KB "read
        consistency"). On a Replicated*/Shared* ledger this replica first fetches every part the ledger's
        replication log names (`SYSTEM SYNC REPLICA … LIGHTWEIGHT`, same session, so the same replica), and on
        SharedMergeTree the read is also sequentially consistent; on a Replicated one that setting would cover
        only inserts with a sequential quorum, which the ledger does not use. A single server is always current.
        """
        client, settings = self._connection.client(), {}
        if self._engine.startswith(REPLICATED_PREFIXES):
            self._connection.sync_replica(LEDGER_TABLE)
            if self._engine.startswith("Shared"):
                settings = {"select_sequential_consistency": 1}
        return list(client.query(sql, parameters={"label": label}, settings=settings).result_rows)
