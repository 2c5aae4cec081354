"""Which target table each row goes to: a fixed table, or the value of a routing column."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from .errors import ConfigurationError, UnknownTableError, UnplannedTableError  # UnknownTableError moved to errors.py


@dataclass(frozen=True)
class Router:
    """Splits Arrow batches by target table. With `table_column`, that column is not written.

    `known_tables` is None for targets that cannot list their tables over their load protocol
    (StarRocks, Doris without a table list): then a wrong name fails at the server's `begin`.
    """

    known_tables: frozenset[str] | None
    table: str | None = None
    table_column: str | None = None
    #: with `table_column`, when tables have schemas of their own (the packaged job): table -> ((column, slot), ...),
    #: its rows are the named slots of the batch under its column names; the batch's other columns reach no table
    table_slots: Mapping[str, tuple[tuple[str, str], ...]] | None = None
    #: the only tables a write pass may begin transactions for (None: any): a pass the sink did not count
    admitted_tables: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if (self.table is None) == (self.table_column is None):
            raise ConfigurationError("give exactly one of table=... or table_column=...")
        if self.table is not None and self.known_tables is not None and self.table not in self.known_tables:
            raise ConfigurationError(
                f"table={self.table!r} is not a table the target can load; known: {sorted(self.known_tables)}"
            )

    def split(self, batch: pa.RecordBatch) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Yield (table, rows for it). Validates the whole batch before yielding anything."""
        if batch.num_rows == 0:
            return
        if self.table is not None:
            yield self.table, batch
            return
        if self.table_column not in batch.schema.names:
            raise ConfigurationError(f"routing column {self.table_column!r} is not in the data: {batch.schema.names}")
        values = batch.column(self.table_column)
        if values.null_count:
            raise UnknownTableError(f"{values.null_count} rows have a null {self.table_column!r}: no table to route to")
        tables = [t for t in pc.unique(values).to_pylist()]
        # known_tables None: the target cannot tell, its `begin` refuses a wrong name; a table without slots has no rows
        for known, holder in ((self.known_tables, "the target has"), (self.table_slots, "the job loads")):
            unknown = sorted(set(map(str, tables)) - set(known)) if known is not None else []
            if unknown:
                raise UnknownTableError(
                    f"rows route to unknown table(s) {unknown} by column {self.table_column!r}; {holder} {sorted(known or ())}"
                )
        unplanned = sorted(set(map(str, tables)) - self.admitted_tables) if self.admitted_tables is not None else []
        if unplanned:
            raise UnplannedTableError(f"rows route to table(s) {unplanned}, which this uncounted write pass does not "
                                      f"admit (it admits {sorted(self.admitted_tables or ())})")
        keep = [name for name in batch.schema.names if name != self.table_column]
        for table in tables:
            mask = pc.equal(values, table)
            if self.table_slots is not None:  # only the table's own slots are filtered (zero-copy renamed below)
                slots = self.table_slots[str(table)]
                rows = batch.select([slot for _, slot in slots]).filter(mask)
                yield str(table), pa.RecordBatch.from_arrays(rows.columns, names=[column for column, _ in slots])
            else:
                yield str(table), batch.filter(mask).select(keep)
