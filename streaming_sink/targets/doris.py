"""Apache Doris target: one Stream Load with `two_phase_commit: true` is one pre-committed transaction.

Doris has no begin/load/prepare API like StarRocks: a whole load request is one transaction that
ends PRECOMMITTED (durable, invisible) when the answer arrives. So a writer's `TableTransaction`
keeps ONE load open for the whole batch, under one deterministic label, and streams every flush
into its chunked body (docs/protocol.md, Doris: one load per table and writer): the (table, writer)
holds the one transaction the batch's plan counted, however often it flushes.

* write   = the first: record the intent, open the 2PC stream load, return once the server began
  it (asked for the body); each: feed the flush into the body;
* prepare = end the body: the answer pre-commits the transaction; one PreparedPart;
* commit  = `_stream_load_2pc` `commit` by txn id; "already committed/visible" is success, "already
  aborted" (the precommit timeout, 3600 s by default, passed, or an abort) is ABORTED: never visible,
  safe to load again. "Not found" means the FE forgot the txn (label history: 12 h, or 2000 newer
  finished txns in the database): the label state decides, and without a committed one it is LOST,
  which only the coordinator can judge;
* abort   = cut the body short, then `_stream_load_2pc` `abort` by txn id when known, else by label
  (2.1+), else by the empty-body probe that older servers need (it reveals the txn id that holds a label).

A load is sent again only while the server has not asked for its body (the body streams and is not
kept). Such a repeat may find its label taken ("Label Already Exists"): a RUNNING or PRECOMMITTED
holder is aborted and the load sent again under the same label (we never adopt data whose load we
did not see answered); a FINISHED holder means the label was committed already, which the protocol
never does before the batch is prepared: a loud error.

Wire facts (paths, headers, messages): docs/protocol.md, the "Doris: ..." sections.
"""
from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..changes import DELETE, OP_COLUMN, VERSION_COLUMN, is_change_schema
from ..committable import Committable, TxnRef
from ..errors import CommittedNotChosenError, ConfigurationError, TargetError, TransactionLimitError
from ..retry import RetryPolicy, wait
from .base import CommitOutcome, ExpiryLimit, NewRef, PreparedPart, RecordIntent, TableTransaction
from .descriptor import TargetDescriptor
from .encoding import CsvFormat, JsonFormat, WireFormat, columns_entry, encode_chunks
from .olap_types import DORIS_COLUMNS
from .streamload.accounting import RowCounts
from .streamload.body_pipe import BodyPipe
from .streamload.doris_arrow import ArrowFormat, table_arrow_type
from .streamload.fe import NO_ANSWER, Answer, Dialect
from .streamload.http import AskedBody, HttpClient, HttpConnectionError, HttpError, HttpStatusError, api_path, excerpt
from .streamload.table_schema import TableModel, fetch_table_schema
from .streamload.target import LabelRetention, Release, SharedOptions, StreamLoadTarget

log = logging.getLogger(__name__)

# Messages of the FE's 2PC handling (docs/protocol.md, Doris: 2PC messages), matched loosely on purpose:
# versions differ in prefixes ("TStatus: errCode = 2, detailMessage = ") and trailing punctuation.
_ALREADY_COMMITTED = re.compile(r"is already (committed|visible)\b", re.IGNORECASE)
_ALREADY_ABORTED = re.compile(r"is already aborted", re.IGNORECASE)
_COULD_NOT_ABORT = re.compile(r"is already (COMMITTED|VISIBLE), could not abort", re.IGNORECASE)
_TXN_NOT_FOUND = re.compile(r"transaction \[\d+\] not found", re.IGNORECASE)
_LABEL_NOT_FOUND = re.compile(r"running transaction not found", re.IGNORECASE)
_LABEL_HOLDER = re.compile(r"has already been used, relate to txn \[(\d+)\]")
# An FE or BE that cannot address a 2PC operation by label (before 2.1) says one of these.
_NO_LABEL_2PC = re.compile(r"No transaction id selected|convert txn_id \[\] failed")
# Transient refusals that a later attempt may pass: the write-lock timeout (docs/protocol.md, Doris: commit
# and abort) and the running-txn limit (docs/protocol.md, Doris: timeouts and label retention; D-DTM).
_RETRYABLE_2PC = re.compile(r"write lock timeout", re.IGNORECASE)
_RETRYABLE_LOAD = re.compile(r"write lock timeout", re.IGNORECASE)
# A load past max_running_txn_num_per_db (D-DTM): not retried, since the batch's own pre-committed txns hold the slots.
_RUNNING_LIMIT = re.compile(r"current running txns on db|too many running txns", re.IGNORECASE)

_RESERVED_HEADERS = frozenset(
    {"label", "two_phase_commit", "format", "columns", "column_separator", "line_delimiter", "row_delimiter",
     "enclose", "escape", "read_json_by_line", "strip_outer_array", "max_filter_ratio", "strict_mode",
     "timeout", "expect", "authorization", "txn_id", "txn_operation"}
)
# The headers by which a load orders or deletes rows itself (docs/protocol.md, Doris: unique key tables, delete sign and
# sequence column): a change load sets them, so a target's `headers` must not.
SEQUENCE_HEADER = "function_column.sequence_col"
# A change load's deletes: `merge_type: MERGE` sets each row's hidden delete sign to the `delete` condition, which
# reads the `__op` source column; a table without the delete sign refuses such a load (matched by _NO_DELETE_SIGN).
CHANGE_MERGE = {"merge_type": "MERGE", "delete": f"`{OP_COLUMN}` = {DELETE}"}
_NO_DELETE_SIGN = re.compile(r"need to upgrade table to support batch delete", re.IGNORECASE)
_CHANGE_HEADERS = frozenset({SEQUENCE_HEADER, "merge_type", "delete", "hidden_columns"})
_MAX_LABEL_RESOLUTIONS = 3
_ERROR_LOG_LINES = 5


#: The option names shared with StarRocks (docs/configuration.md maps them to the connectors' names) ->
#: this target's own, older names, which stay accepted.
COMMON_NAMES = {"properties": "headers", "read_timeout_s": "request_timeout_s", "chunk_bytes": "piece_bytes"}


@dataclass(frozen=True)
class DorisOptions(SharedOptions):
    """What `DorisTarget(**options)` accepts; every field is optional.

    * `tables`: tables rows may be routed to; without it any name goes and Doris refuses unknown ones.
    * `format`: "csv" (with the `enclose`/`escape` headers, which Doris added in 2.0 as far as we know:
      use "json" on older servers), "json" (one object per line, `read_json_by_line`) or "arrow"
      (Doris 2.1+: Arrow IPC streams, no text encoding; each column is sent in the table column's own
      Arrow type, read from the FE's `_schema` endpoint, since Doris copies Arrow buffers as they are:
      docs/protocol.md, Doris: Arrow and Parquet loads).
    * `max_filter_ratio`, `strict_mode`: the Stream Load headers of the same names. Strict mode is on
      unless turned off: a value its column cannot hold filters the row (and fails the load, as the
      ratio is 0 unless set) instead of becoming a NULL counted as loaded.
    * `load_timeout_s`: the load's `timeout` header (the server default is 3 days from Doris 1.2).
    * `headers`: more Stream Load headers passed through as they are (`where`, `partitions`, ...).
    * `abort_by_label`: None detects whether the server takes labels on `_stream_load_2pc` (2.1+);
      False always uses the empty-body probe of older servers.
    * `piece_bytes`: Arrow bytes encoded at a time while a load's body streams (memory bound).
    * `connect_timeout_s`, `request_timeout_s`, `retries`, `backoff_s`, `backoff_max_s`: the HTTP client's, whose
      policy also repeats write-lock timeouts and commits whose answer was lost.
    """

    target = "DorisTarget"
    common_names = COMMON_NAMES
    headers_option = "headers"
    managed_headers = _RESERVED_HEADERS
    managed_by = "format, max_filter_ratio, strict_mode, load_timeout_s"

    max_filter_ratio: float | None = None
    load_timeout_s: int | None = None
    headers: tuple[tuple[str, str], ...] = ()
    abort_by_label: bool | None = None
    piece_bytes: int = 4 * 1024 * 1024
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 600.0
    retries: int = 3
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    label_num_threshold: int | None = None  # the FE's finished-label memory per database when not 2000; -1: none
    # change tables created with a sequence column (`function_column.sequence_type`): their `__version` is its value
    sequence_tables: tuple[str, ...] = ()

    @classmethod
    def _adjusted(cls, values: dict[str, Any]) -> dict[str, Any]:
        sequenced = values.get("sequence_tables", ())
        if isinstance(sequenced, str):
            raise ConfigurationError("DorisTarget: `sequence_tables` must be a list of table names, not one string")
        return {**values, "sequence_tables": tuple(str(t) for t in sequenced)}

    def change_load(self, table: str, chunk: pa.Table) -> tuple[pa.Table, dict[str, str]]:
        """Change rows as Doris loads them, and the headers that say so: `__op` stays a source column that the
        `delete` condition of a MERGE load reads (1 deletes the row's key, 0 upserts it), so a table without the
        hidden delete sign refuses the load instead of taking its deletes as rows, as naming the sign in `columns`
        would; `__version` feeds the table's sequence column where the table has one (listed in `sequence_tables`),
        else stays behind (docs/protocol.md, Doris: unique key tables, delete sign and sequence column)."""
        if not is_change_schema(chunk.schema):
            return chunk, {}
        if VERSION_COLUMN not in chunk.schema.names:
            return chunk, dict(CHANGE_MERGE)
        if table in self.sequence_tables:
            return chunk, {**CHANGE_MERGE, SEQUENCE_HEADER: VERSION_COLUMN}
        return chunk.drop_columns([VERSION_COLUMN]), dict(CHANGE_MERGE)

    def _validate(self) -> None:
        if self.format not in ("csv", "json", "arrow"):
            raise ConfigurationError(f"DorisTarget: format must be 'csv', 'json' or 'arrow', got {self.format!r}")
        if self.max_filter_ratio is not None and not 0.0 <= float(self.max_filter_ratio) <= 1.0:
            raise ConfigurationError(f"DorisTarget: max_filter_ratio must be within [0, 1], got {self.max_filter_ratio}")
        if self.label_num_threshold is not None and (self.label_num_threshold == 0 or self.label_num_threshold < -1):
            raise ConfigurationError(f"DorisTarget: label_num_threshold must be positive or -1, got {self.label_num_threshold}")
        if self.retries < 0 or self.piece_bytes <= 0 or self.commit_parallelism < 1:
            raise ConfigurationError("DorisTarget: retries >= 0, piece_bytes > 0 and commit_parallelism >= 1 are required")

    def wire_format(self, arrow_schema: pa.Schema | None = None) -> WireFormat:
        if self.format == "arrow":
            return ArrowFormat(arrow_schema)
        return CsvFormat() if self.format == "csv" else JsonFormat(lines=True)

    def load_headers(self) -> dict[str, str]:
        """The format and data-quality headers every load of this target sends."""
        fmt = self.wire_format()
        headers = fmt.headers() if isinstance(fmt, (CsvFormat, ArrowFormat)) else {"format": "json", "read_json_by_line": "true"}
        if self.max_filter_ratio is not None:
            headers["max_filter_ratio"] = repr(float(self.max_filter_ratio))
        headers["strict_mode"] = "true" if self.strict_mode else "false"
        if self.load_timeout_s is not None:
            headers["timeout"] = str(int(self.load_timeout_s))
        headers.update(dict(self.headers))
        return headers


@dataclass
class _PartState:
    """A writer's transaction of one table: its label, and its txn id and counts once the load answered."""

    ref: TxnRef
    txn_id: int | None = None
    rows: int = 0
    bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    filtered_rows: int = 0  # rejected under max_filter_ratio: accounted for, not lost
    unselected_rows: int = 0


class LoadApi:
    """Doris' load and 2PC requests for one target: a 2PC stream load, `_stream_load_2pc` by txn id or label, and
    the aborts built on them. What the target's commit and abort and a writer's transaction share; picklable.
    """

    def __init__(self, http: HttpClient, options: DorisOptions) -> None:
        self.http, self.options = http, options
        self._label_2pc: bool | None = options.abort_by_label  # None: learnt at the first abort by label

    @property
    def retry(self) -> RetryPolicy:
        """How often a write-lock timeout or a commit whose answer was lost is tried again (the client's own policy)."""
        return self.http.retry

    def stream_load(self, ref: TxnRef, headers: dict[str, str], body: Any, what: str, repeat: bool = True) -> Answer:
        """A stream-load PUT under `ref`'s label; repeats are safe because the label makes them so (then resolved by
        status). `repeat` False: only a request that never reached the server is sent again (a streamed body)."""
        try:
            payload = self.http.request("PUT", api_path(ref.database, ref.table, "_stream_load"), headers=headers,
                                        body=body, idempotent=repeat).json()
        except HttpError as error:
            raise TargetError(f"Doris {what} got no usable answer: {error}") from error
        return Answer.expect(payload, Dialect.LOAD, f"Doris {what}")

    def two_pc(self, database: str, operation: str, txn_id: int | None = None, label: str | None = None,
               repeat_unclear: bool = True) -> Answer:
        """One `_stream_load_2pc` request. `repeat_unclear=False`: a request that may have been acted on without
        an answer is not repeated here but answered `unclear`, so the caller knows it may have landed."""
        headers = {"Expect": "100-continue", "txn_operation": operation}
        if txn_id is not None:
            headers["txn_id"] = str(txn_id)
        if label is not None:
            headers["label"] = label
        what = f"{operation} of Doris " + (f"txn {txn_id}" if txn_id is not None else f"label {label}")
        try:
            payload = self.http.request("PUT", api_path(database, "_stream_load_2pc"), headers=headers,
                                        idempotent=repeat_unclear).json()
        except (HttpConnectionError, HttpStatusError) as error:
            server_error = isinstance(error, HttpStatusError) and error.response is not None and error.response.status >= 500
            if repeat_unclear or not (server_error or isinstance(error, HttpConnectionError) and error.maybe_applied):
                raise TargetError(f"{what} got no usable answer: {error}") from error
            return Answer.failed(NO_ANSWER, str(error), applied=True)
        except HttpError as error:
            raise TargetError(f"{what} got no usable answer: {error}") from error
        return Answer.expect(payload, Dialect.REST, what)

    def abort(self, ref: TxnRef) -> None:
        """Abort whatever transaction holds `ref.label` now; harmless when none does."""
        if self._label_2pc is not False:
            answer = self.two_pc(ref.database, "abort", label=ref.label)
            if not _NO_LABEL_2PC.search(answer.message):
                self._label_2pc = True
                self._check_abort(answer, f"label {ref.label}")
                return
            log.info("Doris at %s cannot abort by label (before 2.1): using the empty-load probe", self.http.base_url)
            self._label_2pc = False
        self._abort_by_probe(ref)

    def abort_txn(self, txn_id: int, ref: TxnRef) -> None:
        self._check_abort(self.two_pc(ref.database, "abort", txn_id=txn_id), f"txn {txn_id} (label {ref.label})")

    def _abort_by_probe(self, ref: TxnRef) -> None:
        """Older servers: an empty 2PC load under the label either reveals the txn holding it or becomes one."""
        headers = {"Expect": "100-continue", "label": ref.label, "two_phase_commit": "true", **self.options.load_headers()}
        answer = self.stream_load(ref, headers, b"", what=f"abort probe of label {ref.label}")
        if answer.ok:
            self.abort_txn(int(answer.body["TxnId"]), ref)  # the probe itself began one: end it
            return
        if answer.status == "Label Already Exists":
            if answer.body.get("ExistingJobStatus") == "FINISHED":
                raise CommittedNotChosenError(
                    f"cannot abort Doris label {ref.label}: it is already committed "
                    f"({excerpt(answer.message, 200)}). " + CommittedNotChosenError.RUNBOOK
                )
            holder = _LABEL_HOLDER.search(answer.message)
            if holder is None:
                raise TargetError(f"cannot find the txn holding Doris label {ref.label}: {answer.message!r}")
            self.abort_txn(int(holder.group(1)), ref)
            return
        raise TargetError(f"abort probe of Doris label {ref.label} failed: {self.load_failure(ref, answer)}")

    @staticmethod
    def _check_abort(answer: Answer, what: str) -> None:
        if answer.ok:
            return
        if _COULD_NOT_ABORT.search(answer.message):
            raise CommittedNotChosenError(
                f"Doris {what} is already committed and cannot be aborted ({answer.message}); its rows are visible but "
                "belong to no prepared batch. " + CommittedNotChosenError.RUNBOOK
            )
        if any(known.search(answer.message) for known in (_ALREADY_ABORTED, _TXN_NOT_FOUND, _LABEL_NOT_FOUND)):
            return
        raise TargetError(f"Doris refused to abort {what}: status {answer.status!r}, msg {answer.message!r}")

    def load_failure(self, ref: TxnRef, answer: Answer) -> str:
        """Why a stream load failed, with the first rejected rows when the server kept them."""
        text = (
            f"Doris stream load of label {ref.label} into {ref.database}.{ref.table} failed: "
            f"Status {answer.status!r}, Message {excerpt(answer.message, 400)!r}"
        )
        if answer.body.get("NumberFilteredRows"):
            text += (
                f"; {answer.body.get('NumberFilteredRows')} of {answer.body.get('NumberTotalRows')} rows were filtered, "
                f"more than max_filter_ratio={self.options.max_filter_ratio or 0} allows"
            )
        if answer.error_url:
            text += f"; rejected rows: {answer.error_url}" + self._error_log_excerpt(answer.error_url)
        if _NO_DELETE_SIGN.search(answer.message):
            text += (f". The table has no hidden delete sign, so it cannot take the deletes of a change stream: run "
                     f"ALTER TABLE {ref.database}.{ref.table} ENABLE FEATURE \"BATCH_DELETE\" (or create it while the "
                     "FE's enable_batch_delete_by_default is true), then restart the job")
        return text

    def _error_log_excerpt(self, url: str) -> str:
        """The first lines of the server's error log, so the failure says which rows and why."""
        try:
            lines = self.http.request("GET", url, idempotent=True, timeout=10).text.splitlines()
        except HttpError as error:
            return f" (could not read it: {error})"
        return "; first rejected rows:\n  " + "\n  ".join(excerpt(line, 300) for line in lines[:_ERROR_LOG_LINES])


class DorisTarget(StreamLoadTarget):
    """Apache Doris through 2PC stream loads (`two_phase_commit`; abort by label needs 2.1+, `format: arrow` 2.1+).

    The target tables must exist: the sink never creates Doris tables. Picklable: writers run in Spark tasks,
    one pre-committed transaction per table a writer writes.
    """

    kind = "doris"
    display_name = "Doris"
    label_retention = LabelRetention("streaming_label_keep_max_second", 43200.0, "label_num_threshold", 2000,
                                     "newer finished txns in the database")

    # Config.max_running_txn_num_per_db: 100 before apache/doris#20478 (in 2.0), 1000 from 2.0, 10000 from
    # apache/doris#51367 (4.0 assumed, UNCONFIRMED). docs/protocol.md, Doris: timeouts and label retention.
    running_defaults = (((0,), 100), ((2, 0), 1000), ((4, 0), 10000))
    options_class = DorisOptions
    change_model = ("UNIQUE_KEYS", "CREATE TABLE ... UNIQUE KEY (...), merge-on-write the default from 2.1")

    def _read_release(self) -> Release:
        """`GET /api/fe_version_info` (FeVersionInfoAction): the httpv2 envelope whose `data.feVersionInfo` gives the
        release as numbers. It needs the ADMIN privilege, which a load-only user lacks: then the release is unknown."""
        try:
            body = self.http.request("GET", api_path("fe_version_info"), idempotent=True, allow_status=(404,)).json()
        except HttpError as error:
            return Release(None, f"Doris did not tell its release to user {self.user!r} (/api/fe_version_info needs "
                                 f"ADMIN: {excerpt(str(error), 120)})")
        try:
            info = body["data"]["feVersionInfo"] if body["code"] == 0 else {}
            numbers = tuple(int(info[f"dorisBuildVersion{part}"]) for part in ("Major", "Minor", "Patch"))
        except (TypeError, KeyError, ValueError):
            return Release(None, f"Doris did not tell its release ({excerpt(json.dumps(body), 120)!r})")
        return Release(numbers, f"Doris {'.'.join(map(str, numbers))}, read from /api/fe_version_info")

    def _read_model(self, table: str) -> TableModel | None:
        """From `_schema`: its keysType, and its key columns by their missing aggregation type (docs/protocol.md,
        Common: table schema endpoint)."""
        answer = fetch_table_schema(self.http, self.database, table)
        return None if answer is None else answer.model

    def _check_changes(self, table: str, schema: pa.Schema) -> None:
        """Also: the target sets the delete sign and the sequence itself, so `headers` must not; a change table
        without a sequence column is ordered by the batches alone, which is said once here."""
        super()._check_changes(table, schema)
        clash = sorted(name for name, _ in self.options.headers if name.lower() in _CHANGE_HEADERS)
        if clash:
            raise ConfigurationError(f"table {self.database}.{table} takes changes, whose deletes and order the target "
                                     f"sets itself: remove headers {clash} (list sequence tables in sequence_tables)")
        if table not in self.options.sequence_tables:
            log.warning(
                "Doris table %s.%s takes changes without a sequence column: a key's changes apply in the order their "
                "batches commit, which the sink keeps, so within this job a late older change cannot win; a writer "
                "outside it (or a replay of older data) could. Create the table with function_column.sequence_type "
                "and list it in sequence_tables to have Doris ignore older versions", self.database, table)

    def _started(self) -> None:
        self.api = LoadApi(self.http, self.options)
        self._arrow_types: dict[str, dict[str, pa.DataType]] = {}  # table -> column -> Arrow type (format arrow)

    def expiry_limits(self) -> list[ExpiryLimit]:
        """Server defaults (docs/protocol.md, Doris: timeouts and label retention): a pre-committed
        transaction is aborted after `stream_load_default_precommit_timeout_second` (3600 s); a
        finished stream-load label is forgotten after `streaming_label_keep_max_second` (12 h) or,
        from 2.0/2.1, as soon as more than `label_num_threshold` (2000) newer finished transactions
        exist in its database, whichever comes first (apache/doris
        DatabaseTransactionMgr.removeUselessTxns)."""
        return self.outage_limits(
            "pre-committed transactions (FE default)", 3600.0,
            "raise stream_load_default_precommit_timeout_second on the FE",
            "a busy shared database finishes 2000 stream loads within minutes. Raise streaming_label_keep_max_second "
            "and label_num_threshold (-1 disables the count) on the FE, or keep outages short",
        )

    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        return _DorisTransaction(self.api, self.arrow_schema, new_ref, record_intent)

    def check_schema(self, table: str, schema: pa.Schema) -> None:
        """Also, for arrow loads, reads the table's column types once here in the driver: the target
        travels to the tasks with them instead of each task asking the FE."""
        super().check_schema(table, schema)
        if self.options.format == "arrow":
            self.arrow_schema(table, schema)

    def arrow_schema(self, table: str, schema: pa.Schema) -> pa.Schema:
        """`schema` with each column in the Arrow type of its table column where the table says it."""
        if table not in self._arrow_types:
            columns = self.table_columns(table) or {}
            self._arrow_types[table] = {
                name.lower(): kind for name, spelling in columns.items() if (kind := table_arrow_type(spelling)) is not None
            }
        types = self._arrow_types[table]
        return pa.schema([f.with_type(types.get(f.name.lower(), f.type)) for f in schema])

    # -- two-phase commit ------------------------------------------------------------------------

    def commit(self, committable: Committable) -> CommitOutcome:
        if committable.txn_id is None:
            raise TargetError(f"committable {committable.label} has no Doris txn id; it cannot be committed")
        txn_id = int(committable.txn_id)
        pauses = self.api.retry.pauses()
        unclear = False  # a commit this call sent may have landed without our hearing of it
        while True:
            answer = self.api.two_pc(committable.database, "commit", txn_id=txn_id, repeat_unclear=False)
            unclear = unclear or answer.unclear
            pause = next(pauses, None) if answer.unclear or _RETRYABLE_2PC.search(answer.message) else None
            if pause is not None:
                wait(pause, f"commit of Doris txn {txn_id}: {answer.message}")
                continue
            if answer.unclear:
                raise TargetError(
                    f"commit of Doris txn {txn_id} (label {committable.label}) got no answer: {answer.message}. The batch "
                    "stays pre-committed and the next run commits it; check the FE"
                )
            if answer.ok or _ALREADY_COMMITTED.search(answer.message):
                return CommitOutcome.COMMITTED
            if _ALREADY_ABORTED.search(answer.message):
                log.warning("Doris txn %s (label %s) was rolled back by the server, so it was never visible: %s",
                            txn_id, committable.label, answer.message)
                return CommitOutcome.ABORTED
            if _TXN_NOT_FOUND.search(answer.message):
                return self._resolve_not_found(committable, answer, unclear)
            raise TargetError(
                f"Doris refused to commit txn {txn_id} (label {committable.label}, table "
                f"{committable.database}.{committable.table}): status {answer.status!r}, msg {answer.message!r}"
            )

    def _resolve_not_found(self, committable: Committable, answer: Answer, unclear: bool) -> CommitOutcome:
        """The FE forgot the txn (label history passed): the label's state is the last witness.

        An ABORTED label does not make the forgotten txn ABORTED: a forgotten label may be used again
        (the empty-load abort probe does so), and then the state speaks of that newer txn. `unclear`: a
        commit this call sent may have landed before the FE forgot the txn (LOST_AFTER_SEND).
        """
        state, _ = self.fe.label_state(committable.database, committable.label)
        if state.committed:
            return CommitOutcome.COMMITTED
        if state.gone:
            return self.forgotten(f"Doris txn {committable.txn_id} (label {committable.label}) is unknown to the server "
                                  f"({answer.message}; label state {state})", unclear)
        raise TargetError(
            f"Doris says txn {committable.txn_id} is not found but its label {committable.label} is {state}; "
            "refusing to guess whether it holds this committable's data"
        )

    def abort(self, ref: TxnRef) -> None:
        """Abort whatever transaction holds `ref.label` now; harmless when none does."""
        self.api.abort(ref)


class _DorisTransaction(TableTransaction):
    """One table of one writer attempt: ONE server transaction for the whole batch, however often the writer flushes.

    The first write records the intent, opens the 2PC stream load (on its own thread) and returns once the server
    has begun the transaction (it asked for the body); every write feeds the load's chunked body; prepare ends the
    body, and the server's answer pre-commits the transaction. So a (table, writer) holds the one transaction the
    batch's plan counted (docs/protocol.md, Doris: one load per table and writer).
    """

    def __init__(self, api: LoadApi, arrow_schema: Callable[[str, pa.Schema], pa.Schema], new_ref: NewRef,
                 record_intent: RecordIntent) -> None:
        self._api, self._options, self._arrow_schema = api, api.options, arrow_schema
        self._new_ref, self._record_intent = new_ref, record_intent
        self._part: _PartState | None = None
        self._load: _OpenLoad | None = None
        self._rows = 0  # rows fed into the body
        self._bytes = 0

    def write(self, chunk: pa.Table) -> None:
        if self._load is None:
            ref = self._new_ref(0)
            self._part = _PartState(ref)
            chunk, change_headers = self._options.change_load(ref.table, chunk)
            self._record_intent(ref)  # durable before the server sees the label
            self._load = _OpenLoad(self._api, ref, self._headers(ref, chunk, change_headers), chunk.schema)
            self._load.start()
        else:
            chunk, _ = self._options.change_load(self._load.ref.table, chunk)
        load = self._load
        if chunk.schema != load.schema:
            raise TargetError(f"Doris label {load.ref.label}: a later flush of {load.ref.table} has the columns "
                              f"{chunk.schema.names}, the load's body began with {load.schema.names}")
        fmt = self._wire_format(load.ref, chunk)
        for piece in encode_chunks(chunk, fmt, self._options.piece_bytes):
            if not load.pipe.put(piece):
                raise load.failure()
        self._rows += chunk.num_rows
        self._bytes += chunk.nbytes

    def prepare(self) -> list[PreparedPart]:
        if self._load is None or self._part is None:
            return []
        answer = self._load.finish()
        part = self._part
        self._accept_load(part, answer)
        return [PreparedPart(part.ref, str(part.txn_id), part.rows, part.bytes, dict(part.extra), part.filtered_rows,
                             part.unselected_rows)]

    def abort(self) -> None:
        """Stop the body short (the server never takes it whole), then abort by txn id if the load answered, else
        by label."""
        if self._load is None or self._part is None:
            return
        answer = self._load.give_up()
        txn_id = int(answer.body.get("TxnId", -1)) if answer is not None and answer.ok else -1
        if txn_id >= 0:
            self._api.abort_txn(txn_id, self._part.ref)
        else:
            self._api.abort(self._part.ref)

    def _wire_format(self, ref: TxnRef, chunk: pa.Table) -> WireFormat:
        options = self._options
        return options.wire_format(self._arrow_schema(ref.table, chunk.schema) if options.format == "arrow" else None)

    def _headers(self, ref: TxnRef, chunk: pa.Table, change_headers: dict[str, str]) -> dict[str, str]:
        headers = {"Expect": "100-continue", "label": ref.label, "two_phase_commit": "true",
                   **self._options.load_headers()}
        headers.update(columns_entry(chunk.schema, self._wire_format(ref, chunk)))
        headers.update(change_headers)
        return headers

    def _accept_load(self, part: _PartState, answer: Answer) -> None:
        ref = part.ref
        txn_id = int(answer.body.get("TxnId", -1))
        if str(answer.body.get("TwoPhaseCommit", "")).lower() != "true":
            raise TargetError(
                f"Doris loaded label {ref.label} (txn {txn_id}) into {ref.database}.{ref.table} WITHOUT two-phase "
                "commit, so it is visible already and exactly-once cannot hold; this server ignores the "
                "`two_phase_commit` header (Doris 1.0/1.1 need BE config disable_stream_load_2pc=false)"
            )
        part.txn_id = txn_id
        counts = RowCounts.of(answer) or RowCounts(0)
        if not counts.adds_up_to(self._rows):
            self._api.abort_txn(txn_id, ref)
            raise TargetError(counts.mismatch("Doris", ref.label, self._rows) + "; aborted it")
        part.rows, part.bytes = counts.loaded, self._bytes
        part.extra = {"load_bytes": int(answer.body.get("LoadBytes", 0))}
        part.filtered_rows, part.unselected_rows = counts.filtered, counts.unselected  # accounted for, not lost
        counts.log_rejected("Doris", ref.label, answer)


class _OpenLoad:
    """One 2PC stream load whose body is fed while it is sent: the request runs on its own thread.

    Until the server asks for the body the request may be sent again (a lost connection, a 5xx, a write-lock
    timeout), the label making a repeat harmless: a label held by an unfinished transaction (a repeated request's
    own) is freed. Once the body was asked for it cannot be sent again (`BodyPipe`): any failure then fails the
    writer, and Spark retries the task under a new label. (A proxy in front of the FE that asks for the body before
    the FE's redirect is not such a repeat: the HTTP client sends the copy it kept on to the BE, `AskedBody`.)
    """

    def __init__(self, api: LoadApi, ref: TxnRef, headers: dict[str, str], schema: pa.Schema) -> None:
        self.api, self.ref, self.headers, self.schema = api, ref, headers, schema
        self.pipe = BodyPipe()
        self._answer: Answer | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"doris-load-{ref.table}", daemon=True)

    def start(self) -> None:
        """Send the request; return once the server began the transaction (asked for the body) or answered."""
        self._thread.start()
        if not self.pipe.wait_asked():
            self._thread.join()
            raise self.failure()

    def finish(self) -> Answer:
        """End the body and wait for the server's answer: the load's outcome, or its failure raised."""
        self.pipe.end()
        self._thread.join()
        if self._answer is None or not self._answer.ok:
            raise self.failure()
        return self._answer

    def give_up(self) -> Answer | None:
        """Cut the body short and wait for the request to end; its answer, if one came."""
        self.pipe.cancel()
        self._thread.join()
        return self._answer

    def failure(self) -> BaseException:
        """Why the request ended without a load (it must have ended)."""
        self._thread.join()
        if self._error is not None:
            return self._error
        if self._answer is not None and not self._answer.ok:
            return TargetError(self.api.load_failure(self.ref, self._answer))
        return TargetError(f"Doris stream load of label {self.ref.label} answered before its body ended: "
                           f"{self._answer.body if self._answer else 'no answer'}")

    def _run(self) -> None:
        try:
            self._answer = self._send()
        except BaseException as error:  # handed to the writer's thread, which raises it
            self._error = error
        finally:
            self.pipe.close()

    def _send(self) -> Answer:
        ref, resolutions = self.ref, 0
        pauses = self.api.retry.pauses()
        while True:
            try:
                answer = self.api.stream_load(ref, self.headers, AskedBody(self.pipe.body),
                                              what=f"stream load of label {ref.label}", repeat=False)
            except TargetError as error:  # no answer, or a 5xx: sent again only while the body was never asked for
                pause = None if self.pipe.asked or not isinstance(error.__cause__, HttpError) else next(pauses, None)
                if pause is None:
                    raise
                wait(pause, f"Doris stream load of label {ref.label}: {error}")
                continue
            if answer.ok:
                return answer
            if answer.status == "Label Already Exists" and resolutions < _MAX_LABEL_RESOLUTIONS:
                resolutions += 1
                _free_label(self.api, ref, answer)
                continue
            if _RUNNING_LIMIT.search(answer.message):
                raise TransactionLimitError(self.api.load_failure(ref, answer))
            retryable = answer.status == "Fail" and _RETRYABLE_LOAD.search(answer.message) and not self.pipe.asked
            pause = next(pauses, None) if retryable else None
            if pause is not None:
                wait(pause, f"Doris stream load of label {ref.label}: {answer.message}")
                continue
            return answer


def _free_label(api: LoadApi, ref: TxnRef, answer: Answer) -> None:
    """A retried load found its label taken: abort a RUNNING/PRECOMMITTED holder, refuse a FINISHED one."""
    existing = str(answer.body.get("ExistingJobStatus", ""))
    if existing == "FINISHED":
        raise TargetError(
            f"Doris label {ref.label} is already committed (ExistingJobStatus FINISHED: {excerpt(answer.message, 200)}); "
            "loading it again would duplicate its rows. A writer never reuses a committed label: was the state "
            "store or the checkpoint restored from an older copy, or does another job share this job_id?"
        )
    holder = _LABEL_HOLDER.search(answer.message)
    log.warning(
        "Doris label %s is held by txn %s (%s) after a retried load; aborting that txn and loading again",
        ref.label, holder.group(1) if holder else "?", existing or "status not given",
    )
    if holder:
        api.abort_txn(int(holder.group(1)), ref)
    else:
        api.abort(ref)


DESCRIPTOR = TargetDescriptor(
    product=DorisTarget.kind,
    display_name=DorisTarget.display_name,
    schemes={"doris": "http", "doriss": "https"},
    url_forms=("doris://fe:8030", "doriss://fe:8443"),
    factory=lambda url, database, user, password, options: DorisTarget(
        fe_url=url, database=database, user=user, password=password or "", **options),
    option_names=frozenset(DorisTarget.option_names()),
    columns=DORIS_COLUMNS,
    needs_user=True,
    trigger_timeouts=(("load_timeout_s", 1),),
    scheme_hints={"mysql": "the FE's HTTP port, e.g. doris://fe-host:8030"},
)
