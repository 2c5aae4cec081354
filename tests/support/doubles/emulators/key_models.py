"""Table key models: how a table's committed loads become what `SELECT *` shows (docs/protocol.md, "StarRocks: primary
key tables and `__op`", "Doris: unique key tables, delete sign and sequence column").

A DUPLICATE table keeps every loaded row. A StarRocks PRIMARY KEY table and a Doris UNIQUE KEY table keep one row per
key: loads are applied in commit order, and within a load the last row of a key wins, except where a StarRocks load
flushed several memtables: its deletes then apply after all its upserts (`primary_key_apply_order`). Their hidden
columns travel with every stored row:

* StarRocks: `__op`, the load's op pseudo-column (TINYINT; the BE deletes a key only where it is 1, SR-PK-OP);
* Doris: `__DORIS_DELETE_SIGN__` (a read hides a row whose sign is not 0) and, with a sequence column,
  `__DORIS_SEQUENCE_COL__`: a row whose sequence is lower than the stored one of its key is ignored, a delete
  included (D-SEQ).

Merge-on-write and merge-on-read Doris tables show the same rows; they differ only in what `_schema` reports.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tests.support.doubles.emulators.column_types import NESTED, ColumnType

DUP_KEYS, PRIMARY_KEYS, UNIQUE_KEYS = "DUP_KEYS", "PRIMARY_KEYS", "UNIQUE_KEYS"
OP_COLUMN = "__op"  # StarRocks' load op pseudo-column (Load.LOAD_OP_COLUMN)
DELETE_SIGN = "__DORIS_DELETE_SIGN__"  # Doris' hidden delete-sign column
SEQUENCE_COL = "__DORIS_SEQUENCE_COL__"  # Doris' hidden sequence column
_MODELS = {"starrocks": (DUP_KEYS, PRIMARY_KEYS), "doris": (DUP_KEYS, UNIQUE_KEYS)}


class ModelError(ValueError):
    """A table definition the product's CREATE TABLE refuses."""


@dataclass(frozen=True)
class KeyModel:
    """A table's key model as CREATE TABLE gave it.

    `key`: the key columns (PRIMARY KEY / UNIQUE KEY; for a DUPLICATE table its sort key, which identifies nothing).
    Doris only: `sequence_type` (table property `function_column.sequence_type`: a hidden sequence column a load must
    map, header `function_column.sequence_col`), `sequence_col` (property `function_column.sequence_col`: a table
    column is the sequence), `merge_on_write` (None: the release default), `delete_sign`: whether a UNIQUE KEY table
    has the hidden delete sign, as CREATE TABLE gives it while the FE's `enable_batch_delete_by_default` is on (the
    2.x default); False models a table created without it, which `merge_type` MERGE/DELETE loads are refused on
    (docs/protocol.md, "Doris: unique key tables, delete sign and sequence column").
    """

    product: str
    keys_type: str = DUP_KEYS
    key: tuple[str, ...] = ()
    sequence_type: str | None = None
    sequence_col: str | None = None
    merge_on_write: bool | None = None
    delete_sign: bool = True

    @property
    def unique(self) -> bool:
        """Whether the table keeps one row per key."""
        return self.keys_type in (PRIMARY_KEYS, UNIQUE_KEYS)

    @property
    def has_sequence(self) -> bool:
        return self.sequence_type is not None or self.sequence_col is not None

    def check(self, columns: Sequence[tuple[str, str]]) -> None:
        """Refuse what the product's CREATE TABLE refuses (as far as the emulators model tables)."""
        if self.keys_type not in _MODELS.get(self.product, ()):
            raise ModelError(f"{self.product} emulator: keys type {self.keys_type} is not emulated")
        names = [name.lower() for name, _ in columns]
        if self.unique and not self.key:
            raise ModelError(f"{self.keys_type} table needs key columns")
        if [k.lower() for k in self.key] != names[:len(self.key)]:  # both products: keys are the leading columns
            raise ModelError(f"Key columns should be a ordered prefix of the schema: {list(self.key)}")
        if self.has_sequence and self.keys_type != UNIQUE_KEYS:
            raise ModelError("sequence column only support UNIQUE_KEYS")  # Doris PropertyAnalyzer wording, UNCONFIRMED
        if self.sequence_col is not None and self.sequence_col.lower() not in names:
            raise ModelError(f"The specified sequence column[{self.sequence_col}] not exists")

    def hidden_columns(self, columns: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """The hidden columns every stored row carries after the table's own."""
        if self.keys_type == PRIMARY_KEYS:
            return [(OP_COLUMN, "TINYINT NOT NULL")]
        if self.keys_type != UNIQUE_KEYS:
            return []
        hidden = [(DELETE_SIGN, "TINYINT NOT NULL")] if self.delete_sign else []
        if self.sequence_col is not None:
            mapped = next(kind for name, kind in columns if name.lower() == self.sequence_col.lower())
            hidden.append((SEQUENCE_COL, mapped))
        elif self.sequence_type is not None:
            hidden.append((SEQUENCE_COL, self.sequence_type))
        return hidden

    def drops_load_column(self, name: str) -> bool:
        """Whether a name in a load's `columns` that is no column of the table is planned as a source column no table
        column reads, its values dropped. StarRocks: `__op` on a table that is not PRIMARY KEY, so every row is
        appended (SR-PK-OP). Doris: any such name (*inference* of the conformance review of 2026-11-27, D1), so
        `__DORIS_DELETE_SIGN__` named for a table without a delete sign loads deletes as upserts."""
        if self.product == "doris":
            return True
        return name == OP_COLUMN and self.keys_type != PRIMARY_KEYS

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> KeyModel:
        return cls(**{**value, "key": tuple(value.get("key", ()))})


def default_sort_key(columns: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """The sort key a DUPLICATE table gets when CREATE TABLE names none: its leading columns, at most three, up to and
    including the first string column, never a FLOAT, DOUBLE or nested one (both products' docs say "the first
    columns"; this exact rule is **UNCONFIRMED**). It identifies nothing: a DUPLICATE table keeps every row."""
    key: list[str] = []
    for name, text in columns[:3]:
        base = ColumnType.parse(text).base
        if base in NESTED or base in ("FLOAT", "DOUBLE", "JSON"):
            break
        key.append(name)
        if base in ("CHAR", "VARCHAR", "STRING"):
            break
    return tuple(key)


def current_rows(model: KeyModel, stored: Sequence[str], visible: int, loads: Iterable[list[list[Any]]]) -> list[tuple[Any, ...]]:
    """What `SELECT *` shows after `loads` (each a committed load's stored rows, in commit order): every row of a
    DUPLICATE table; one row per key of a keyed table, deleted keys gone. `stored`: the stored column names (the
    table's own `visible` ones, then the hidden ones)."""
    if not model.unique:
        return [tuple(row[:visible]) for rows in loads for row in rows]
    index = {name.lower(): i for i, name in enumerate(stored)}
    keys = [index[k.lower()] for k in model.key]
    sign = index.get(OP_COLUMN if model.keys_type == PRIMARY_KEYS else DELETE_SIGN.lower())  # None: no delete sign
    sequence = index.get(SEQUENCE_COL.lower())
    kept: dict[tuple[Any, ...], list[Any]] = {}
    for rows in loads:
        for row in rows:
            key = tuple(row[i] for i in keys)
            old = kept.get(key)
            if sequence is not None and old is not None and _lower(row[sequence], old[sequence]):
                continue  # D-SEQ: an older change never replaces a newer one, a delete included
            kept[key] = row
    deleted = (lambda v: v == 1) if model.keys_type == PRIMARY_KEYS else (lambda v: v not in (0, None))
    return [tuple(row[:visible]) for row in kept.values() if sign is None or not deleted(row[sign])]


def _lower(new: Any, old: Any) -> bool:
    """Whether sequence `new` is below `old`; NULL sorts first (UNCONFIRMED), an equal sequence replaces."""
    if old is None:
        return False
    return new is None or new < old


def primary_key_apply_order(stored: Sequence[str], key: Sequence[str], rows: list[list[Any]],
                            memtable_rows: int | None) -> list[list[Any]]:
    """One load's rows into a StarRocks PRIMARY KEY table, listed so that "the last row of a key wins" gives what the
    server shows. Each memtable (`memtable_rows` rows of the load, None: the whole load) keeps the last row of each key,
    its op included, and splits them into upserts and deletes (be/src/storage/memtable.cpp, `_split_upserts_deletes`);
    the apply step then upserts every segment in order and erases every delete afterwards (be/src/storage/
    tablet_updates.cpp, the rowset apply; lake/update_manager.cpp alike). So a delete of a key in one memtable beats an
    upsert of it in any other, earlier or later (SR-PK-OP)."""
    index = {name.lower(): i for i, name in enumerate(stored)}
    keys, op = [index[k.lower()] for k in key], index[OP_COLUMN]
    size = memtable_rows or max(1, len(rows))
    upserts: list[list[Any]] = []
    deletes: list[list[Any]] = []
    for start in range(0, len(rows), size):
        last: dict[tuple[Any, ...], list[Any]] = {}
        for row in rows[start:start + size]:
            last[tuple(row[i] for i in keys)] = row
        for row in last.values():
            (deletes if row[op] == 1 else upserts).append(row)
    return upserts + deletes
