"""StarRocks FE + BE emulator: the Stream Load transaction interface and plain Stream Load.

A test double of the wire protocol in docs/protocol.md, the "StarRocks: ..." sections (their
names and source keys are cited next to each behaviour). The FE answers routing, validation and
the commit/rollback of PREPARED or finished transactions; everything with a data phase is
307-redirected to the BE, which keeps a per-label stream context with try-lock semantics, like
the real BE (SR-BE-TM).

Usage::

    with StarRocksEmulator(tmp_path) as sr:
        sr.create_table("db", "t", [("id", "INT"), ("name", "VARCHAR(20)")])
        sr.create_table("db", "pk", [("id", "INT NOT NULL"), ("name", "VARCHAR(20)")],
                        keys_type="PRIMARY_KEYS", key=("id",))  # loads upsert by key, `__op` 1 deletes
        ... talk HTTP to sr.fe_url ...
        sr.visible_rows("db", "t")

Run standalone: ``python -m tests.support.doubles.emulators.starrocks --data-dir DIR``.
"""
from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.doubles.emulators.base_emulator import BaseEmulator, run_main
from tests.support.doubles.emulators.column_types import schema_properties
from tests.support.doubles.emulators.conversion import STARROCKS_RULES
from tests.support.doubles.emulators.faults import Call
from tests.support.doubles.emulators.http_server import Request, Response, redirect
from tests.support.doubles.emulators.key_models import PRIMARY_KEYS, primary_key_apply_order
from tests.support.doubles.emulators.load_formats import LoadError, LoadFormat, ParseResult, parse_payload
from tests.support.doubles.emulators.profiles import profile_fields, version_tuple
from tests.support.doubles.emulators.store import ABORTED, COMMITTED, VISIBLE, Txn, load_counts

PREPARE, PREPARED = "PREPARE", "PREPARED"
TXN_OPS = ("begin", "load", "prepare", "commit", "rollback")

# StarRocks: label states / SR-TWCH: what the FE does with commit/rollback, by the state of the label's txn.
# "to_be" is the 307 to the coordinator BE (data phase still open: one-phase commit/rollback).
FE_FINISH: dict[tuple[str, str], str] = {
    ("commit", PREPARE): "to_be",
    ("commit", PREPARED): "fe_commit",
    ("commit", COMMITTED): "already_committed",
    ("commit", VISIBLE): "already_committed",
    ("commit", ABORTED): "cannot_commit",
    ("rollback", PREPARE): "to_be",
    ("rollback", PREPARED): "fe_abort",
    ("rollback", COMMITTED): "cannot_abort",
    ("rollback", VISIBLE): "cannot_abort",
    ("rollback", ABORTED): "already_aborted",
}

# SR-LAUE: ExistingJobStatus when the FE refuses a label that a non-aborted txn owns.
EXISTING_JOB_STATUS = {PREPARE: "RUNNING", PREPARED: "RUNNING", COMMITTED: "FINISHED",
                       VISIBLE: "FINISHED"}

CANT_FIND_TXN = ("Can't find the transaction with db [{db}] and label[{label}]. The possible "
                 "reasons: 1. FE leader is started or switched; 2. The transaction timeouts and "
                 "is cleaned.")  # SR-CMGR getNodeFromTransactionState

KNOBS = {
    "publish_timeout": "commit answers FAILED 'publish timeout' (FE) / PUBLISH_TIMEOUT (BE) / "
                       "'Publish Timeout' (stream load); txn is COMMITTED, VISIBLE after "
                       "`visible_after` clock seconds (default 0: on the next request)",
    "write_lock_timeout": "FE commit of a PREPARED txn answers FAILED 'get database write lock "
                          "timeout'; txn stays PREPARED",
    "txn_in_processing": "a BE load/prepare/commit answers TXN_IN_PROCESSING without acting",
    "fe_cache_loss": "FE routing of load/prepare/commit/rollback answers FAILED 'Can't find the "
                     "transaction…' although the txn exists",
    "restart_be": "a matching BE request finds the BE restarting: every stream context is lost "
                  "(C.15) and the request's connection is closed without an answer",
}


@dataclass
class StarRocksProfile:
    """Server configuration and version-dependent behaviour (docs/protocol.md, StarRocks: versions)."""

    version: str = "3.5.4"
    label_keep_max_second: float = 259200            # SR-CFG, 3 days
    # Label eviction by count (docs/protocol.md, StarRocks: label retention): while a database holds
    # more transactions, running plus finished, than label_keep_max_num, the FE forgets its oldest
    # finished ones whatever their age (SR-DTM `removeExpiredTxns`, `getTransactionNum`; StarRocks
    # PR #2414, in every release since 2.0/2.1). On at the server's default; None turns it off.
    label_keep_max_num: int | None = 1000                # SR-CFG
    stream_load_default_timeout_second: int = 600    # SR-CFG (StarRocks: timeouts)
    max_stream_load_timeout_second: int = 259200     # StarRocks: timeouts (which max: UNCONFIRMED)
    prepared_transaction_default_timeout_second: int = 86400  # SR-T-prepared_timeout
    # Running transactions per database (SR-DTM `checkRunningTxnExceedLimit`). None: the release's default, 1000 in
    # the 3.x Config.java and 100 in an older (2.x-era) one; the release that changed it is UNCONFIRMED, 3.0 assumed.
    max_running_txn_num_per_db: int | None = None
    # Rows of one load per memtable flush (each a segment of the load's rowset); None: the whole load is one memtable.
    # The server flushes by memory (write_buffer_size, 100 MB by default); where a load spans several, its deletes
    # apply after its upserts (key_models.primary_key_apply_order).
    memtable_rows: int | None = None
    terminal_state_cache: bool = False               # SR-TWCH new; release UNCONFIRMED: off
    exception_class: str | None = None            # derived from version when None
    in_processing_message: str | None = None      # derived from version when None

    def __post_init__(self) -> None:
        v = version_tuple(self.version)
        if self.max_running_txn_num_per_db is None:
            self.max_running_txn_num_per_db = 1000 if v >= (3, 0) else 100
        if self.exception_class is None:
            # StarRocks: responses (FE answers): UserException in older releases, StarRocksException after the rename.
            # The release of the rename is UNCONFIRMED; 3.4 is assumed.
            self.exception_class = ("com.starrocks.common.StarRocksException" if v >= (3, 4)
                                    else "com.starrocks.common.UserException")
        if self.in_processing_message is None:
            # StarRocks: responses (TXN_IN_PROCESSING): the older wording; the switch release is UNCONFIRMED (3.2 assumed).
            self.in_processing_message = ("Transaction is in processing" if v >= (3, 2)
                                          else "Transaction in processing, please retry later")

    @property
    def table_schema_v2(self) -> bool:
        """The v2 table schema API (keys type, key columns): StarRocks PR #41938, merged 2024-02, so 3.3 is assumed
        (UNCONFIRMED)."""
        return version_tuple(self.version) >= (3, 3)

    @property
    def sql_api(self) -> bool:
        """The HTTP SQL API (`POST /api/v1/catalogs/{catalog}[/databases/{db}]/sql`): from 3.2.0 (its docs)."""
        return version_tuple(self.version) >= (3, 2)

    @property
    def supports_prepared_timeout(self) -> bool:
        return version_tuple(self.version) >= (3, 5, 4)  # StarRocks: headers; SR-DOC, PR #61539


@dataclass
class StreamContext:
    """The BE's per-label context (SR-BE-TM): lives from begin until prepare/commit/rollback."""

    label: str
    db: str
    table: str
    txn_id: int
    timeout_s: int
    idle_timeout_s: int
    last_active: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    chunks: list[bytes] = field(default_factory=list)
    fmt: LoadFormat | None = None
    has_sink: bool = False  # a load created the pipe; prepare/commit without it is an error
    load_bytes: int = 0
    aborted: bool = False
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)

    def brief(self) -> str:
        """SR-BE-CTX ``brief()``, used in 'hasn't send any data yet'."""
        return f"id={self.uid}, job_id=-1, txn_id: {self.txn_id}, label={self.label}, db={self.db}"


class StarRocksEmulator(BaseEmulator):
    """StarRocks FE (``fe_url``) and BE (``be_url``) emulator; see the module doc."""

    PRODUCT = "starrocks"
    RULES = STARROCKS_RULES  # docs/protocol.md, "Common: value conversion"
    EXPIRING_STATES = frozenset({PREPARE, PREPARED})
    EXTRA_KNOBS = KNOBS

    def __init__(self, data_dir: Any, user: str = "root", password: str = "",
                 **profile: Any) -> None:
        self.profile: StarRocksProfile = profile_fields(StarRocksProfile, profile)
        self._contexts: dict[str, StreamContext] = {}   # BE, by label
        self._coordinators: set[str] = set()             # FE label -> BE cache (SR-CMGR)
        super().__init__(str(data_dir), user, password)

    # -- memory lost on restarts --------------------------------------------------------------

    def _reset_memory(self) -> None:
        super()._reset_memory()
        self._coordinators.clear()

    def _reset_be_memory(self) -> None:
        for ctx in self._contexts.values():
            ctx.aborted = True
        self._contexts.clear()

    def _on_aborted(self, txn: Txn) -> None:
        ctx = self._contexts.get(txn.label)
        if ctx is not None and ctx.txn_id == txn.txn_id:
            ctx.aborted = True
            del self._contexts[txn.label]

    def _tick_extra(self, now: float) -> None:
        """BE cleaner: idle timeout (SR-BE-TM ``_clean_stream_context``; only if set on begin);
        FE: label eviction by count (``label_keep_max_num``, see the profile)."""
        if self.profile.label_keep_max_num is not None:
            self._evict_beyond_count(self.profile.label_keep_max_num, count_running=True)
        for ctx in list(self._contexts.values()):
            if ctx.idle_timeout_s > 0 and now - ctx.last_active > ctx.idle_timeout_s and ctx.lock.acquire(blocking=False):
                try:
                    txn = self.store.txns.get(ctx.txn_id)
                    if txn is not None and txn.state == PREPARE:
                        self._abort(txn, f"transaction is aborted by idle timeout "
                                         f"{ctx.idle_timeout_s} seconds.")
                finally:
                    ctx.lock.release()

    def _attach(self, txn: Txn, parsed: ParseResult, load_bytes: int) -> None:
        """A PRIMARY KEY table keeps a load's rows in the order its apply step takes effect (key_models.py)."""
        super()._attach(txn, parsed, load_bytes)
        schema = self.store.schema(txn.db, txn.table)
        if schema is not None and schema.model.keys_type == PRIMARY_KEYS:
            txn.rows = primary_key_apply_order([name for name, _ in schema.stored], schema.model.key, txn.rows,
                                               self.profile.memtable_rows)
            self.store.save(txn, with_rows=True)

    def stream_context_busy(self, label: str) -> bool:
        """Test hook: is a BE request holding this label's context lock right now?"""
        ctx = self._contexts.get(label)
        return ctx is not None and ctx.lock.locked()

    # -- request classification --------------------------------------------------------------

    def describe(self, role: str, req: Request) -> Call:
        s = req.segments
        if len(s) == 3 and s[:2] == ["api", "transaction"]:
            return Call(s[2].lower(), role, req.header("label") or None, req.header("db") or None)
        if len(s) == 4 and s[0] == "api" and s[3] == "_stream_load":
            return Call("stream_load", role, req.header("label") or None, s[1])
        if len(s) == 3 and s[0] == "api" and s[2] == "get_load_state":
            return Call("get_load_state", role, req.query.get("label"), s[1])
        if len(s) == 4 and s[0] == "api" and s[3] == "_cancel":
            return Call("cancel", role, req.query.get("label"), s[1])
        if len(s) == 4 and s[0] == "api" and s[3] == "_schema":
            return Call("schema", role, None, s[1])
        if len(s) == 9 and s[:3] == ["api", "v2", "catalogs"] and s[4] == "databases" and s[6] == "tables" \
                and s[8] == "schema" and self.profile.table_schema_v2:
            return Call("schema_v2", role, None, s[5])
        if len(s) in (5, 7) and s[:3] == ["api", "v1", "catalogs"] and s[-1] == "sql" and self.profile.sql_api:
            return Call("sql", role, None, s[5] if len(s) == 7 else None)
        return Call("other", role)

    def route(self, role: str, req: Request, call: Call) -> Response:
        if role == "be" and self.faults.restart_be.take(call) is not None:
            with self.lock:  # the BE crashed at this instant: contexts gone, request unanswered
                self._reset_be_memory()
            return Response.dropped()
        s = req.segments
        is_txn = len(s) == 3 and s[:2] == ["api", "transaction"]
        if role == "fe":
            if is_txn and req.method in ("POST", "PUT"):
                return self._fe_transaction(req, call)
            if call.op == "stream_load":
                return self._fe_stream_load(req, call)
            if call.op == "get_load_state" and req.method == "GET":
                return self._fe_get_load_state(req, call)
            if call.op == "cancel" and req.method == "POST":
                return self._fe_cancel(req, call)
            if call.op == "schema" and req.method == "GET":
                return self._fe_schema(req)
            if call.op == "schema_v2" and req.method == "GET":
                return self._fe_schema_v2(req)
            if call.op == "sql" and req.method == "POST":
                return self._fe_sql(req)
        else:
            if is_txn and req.method in ("POST", "PUT"):
                handler = self._BE_OPS.get(call.op)
                if handler is None:
                    return self._be_reply("INVALID_ARGUMENT", f"unsupported txn_op {s[2]}")
                return handler(self, req, call)
            if call.op == "stream_load" and req.method == "PUT":
                return self._be_stream_load(req, call)
        return Response.text("Not Found", 404)

    # -- response shapes ---------------------------------------------------------------------

    @staticmethod
    def _fe_result(status: str, message: str = "", txn: Txn | None = None,
                   label: str | None = None, **extra: Any) -> Response:
        """FE TransactionResult (SR-TR): Gson pretty printing, 2-space indent, HashMap order."""
        body: dict[str, Any] = {}
        if txn is not None or label is not None:
            body["Label"] = label if label is not None else txn.label  # type: ignore[union-attr]
        body["Status"] = status
        body.update(extra)
        if txn is not None:
            body["TxnId"] = txn.txn_id
        body["Message"] = message
        return Response.json(body, indent=2)

    def _fe_failed(self, message: str, exc_class: str | None = None) -> Response:
        """An FE exception: FAILED with '<exception class>: <msg>' (SR-TLA catch block)."""
        return self._fe_result("FAILED", f"class {exc_class or self.profile.exception_class}: "
                                         f"{message}")

    @staticmethod
    def _rest_result(message: str | None = None, **extra: Any) -> Response:
        """RestBaseResult (SR-TR/SR-GLS): compact Gson, subclass fields first; FAILED on msg."""
        body = dict(extra)
        if message is None:
            body.update(status="OK", code="0", msg="Success", message="OK")
        else:
            body.update(status="FAILED", code="1", msg=message, message=message)
        return Response.json(body, indent=None)

    def _unauthorized(self) -> Response:
        """SR-RBA (Common: HTTP conventions): HTTP 401 with ``WWW-Authenticate`` and a RestBaseResult body."""
        resp = self._rest_result(f"Access denied for user '{self.user}'. "
                                 f"Please check the user name and password.")
        resp.status = 401
        resp.headers["WWW-Authenticate"] = 'Basic realm=""'
        return resp

    @staticmethod
    def _be_reply(status: str, message: str = "", label: str = "",
                  ok_fields: dict[str, Any] | None = None, existing: str | None = None,
                  error_url: str = "") -> Response:
        """BE ``to_resp_json`` (SR-BE-CTX): 4-space pretty JSON, TStatusCode name as Status."""
        body: dict[str, Any] = {"Status": status}
        if status == "LABEL_ALREADY_EXISTS":
            body["ExistingJobStatus"] = existing or ""
        elif status == "TXN_IN_PROCESSING":
            body["Label"] = label
        body["Message"] = message
        if status == "OK":
            body["Label"] = label
            body.update(ok_fields or {})
        if error_url:
            body["ErrorURL"] = error_url
        return Response.json(body, indent=4)

    @staticmethod
    def _row_counts(txn: Txn) -> dict[str, Any]:
        """prepare/commit OK fields (SR-BE-CTX ``to_resp_json``, SR-T-prepared_timeout)."""
        return {"TxnId": txn.txn_id, **load_counts(txn), "LoadTimeMs": 0, "StreamLoadPlanTimeMs": 0, "ReceivedDataTimeMs": 0,
                "WriteDataTimeMs": 0, "CommitAndPublishTimeMs": 0}

    # -- FE: /api/transaction/{op} -----------------------------------------------------------

    def _fe_transaction(self, req: Request, call: Call) -> Response:
        if not self.credentials_ok(req):
            return self._unauthorized()
        op = call.op
        # SR-TLA: the op is parsed first, then toTxnOperationParams checks db, label, timeouts.
        if op not in TXN_OPS:
            return self._fe_failed(f"Unknown transaction operation: {req.segments[2]}")
        db = req.header("db")
        if not db:
            return self._fe_failed("No database selected.")
        label = req.header("label")
        if not label:
            return self._fe_failed("Empty label.")
        numeric = ["timeout"] + (["prepared_timeout"] if self.profile.supports_prepared_timeout
                                 else [])
        for name in numeric:
            value = req.headers.get(name)
            if value is not None:
                try:
                    int(str(value))
                except ValueError:  # Long.parseLong
                    return self._fe_failed(f'For input string: "{value}"',
                                           "java.lang.NumberFormatException")
        if req.header("transaction_type").lower() == "multi":
            # Deviation: v4 multi-table transactions (StarRocks: headers) are out of scope for the emulator.
            return self._fe_failed("emulator: transaction_type=multi is not supported")
        with self.lock:
            if db not in self.store.dbs:
                return self._fe_failed(f"Database[{db}] does not exist.")
            txn = self.store.label_txn(db, label)
            if op == "begin":
                self._coordinators.add(label)  # SR-CMGR allocate
                return redirect(req, self.be_port)
            if op == "load":
                return self._fe_route_to_be(req, call, db, label, txn)
            if label not in self._coordinators and txn is None:
                evicted = self._evicted_result(op, db, label)
                if evicted is not None:
                    return evicted
                # SR-TLA getTxnOperationHandler (newest source)
                return self._fe_failed(f"No transaction found with db[{db}] and label[{label}]")
            if op == "prepare":
                return self._fe_route_to_be(req, call, db, label, txn)
            if txn is None:  # cached coordinator, txn evicted meanwhile
                evicted = self._evicted_result(op, db, label)
                return evicted or self._fe_failed(f"No transaction found by label {label}")
            action = FE_FINISH[(op, txn.state)]
            return getattr(self, f"_fin_{action}")(req, call, txn)

    def _evicted_result(self, op: str, db: str, label: str) -> Response | None:
        """SR-TWCH newest: answers for a label whose txn was evicted (terminal-state cache)."""
        if not self.profile.terminal_state_cache or op not in ("commit", "rollback"):
            return None
        txn = self.store.evicted_label_txn(db, label)
        if txn is None:
            return self._fe_failed(f"No transaction found by label {label}")
        committed = txn.state in (COMMITTED, VISIBLE)
        if op == "commit":
            if committed:
                return self._fe_result("OK", f"Transaction has already committed, label is {label}",
                                       label=label)
            return self._fe_failed(f"Can not commit ABORTED transaction, label is {label}")
        if committed:
            return self._fe_failed(f"Can not abort COMMITTED transaction, label is {label}")
        return self._fe_result("OK", f"Transaction has already aborted, label is {label}",
                               label=label)

    def _fe_route_to_be(self, req: Request, call: Call, db: str, label: str,
                        txn: Txn | None) -> Response:
        """307 to the label's coordinator BE, from the cache or the txn state (SR-CMGR get)."""
        if self.faults.fe_cache_loss.take(call) is not None or (
                label not in self._coordinators and txn is None):
            return self._fe_failed(CANT_FIND_TXN.format(db=db, label=label))
        return redirect(req, self.be_port)

    def _fin_to_be(self, req: Request, call: Call, txn: Txn) -> Response:
        return self._fe_route_to_be(req, call, txn.db, txn.label, txn)

    def _fin_fe_commit(self, req: Request, call: Call, txn: Txn) -> Response:
        """SR-GTM commitPreparedTransaction, with the publish and write-lock timeout faults."""
        txn.commit_count += 1
        timeout_ms = int(req.header("timeout") or 0) * 1000 or 20000  # SR-TLA default 20000 ms
        if self.faults.write_lock_timeout.take(call) is not None:  # stays PREPARED
            self.store.save(txn)
            return self._fe_failed(f"get database write lock timeout, database={txn.db}, "
                                   f"timeoutMillis={timeout_ms}")
        params = self.faults.publish_timeout.take(call)
        if params is not None:  # FAILED, yet COMMITTED and later VISIBLE
            self._commit(txn, visible_after=float(params.get("visible_after", 0)))
            return self._fe_failed(f"publish timeout: {timeout_ms}")
        self._commit(txn)
        return self._fe_result("OK", "", txn)

    def _fin_already_committed(self, req: Request, call: Call, txn: Txn) -> Response:
        txn.commit_count += 1  # idempotent re-commit is OK (SR-T-basic_txn)
        self.store.save(txn)
        return self._fe_result("OK", f"Transaction {txn.txn_id} has already committed, "
                                     f"label is {txn.label}", txn)

    def _fin_cannot_commit(self, req: Request, call: Call, txn: Txn) -> Response:
        txn.commit_count += 1
        self.store.save(txn)
        return self._fe_failed(f"Can not commit ABORTED transaction {txn.txn_id}, "
                               f"label is {txn.label}")

    def _fin_fe_abort(self, req: Request, call: Call, txn: Txn) -> Response:
        self._abort(txn, "User Aborted")
        return self._fe_result("OK", "", txn)

    def _fin_already_aborted(self, req: Request, call: Call, txn: Txn) -> Response:
        return self._fe_result("OK", f"Transaction {txn.txn_id} has already aborted, "
                                     f"label is {txn.label}", txn)

    def _fin_cannot_abort(self, req: Request, call: Call, txn: Txn) -> Response:
        return self._fe_failed(f"Can not abort {txn.state} transaction {txn.txn_id}, "
                               f"label is {txn.label}")

    # -- FE: other endpoints -----------------------------------------------------------------

    def _fe_get_load_state(self, req: Request, call: Call) -> Response:
        """StarRocks: get_load_state / SR-GLS: the label's state and abort reason; UNKNOWN once evicted."""
        if not self.credentials_ok(req):
            return self._unauthorized()
        label = req.query.get("label", "")
        if not label:
            return self._rest_result("No label selected.")
        db = req.segments[1]
        with self.lock:
            if db not in self.store.dbs:
                return self._rest_result(f"unknown database, database={db}")
            txn = self.store.label_txn(db, label)
            state, reason = (txn.state, txn.reason) if txn else ("UNKNOWN", "")
        return self._rest_result(None, state=state, reason=reason)

    def _fe_stream_load(self, req: Request, call: Call) -> Response:
        """SR-LA: PUT only; requires ``Expect: 100-continue`` on HTTP/1.1 (StarRocks: plain Stream Load); forced close."""
        if req.method != "PUT":
            return Response.text("Method Not Allowed", 405)
        if not self.credentials_ok(req):
            return self._unauthorized()
        if req.http_version != "HTTP/1.0" and not req.expect_continue:
            resp = self._fe_failed("There is no 100-continue header",
                                   "com.starrocks.common.DdlException")
            resp.close = True
            return resp
        return redirect(req, self.be_port, close=True)

    def _fe_schema(self, req: Request) -> Response:
        """``GET /api/{db}/{table}/_schema`` (docs/protocol.md, "Common: table schema endpoint"; SR-TSA): the HTTP status
        repeats the body's ``status``; types are primitive-type names, decimals add precision and scale."""
        if not self.credentials_ok(req):
            return self._unauthorized()
        db, table = req.segments[1], req.segments[2]
        with self.lock:
            schema = self.store.schema(db, table)
            if db not in self.store.dbs:
                body: dict[str, Any] = {"status": 404, "exception": f"Database [{db}] does not exists"}
            elif schema is None:
                body = {"status": 404, "exception": f"Table [{table}] does not exists"}
            else:
                body = {"status": 200, "properties": schema_properties(schema, self.PRODUCT)}
        return Response.json(body, indent=None, status=int(body["status"]))

    def _fe_schema_v2(self, req: Request) -> Response:
        """``GET /api/v2/catalogs/{catalog}/databases/{db}/tables/{table}/schema`` (docs/protocol.md, "StarRocks:
        primary key tables and `__op`"; SR-TSA2): a RestBaseResultV2 whose ``result`` is the table's view, with its
        ``keysType`` and each column's ``isKey``; unknown database or table HTTP 404. The fields the emulator leaves
        out (ids, partitions, indexes, properties) are not read by the sink."""
        if not self.credentials_ok(req):
            return self._unauthorized()
        catalog, db, table = req.segments[3], req.segments[5], req.segments[7]
        with self.lock:
            schema = self.store.schema(db, table)
            if db not in self.store.dbs or catalog != "default_catalog":
                return Response.json({"code": "404", "message": f"Unknown database '{db}'"}, indent=None, status=404)
            if schema is None:
                return Response.json({"code": "404", "message": f"Unknown table '{table}'"}, indent=None, status=404)
            model = schema.model
            keys = {k.lower() for k in model.key}
            columns = []
            for prop, (name, ctype) in zip(schema_properties(schema, self.PRODUCT), schema.columns):
                is_key = name.lower() in keys
                view: dict[str, Any] = {"name": name, "primitiveType": prop["type"]}
                if not is_key:  # SR: a PRIMARY KEY table's value columns REPLACE, a DUPLICATE table's NONE
                    view["aggregationType"] = "REPLACE" if model.unique else "NONE"
                view.update(isKey=is_key, isAllowNull=ctype.nullable, isAutoIncrement=False, comment="")
                columns.append(view)
            result = {"name": table, "tableType": "OLAP", "keysType": model.keys_type, "columns": columns}
        return Response.json({"code": "0", "message": "OK", "result": result}, indent=None)

    def _fe_sql(self, req: Request) -> Response:
        """The HTTP SQL API (StarRocks' docs, reference/HTTP_API/SQL.md; 3.2+): a JSON body `{"query": …}`, an answer of
        newline-delimited JSON objects (`connectionId`, `meta`, one `data` per row, `statistics`), or
        `{"status":"FAILED","msg":…}` before any data. The emulator answers `select current_version()` only, as
        `"<version> <commit>"`."""
        if not self.credentials_ok(req):
            return self._unauthorized()
        try:
            query = str(json.loads(req.body() or b"{}").get("query", ""))
        except (ValueError, AttributeError):
            query = ""
        if " ".join(query.lower().rstrip("; ").split()) != "select current_version()":
            return Response.json({"status": "FAILED", "msg": f"emulator: only select current_version() is answered, "
                                  f"not {query!r}"}, indent=None, status=400)
        lines = [{"connectionId": 1}, {"meta": [{"name": "current_version()", "type": "varchar"}]},
                 {"data": [f"{self.profile.version} emulator"]},
                 {"statistics": {"scanRows": 0, "scanBytes": 0, "returnRows": 1}}]
        body = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
        return Response(body=body, headers={"Content-Type": "application/x-ndjson; charset=UTF-8"})

    def _fe_cancel(self, req: Request, call: Call) -> Response:
        """``POST /api/{db}/{table}/_cancel?label=`` (SR-CSLA): aborts the label's running txn with
        reason "user cancel" and answers a RestBaseResult with lower-case ``status``/``msg``, OK or
        FAILED with the exception's text (SR-CSLA-T). The text for a label with no running txn is
        UNCONFIRMED; a finished txn cannot be aborted, so it fails too.
        """
        if not self.credentials_ok(req):
            return self._unauthorized()
        db, label = req.segments[1], req.query.get("label", "")
        if not label:
            return self._rest_result("No label selected.")
        with self.lock:
            if db not in self.store.dbs:
                return self._rest_result(f"Database[{db}] does not exist.")
            txn = self.store.label_txn(db, label)
            if txn is None or txn.state not in (PREPARE, PREPARED):
                return self._rest_result(f"transaction with label {label} not found or not running")
            self._abort(txn, "user cancel")
            return self._rest_result()

    # -- BE: /api/transaction/{op} (SR-BE-TSL, SR-BE-TM) --------------------------------------

    def _be_begin(self, req: Request, call: Call) -> Response:
        label = req.header("label")
        if req.header("transaction_type"):
            return self._be_reply("INVALID_ARGUMENT", "Multi-statement transaction requests can "
                                                      "only be sent to FE nodes, not BE nodes")
        if not label:
            return self._be_reply("INVALID_ARGUMENT", "empty label")
        with self.lock:
            if label in self._contexts:  # context still on this BE
                return self._be_reply("LABEL_ALREADY_EXISTS", "", existing="")
        timeouts: dict[str, int] = {}
        for name in ("timeout", "idle_transaction_timeout"):
            value = req.header(name)
            if value:
                if not value.isdigit():
                    return self._be_reply("INVALID_ARGUMENT", "Invalid timeout format")
                timeouts[name] = int(value)
        auth = req.basic_auth()
        if auth is None:
            return self._be_reply("INTERNAL_ERROR", "no valid Basic authorization")
        db, table = req.header("db"), req.header("table")
        with self.lock:
            # The FE side of begin (loadTxnBegin RPC); its errors are passed through.
            # Status names for these FE errors are UNCONFIRMED (StarRocks: responses, last row of the BE table).
            if auth != (self.user, self.password):
                return self._be_reply("ANALYSIS_ERROR", f"Access denied for user '{auth[0]}'")
            if db not in self.store.dbs:
                return self._be_reply("ANALYSIS_ERROR", f"unknown database, database={db}")
            if self.store.schema(db, table) is None:
                return self._be_reply("ANALYSIS_ERROR", f'unknown table "{db}.{table}"')
            timeout = timeouts.get("timeout") or self.profile.stream_load_default_timeout_second
            if not 1 <= timeout <= self.profile.max_stream_load_timeout_second:
                return self._be_reply("ANALYSIS_ERROR", "Invalid timeout. Timeout should between "
                                      f"1 and {self.profile.max_stream_load_timeout_second} "
                                      "seconds")
            owner = self.store.label_txn(db, label)
            if owner is not None and owner.state != ABORTED:  # label reuse only after abort
                return self._be_reply("LABEL_ALREADY_EXISTS",
                                      f"Label [{label}] has already been used.",
                                      existing=EXISTING_JOB_STATUS[owner.state])
            limit_error = self._running_limit_error(db)
            if limit_error:
                return self._be_reply("ANALYSIS_ERROR", limit_error)
            now = self.clock.now()
            txn = self.store.new_txn(db=db, table=table, label=label, state=PREPARE,
                                     timeout_s=timeout, deadline=now + timeout,
                                     keep_s=self.profile.label_keep_max_second)
            self._coordinators.add(label)
            self._contexts[label] = StreamContext(
                label=label, db=db, table=table, txn_id=txn.txn_id, timeout_s=timeout,
                idle_timeout_s=timeouts.get("idle_transaction_timeout", 0), last_active=now)
        return self._be_reply("OK", "", label, {"TxnId": txn.txn_id, "BeginTxnTimeMs": 0})

    def _running_limit_error(self, db: str) -> str:
        """StarRocks: concurrency and limits: begin fails past max_running_txn_num_per_db (exact wording UNCONFIRMED)."""
        running = self.store.running_count(db)
        limit = self.profile.max_running_txn_num_per_db
        if running >= limit:
            return (f"current running txns on db {self.store.dbs[db]} is {running}, "
                    f"larger than limit {limit}")
        return ""

    def _lock_context(self, req: Request, call: Call, label: str, not_exists: str
                      ) -> tuple[StreamContext | None, Response | None]:
        """Find the label's context and try-lock it (SR-BE-CTX ``try_lock``; StarRocks: concurrency and limits)."""
        with self.lock:
            ctx = self._contexts.get(label)
            if ctx is None:
                return None, self._be_reply("TXN_NOT_EXISTS", not_exists)
            if ctx.db != req.header("db"):
                return None, self._be_reply(
                    "INVALID_ARGUMENT",
                    f"request db {req.header('db')} transaction db {ctx.db} not match")
            if call.op == "prepare" and self.profile.supports_prepared_timeout:
                value = req.header("prepared_timeout")
                if value and (not value.isdigit() or int(value) <= 0):
                    return None, self._be_reply("INVALID_ARGUMENT",
                                                f"Invalid prepared_timeout: {value}")
            if self.faults.txn_in_processing.take(call) is not None or \
                    not ctx.lock.acquire(blocking=False):
                return None, self._be_reply("TXN_IN_PROCESSING",
                                            self.profile.in_processing_message or "", label)
            return ctx, None

    def _rollback_ctx(self, ctx: StreamContext, reason: str) -> None:
        """need_rollback: a failed load/prepare/commit rolls the txn back (SR-DOC Precautions)."""
        txn = self.store.txns.get(ctx.txn_id)
        if txn is not None and txn.state == PREPARE:
            self._abort(txn, reason)
        self._contexts.pop(ctx.label, None)
        ctx.aborted = True

    def _be_load(self, req: Request, call: Call) -> Response:
        label = req.header("label")
        if not label:
            return self._be_reply("INVALID_ARGUMENT", "empty label")
        ctx, error = self._lock_context(req, call, label,
                                        f"Transaction with label {label} not exists")
        if ctx is None:
            return error  # type: ignore[return-value]
        try:
            table = req.header("table")
            if table != ctx.table:
                return self._be_reply("INVALID_ARGUMENT", f"Request table {table} not equal "
                                                          f"transaction table {ctx.table}")
            try:
                fmt = LoadFormat.from_headers(req.headers)
            except LoadError as exc:
                with self.lock:
                    self._rollback_ctx(ctx, str(exc))
                return self._be_reply("INTERNAL_ERROR", str(exc))
            body = req.body()  # read while holding the context lock, like the BE pipe
            with self.lock:
                if ctx.aborted or self._contexts.get(label) is not ctx:
                    return self._be_reply("ABORTED", "transaction is aborted")
                if ctx.fmt is None:
                    ctx.fmt = fmt  # every load of a txn must use the same parameters (SR-DOC)
                ctx.chunks.append(body)
                ctx.has_sink = True
                ctx.load_bytes += len(body)
                ctx.last_active = self.clock.now()
            return self._be_reply("OK", "", label, {
                "TxnId": ctx.txn_id, "LoadBytes": len(body), "StreamLoadPlanTimeMs": 0,
                "ReceivedDataTimeMs": 0})
        finally:
            ctx.lock.release()

    def _parse_context(self, ctx: StreamContext) -> ParseResult:
        """All data of a txn: CSV loads form one stream (so records must end with the row
        delimiter, SR-DOC 'Limits'); each JSON load is complete documents (SR-BE-TSL)."""
        schema = self.store.schema(ctx.db, ctx.table)
        fmt = ctx.fmt or LoadFormat()
        if schema is None:
            raise LoadError(f"unknown table {ctx.table}")
        if fmt.format == "csv":
            return parse_payload(b"".join(ctx.chunks), fmt, schema)
        result = ParseResult()
        for chunk in ctx.chunks:
            result.extend(parse_payload(chunk, fmt, schema))
        return result

    def _be_finish(self, req: Request, call: Call) -> Response:
        """BE prepare, or one-phase commit of a txn still in PREPARE (SR-BE-TM commit_txn)."""
        label = req.header("label")
        if not label:
            return self._be_reply("INVALID_ARGUMENT", "empty label")
        ctx, error = self._lock_context(req, call, label,
                                        f"transaction with label {label} not exists")
        if ctx is None:
            return error  # type: ignore[return-value]
        try:
            with self.lock:
                txn = self.store.txns.get(ctx.txn_id)
                if ctx.aborted or txn is None or txn.state != PREPARE:
                    return self._be_reply("ABORTED", "transaction is aborted")
                if not ctx.has_sink:  # StarRocks: responses (no data loaded)
                    message = f"transaction {ctx.brief()} hasn't send any data yet"
                    self._rollback_ctx(ctx, message)
                    return self._be_reply("INTERNAL_ERROR", message)
            try:
                parsed = self._parse_context(ctx)  # outside the global lock: may be big
            except LoadError as exc:
                with self.lock:
                    self._rollback_ctx(ctx, str(exc))
                return self._be_reply("INTERNAL_ERROR", str(exc))
            with self.lock:
                if ctx.aborted or txn.state != PREPARE:
                    return self._be_reply("ABORTED", "transaction is aborted")
                fmt = ctx.fmt or LoadFormat()
                if parsed.too_many_filtered(fmt.max_filter_ratio):  # fails late (StarRocks: responses)
                    url = self._error_url(txn.txn_id, parsed.errors)
                    txn.error_url = url
                    self._rollback_ctx(ctx, "too many filtered rows")
                    return self._be_reply("INTERNAL_ERROR", "too many filtered rows",
                                          error_url=url)
                self._attach(txn, parsed, ctx.load_bytes)
                del self._contexts[label]  # step 4: the BE forgets the txn (StarRocks: routing)
                ctx.aborted = True
                url = self._error_url(txn.txn_id, parsed.errors) if parsed.errors else ""
                if call.op == "prepare":
                    now = self.clock.now()
                    header = req.header("prepared_timeout")
                    seconds = (int(header) if header and self.profile.supports_prepared_timeout
                               else self.profile.prepared_transaction_default_timeout_second)
                    txn.state = PREPARED
                    txn.prepare_time = now
                    txn.prepared_timeout_s = seconds
                    txn.deadline = now + seconds
                    self.store.save(txn)
                    return self._be_reply("OK", "", label, self._row_counts(txn), error_url=url)
                txn.commit_count += 1
                params = self.faults.publish_timeout.take(call)
                if params is not None:  # PUBLISH_TIMEOUT: committed, not yet visible
                    self._commit(txn, visible_after=float(params.get("visible_after", 0)))
                    return self._be_reply("PUBLISH_TIMEOUT", "transaction commit successfully, "
                                          "BUT data will be visible later", error_url=url)
                self._commit(txn)
                return self._be_reply("OK", "", label, self._row_counts(txn), error_url=url)
        finally:
            ctx.lock.release()

    def _be_rollback(self, req: Request, call: Call) -> Response:
        """SR-BE-TM rollback_transaction: no try-lock; the FE records the BE's reason."""
        label = req.header("label")
        if not label:
            return self._be_reply("INVALID_ARGUMENT", "empty label")
        with self.lock:
            ctx = self._contexts.get(label)
            if ctx is None:  # StarRocks: routing: e.g. after a BE restart
                return self._be_reply("TXN_NOT_EXISTS",
                                      f"transaction with label {label} not exists")
            if ctx.db != req.header("db"):
                return self._be_reply("INVALID_ARGUMENT", f"request db {req.header('db')} "
                                                          f"transaction db {ctx.db} not match")
            self._rollback_ctx(ctx, "transaction is aborted by user.")
        return self._be_reply("OK", "", label)

    _BE_OPS: dict[str, Callable[[StarRocksEmulator, Request, Call], Response]] = {
        "begin": _be_begin, "load": _be_load, "prepare": _be_finish, "commit": _be_finish,
        "rollback": _be_rollback,
    }

    # -- BE: non-transactional stream load ---------------------------------------------------

    def _stream_load_json(self, txn_id: int, label: str, status: str, message: str,
                          txn: Txn | None = None, existing: str | None = None,
                          error_url: str = "") -> Response:
        """BE ``to_json`` (SR-BE-CTX): Success / Publish Timeout / Label Already Exists / Fail."""
        body: dict[str, Any] = {"TxnId": txn_id, "Label": label, "Status": status}
        if existing is not None:
            body["ExistingJobStatus"] = existing
        body["Message"] = message
        body.update({
            **load_counts(txn), "LoadTimeMs": 0, "BeginTxnTimeMs": 0,
            "StreamLoadPlanTimeMs": 0, "ReadDataTimeMs": 0, "WriteDataTimeMs": 0,
            "CommitAndPublishTimeMs": 0})
        if error_url:
            body["ErrorURL"] = error_url
        return Response.json(body, indent=4)

    def _be_stream_load(self, req: Request, call: Call) -> Response:
        db, table = req.segments[1], req.segments[2]
        label = req.header("label") or uuid.uuid4().hex
        auth = req.basic_auth()
        if auth is None:
            return self._stream_load_json(-1, label, "Fail", "no valid Basic authorization")
        try:
            fmt = LoadFormat.from_headers(req.headers)
        except LoadError as exc:
            return self._stream_load_json(-1, label, "Fail", str(exc))
        with self.lock:
            if auth != (self.user, self.password):
                return self._stream_load_json(-1, label, "Fail",
                                              f"Access denied for user '{auth[0]}'")
            schema = self.store.schema(db, table)
            if schema is None:
                return self._stream_load_json(-1, label, "Fail", f'unknown table "{db}.{table}"')
            owner = self.store.label_txn(db, label)
            if owner is not None and owner.state != ABORTED:  # SR-T-label_already_exist
                return self._stream_load_json(-1, label, "Label Already Exists",
                                              f"Label [{label}] has already been used.",
                                              existing=EXISTING_JOB_STATUS[owner.state])
            limit_error = self._running_limit_error(db)
            if limit_error:
                return self._stream_load_json(-1, label, "Fail", limit_error)
            timeout_header = req.header("timeout")
            if timeout_header and not timeout_header.isdigit():
                return self._stream_load_json(-1, label, "Fail", "Invalid timeout format")
            timeout = int(timeout_header or self.profile.stream_load_default_timeout_second)
            txn = self.store.new_txn(db=db, table=table, label=label, state=PREPARE,
                                     timeout_s=timeout, deadline=self.clock.now() + timeout,
                                     keep_s=self.profile.label_keep_max_second, two_phase=False)
        body = req.body()
        try:
            parsed = parse_payload(body, fmt, schema)
        except LoadError as exc:
            with self.lock:
                self._abort(txn, str(exc))
            return self._stream_load_json(txn.txn_id, label, "Fail", str(exc), txn)
        with self.lock:
            if txn.state != PREPARE:
                return self._stream_load_json(txn.txn_id, label, "Fail", "transaction is aborted",
                                              txn)
            txn.load_bytes = len(body)
            if parsed.too_many_filtered(fmt.max_filter_ratio):
                url = self._error_url(txn.txn_id, parsed.errors)
                txn.total_rows, txn.filtered_rows = parsed.total, parsed.filtered
                txn.loaded_rows = len(parsed.rows)
                txn.error_url = url
                self._abort(txn, "too many filtered rows")
                return self._stream_load_json(txn.txn_id, label, "Fail", "too many filtered rows",
                                              txn, error_url=url)
            self._attach(txn, parsed, len(body))
            url = self._error_url(txn.txn_id, parsed.errors) if parsed.errors else ""
            txn.commit_count += 1
            params = self.faults.publish_timeout.take(call)
            if params is not None:  # StarRocks issue #771 wording
                self._commit(txn, visible_after=float(params.get("visible_after", 0)))
                return self._stream_load_json(
                    txn.txn_id, label, "Publish Timeout",
                    "transaction commit successfully, BUT data will be visible later", txn,
                    error_url=url)
            self._commit(txn)
            return self._stream_load_json(txn.txn_id, label, "Success", "OK", txn, error_url=url)


if __name__ == "__main__":
    run_main(StarRocksEmulator)
