"""The data phase of the ClickHouse target: one writer's rows of one table in a staging table of its own,
made `CREATE TABLE <staging> AS <target>`, which plays the prepared transaction stock ClickHouse lacks."""
from __future__ import annotations

import logging
from collections.abc import Callable

import pyarrow as pa

from ...changes import is_change_schema
from ...committable import TxnRef
from ..base import ConfigurationError, NewRef, PreparedPart, RecordIntent, TableTransaction, TargetError
from ..encoding import EncodingError
from .catalog import Catalog
from .change_tables import change_refusal, table_rows, upsert_rows
from .column_types import DEFAULTED
from .connection import Connection, quote

_NULLABLE_PREFIXES = ("Nullable(", "LowCardinality(Nullable(")
_KEEPS_EVERY_ROW = frozenset({"MergeTree", "ReplicatedMergeTree", "SharedMergeTree"})  # merges fold no rows
#: A writer that inserted this often in one batch moves at least as many parts into each partition of the table it wrote
#: (beside the other writers' parts); ClickHouse slows inserts into a partition past 1000 active parts and refuses them
#: past 3000 (docs/protocol.md, "ClickHouse: one batch, per table"), so it is worth a warning long before.
MANY_INSERTS = 100
#: Every staging insert: rows of equal key are not folded as the block is written (`optimize_on_insert`, on by default,
#: would do what a Replacing/Summing/Collapsing merge does, so prepare would count fewer rows than were written; the
#: target's merges fold them once moved), and a NULL for a column that is not Nullable lands as its default: only
#: deletes of change rows send one (`_refuse_nulls_where_defaults_would_land` refuses every other).
_STAGING_INSERT = {"optimize_on_insert": 0, "input_format_null_as_default": 1}
log = logging.getLogger(__name__)


class StagingTransaction(TableTransaction):
    def __init__(self, connection: Connection, catalog: Catalog, abort: Callable[[TxnRef], None],
                 table: str, new_ref: NewRef, record_intent: RecordIntent) -> None:
        """`abort` is the target's: it drops the staging table unless the ledger says its commit began."""
        self._connection, self._catalog, self._abort, self._table = connection, catalog, abort, table
        self._new_ref, self._record_intent = new_ref, record_intent
        self._ref: TxnRef | None = None
        self._rows = 0
        self._bytes = 0
        self._inserts = 0
        self._not_nullable: set[str] | None = None

    def write(self, chunk: pa.Table) -> None:
        connection = self._connection
        if is_change_schema(chunk.schema):
            chunk = self._change_rows(chunk)
        else:
            self._refuse_nulls_where_defaults_would_land(chunk)
        if self._ref is None:
            ref = self._new_ref(0)
            self._record_intent(ref)
            connection.client().command(f"CREATE TABLE {connection.table(ref.label)} AS {connection.table(self._table)}")
            self._ref = ref  # only now: a writer whose CREATE failed (the label's table exists) must not drop it
            if self._catalog.engine_of(self._table) not in _KEEPS_EVERY_ROW:
                # A Replacing/Summing/Collapsing... staging table would fold rows of equal keys in a background
                # merge before prepare counts them; the target's own merges apply once the rows are moved.
                connection.client().command(f"SYSTEM STOP MERGES {connection.table(ref.label)}")
        connection.repeating(f"insert into {self._ref.label}", lambda: self._insert(chunk))
        self._rows += chunk.num_rows
        self._bytes += chunk.nbytes
        self._inserts += 1

    def _insert(self, chunk: pa.Table) -> None:
        """One insert into the staging table, which only this writer writes: after an error its row count
        tells whether the insert landed (done), did not (raised again, so it is repeated), or neither."""
        from clickhouse_connect.driver.exceptions import DatabaseError

        connection, label = self._connection, self._ref.label if self._ref else ""
        try:
            connection.client().insert_arrow(quote(label), chunk, database=connection.database, settings=_STAGING_INSERT)
        except DatabaseError:
            connection.close()
            landed = connection.repeating(f"row count of {label}", lambda: connection.count_rows(label))
            if landed == self._rows + chunk.num_rows:
                return
            if landed != self._rows:
                raise TargetError(
                    f"staging table {label} holds {landed} rows after an insert whose answer was lost; "
                    f"{self._rows} or {self._rows + chunk.num_rows} were expected"
                ) from None
            raise

    def _change_rows(self, chunk: pa.Table) -> pa.Table:
        """Change rows as the ReplacingMergeTree's rows (change_tables.py). A delete carries its key and NULLs
        elsewhere: those land as the columns' defaults (`input_format_null_as_default`, set on every staging insert),
        which no one sees, as FINAL leaves the key out; a NULL in an upsert, a key or a version is refused as always."""
        replacing = self._catalog.replacing(self._table)
        if replacing is None:
            raise ConfigurationError(change_refusal(self._catalog.facts_of(self._table, fresh=True),
                                                    self._catalog.columns(self._table), chunk.schema)
                                     or f"ClickHouse table {self._table} cannot take change rows")
        self._refuse_nulls_where_defaults_would_land(upsert_rows(chunk))
        rows = table_rows(chunk, replacing)
        self._refuse_nulls_where_defaults_would_land(rows.select([*replacing.key, replacing.version, replacing.is_deleted]))
        return rows

    def _refuse_nulls_where_defaults_would_land(self, chunk: pa.Table) -> None:
        """ClickHouse stores a NULL sent to a column that is not Nullable (Array, Map and Tuple columns never
        are) as the type's default: 0, '', [], {}. Refused instead, naming the column (docs/types.md); a column with a
        DEFAULT expression takes the expression, as an INSERT without the column would give it. The columns are
        read only for a chunk that holds a NULL: without one there is nothing to refuse."""
        if not any(column.null_count for column in chunk.columns):
            return
        if self._not_nullable is None:  # a DEFAULT column takes its expression for a NULL (DEFAULTED)
            columns = self._catalog.columns(self._table, defaults=True)
            self._not_nullable = {name for name, kind in columns.items()
                                  if not kind.startswith(_NULLABLE_PREFIXES) and not kind.endswith(DEFAULTED)}
        for name in chunk.column_names:
            if name in self._not_nullable and chunk.column(name).null_count:
                raise EncodingError(
                    f"column {name!r} of {self._connection.database}.{self._table} has NULLs, but its ClickHouse type is not "
                    "Nullable: ClickHouse would store the type's default (0, '', [], {}) instead; make the column "
                    "Nullable(...) or send no NULLs"
                )

    def prepare(self) -> list[PreparedPart]:
        if self._ref is None:
            return []
        label = self._ref.label
        counted = self._connection.repeating(f"row count of {label}", lambda: self._connection.count_rows(label))
        if counted != self._rows:
            raise TargetError(
                f"staging table {self._ref.label} holds {counted} rows but {self._rows} were written; "
                "is insert deduplication or a TTL active on the target table?"
            )
        if self._inserts >= MANY_INSERTS:
            log.warning(
                "ClickHouse staging table %s took %d inserts in this batch: its commit moves at least %d parts into each "
                "partition of %s it holds, and inserts into a partition slow down past parts_to_delay_insert (1000 by "
                "default) and fail past parts_to_throw_insert (3000) active parts; raise sink.flush_bytes or give the "
                "table fewer writers", label, self._inserts, self._inserts, self._connection.table(self._table))
        return [PreparedPart(self._ref, None, self._rows, self._bytes, {"staging": self._ref.label})]

    def abort(self) -> None:
        if self._ref is not None:
            self._abort(self._ref)
