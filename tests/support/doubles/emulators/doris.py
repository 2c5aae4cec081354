"""Apache Doris FE + BE emulator: Stream Load with two-phase commit.

A test double of the wire protocol, built on ``base_emulator.py`` like the StarRocks emulator. One
``PUT /api/{db}/{table}/_stream_load`` with ``two_phase_commit: true`` is one transaction that
ends PRECOMMITTED; ``PUT /api/{db}[/{table}]/_stream_load_2pc`` with ``txn_operation`` commits
or aborts it by ``txn_id`` (or by ``label`` from 2.1). The FE 307-redirects both to the BE, which
answers them, as in D-LA / D-2PC. The wire facts are in docs/protocol.md, the "Doris: ..."
sections; their names and source keys are cited next to each behaviour.

Tables are DUPLICATE unless created ``keys_type="UNIQUE_KEYS", key=(...)`` (and ``sequence_type=`` or
``sequence_col=`` for a sequence column, ``delete_sign=False`` for a table without the hidden delete sign):
key_models.py.

Run standalone: ``python -m tests.support.doubles.emulators.doris --data-dir DIR``.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from tests.support.doubles.emulators.base_emulator import BaseEmulator, run_main
from tests.support.doubles.emulators.column_types import schema_properties
from tests.support.doubles.emulators.conversion import DORIS_RULES, ConversionRules
from tests.support.doubles.emulators.faults import Call
from tests.support.doubles.emulators.http_server import Request, Response, redirect
from tests.support.doubles.emulators.key_models import UNIQUE_KEYS
from tests.support.doubles.emulators.load_formats import LoadError, LoadFormat, TableSchema, parse_payload
from tests.support.doubles.emulators.profiles import profile_fields, version_tuple
from tests.support.doubles.emulators.store import ABORTED, COMMITTED, VISIBLE, Txn, load_counts

PREPARE, PRECOMMITTED = "PREPARE", "PRECOMMITTED"

# Doris: label already exists: ExistingJobStatus by the state of the label's txn.
EXISTING_JOB_STATUS = {PREPARE: "RUNNING", PRECOMMITTED: "PRECOMMITTED", COMMITTED: "FINISHED",
                       VISIBLE: "FINISHED"}

# Doris: 2PC messages (D-DTM, D-RT, DF TestResponseUtil): (operation, state) -> the action
# to take, or the failure message. "{id}" is the txn id, "{reason}" the abort reason.
TWO_PC: dict[tuple[str, str], str] = {
    ("commit", PRECOMMITTED): "@commit",
    ("commit", PREPARE): "transaction [{id}] is prepare, not pre-committed.",
    ("commit", COMMITTED): "transaction [{id}] is already committed, not pre-committed.",
    ("commit", VISIBLE): "transaction [{id}] is already visible, not pre-committed.",
    ("commit", ABORTED): "transaction [{id}] is already aborted. abort reason: {reason}",
    ("abort", PREPARE): "@abort",
    ("abort", PRECOMMITTED): "@abort",
    ("abort", COMMITTED): "transaction [{id}] is already COMMITTED, could not abort.",
    ("abort", VISIBLE): "transaction [{id}] is already VISIBLE, could not abort.",
    ("abort", ABORTED): "transaction [{id}] is already aborted, abort reason: {reason}",
}

KNOBS = {
    "publish_timeout": "non-2PC load answers 'Publish Timeout'; a 2PC commit answers Success; "
                       "either way the txn is COMMITTED and VISIBLE after `visible_after` clock "
                       "seconds (default 0: on the next request)",
    "write_lock_timeout": "2PC commit fails with 'get tableList write lock timeout'; the txn "
                          "stays PRECOMMITTED (C.2, Doris PR #20647)",
}


@dataclass
class DorisProfile:
    """Server configuration and version-dependent wording (docs/protocol.md, Doris: versions)."""

    version: str = "2.1.8"
    streaming_label_keep_max_second: float = 43200           # D-DTM: 12 h for stream loads
    # Label eviction by count (docs/protocol.md, Doris: timeouts and label retention): once a database holds
    # more than this many finished (VISIBLE/ABORTED) stream-load txns, the oldest are forgotten at
    # once, whatever their age (`DatabaseTransactionMgr.removeUselessTxns` in apache/doris: it pops
    # the finished-txn deque while its size exceeds Config.label_num_threshold, and only when the
    # threshold is > 0, so -1 (documented) and 0 both disable it; it keeps one deque for stream
    # loads and one for other loads, and every emulated txn is a stream load). Default 2000. When None it
    # is derived from the version: its first release is UNCONFIRMED (2.0 or 2.1), so 2.0 is
    # assumed and older FEs get no limit.
    label_num_threshold: int | None = None
    stream_load_default_precommit_timeout_second: int = 3600  # doris-flink #510
    stream_load_default_timeout_second: int | None = None  # 600 in 1.1, 259200 from 1.2
    # Running transactions per database, PRECOMMITTED ones included, past which a load is refused
    # (D-DTM `checkRunningTxnExceedLimit`; Config.max_running_txn_num_per_db). None: the version's
    # default: 100 before doris PR #20478 (merged 2023-06, in 2.0: a 2.0.2 report, doris issue #28227,
    # shows 1000), 1000 from 2.0, 10000 from doris PR #51367 (2025; 4.0 assumed, its release UNCONFIRMED).
    max_running_txn_num_per_db: int | None = None
    # Whether the emulator's user has the ADMIN privilege, which `/api/fe_version_info` requires
    # (FeVersionInfoAction: `checkGlobalAuth(…, PrivPredicate.ADMIN)`); a load-only user is refused.
    user_is_admin: bool = True
    two_pc_error_status: str | None = None   # FE-side 2PC failures; derived when None
    internal_error_status: str | None = None  # BE-side 2PC failures; derived when None

    def __post_init__(self) -> None:
        v = version_tuple(self.version)
        if self.stream_load_default_timeout_second is None:
            self.stream_load_default_timeout_second = 259200 if v >= (1, 2) else 600
        if self.label_num_threshold is None:
            self.label_num_threshold = 2000 if v >= (2, 0) else -1
        if self.max_running_txn_num_per_db is None:
            self.max_running_txn_num_per_db = 10000 if v >= (4, 0) else 1000 if v >= (2, 0) else 100
        if self.two_pc_error_status is None:
            # Doris: commit and abort: "Fail" (docs/1.x and the 2.0-era PR #20647 example), ANALYSIS_ERROR in 2.x
            # BE Status::to_json. Which 2.x minor switched is UNCONFIRMED; 2.1 is assumed.
            self.two_pc_error_status = "ANALYSIS_ERROR" if v >= (2, 1) else "Fail"
        if self.internal_error_status is None:
            self.internal_error_status = "INTERNAL_ERROR" if v >= (2, 1) else "Internal error"

    @property
    def v(self) -> tuple[int, ...]:
        return version_tuple(self.version)

    @property
    def load_formats(self) -> tuple[str, ...]:
        """Stream Load formats the emulator reads: arrow from 2.1.0 (docs/protocol.md, "Doris: Arrow and Parquet
        loads"; doris PR #26709, #28098)."""
        return ("csv", "json", "arrow") if self.v >= (2, 1) else ("csv", "json")

    @property
    def unique_key_merge_on_write(self) -> bool:
        """A new UNIQUE KEY table is merge-on-write unless its properties say otherwise from 2.1 on; merge-on-read
        before (D-MOW: `enable_unique_key_merge_on_write` defaults to true from 2.1)."""
        return self.v >= (2, 1)

    @property
    def schema_nullability(self) -> bool:
        """``is_nullable``/``is_key`` in ``_schema`` answers: newest source only; 4.0 assumed (UNCONFIRMED)."""
        return self.v >= (4, 0)

    @property
    def label_2pc(self) -> bool:
        """2PC by label needs the newer BE handler: '2.1+' (doris-flink PR #362; UNCONFIRMED)."""
        return self.v >= (2, 1)

    def fe_message(self, text: str) -> str:
        """An FE error as relayed by the BE: 'errCode = 2, detailMessage = ' (1.x/2.0) or with
        'TStatus: ' in front (2.1+; Doris: commit and abort, doris-flink #510)."""
        prefix = "TStatus: " if self.v >= (2, 1) else ""
        return f"{prefix}errCode = 2, detailMessage = {text}"

    def be_message(self, code: str, text: str) -> str:
        """BE Status text: '[CODE]text' from 2.0 (Status::to_string), bare text before."""
        return f"[{code}]{text}" if self.v >= (2, 0) else text


class DorisEmulator(BaseEmulator):
    """Doris FE (``fe_url``) and BE (``be_url``) emulator; see the module doc."""

    PRODUCT = "doris"
    RULES = DORIS_RULES
    EXPIRING_STATES = frozenset({PREPARE, PRECOMMITTED})
    EXTRA_KNOBS = KNOBS

    def __init__(self, data_dir: Any, user: str = "root", password: str = "",
                 **profile: Any) -> None:
        self.profile: DorisProfile = profile_fields(DorisProfile, profile)
        super().__init__(str(data_dir), user, password)

    def conversion_rules(self) -> ConversionRules:
        """docs/protocol.md, "Common: strict mode": too-long strings are filtered before 4.0; the 4.x documentation
        truncates them when strict mode is off (first release UNCONFIRMED, 4.0 assumed)."""
        if self.profile.v >= (4, 0):
            return ConversionRules(long_string="truncate", datetime_default_scale=0)
        return DORIS_RULES

    def _merge_on_read(self, schema: TableSchema) -> bool:
        """A UNIQUE KEY table without merge-on-write: the property as given, else the release default (D-MOW)."""
        model = schema.model
        if model.keys_type != UNIQUE_KEYS:
            return False
        merge_on_write = self.profile.unique_key_merge_on_write if model.merge_on_write is None else model.merge_on_write
        return not merge_on_write

    def _tick_extra(self, now: float) -> None:
        """Label eviction by count, per database (``label_num_threshold``, see the profile)."""
        threshold = self.profile.label_num_threshold or 0
        if threshold > 0:
            self._evict_beyond_count(threshold, count_running=False)

    def _reset_be_memory(self) -> None:
        """A BE restart kills in-flight loads; the FE aborts their txns (coordinator down).

        The reason wording is UNCONFIRMED ('coordinate BE is down' in D-DTM, from memory).
        """
        for txn in self.store.live():
            if txn.state == PREPARE:
                self._abort(txn, "coordinate BE is down")

    # -- request classification --------------------------------------------------------------

    def describe(self, role: str, req: Request) -> Call:
        s = req.segments
        if len(s) == 4 and s[0] == "api" and s[3] == "_stream_load":
            return Call("stream_load", role, req.header("label") or None, s[1])
        if len(s) in (3, 4) and s[0] == "api" and s[-1] == "_stream_load_2pc":
            label = req.header("label") or None
            txn_id = req.header("txn_id")
            if txn_id.isdigit():
                with self.lock:
                    txn = self.store.txns.get(int(txn_id))
                    label = txn.label if txn is not None else label
            op = req.header("txn_operation").lower() or "2pc"
            return Call(op, role, label, s[1])
        if len(s) == 3 and s[0] == "api" and s[2] == "get_load_state":
            return Call("get_load_state", role, req.query.get("label"), s[1])
        if len(s) == 4 and s[0] == "api" and s[3] == "_schema":
            return Call("schema", role, None, s[1])
        if s == ["api", "fe_version_info"]:
            return Call("fe_version_info", role)
        return Call("other", role)

    def route(self, role: str, req: Request, call: Call) -> Response:
        s = req.segments
        is_2pc = len(s) in (3, 4) and s[0] == "api" and s[-1] == "_stream_load_2pc"
        if call.op == "stream_load" and req.method == "PUT":
            return self._fe_stream_load(req) if role == "fe" else self._be_stream_load(req, call)
        if is_2pc and req.method == "PUT":
            return self._fe_2pc(req) if role == "fe" else self._be_2pc(req, call)
        if call.op == "get_load_state" and req.method == "GET" and role == "fe":
            return self._fe_get_load_state(req)
        if call.op == "schema" and req.method == "GET" and role == "fe":
            return self._fe_schema(req)
        if call.op == "fe_version_info" and req.method == "GET" and role == "fe":
            return self._fe_version_info(req)
        return Response.text("Not Found", 404)

    def _fe_version_info(self, req: Request) -> Response:
        """``GET /api/fe_version_info`` (FeVersionInfoAction, docs admin-manual/open-api/fe-http/fe-version-info-action):
        the httpv2 envelope with ``data.feVersionInfo``, the release as numbers and as ``doris-<x.y.z>-<rc>``. It needs
        ADMIN; a user without it is refused as the httpv2 handler refuses an unauthorized call (body shape
        UNCONFIRMED, as for ``_unauthorized``)."""
        if not self.credentials_ok(req) or not self.profile.user_is_admin:
            return self._unauthorized()
        major, minor, patch = (list(self.profile.v) + [0, 0, 0])[:3]
        info = {"dorisBuildVersionPrefix": "doris", "dorisBuildVersionMajor": major,
                "dorisBuildVersionMinor": minor, "dorisBuildVersionPatch": patch,
                "dorisBuildVersionRcVersion": "rc01", "dorisBuildVersion": f"doris-{self.profile.version}-rc01",
                "dorisBuildShortHash": "emulate"}
        return Response.json({"msg": "success", "code": 0, "data": {"feVersionInfo": info}, "count": 0}, indent=None)

    # -- shapes ------------------------------------------------------------------------------

    @staticmethod
    def _rest_failed(message: str) -> Response:
        """Old httpv2 RestBaseResult failure (D-LA; Doris: pre-commit load)."""
        return Response.json({"status": "FAILED", "msg": message}, indent=None)

    def _unauthorized(self) -> Response:
        """HTTP 401 on a wrong password. Body shape (httpv2 ResponseEntity) is UNCONFIRMED."""
        return Response.json({"msg": "Unauthorized", "code": 401,
                              "data": f"Access denied for user '{self.user}'", "count": 0},
                             indent=None, status=401,
                             headers={"WWW-Authenticate": 'Basic realm=""'})

    @staticmethod
    def _two_pc_json(status: str, msg: str) -> Response:
        """2PC answers use lowercase keys (D-2PC ``get_success_info`` / Status::to_json)."""
        return Response.json({"status": status, "msg": msg}, indent=4)

    def _load_json(self, label: str, two_pc: bool, status: str, message: str,
                   txn: Txn | None = None, existing: str | None = None,
                   error_url: str = "") -> Response:
        """Stream-load answer with capitalised keys (Doris: pre-commit load; D-DOC, DF HttpTestUtil)."""
        body: dict[str, Any] = {"TxnId": txn.txn_id if txn is not None else -1, "Label": label}
        if self.profile.v >= (2, 0):
            body["Comment"] = ""
        body["TwoPhaseCommit"] = "true" if two_pc else "false"
        body["Status"] = status
        if existing is not None:
            body["ExistingJobStatus"] = existing
        body["Message"] = message
        body.update({
            **load_counts(txn), "LoadTimeMs": 0, "BeginTxnTimeMs": 0,
            "StreamLoadPutTimeMs": 0, "ReadDataTimeMs": 0, "WriteDataTimeMs": 0})
        if self.profile.v >= (2, 1):
            body["ReceiveDataTimeMs"] = 0
        body["CommitAndPublishTimeMs"] = 0
        if error_url:
            body["ErrorURL"] = error_url
        return Response.json(body, indent=4)

    def _label_exists_message(self, label: str, txn_id: int) -> str:
        """Doris: label already exists: the message variants by version."""
        text = f"Label [{label}] has already been used, relate to txn [{txn_id}]"
        if self.profile.v >= (2, 0):
            return f"[LABEL_ALREADY_EXISTS]{self.profile.fe_message(text)}"
        return self.profile.fe_message(text)

    # -- FE ----------------------------------------------------------------------------------

    def _fe_stream_load(self, req: Request) -> Response:
        """D-LA: password first, then ``Expect: 100-continue`` (Doris: pre-commit load), then 307 to a BE whose
        Location carries the credentials (conformance 2026-11-27 D9)."""
        if not self.credentials_ok(req):
            return self._unauthorized()
        if not req.expect_continue:
            return self._rest_failed("There is no 100-continue header")
        return redirect(req, self.be_port, credentials=req.basic_auth())

    def _fe_2pc(self, req: Request) -> Response:
        """D-LA executeStreamLoad2PC: validate, then 307 (headers must be re-sent)."""
        if not self.credentials_ok(req):
            return self._unauthorized()
        if not req.header("txn_id") and not (self.profile.label_2pc and req.header("label")):
            return self._rest_failed("No transaction id selected.")
        if not req.header("txn_operation"):
            return self._rest_failed("No transaction operation('commit' or 'abort') selected.")
        return redirect(req, self.be_port, credentials=req.basic_auth())

    def _fe_get_load_state(self, req: Request) -> Response:
        """Doris: label states (get_load_state). The envelope is UNCONFIRMED (ResponseEntityBuilder.ok)."""
        if not self.credentials_ok(req):
            return self._unauthorized()
        db, label = req.segments[1], req.query.get("label", "")
        with self.lock:
            if not label:
                return Response.json({"msg": "No label selected.", "code": 1, "data": None,
                                      "count": 0}, indent=None)
            if db not in self.store.dbs:
                return Response.json({"msg": f"unknown database, database={db}", "code": 1,
                                      "data": None, "count": 0}, indent=None)
            txn = self.store.label_txn(db, label)
            state = txn.state if txn is not None else "UNKNOWN"
        return Response.json({"msg": "success", "code": 0, "data": state, "count": 0},
                             indent=None)

    def _fe_schema(self, req: Request) -> Response:
        """``GET /api/{db}/{table}/_schema`` (docs/protocol.md, "Common: table schema endpoint"; D-TSA): httpv2 envelope,
        HTTP 200 even for an unknown table (code 1, the reason in ``data``)."""
        if not self.credentials_ok(req):
            return self._unauthorized()
        db, table = req.segments[1], req.segments[2]
        with self.lock:
            schema = self.store.schema(db, table)
            if db not in self.store.dbs or schema is None:
                reason = (f"database not found, dbName={db}" if db not in self.store.dbs
                          else f"table not found, tableName={table}")
                return Response.json({"msg": "Error", "code": 1, "data": reason, "count": 0}, indent=None)
            model = schema.model
            keys = {k.lower() for k in model.key}
            props = schema_properties(schema, self.PRODUCT)
            for prop, (name, ctype) in zip(props, schema.columns):
                # D-TSA: a key column has no aggregation type; a value column NONE (DUPLICATE, merge-on-write) or
                # REPLACE (merge-on-read) as CREATE TABLE gave it (D-AGG)
                is_key = name.lower() in keys
                prop["aggregation_type"] = "" if is_key else "REPLACE" if self._merge_on_read(schema) else "NONE"
                if self.profile.schema_nullability:
                    prop.update(is_nullable="Yes" if ctype.nullable else "No", is_key="Yes" if is_key else "No")
        data: dict[str, Any] = {"keysType": model.keys_type, "properties": props, "status": 200}
        return Response.json({"msg": "success", "code": 0, "data": data, "count": 0}, indent=None)

    # -- BE: stream load ---------------------------------------------------------------------

    def _be_stream_load(self, req: Request, call: Call) -> Response:
        db, table = req.segments[1], req.segments[2]
        label = req.header("label") or uuid.uuid4().hex
        two_pc = req.header("two_phase_commit").lower() == "true"
        p = self.profile
        auth = req.basic_auth()
        if auth is None:
            return self._load_json(label, two_pc, "Fail",
                                   p.be_message("INTERNAL_ERROR", "no valid Basic authorization"))
        try:
            fmt = LoadFormat.from_headers(req.headers, p.load_formats)
        except LoadError as exc:
            return self._load_json(label, two_pc, "Fail", p.be_message("INTERNAL_ERROR", str(exc)))
        timeout_header = req.header("timeout")
        if timeout_header and not timeout_header.isdigit():
            return self._load_json(label, two_pc, "Fail",
                                   p.be_message("INVALID_ARGUMENT", "Invalid timeout format"))
        with self.lock:
            # The FE side of the load (begin txn): its errors come back through the BE.
            if auth != (self.user, self.password):
                return self._load_json(label, two_pc, "Fail", p.be_message(
                    "ANALYSIS_ERROR", p.fe_message(f"Access denied for user '{auth[0]}'")))
            schema = self.store.schema(db, table)
            if schema is None:
                return self._load_json(label, two_pc, "Fail", p.be_message(
                    "ANALYSIS_ERROR", p.fe_message(f"Unknown table '{table}' in {db}")))
            owner = self.store.label_txn(db, label)
            if owner is not None and owner.state != ABORTED:  # reuse only after abort (Doris: label states)
                return self._load_json(label, two_pc, "Label Already Exists",
                                       self._label_exists_message(label, owner.txn_id),
                                       existing=EXISTING_JOB_STATUS[owner.state])
            running = self.store.running_count(db)
            if running >= p.max_running_txn_num_per_db:
                return self._load_json(label, two_pc, "Fail", p.be_message(
                    "ANALYSIS_ERROR", p.fe_message(
                        f"current running txns on db {self.store.dbs[db]} is {running}, "
                        f"larger than limit {p.max_running_txn_num_per_db}")))
            timeout = int(timeout_header or p.stream_load_default_timeout_second or 600)
            txn = self.store.new_txn(db=db, table=table, label=label, state=PREPARE,
                                     timeout_s=timeout, deadline=self.clock.now() + timeout,
                                     keep_s=p.streaming_label_keep_max_second, two_phase=two_pc)
        try:  # the FE plans the load from its headers before the BE asks for the body (docs/protocol.md, D7)
            schema.mapping(fmt)
        except LoadError as exc:
            self._cancel_load(txn, str(exc))
            return self._load_json(label, two_pc, "Fail", p.be_message("ANALYSIS_ERROR", p.fe_message(str(exc))), txn)
        # A probe with an empty body is a valid load (Doris: the Flink connector): 0 rows, Success.
        try:
            body = req.body()
        except ConnectionError as exc:  # the sender went away before the body's end: the BE cancels the load (D-SLA)
            self._cancel_load(txn, f"sender is gone: {exc}")
            raise
        try:
            parsed = parse_payload(body, fmt, schema)
        except LoadError as exc:
            self._cancel_load(txn, str(exc))
            return self._load_json(label, two_pc, "Fail", p.be_message("INTERNAL_ERROR", str(exc)),
                                   txn)
        with self.lock:
            if txn.state != PREPARE:  # aborted while the body streamed (2PC abort, timeout)
                return self._load_json(label, two_pc, "Fail", p.be_message(
                    "CANCELLED", f"transaction [{txn.txn_id}] is aborted: {txn.reason}"), txn)
            txn.load_bytes = len(body)
            if parsed.too_many_filtered(fmt.max_filter_ratio):  # rows rejected (wording UNCONFIRMED)
                url = self._error_url(txn.txn_id, parsed.errors)
                txn.total_rows, txn.filtered_rows = parsed.total, parsed.filtered
                txn.loaded_rows, txn.error_url = len(parsed.rows), url
                self._abort(txn, "too many filtered rows")
                return self._load_json(label, two_pc, "Fail", p.be_message(
                    "DATA_QUALITY_ERROR", "too many filtered rows"), txn, error_url=url)
            self._attach(txn, parsed, len(body))
            url = self._error_url(txn.txn_id, parsed.errors) if parsed.errors else ""
            if two_pc:  # Doris: pre-commit load: PRECOMMITTED, invisible, expires after 3600 s
                now = self.clock.now()
                txn.state = PRECOMMITTED
                txn.prepare_time = now
                txn.prepared_timeout_s = p.stream_load_default_precommit_timeout_second
                txn.deadline = now + p.stream_load_default_precommit_timeout_second
                self.store.save(txn)
                return self._load_json(label, two_pc, "Success", "OK", txn, error_url=url)
            txn.commit_count += 1
            params = self.faults.publish_timeout.take(call)
            if params is not None:
                self._commit(txn, visible_after=float(params.get("visible_after", 0)))
                return self._load_json(label, two_pc, "Publish Timeout",
                                       "transaction commit successfully, BUT data will be "
                                       "visible later", txn, error_url=url)
            self._commit(txn)
            return self._load_json(label, two_pc, "Success", "OK", txn, error_url=url)

    def _cancel_load(self, txn: Txn, reason: str) -> None:
        """The BE cancels a load whose body failed; one the FE aborted while its body streamed (a BE restart, a 2PC
        abort, its timeout) keeps the reason it was aborted for."""
        with self.lock:
            if txn.state == PREPARE:
                self._abort(txn, reason)

    # -- BE: 2PC commit / abort --------------------------------------------------------------

    def _be_2pc(self, req: Request, call: Call) -> Response:
        """D-2PC: parse txn_id (or label, 2.1+) and the operation, then the FE decides."""
        p = self.profile
        db = req.segments[1]
        raw_id, label = req.header("txn_id"), req.header("label")
        txn_id: int | None = None
        if raw_id or not (p.label_2pc and label):
            if not raw_id.isdigit():  # Status::to_json: code name + bare message
                return self._two_pc_json(p.internal_error_status or "",
                                         f"convert txn_id [{raw_id}] failed")
            txn_id = int(raw_id)
        operation = req.header("txn_operation")
        if operation not in ("commit", "abort"):  # exact lowercase (Doris: commit and abort)
            return self._two_pc_json(p.internal_error_status or "",
                                     "transaction operation should be 'commit' or 'abort'")
        fail = p.two_pc_error_status or "Fail"
        with self.lock:
            if req.basic_auth() != (self.user, self.password):
                user = (req.basic_auth() or ("",))[0]
                return self._two_pc_json(fail, p.fe_message(f"Access denied for user '{user}'"))
            if db not in self.store.dbs:
                return self._two_pc_json(fail, p.fe_message(f"unknown database, database={db}"))
            if txn_id is not None:
                txn = self.store.txns.get(txn_id)
                if txn is None or txn.evicted or txn.db != db:  # forgotten: doris #13341
                    return self._two_pc_json(
                        fail, p.fe_message(f"transaction [{txn_id}] not found"))
            else:
                txn = self.store.label_txn(db, label)
                if txn is None:  # DF HttpTestUtil mock wording
                    return self._two_pc_json(fail, p.fe_message(
                        f"running transaction not found, label={label}"))
            if operation == "commit":
                txn.commit_count += 1
                self.store.save(txn)
            action = TWO_PC[(operation, txn.state)]
            if not action.startswith("@"):
                return self._two_pc_json(fail, p.fe_message(
                    action.format(id=txn.txn_id, reason=txn.reason)))
            if action == "@abort":
                self._abort(txn, "User Abort")
            elif self.faults.write_lock_timeout.take(call) is not None:  # write-lock timeout
                return self._two_pc_json(fail, p.fe_message(
                    f"get tableList write lock timeout, tableList=({txn.db}.{txn.table})"))
            else:
                params = self.faults.publish_timeout.take(call)
                # Doris' commitTransaction2PC does not wait for publish (UNCONFIRMED): Success.
                self._commit(txn, None if params is None
                             else float(params.get("visible_after", 0)))
        return self._two_pc_json("Success", self._success_message(raw_id, label, operation))

    def _success_message(self, raw_id: str, label: str, operation: str) -> str:
        """'transaction [N] commit successfully.'; the newer BE names what was supplied."""
        if not self.profile.label_2pc or not label:
            return f"transaction [{raw_id}] {operation} successfully."
        if not raw_id:
            return f"label [{label}] {operation} successfully."
        return f"label [{label}] transaction [{raw_id}] {operation} successfully."


if __name__ == "__main__":
    run_main(DorisEmulator)
