"""What the FE remembers: databases, tables, transactions and their rows, persisted to sqlite3.

A restarted emulator (``restart()``, or a new process on the same data dir) must find PREPARED and
PRECOMMITTED transactions, visible rows and the label history like a real FE does, so every state change is
written in one SQL transaction. Label retention and the finished-transaction order follow D-DTM / SR-TS
(docs/protocol.md, "StarRocks: label retention"). The product-specific state machines live in the emulators;
this module only keeps their records.
"""
from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from tests.support.doubles.emulators.clock import Clock
from tests.support.doubles.emulators.conversion import STARROCKS_RULES, ConversionRules, encode_cell, from_storage
from tests.support.doubles.emulators.key_models import KeyModel, current_rows
from tests.support.doubles.emulators.load_formats import TableSchema

COMMITTED, VISIBLE, ABORTED = "COMMITTED", "VISIBLE", "ABORTED"
FINAL_STATES = frozenset({VISIBLE, ABORTED})
TIMEOUT_REASON = "timeout by txn manager"  # SR-T-prepared_timeout, D-DTM (StarRocks: timeouts)


@dataclass
class Txn:
    """One load transaction as the FE knows it; rows are attached once the data phase ends."""

    txn_id: int
    db: str
    table: str
    label: str
    state: str
    reason: str = ""
    begin_time: float = 0.0
    timeout_s: float = 600.0
    deadline: float | None = None        # abort "timeout by txn manager" when now > deadline
    prepared_timeout_s: float | None = None
    prepare_time: float | None = None
    commit_time: float | None = None
    finish_time: float | None = None
    visible_at: float | None = None      # COMMITTED -> VISIBLE when now >= visible_at
    keep_s: float = 259200.0                # label retention after VISIBLE/ABORTED
    evicted: bool = False
    commit_count: int = 0
    total_rows: int = 0
    loaded_rows: int = 0
    filtered_rows: int = 0
    unselected_rows: int = 0
    load_bytes: int = 0
    visible_seq: int | None = None
    two_phase: bool = True
    error_url: str = ""
    rows: list[list[Any]] = field(default_factory=list, repr=False)

    def public(self) -> dict[str, Any]:
        """The dict ``transactions()`` returns."""
        return {
            "label": self.label, "txn_id": self.txn_id, "db": self.db, "table": self.table,
            "state": self.state, "reason": self.reason, "rows": self.loaded_rows,
            "filtered_rows": self.filtered_rows, "commit_count": self.commit_count,
            "evicted": self.evicted, "two_phase": self.two_phase,
        }


def load_counts(txn: Txn | None) -> dict[str, int]:
    """The row and byte counts both products' BEs put in a load's answer, under the names both use (SR-BE-CTX;
    Doris' stream load result); zero where no transaction took data."""
    return {"NumberTotalRows": txn.total_rows if txn else 0, "NumberLoadedRows": txn.loaded_rows if txn else 0,
            "NumberFilteredRows": txn.filtered_rows if txn else 0,
            "NumberUnselectedRows": txn.unselected_rows if txn else 0, "LoadBytes": txn.load_bytes if txn else 0}


_TXN_META_FIELDS = [f.name for f in fields(Txn) if f.name != "rows"]


class Store:
    """Databases, tables and transactions, mirrored to sqlite3 on every change.

    The in-memory objects are the truth while running; every mutation is written in one SQL
    transaction so that a restarted emulator (``restart()`` or a new process on the same data
    dir) finds PREPARED/PRECOMMITTED txns, visible rows and label history like a real FE.
    Callers hold the emulator lock.
    """

    def __init__(self, path: str, clock: Clock, rules: ConversionRules = STARROCKS_RULES) -> None:
        self.path = path
        self.clock = clock
        self.rules = rules
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(
            """
            CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
            CREATE TABLE IF NOT EXISTS dbs (name TEXT PRIMARY KEY, id INTEGER);
            CREATE TABLE IF NOT EXISTS tables (db TEXT, name TEXT, columns TEXT,
                                               PRIMARY KEY (db, name));
            CREATE TABLE IF NOT EXISTS txns (txn_id INTEGER PRIMARY KEY, meta TEXT);
            CREATE TABLE IF NOT EXISTS txn_rows (txn_id INTEGER PRIMARY KEY, rows TEXT);
            """)
        self.dbs: dict[str, int] = {}
        self.tables: dict[tuple[str, str], TableSchema] = {}
        self.txns: dict[int, Txn] = {}
        self._live: set[int] = set()  # not evicted
        # Live txns by database, so expiry and eviction never scan the whole history: the running
        # ones (not VISIBLE/ABORTED), and the finished ones in the order they finished (the FE's
        # finished-txn deque, D-DTM / SR-TS).
        self._running: dict[str, set[int]] = {}
        self._finished: dict[str, dict[int, None]] = {}
        self._by_label: dict[tuple[str, str], list[int]] = {}
        self.next_txn_id = 1000
        self.next_db_id = 10001
        self.next_visible_seq = 1
        self._load()

    # -- persistence -------------------------------------------------------------------------

    def _load(self) -> None:
        meta = dict(self._conn.execute("SELECT key, value FROM meta"))
        if "clock" in meta:
            self.clock.set(float(meta["clock"]))
        self.next_txn_id = int(meta.get("next_txn_id", self.next_txn_id))
        self.next_db_id = int(meta.get("next_db_id", self.next_db_id))
        self.next_visible_seq = int(meta.get("next_visible_seq", self.next_visible_seq))
        self.dbs = {name: int(i) for name, i in self._conn.execute("SELECT name, id FROM dbs")}
        for db, name, definition in self._conn.execute("SELECT db, name, columns FROM tables"):
            saved = json.loads(definition)  # a list of columns (a DUPLICATE table before key models), or both
            columns = saved["columns"] if isinstance(saved, dict) else saved
            model = KeyModel.from_json(saved["model"]) if isinstance(saved, dict) else None
            self.tables[(db, name)] = TableSchema([tuple(c) for c in columns], self.rules, model)
        rows = dict(self._conn.execute("SELECT txn_id, rows FROM txn_rows"))
        for txn_id, blob in self._conn.execute("SELECT txn_id, meta FROM txns ORDER BY txn_id"):
            txn = Txn(**json.loads(blob))
            schema = self.tables.get((txn.db, txn.table))
            if txn_id in rows and schema is not None:
                txn.rows = [[from_storage(v, ctype) for v, (_, ctype) in zip(row, schema.stored)]
                            for row in json.loads(rows[txn_id])]
            self._index(txn)
        for db, ids in self._finished.items():  # finish order, not txn-id order
            self._finished[db] = dict.fromkeys(
                sorted(ids, key=lambda i: (self.txns[i].finish_time or 0.0, i)))

    def _index(self, txn: Txn) -> None:
        self.txns[txn.txn_id] = txn
        ids = self._by_label.setdefault((txn.db, txn.label), [])
        if txn.txn_id not in ids:
            ids.append(txn.txn_id)
        running = self._running.setdefault(txn.db, set())
        finished = self._finished.setdefault(txn.db, {})
        if txn.evicted:
            self._live.discard(txn.txn_id)
            running.discard(txn.txn_id)
            finished.pop(txn.txn_id, None)
        elif txn.state in FINAL_STATES:
            self._live.add(txn.txn_id)
            running.discard(txn.txn_id)
            finished.setdefault(txn.txn_id, None)
        else:
            self._live.add(txn.txn_id)
            running.add(txn.txn_id)

    def _meta(self) -> list[tuple[str, str]]:
        return [("clock", repr(self.clock.now())), ("next_txn_id", str(self.next_txn_id)),
                ("next_db_id", str(self.next_db_id)),
                ("next_visible_seq", str(self.next_visible_seq))]

    def save(self, txn: Txn, with_rows: bool = False) -> None:
        """Write one txn (and its rows when they were just attached) atomically."""
        self._index(txn)
        meta = json.dumps({k: getattr(txn, k) for k in _TXN_META_FIELDS})
        with self._conn:
            self._conn.execute("BEGIN")
            self._conn.execute("INSERT OR REPLACE INTO txns VALUES (?, ?)", (txn.txn_id, meta))
            if with_rows:
                schema = self.tables.get((txn.db, txn.table))
                types = [c for _, c in schema.stored] if schema is not None else []
                self._conn.execute("INSERT OR REPLACE INTO txn_rows VALUES (?, ?)", (
                    txn.txn_id, json.dumps([[encode_cell(v, c) for v, c in zip(r, types)] for r in txn.rows])))
            elif txn.state == ABORTED and txn.rows:
                txn.rows = []
                self._conn.execute("DELETE FROM txn_rows WHERE txn_id = ?", (txn.txn_id,))
            self._conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", self._meta())

    def save_clock(self) -> None:
        with self._conn:
            self._conn.execute("BEGIN")
            self._conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", self._meta())

    def close(self) -> None:
        self._conn.close()

    # -- catalog -----------------------------------------------------------------------------

    def create_database(self, db: str) -> int:
        if db not in self.dbs:
            self.dbs[db] = self.next_db_id
            self.next_db_id += 1
            with self._conn:
                self._conn.execute("BEGIN")
                self._conn.execute("INSERT INTO dbs VALUES (?, ?)", (db, self.dbs[db]))
                self._conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", self._meta())
        return self.dbs[db]

    def create_table(self, db: str, table: str, columns: list[tuple[str, str]], model: KeyModel) -> None:
        if db not in self.dbs:
            raise KeyError(f"unknown database {db!r}")
        model.check(columns)
        schema = TableSchema(list(columns), self.rules, model)
        self.tables[(db, table)] = schema
        with self._conn:
            self._conn.execute("INSERT OR REPLACE INTO tables VALUES (?, ?, ?)",
                               (db, table, json.dumps({"columns": schema.raw, "model": model.to_json()})))

    def schema(self, db: str, table: str) -> TableSchema | None:
        return self.tables.get((db, table))

    # -- transactions ------------------------------------------------------------------------

    def new_txn(self, **kwargs: Any) -> Txn:
        txn = Txn(txn_id=self.next_txn_id, begin_time=self.clock.now(), **kwargs)
        self.next_txn_id += 1
        self.save(txn)
        return txn

    def live(self) -> list[Txn]:
        return [self.txns[i] for i in sorted(self._live)]

    def label_txns(self, db: str, label: str) -> list[Txn]:
        """Non-evicted txns that used ``label`` in ``db``, oldest first."""
        return [self.txns[i] for i in self._by_label.get((db, label), []) if i in self._live]

    def label_txn(self, db: str, label: str) -> Txn | None:
        """The txn a label names: its non-aborted txn if any, else the latest aborted one."""
        txns = self.label_txns(db, label)
        for txn in reversed(txns):
            if txn.state != ABORTED:
                return txn
        return txns[-1] if txns else None

    def evicted_label_txn(self, db: str, label: str) -> Txn | None:
        """The newest evicted txn of a label (for the terminal-state cache)."""
        ids = [i for i in self._by_label.get((db, label), []) if i not in self._live]
        return self.txns[ids[-1]] if ids else None

    def running(self) -> list[Txn]:
        """Live txns that are not VISIBLE/ABORTED yet, every database."""
        return [self.txns[i] for ids in self._running.values() for i in sorted(ids)]

    def finished(self, db: str) -> Iterator[Txn]:
        """Live VISIBLE/ABORTED txns of ``db``, the first finished first (lazily: it may be long)."""
        return (self.txns[i] for i in self._finished.get(db, {}))

    def finished_count(self, db: str) -> int:
        return len(self._finished.get(db, ()))

    def finished_databases(self) -> list[str]:
        return [db for db, ids in self._finished.items() if ids]

    def running_count(self, db: str) -> int:
        return len(self._running.get(db, ()))

    def visible_rows(self, db: str, table: str) -> list[tuple[Any, ...]]:
        """What `SELECT *` shows: the visible loads applied in the order they became visible (key_models.py)."""
        txns = [t for t in self.txns.values()
                if t.db == db and t.table == table and t.state == VISIBLE]
        txns.sort(key=lambda t: t.visible_seq or 0)
        schema = self.tables.get((db, table))
        if schema is None:
            return [tuple(r) for t in txns for r in t.rows]
        names = [name for name, _ in schema.stored]
        return current_rows(schema.model, names, len(schema.columns), (t.rows for t in txns))

    def take_visible_seq(self) -> int:
        seq = self.next_visible_seq
        self.next_visible_seq += 1
        return seq
