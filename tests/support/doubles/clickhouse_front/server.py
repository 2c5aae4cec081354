"""A ClickHouse HTTP server in front of the real engine (chdb), for tests of the HTTP path.

It speaks the part of ClickHouse's HTTP interface that clickhouse-connect uses, and hands every
statement, as bytes, to the embedded engine: the engine parses it, checks settings and parameters,
reads an INSERT's data in its format and writes the output format the client asked for, so the bytes
and the errors are the engine's own. An INSERT's data (what follows `FORMAT <name>`) goes to the
engine as a stream (chdb's streaming insert), as a server reads the body, never as query text:
chdb ends inline data at the first blank line, which any Arrow body may hold. What the front does
itself is the HTTP layer, as ClickHouse's HTTP handler does it (src/Server/HTTPHandler.cpp, docs
https://clickhouse.com/docs/interfaces/http):

* the statement is the `query` URL parameter, a line break, then the (decompressed) body; with
  `multipart/form-data` it is the `query` form field (text fields only: no external tables);
* URL parameters: `param_<name>` are query parameters; `database` (or the X-ClickHouse-Database
  header), `default_format` (or X-ClickHouse-Format), `query_id` (or X-ClickHouse-Query-Id),
  `session_id`/`session_timeout`/`session_check`/`close_session` are the handler's own; the other
  reserved names (`compress`, `decompress`, `user`, `password`, `quota_key`, `stacktrace`, `role`,
  `buffer_size`, `wait_end_of_query`, `client_protocol_version`) are not settings; everything
  else is a setting, unknown ones fail in the engine (UNKNOWN_SETTING) as on a server;
* GET is read-only (only result-producing statements, SET and USE), POST may write;
* request bodies are decompressed by Content-Encoding (gzip, deflate, zstd, lz4, br, xz, bz2);
  answers are compressed when `enable_http_compression` is on and Accept-Encoding names a method,
  choosing zstd, br, lz4, gzip, deflate, xz, bz2 in that order of preference (as ClickHouse does);
* answers carry X-ClickHouse-Query-Id, X-ClickHouse-Timezone, X-ClickHouse-Summary (JSON of
  strings), X-ClickHouse-Server-Display-Name, and X-ClickHouse-Format only for statements that
  produce a result (clickhouse-connect's `command` tells "" from a summary by it);
* errors: status from the exception code (ClickHouse's exceptionCodeToHTTPStatus: 400 for parse
  and argument errors, 404 for unknown tables/databases/settings..., 403 auth, else 500), header
  X-ClickHouse-Exception-Code, body `Code: N. DB::Exception: ... (NAME) (version V)`;
* sessions: a named session keeps SET settings and USE, is locked while a statement runs (a
  second concurrent statement gets 373 SESSION_IS_LOCKED), expires `session_timeout` s (default
  60) after its last use, and `session_check=1` on a missing one gives 372 SESSION_NOT_FOUND.

Not spoken: `compress=1`/`decompress=1` (ClickHouse's own block compression: 501 here), external
tables, `client_protocol_version` (ignored, like a proxy that drops it: the client then reads
Native without block info), progress headers, streaming before the end of the query (answers are
always buffered, as with `wait_end_of_query=1`), temporary tables per session, users and roles
beyond an optional password check, `result_rows` in the summary.

One engine per data path per process (chdb allows one path per process), shared by every front on
the path, runs one statement at a time under a lock. That is faithful enough for what the tests
check: a server also applies each statement atomically with respect to the parts it creates and
moves, so clients see the same set of outcomes; what is lost is only overlap in time (no two
statements ever run at once), which no test may depend on anyway. URL and session settings are
applied to the shared engine with SET (and reset to DEFAULT when a later statement does not ask
for them) under the same lock, so each statement runs with exactly its own settings.

Faults (`front.faults`) copy what real servers and networks do, each armed for the next N
statements whose text matches a predicate, counted, and resettable: `drop_before`, `fail_before`
(5xx before executing), `drop_after_apply` (the statement is applied, the connection closes before
the answer) and `delay` (the answer, or the statement, waits on an event: client timeouts).

Replicas (`front.replicate`, `front.lag`, `front.stale_reads`). One engine cannot replicate, so the front
models what a client behind a load balancer over replicas of a Replicated/Shared table sees:

* `replicate("db.table", engine)` presents the table as replicated: reads of `system.tables` show
  `engine` (ReplicatedMergeTree; or SharedMergeTree, which ClickHouse Cloud makes of a table created
  as MergeTree, the ledger included) with a Keeper path in `engine_full`, and `SYSTEM SYNC REPLICA` of
  it is accepted (the engine refuses it for a table that is not replicated, as a server does). The
  target is not told anything: it finds the engine where it would on a server.
* `lag("db.table")` stalls one replica's replication queue for the table: from then on that replica
  holds the table's rows as they were (a copy in the engine's database `_front_replica`); writes go on
  reaching the other replicas. The database's DDL is not lagged: a table dropped is gone everywhere.
* `front.stale_reads` (a `Fault`, armed like those of `front.faults`) is the load balancer sending the
  next N matching reads (SELECT, EXISTS, ...) to the lagging replica: they read a lagged table's copy
  instead of the table, as a replica that has not fetched the newest parts answers (ClickHouse KB
  "read consistency",
  clickhouse.com/docs/resources/support-center/knowledge-base/data-management/read-consistency).
* What ends the staleness, as on a real replica: `SYSTEM SYNC REPLICA <table>` (plain, STRICT or
  LIGHTWEIGHT) makes the replica fetch every part in the replication log, so the lag of that table ends
  (docs: reference/statements/system, "SYNC REPLICA"; PULL only queues the entries and waits for
  nothing, so it ends nothing). The front assumes the session that syncs is the one that reads, as the
  KB's recipe does. A read with `select_sequential_consistency = 1` of a table presented as Shared*
  reads the newest parts (SharedMergeTree docs, "consistency"); of a Replicated* one it stays stale,
  since that setting only covers inserts made with a sequential (non-parallel) quorum
  (settings reference, select_sequential_consistency).

* The lagging replica's `system.parts` lists a lagged table's parts as its copy holds them (a stale read of
  `system.parts` is answered there too).
* `ALTER TABLE <presented> MOVE PARTITION … TO TABLE …` runs on one replica, as on a server
  (StorageReplicatedMergeTree::movePartitionToTable): it moves that replica's parts of the partition, and the
  source's DROP_RANGE takes the partition off the other replica as well (the move waits for it: `alter_sync = 2`).
  A move that `stale_reads` sends to the lagging replica moves the copy's parts; one that reaches the current
  replica moves the table's, and the copy loses the partition too.
* `faults.unfinished` on such a move is the move that applied and then answered 341 UNFINISHED (alter_sync waited
  for an inactive replica past replication_wait_for_inactive_replica_timeout): the replica that ran it has moved
  the partition, but the source's DROP_RANGE, written only after that wait, never was, so the other replica keeps
  its parts of the partition (the front keeps a copy of the table as it was before the move; conformance review
  2026-11-27, C8). No sync ends that copy: the replication log holds nothing that drops it.
* `DROP TABLE` of a presented table drops it on every replica (database DDL): its copy goes with it.

Not modelled: writes landing on the lagging replica, new parts reaching a copy kept by an unfinished move, several
lagging replicas.
`front.executed` lists each statement with the settings it ran with (URL and session settings).
"""
from __future__ import annotations

import bz2
import collections
import email.parser
import email.policy
import gzip
import itertools
import json
import lzma
import re
import socket
import ssl
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from re import Pattern
from typing import Any
from urllib.parse import parse_qsl, urlsplit

#: Query parameters ClickHouse's HTTP handler keeps for itself (not settings).
RESERVED_PARAMS = frozenset({
    "query", "compress", "decompress", "user", "password", "quota_key", "query_id", "stacktrace", "role", "buffer_size",
    "wait_end_of_query", "session_id", "session_timeout", "session_check", "client_protocol_version", "close_session",
    "database", "default_format",
})
#: Settings the front never SETs on the shared engine: `readonly` cannot be unset once set (it is enforced here).
_FRONT_ONLY_SETTINGS = frozenset({"readonly"})

# exceptionCodeToHTTPStatus, by exception name (the engine's messages end with the name).
_STATUS_BY_NAME: dict[str, int] = {
    "REQUIRED_PASSWORD": 401,
    **dict.fromkeys(("UNKNOWN_USER", "WRONG_PASSWORD", "AUTHENTICATION_FAILED", "SET_NON_GRANTED_ROLE"), 403),
    **dict.fromkeys((
        "BAD_ARGUMENTS", "CANNOT_COMPILE_REGEXP", "CANNOT_PARSE_TEXT", "CANNOT_PARSE_ESCAPE_SEQUENCE", "CANNOT_PARSE_QUOTED_STRING",
        "CANNOT_PARSE_DATE", "CANNOT_PARSE_DATETIME", "CANNOT_PARSE_NUMBER", "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING",
        "CANNOT_PARSE_IPV4", "CANNOT_PARSE_IPV6", "CANNOT_PARSE_INPUT_ASSERTION_FAILED", "CANNOT_PARSE_UUID", "DUPLICATE_COLUMN",
        "ILLEGAL_COLUMN", "UNKNOWN_ELEMENT_IN_AST", "UNKNOWN_TYPE_OF_AST_NODE", "THERE_IS_NO_COLUMN", "TOO_DEEP_AST", "TOO_BIG_AST",
        "UNEXPECTED_AST_STRUCTURE", "SYNTAX_ERROR", "INCORRECT_DATA", "TYPE_MISMATCH", "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
    ), 400),
    **dict.fromkeys((
        "UNKNOWN_TABLE", "UNKNOWN_FUNCTION", "UNKNOWN_IDENTIFIER", "UNKNOWN_TYPE", "UNKNOWN_STORAGE", "UNKNOWN_DATABASE",
        "UNKNOWN_SETTING", "UNKNOWN_DIRECTION_OF_SORTING", "UNKNOWN_AGGREGATE_FUNCTION", "UNKNOWN_FORMAT",
        "UNKNOWN_DATABASE_ENGINE", "UNKNOWN_TYPE_OF_QUERY", "UNKNOWN_ROLE",
    ), 404),
    "QUERY_IS_TOO_LARGE": 413,
    "NOT_IMPLEMENTED": 501,
    "SOCKET_TIMEOUT": 503, "CANNOT_OPEN_FILE": 503, "CANNOT_SCHEDULE_TASK": 503,
    "HTTP_LENGTH_REQUIRED": 411,
    "TIMEOUT_EXCEEDED": 408,
}
_CODE_RE = re.compile(r"Code:\s*(\d+)")
_NAME_RE = re.compile(r"\(([A-Z][A-Z0-9_]+)\)\s*$")
# A trailing `FORMAT name` (maybe followed by SETTINGS) names the output format of a query.
_TRAILING_FORMAT_RE = re.compile(r"\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*)\s*(?:SETTINGS\b[^;]*)?;?\s*$", re.IGNORECASE | re.DOTALL)
# The statement part of an INSERT with inline data: up to its format name.
_INSERT_HEAD_RE = re.compile(rb"^\s*(?P<insert>INSERT\b.*?)\s+FORMAT\s+(?P<format>[A-Za-z][A-Za-z0-9_]*)", re.IGNORECASE | re.DOTALL)
_LEADING_NOISE_RE = re.compile(r"^(?:\s+|--[^\n]*\n?|/\*.*?\*/|\()*", re.DOTALL)
_RESULT_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESC", "DESCRIBE", "EXISTS", "EXPLAIN", "CHECK"})
_CONTENT_TYPES = (
    (re.compile(r"^(TabSeparated|TSV)", re.I), "text/tab-separated-values; charset=UTF-8"),
    (re.compile(r"^CSV", re.I), "text/csv; charset=UTF-8; header=absent"),
    (re.compile(r"^JSON", re.I), "application/json; charset=UTF-8"),
    (re.compile(r"^(Native|RowBinary|Arrow|Parquet|ORC|Avro)", re.I), "application/octet-stream"),
)
_PREFERRED_ENCODINGS = ("zstd", "br", "lz4", "gzip", "deflate", "xz", "bz2")  # ClickHouse's chooseHTTPCompressionMethod order


# --------------------------------------------------------------------------------------------
# Compression
# --------------------------------------------------------------------------------------------


def _codec(name: str) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]] | None:
    """(compress, decompress) for an HTTP content coding, or None if this Python cannot do it."""
    if name == "gzip":
        return gzip.compress, gzip.decompress
    if name == "deflate":
        return zlib.compress, zlib.decompress
    if name == "xz":
        return lzma.compress, lzma.decompress
    if name == "bz2":
        return bz2.compress, bz2.decompress
    if name == "zstd":
        try:
            from backports import zstd  # type: ignore[import-not-found]
        except ImportError:
            try:
                from compression import zstd  # type: ignore[import-not-found,no-redef]
            except ImportError:
                return None
        return zstd.compress, zstd.decompress
    if name == "lz4":
        try:
            import lz4.frame
        except ImportError:
            return None
        return lz4.frame.compress, lz4.frame.decompress
    if name == "br":
        try:
            import brotli  # type: ignore[import-not-found]
        except ImportError:
            return None
        return brotli.compress, brotli.decompress
    return None


def choose_response_encoding(accept_encoding: str) -> str | None:
    """The coding ClickHouse would answer in for this Accept-Encoding (substring match, fixed preference)."""
    for name in _PREFERRED_ENCODINGS:
        if name in accept_encoding and _codec(name) is not None:
            return name
    return None


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class ClickHouseError(Exception):
    """An exception as ClickHouse reports it: code, name and message."""

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(message)
        self.code, self.name, self.message = code, name, message

    @classmethod
    def from_engine(cls, error: BaseException) -> ClickHouseError:
        text = str(error).strip()
        code = _CODE_RE.search(text)
        name = _NAME_RE.search(text)
        if code is None:  # not the engine's exception: report it the way a server reports a C++ one
            return cls(1001, "STD_EXCEPTION", f"Code: 1001. DB::Exception: {text}. (STD_EXCEPTION)")
        return cls(int(code.group(1)), name.group(1) if name else "", text)

    @classmethod
    def make(cls, code: int, name: str, text: str) -> ClickHouseError:
        return cls(code, name, f"Code: {code}. DB::Exception: {text}. ({name})")

    @property
    def status(self) -> int:
        return _STATUS_BY_NAME.get(self.name, 500)


# --------------------------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------------------------

Predicate = str | Pattern[str] | Callable[[str], bool]


@dataclass
class _Arm:
    match: Callable[[str], bool]
    times: int
    params: dict[str, Any]


class Fault:
    """One fault, armed for the next `times` statements whose text matches `when`; `fired` counts its uses."""

    def __init__(self, name: str, doc: str) -> None:
        self.name, self.__doc__ = name, doc
        self._arms: list[_Arm] = []
        self._lock = threading.Lock()
        self.fired = 0

    def arm(self, when: Predicate = r"", times: int = 1, **params: Any) -> Fault:
        """`when`: a regex searched in the statement text, or a callable on it."""
        if times < 1:
            raise ValueError("times must be >= 1")
        if callable(when):
            match = when
        else:
            pattern = when if isinstance(when, re.Pattern) else re.compile(when, re.DOTALL)
            match = lambda text: pattern.search(text) is not None  # noqa: E731
        with self._lock:
            self._arms.append(_Arm(match, times, params))
        return self

    def take(self, statement: str) -> dict[str, Any] | None:
        """Use one arming that matches the statement; its params, or None if none matches."""
        with self._lock:
            for arm in self._arms:
                if arm.match(statement):
                    arm.times -= 1
                    if arm.times == 0:
                        self._arms.remove(arm)
                    self.fired += 1
                    return dict(arm.params)
        return None

    @property
    def armed(self) -> bool:
        with self._lock:
            return bool(self._arms)

    def reset(self) -> None:
        with self._lock:
            self._arms.clear()
            self.fired = 0


class Faults:
    """The front's fault knobs, as attributes (`front.faults.drop_after_apply.arm("MOVE PARTITION")`)."""

    KNOBS = {
        "drop_before": "close the connection without executing or answering",
        "fail_before": "answer HTTP `status` (503) with ClickHouse error `code`/`name` (439 CANNOT_SCHEDULE_TASK), not executing",
        "drop_after_apply": "execute the statement, then close the connection without an answer",
        "delay": "wait up to `seconds` (5) on an event, `phase` 'after' (default: applied, answer held) or 'before' executing",
        "unfinished": "execute the statement, then answer 341 UNFINISHED (an ALTER whose alter_sync wait gave up on an "
                      "inactive replica); a MOVE PARTITION of a presented table leaves the other replica its parts",
    }

    def __init__(self) -> None:
        self._knobs = {name: Fault(name, doc) for name, doc in self.KNOBS.items()}
        self._wake = threading.Event()

    def __getattr__(self, name: str) -> Fault:
        knobs = self.__dict__.get("_knobs", {})
        if name in knobs:
            return knobs[name]
        raise AttributeError(f"unknown fault {name!r}; known: {sorted(knobs)}")

    def __iter__(self) -> Iterator[Fault]:
        return iter(self._knobs.values())

    def reset(self) -> None:
        """Disarm every knob and zero its count; held answers go now."""
        for knob in self._knobs.values():
            knob.reset()
        self.release()

    def release(self) -> None:
        """Let every delayed statement go on now (later delays wait again)."""
        old, self._wake = self._wake, threading.Event()
        old.set()

    def wait(self, seconds: float) -> None:
        self._wake.wait(seconds)


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    body: bytes
    read_rows: int = 0
    read_bytes: int = 0
    written_rows: int = 0
    written_bytes: int = 0
    elapsed_s: float = 0.0


class Engine:
    """One chdb session on a data path, shared by every front on the path; one statement at a time."""

    _registry: dict[str, Engine] = {}
    _registry_lock = threading.Lock()

    def __init__(self, path: str) -> None:
        from chdb import session as chdb_session

        self.path = path
        self.lock = threading.Lock()
        self.users = 0
        self._session = chdb_session.Session(path)
        self._applied: dict[str, str] = {}  # settings this front has SET on the engine
        self._database: str | None = None  # the engine's current database, when known
        version, tz = self._session.query("SELECT version(), timezone()", "TabSeparated").bytes().decode().rstrip("\n").split("\t")
        self.version, self.timezone = version, tz
        # ClickHouse reads enable_http_compression from the query's settings, so its default is the engine's
        self.http_compression_default = self._session.query(
            "SELECT value FROM system.settings WHERE name = 'enable_http_compression'", "TabSeparated").bytes().decode().strip() or "0"

    @classmethod
    def acquire(cls, path: str) -> Engine:
        with cls._registry_lock:
            engine = cls._registry.get(path)
            if engine is None:
                engine = cls._registry[path] = Engine(path)
            engine.users += 1
            return engine

    def release(self) -> None:
        with self._registry_lock:
            self.users -= 1
            if self.users == 0:
                del self._registry[self.path]
                with self.lock:
                    self._session.close()

    def _raw(self, sql: str | bytes, fmt: str = "TabSeparated", params: dict[str, str] | None = None) -> Any:
        try:
            return self._session.query(sql, fmt, params=params or {})
        except Exception as error:  # chdb raises its own error types with ClickHouse's message
            raise ClickHouseError.from_engine(error) from None

    def _use(self, database: str) -> None:
        if database != self._database:
            self._database = None
            self._raw(f"USE {quote_identifier(database)}")
            self._database = database

    def _apply(self, wanted: dict[str, str]) -> None:
        for name in [k for k in self._applied if k not in wanted]:
            self._raw(f"SET {name} = DEFAULT")
            del self._applied[name]
        for name, value in wanted.items():
            if self._applied.get(name) != value:
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                    raise ClickHouseError.make(115, "UNKNOWN_SETTING", f"Setting {name} is neither a builtin setting nor custom")
                self._applied.pop(name, None)
                self._raw(f"SET {name} = {quote_string(value)}")
                self._applied[name] = value

    def changed_settings(self) -> dict[str, str]:
        """Settings the engine reports as changed (after a SET statement: what it changed)."""
        rows = self._raw("SELECT name, value FROM system.settings WHERE changed", "JSONEachRow").bytes().splitlines()
        return {row["name"]: row["value"] for row in map(json.loads, rows)}

    def execute(self, sql: bytes, fmt: str, params: dict[str, str], settings: dict[str, str], database: str,
                after: Callable[[Engine], None] | None = None) -> Outcome:
        """Run one statement with exactly these settings, in this database; `after` runs under the same lock."""
        with self.lock:
            self._use(database)
            self._apply(settings)
            started = time.monotonic()
            insert = None if params else inline_insert(sql)
            if insert is not None:
                return self._stream_insert(*insert, started)
            result = self._raw(sql, fmt, params)
            outcome = Outcome(
                body=result.bytes() or b"", read_rows=result.rows_read(), read_bytes=result.bytes_read(),
                written_rows=result.rows_written(), written_bytes=result.bytes_written(), elapsed_s=time.monotonic() - started,
            )
            if after is not None:
                after(self)
            return outcome

    def _stream_insert(self, statement: str, fmt: str, data: bytes, started: float) -> Outcome:
        """An INSERT whose data is streamed in its format, as a server reads the request body (under the lock)."""
        try:
            with self._session.send_insert(statement, fmt) as inserter:
                inserter.append(data)
                result = inserter.finish()
        except Exception as error:  # chdb's RuntimeError, carrying ClickHouse's message
            raise ClickHouseError.from_engine(error) from None
        return Outcome(b"", written_rows=result.rows_written, written_bytes=result.bytes_written,
                       elapsed_s=time.monotonic() - started)

    def after_use(self) -> str:
        """The engine's database after a USE statement (called under the lock)."""
        self._database = self._raw("SELECT currentDatabase()").bytes().decode().rstrip("\n")
        return self._database

    def after_set(self) -> dict[str, str]:
        """What a SET statement changed beyond the settings this front applied (called under the lock)."""
        changed = {k: v for k, v in self.changed_settings().items() if self._applied.get(k) != v}
        self._applied.update(changed)
        return changed


def quote_identifier(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def quote_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --------------------------------------------------------------------------------------------
# Sessions
# --------------------------------------------------------------------------------------------


@dataclass
class _Session:
    timeout_s: float
    expires_at: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    database: str | None = None
    settings: dict[str, str] = field(default_factory=dict)


class _Sessions:
    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def acquire(self, session_id: str, timeout_s: float, check: bool) -> _Session:
        now = time.monotonic()
        with self._lock:
            for key in [k for k, s in self._sessions.items() if s.expires_at <= now and not s.lock.locked()]:
                del self._sessions[key]
            session = self._sessions.get(session_id)
            if session is None:
                if check:
                    raise ClickHouseError.make(372, "SESSION_NOT_FOUND", f"Session {session_id} not found")
                session = self._sessions[session_id] = _Session(timeout_s, now + timeout_s)
            if not session.lock.acquire(blocking=False):
                raise ClickHouseError.make(373, "SESSION_IS_LOCKED", "Session is locked by a concurrent client")
            session.timeout_s = timeout_s
            return session

    def release(self, session_id: str, session: _Session, close: bool) -> None:
        with self._lock:
            session.expires_at = time.monotonic() + session.timeout_s
            session.lock.release()
            if close:
                self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)


# --------------------------------------------------------------------------------------------
# Replicas
# --------------------------------------------------------------------------------------------

_IDENTIFIER = r"(?:`(?:[^`\\]|\\.)*`|[A-Za-z_][A-Za-z0-9_]*)"
_SYNC_REPLICA_RE = re.compile(
    rf"^SYSTEM\s+SYNC\s+REPLICA\s+(?:ON\s+CLUSTER\s+\S+\s+)?(?:(?P<db>{_IDENTIFIER})\s*\.\s*)?(?P<table>{_IDENTIFIER})"
    r"(?:\s+(?P<mode>STRICT|LIGHTWEIGHT|PULL)\b.*)?\s*;?\s*$",
    re.IGNORECASE | re.DOTALL,
)
_SYSTEM_TABLES_RE = re.compile(r"(?<![\w`.])system\s*\.\s*tables(?![\w`])", re.IGNORECASE)
_SYSTEM_PARTS_RE = re.compile(r"(?<![\w`.])system\s*\.\s*parts(?![\w`])", re.IGNORECASE)
_TABLE_NAME = rf"(?:(?P<db>{_IDENTIFIER})\s*\.\s*)?(?P<table>{_IDENTIFIER})"
_MOVE_RE = re.compile(rf"^ALTER\s+TABLE\s+{_TABLE_NAME}\s+MOVE\s+PARTITION\s+(?P<partition>.+?)\s+TO\s+TABLE\s+",
                      re.IGNORECASE | re.DOTALL)
_DROP_TABLE_RE = re.compile(rf"^DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?{_TABLE_NAME}", re.IGNORECASE)
_LAGGING_DB = "_front_replica"  # where the lagging replica's copies of lagged tables live, in the engine


def _unquote_identifier(name: str) -> str:
    return re.sub(r"\\(.)", r"\1", name[1:-1]) if name.startswith("`") else name


def _split_table(table: str) -> tuple[str, str]:
    database, dot, name = table.partition(".")
    if not dot:
        raise ValueError(f"name the table with its database, e.g. analytics.{table}")
    return database, name


class _Replicas:
    """Tables the front presents as replicated, and which of them the lagging replica holds stale (module docstring)."""

    def __init__(self) -> None:
        self.engines: dict[tuple[str, str], str] = {}  # (database, table) -> the engine system.tables shows
        self.lagging: set[tuple[str, str]] = set()  # tables whose newest parts the lagging replica has not fetched
        self.kept: set[tuple[str, str]] = set()  # tables whose parts it keeps after an unfinished move (no sync ends it)
        self.lock = threading.Lock()

    def copied(self, key: tuple[str, str]) -> bool:
        """Whether the lagging replica answers for the table from a copy of its own."""
        with self.lock:
            return key in self.lagging or key in self.kept

    @staticmethod
    def named(found: re.Match[str], database: str) -> tuple[str, str]:
        return (_unquote_identifier(found.group("db")) if found.group("db") else database, _unquote_identifier(found.group("table")))

    @staticmethod
    def copy_of(key: tuple[str, str]) -> str:
        return f"{quote_identifier(_LAGGING_DB)}.{quote_identifier('.'.join(key))}"

    def synced_table(self, text: str, database: str) -> tuple[tuple[str, str], bool] | None:
        """For a SYNC REPLICA of a presented table: the table, and whether the replica catches up (not PULL)."""
        found = _SYNC_REPLICA_RE.match(text)
        if found is None:
            return None
        key = self.named(found, database)
        with self.lock:
            if key not in self.engines:
                return None  # the engine answers: not replicated
        return key, (found.group("mode") or "").upper() != "PULL"

    def view(self, sql: bytes, stale: bool, settings: dict[str, str]) -> bytes:
        """The read as the replica it lands on answers it: presented engines, and lagged tables' copies when `stale`."""
        with self.lock:
            engines, lagging = dict(self.engines), self.lagging | self.kept
        text = sql.decode("utf-8", errors="replace")
        if engines:
            text = _SYSTEM_TABLES_RE.sub(lambda _: self._presented_tables(engines), text)
        sequential = settings.get("select_sequential_consistency", "0") not in ("0", "")
        for key in sorted(lagging) if stale else ():
            if sequential and engines[key].startswith("Shared"):
                continue  # SharedMergeTree: a sequentially consistent read fetches the newest parts first
            database, table = (re.escape(quote_identifier(part)) + "|" + re.escape(part) for part in key)
            reference = re.compile(rf"(?<![\w`.])(?:{database})\s*\.\s*(?:{table})(?![\w`])")
            text = reference.sub(lambda _, key=key: self.copy_of(key), text)
        if stale and lagging:  # after the references: its own literals name the copies
            text = _SYSTEM_PARTS_RE.sub(lambda _: self._replica_parts(sorted(lagging)), text)
        return text.encode()

    @staticmethod
    def _replica_parts(copied: list[tuple[str, str]]) -> str:
        """system.parts as the lagging replica lists it: a copied table's parts are its copy's, under the table's name."""
        def where(key: tuple[str, str]) -> str:
            return f"database = {quote_string(_LAGGING_DB)} AND table = {quote_string('.'.join(key))}"

        own = " OR ".join(f"(database = {quote_string(db)} AND table = {quote_string(table)})" for db, table in copied)
        database = ", ".join(f"{where(key)}, {quote_string(key[0])}" for key in copied)
        table = ", ".join(f"{where(key)}, {quote_string(key[1])}" for key in copied)
        kept = f"database != {quote_string(_LAGGING_DB)} AND NOT ({own}) OR {' OR '.join(f'({where(key)})' for key in copied)}"
        return (f"(SELECT * REPLACE (multiIf({database}, database) AS database, multiIf({table}, table) AS table) "
                f"FROM (SELECT * FROM system.parts WHERE {kept}))")  # filtered inside: WHERE would see the aliases

    @staticmethod
    def _presented_tables(engines: dict[tuple[str, str], str]) -> str:
        """system.tables, with each presented table's engine (and a Keeper path in engine_full, as a server shows)."""
        keeper_args = "('/clickhouse/tables/{uuid}/{shard}', '{replica}')"
        cases = [(f"database = {quote_string(db)} AND name = {quote_string(table)}", name) for (db, table), name in engines.items()]
        engine = ", ".join(f"{condition}, {quote_string(name)}" for condition, name in cases)
        full = ", ".join(f"{condition}, concat({quote_string(name + keeper_args)}, substring(engine_full, length(engine) + 1))"
                         for condition, name in cases)
        return f"(SELECT * REPLACE (multiIf({engine}, engine) AS engine, multiIf({full}, engine_full) AS engine_full) FROM system.tables)"


# --------------------------------------------------------------------------------------------
# The HTTP server
# --------------------------------------------------------------------------------------------


@dataclass
class _Request:
    method: str
    params: dict[str, str]
    headers: Any
    body: bytes


class _Drop(Exception):
    """Close the connection without an answer."""


class ClickHouseFront:
    """A threaded HTTP server on 127.0.0.1 (a free port) speaking ClickHouse's HTTP interface over chdb at `path`.

    `password`: if given, the user `default` must present it (HTTP Basic or `user`/`password`
    parameters or X-ClickHouse-User/Key headers); otherwise any credentials are accepted.
    `tls`: (certificate chain file, key file): serve HTTPS (ClickHouse's `https_port`) instead of HTTP.
    """

    def __init__(self, path: str | Path, password: str | None = None, display_name: str = "clickhouse-front",
                 tls: tuple[str, str] | None = None) -> None:
        self.path = str(path)
        self.password = password
        self.tls = tls
        self.display_name = display_name
        self.faults = Faults()
        self.sessions = _Sessions()
        self.statements: list[str] = []  # every statement executed (its text up to any inline data), in order
        self.executed: list[tuple[str, dict[str, str]]] = []  # each of them with the settings it ran with
        self._replicas = _Replicas()
        self.stale_reads = Fault("stale_reads", "a read lands on the lagging replica: tables `lag` froze read as they were then")
        self.encodings: collections.Counter[tuple[str, str]] = collections.Counter()  # ("request"|"response", coding)
        self._statements_lock = threading.Lock()
        self._engine: Engine | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> ClickHouseFront:
        Path(self.path).mkdir(parents=True, exist_ok=True)
        self._engine = Engine.acquire(self.path)
        front = self

        class Handler(_Handler):
            owner = front

        # 127.0.0.1 serves every loopback address's clients: the cluster's executors on 127.0.0.2/.3 connect to it
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            # the handshake happens in the connection's own thread, on its first read: a client that never
            # completes one holds only its thread, never the accepting one
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True, do_handshake_on_connect=False)
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"clickhouse-front:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.faults.reset()
        self.stale_reads.reset()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._engine is not None:
            self._engine.release()
            self._engine = None

    def __enter__(self) -> ClickHouseFront:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the front first"
        return int(self._server.server_address[1])

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def url(self) -> str:
        """The address as the target's transport takes it (`http://127.0.0.1:port`, or `https://…` with `tls`)."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def target_url(self) -> str:
        """The address as a job's `target.url` names it (`clickhouse://127.0.0.1:port`, or `clickhouses://…` with `tls`)."""
        return f"{'clickhouses' if self.tls else 'clickhouse'}://{self.host}:{self.port}"

    @property
    def engine(self) -> Engine:
        assert self._engine is not None, "start() the front first"
        return self._engine

    # -- one request -------------------------------------------------------------------------

    def handle(self, request: _Request, send: Callable[[int, dict[str, str], bytes], None]) -> None:
        """Answer one query request (raises _Drop to close the connection without an answer)."""
        params = request.params
        query_id = params.get("query_id") or request.headers.get("X-ClickHouse-Query-Id") or str(uuid.uuid4())
        headers = {"X-ClickHouse-Server-Display-Name": self.display_name, "X-ClickHouse-Query-Id": query_id,
                   "Content-Type": "text/plain; charset=UTF-8"}
        encoding: str | None = None
        session_id = params.get("session_id")
        session: _Session | None = None
        try:
            self._authenticate(request)
            if params.get("compress", "0") not in ("0", "") or params.get("decompress", "0") not in ("0", ""):
                raise ClickHouseError.make(48, "NOT_IMPLEMENTED", "compress/decompress (block compression): not spoken by the front")
            sql, form_params = self._statement(request)
            params = {**params, **form_params}
            if session_id:
                timeout = params.get("session_timeout", "60")
                if not timeout.isdigit():
                    raise ClickHouseError.make(374, "INVALID_SESSION_TIMEOUT", f"Invalid session timeout: '{timeout}'")
                session = self.sessions.acquire(session_id, float(timeout), params.get("session_check") == "1")
            settings = dict(session.settings) if session else {}
            settings.update({k: v for k, v in params.items() if k not in RESERVED_PARAMS and not k.startswith("param_")})
            if settings.get("enable_http_compression", self.engine.http_compression_default) not in ("0", "false", ""):
                encoding = choose_response_encoding(request.headers.get("Accept-Encoding", ""))
            readonly = request.method != "POST" or settings.get("readonly", "0") not in ("0", "")
            engine_settings = {k: v for k, v in settings.items() if k not in _FRONT_ONLY_SETTINGS}
            text = statement_text(sql)
            keyword = first_keyword(text)
            if readonly and keyword not in _RESULT_KEYWORDS | {"SET", "USE"}:
                raise ClickHouseError.make(164, "READONLY", "Cannot execute query in readonly mode")
            database = (request.headers.get("X-ClickHouse-Database") or params.get("database")
                        or (session.database if session else None) or "default")
            default_format = request.headers.get("X-ClickHouse-Format") or params.get("default_format") or "TabSeparated"
            query_params = {k[len("param_"):]: v for k, v in params.items() if k.startswith("param_")}
            held = self._before(text)
            unfinished = self.faults.unfinished.take(text) is not None

            after: Callable[[Engine], None] | None = None
            if keyword == "USE":
                def after(engine: Engine) -> None:
                    db = engine.after_use()
                    if session is not None:
                        session.database = db
            elif keyword == "SET":
                def after(engine: Engine) -> None:
                    changed = engine.after_set()
                    if session is not None:
                        session.settings.update(changed)

            synced = self._replicas.synced_table(text, database) if keyword == "SYSTEM" else None
            if synced is not None:
                if synced[1]:
                    self._catch_up(synced[0])
                outcome = Outcome(b"")
            elif keyword == "ALTER" and (move := self._replicated_move(text, database)) is not None:
                outcome = self._move(sql, text, *move, engine_settings, database, unfinished)
            else:
                if keyword in _RESULT_KEYWORDS and self._replicas.engines:
                    stale = self.stale_reads.take(text) is not None  # it lands on the lagging replica
                    sql = self._replicas.view(sql, stale, engine_settings)
                outcome = self.engine.execute(sql, default_format, query_params, engine_settings, database, after)
                if keyword == "DROP":
                    self._dropped(text, database)
            with self._statements_lock:
                self.statements.append(text)
                self.executed.append((text, dict(engine_settings)))
            if session is not None:  # a server frees the session when the statement ends, before the answer goes out
                self.sessions.release(session_id or "", session, params.get("close_session") == "1")
                session = None
            self._after(text, held)
            if unfinished:
                raise ClickHouseError.make(341, "UNFINISHED", "Timeout exceeded while waiting for replicas to execute the "
                                           "query (replication_wait_for_inactive_replica_timeout): injected by the test front")

            produces_result = keyword in _RESULT_KEYWORDS or bool(outcome.body)
            headers["X-ClickHouse-Timezone"] = settings.get("session_timezone") or self.engine.timezone
            if produces_result:
                found = _TRAILING_FORMAT_RE.search(text)
                fmt = found.group(1) if found else default_format
                headers["X-ClickHouse-Format"] = fmt
                headers["Content-Type"] = next((ct for pattern, ct in _CONTENT_TYPES if pattern.match(fmt)), "text/plain; charset=UTF-8")
            headers["X-ClickHouse-Summary"] = json.dumps({
                "read_rows": str(outcome.read_rows), "read_bytes": str(outcome.read_bytes),
                "written_rows": str(outcome.written_rows), "written_bytes": str(outcome.written_bytes),
                "total_rows_to_read": str(outcome.read_rows), "result_bytes": str(len(outcome.body)),
                "elapsed_ns": str(int(outcome.elapsed_s * 1e9)),
            }, separators=(",", ":"))
            body, status = outcome.body, 200
        except ClickHouseError as error:
            status = error.status
            headers["X-ClickHouse-Exception-Code"] = str(error.code)
            body = f"{error.message} (version {self.engine.version})\n".encode()
        finally:
            if session is not None and session_id:
                self.sessions.release(session_id, session, params.get("close_session") == "1")
        if encoding is not None:
            headers["Content-Encoding"] = encoding
            self.encodings["response", encoding] += 1
            compress = _codec(encoding)
            assert compress is not None
            body = compress[0](body)
        send(status, headers, body)

    # -- replicas (module docstring) -----------------------------------------------------------

    def replicate(self, table: str, engine: str = "ReplicatedMergeTree") -> None:
        """Present `database.table` as a replicated table of this engine (ReplicatedMergeTree, SharedMergeTree, ...)."""
        with self._replicas.lock:
            self._replicas.engines[_split_table(table)] = engine

    def lag(self, table: str) -> None:
        """Stall the lagging replica's queue for the presented `database.table`: it keeps the rows the table holds now."""
        key = _split_table(table)
        if key not in self._replicas.engines:
            raise ValueError(f"{table} is not presented as replicated: call replicate({table!r}) first")
        self._copy(key)
        with self._replicas.lock:
            self._replicas.lagging.add(key)

    def _copy(self, key: tuple[str, str]) -> None:
        """The lagging replica's copy of the table: its rows, and its partitions, as they are now."""
        source, copy = ".".join(map(quote_identifier, key)), self._replicas.copy_of(key)
        for statement in (f"CREATE DATABASE IF NOT EXISTS {quote_identifier(_LAGGING_DB)}", f"DROP TABLE IF EXISTS {copy} SYNC",
                          f"CREATE TABLE {copy} AS {source}", f"INSERT INTO {copy} SELECT * FROM {source}"):
            self._system(statement)

    def _system(self, statement: str) -> None:
        """A statement of the front's own (replication it models), not a client's."""
        self.engine.execute(statement.encode(), "TabSeparated", {}, {}, "default")

    def _replicated_move(self, text: str, database: str) -> tuple[tuple[str, str], str] | None:
        """For a MOVE PARTITION out of a presented table: the table and the partition expression."""
        found = _MOVE_RE.match(text)
        if found is None:
            return None
        key = self._replicas.named(found, database)
        with self._replicas.lock:
            presented = key in self._replicas.engines
        return (key, found.group("partition")) if presented else None

    def _move(self, sql: bytes, text: str, key: tuple[str, str], partition: str, settings: dict[str, str], database: str,
              unfinished: bool) -> Outcome:
        """A partition move run on the replica the balancer picks; the source's DROP_RANGE reaches the other one,
        unless the move is unfinished (module docstring, "Replicas")."""
        table, copy = ".".join(map(quote_identifier, key)), self._replicas.copy_of(key)
        if self._replicas.copied(key) and self.stale_reads.take(text) is not None:  # it lands on the lagging replica
            outcome = self.engine.execute(self._replicas.view(sql, True, settings), "TabSeparated", {}, settings, database)
            other = table
        else:
            if unfinished and not self._replicas.copied(key):
                self._copy(key)  # the other replica, current until now, keeps what it holds
            outcome = self.engine.execute(sql, "TabSeparated", {}, settings, database)
            other = copy if self._replicas.copied(key) else ""
        if unfinished:
            with self._replicas.lock:
                self._replicas.lagging.discard(key)
                self._replicas.kept.add(key)
        elif other:
            self._system(f"ALTER TABLE {other} DROP PARTITION {partition}")
        return outcome

    def _dropped(self, text: str, database: str) -> None:
        """A presented table dropped is gone on every replica: so is its copy."""
        found = _DROP_TABLE_RE.match(text)
        if found is None:
            return
        key = self._replicas.named(found, database)
        with self._replicas.lock:
            copied = key in self._replicas.lagging or key in self._replicas.kept
            self._replicas.lagging.discard(key)
            self._replicas.kept.discard(key)
            self._replicas.engines.pop(key, None)
        if copied:
            self._system(f"DROP TABLE IF EXISTS {self._replicas.copy_of(key)} SYNC")

    def _catch_up(self, key: tuple[str, str]) -> None:
        """The lagging replica fetched every part of the table's replication log: its reads are current again."""
        with self._replicas.lock:
            lagged = key in self._replicas.lagging
            self._replicas.lagging.discard(key)
        if lagged:
            self.engine.execute(f"DROP TABLE IF EXISTS {self._replicas.copy_of(key)} SYNC".encode(), "TabSeparated", {}, {}, "default")

    def _authenticate(self, request: _Request) -> None:
        if self.password is None:
            return
        import base64

        user, password = request.params.get("user"), request.params.get("password")
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
        user = request.headers.get("X-ClickHouse-User", user)
        password = request.headers.get("X-ClickHouse-Key", password)
        if (user or "default") != "default" or (password or "") != self.password:
            raise ClickHouseError.make(516, "AUTHENTICATION_FAILED",
                                       f"{user or 'default'}: Authentication failed: password is incorrect, "
                                       "or there is no user with such name")

    def _statement(self, request: _Request) -> tuple[bytes, dict[str, str]]:
        """The statement bytes (query parameter, a line break, the body) and any form fields."""
        content_type = request.headers.get("Content-Type", "")
        body = request.body
        coding = request.headers.get("Content-Encoding", "").strip().lower()
        if coding and coding != "identity":
            codec = _codec(coding)
            if codec is None:
                raise ClickHouseError.make(48, "NOT_IMPLEMENTED", f"Unknown compression method: {coding}")
            self.encodings["request", coding] += 1
            try:
                body = codec[1](body)
            except Exception as error:
                raise ClickHouseError.make(271, "CANNOT_DECOMPRESS", f"Cannot decompress {coding} request body: {error}") from None
        if content_type.startswith("multipart/form-data"):
            message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
            fields: dict[str, str] = {}
            for part in message.iter_parts():  # type: ignore[attr-defined]
                if part.get_filename():
                    raise ClickHouseError.make(48, "NOT_IMPLEMENTED", "external tables are not spoken by the test front")
                fields[part.get_param("name", header="content-disposition")] = part.get_content()
            query = fields.pop("query", "")
            return query.encode(), {k: v for k, v in fields.items() if k.startswith("param_")}
        query = request.params.get("query", "")
        return ((query + "\n").encode() if query else b"") + body, {}

    def _before(self, text: str) -> float | None:
        """Faults that act before the statement runs; the seconds to hold the answer after it ran, if any."""
        if self.faults.drop_before.take(text) is not None:
            raise _Drop()
        fail = self.faults.fail_before.take(text)
        if fail is not None:
            error = ClickHouseError.make(int(fail.get("code", 439)), str(fail.get("name", "CANNOT_SCHEDULE_TASK")),
                                         str(fail.get("message", "Cannot schedule a task: injected by the test front")))
            raise _StatusError(error, int(fail.get("status", 503)))
        delay = self.faults.delay.take(text)
        if delay is None:
            return None
        if delay.get("phase", "after") == "before":
            self.faults.wait(float(delay.get("seconds", 5)))
            return None
        return float(delay.get("seconds", 5))

    def _after(self, text: str, held: float | None) -> None:
        if self.faults.drop_after_apply.take(text) is not None:
            raise _Drop()
        if held is not None:
            self.faults.wait(held)


class _StatusError(ClickHouseError):
    """An injected error with a chosen HTTP status."""

    def __init__(self, error: ClickHouseError, status: int) -> None:
        super().__init__(error.code, error.name, error.message)
        self._status = status

    @property
    def status(self) -> int:
        return self._status


def inline_insert(sql: bytes) -> tuple[str, str, bytes] | None:
    """An INSERT with inline data as (the statement without FORMAT, the format, the data); None for anything else.

    As ClickHouse's parser reads it: the data starts after the format name, spaces and at most one line break."""
    head = _INSERT_HEAD_RE.match(sql[:65536])
    if head is None:
        return None
    data = sql[head.end():].lstrip(b" \t\f")
    data = data[2:] if data.startswith(b"\r\n") else data[1:] if data.startswith(b"\n") else data
    if not data:
        return None  # no data: the engine answers as it does for a bare INSERT … FORMAT
    return head.group("insert").decode("utf-8", errors="replace"), head.group("format").decode(), data


def statement_text(sql: bytes) -> str:
    """The statement as text: an INSERT's up to its format name (the data after it is not text)."""
    head = _INSERT_HEAD_RE.match(sql[:65536])
    return (head.group(0) if head else sql).decode("utf-8", errors="replace").strip()


def first_keyword(text: str) -> str:
    rest = text[_LEADING_NOISE_RE.match(text).end():]  # type: ignore[union-attr]
    word = re.match(r"[A-Za-z]+", rest)
    return word.group(0).upper() if word else ""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: ClickHouseFront
    _ids = itertools.count()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except ssl.SSLError:  # a client that refused the certificate, or spoke no TLS: nothing to answer
            self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._dispatch()

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch()

    def _dispatch(self) -> None:
        split = urlsplit(self.path)
        params = dict(parse_qsl(split.query, keep_blank_values=True))
        try:
            body = self._read_body()
        except _LengthRequired:
            error = ClickHouseError.make(381, "HTTP_LENGTH_REQUIRED",
                                         "The Transfer-Encoding is not chunked and there is no Content-Length header for POST request")
            self._send(error.status, {"X-ClickHouse-Exception-Code": str(error.code)}, (error.message + "\n").encode())
            return
        if split.path.rstrip("/") == "/ping" or (self.command == "GET" and "query" not in params and split.path in ("", "/")):
            self._send(200, {"Content-Type": "text/html; charset=UTF-8"}, b"Ok.\n")
            return
        try:
            self.owner.handle(_Request(self.command, params, self.headers, body), self._send)
        except _Drop:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = self.headers.get("Content-Length")
        if length is None:
            if self.command == "POST":
                raise _LengthRequired()
            return b""
        return self.rfile.read(int(length))

    def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            # headers and body in one write: two small writes meet Nagle's algorithm and the client's delayed
            # ACK, which held every answer back ~40 ms
            self._headers_buffer.append(b"\r\n" + body)
            self.flush_headers()
            self.wfile.flush()
        except OSError:  # the client gave up (a timeout): nothing to answer to
            self.close_connection = True


class _LengthRequired(Exception):
    pass
