"""StarRocks target: the Stream Load transaction interface, one label per transaction.

* begin    = `POST /api/transaction/begin` with `timeout`, at the first flush of a (table, writer
  attempt), after the intent is recorded; never for a table with no rows;
* write    = one `PUT /api/transaction/load` per encoded piece (CSV with enclose/escape, or JSON),
  so a writer holds at most its flush plus one piece;
* prepare  = `POST /api/transaction/prepare` (with `prepared_timeout` when configured);
* commit   = `POST /api/transaction/commit` on the driver; every answer but OK is resolved through
  `GET /api/{db}/get_load_state`: COMMITTED/VISIBLE is done, PREPARE(D) is retried, ABORTED is
  ABORTED (never visible: loading it again is safe), UNKNOWN is LOST (the label never began, or
  finished and was forgotten after label retention; the coordinator decides);
* abort    = `POST /api/transaction/rollback`, falling back to `_cancel` when the BE forgot the
  transaction (e.g. after a BE restart).

Every request goes to the FE, which answers with a 307 to a BE for data-phase operations: the HTTP
client follows it itself and re-sends credentials and body (targets/streamload/http.py). Logical
errors come back as HTTP 200 with a `Status` field; `OK` is the only success.

Wire facts (paths, headers, answers, label states): docs/protocol.md, the "StarRocks: ..." sections.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..committable import Committable, TxnRef
from .encoding import (
    DEFAULT_CHUNK_BYTES, CsvFormat, JsonFormat, WireFormat, columns_header, encode_chunks, header_safe,
)
from .streamload.http import AuthenticationError, HttpConnectionError, HttpError, HttpResponse, api_path
from ..retry import RetryPolicy, wait
from .streamload.target import FORGOTTEN_LABELS, SharedOptions, StreamLoadTarget, option_values
from .descriptor import TargetDescriptor
from .olap_types import STARROCKS_COLUMNS
from .base import (
    CommitOutcome, CommittedNotChosenError, ConfigurationError, ExpiryKind, ExpiryLimit, NewRef, PreparedPart, RecordIntent,
    TableTransaction, TargetError, TransactionLimitError,
)

log = logging.getLogger(__name__)

# Label states (docs/protocol.md, StarRocks: label states; StarRocks: get_load_state).
UNKNOWN, PREPARE, PREPARED, COMMITTED, VISIBLE, ABORTED = "UNKNOWN", "PREPARE", "PREPARED", "COMMITTED", "VISIBLE", "ABORTED"
_DONE = (COMMITTED, VISIBLE)
_GONE = (ABORTED, UNKNOWN)
# The newest FE answers a commit of an evicted label from a terminal-state cache (SR-TWCH;
# docs/protocol.md, StarRocks: commit and rollback answers): "Can not commit ABORTED transaction,
# label is L" says it was rolled back.
_CACHED_ABORTED = "Can not commit ABORTED transaction"

# Headers the target owns; `properties` may not override them.
_MANAGED_HEADERS = frozenset(
    {"label", "db", "table", "format", "columns", "column_separator", "row_delimiter", "enclose", "escape",
     "strip_outer_array", "ignore_json_size", "timeout", "prepared_timeout", "authorization", "expect",
     "transaction_type", "strict_mode"}
)
_PROBE_LABEL = "streaming_sink_connectivity_probe"
# How the FE refuses a begin past max_running_txn_num_per_db (docs/protocol.md, StarRocks: concurrency and limits).
_RUNNING_LIMIT = "current running txns on db"
DEFAULT_PREPARED_TIMEOUT_S = 86400.0  # FE prepared_transaction_default_timeout_second (docs/protocol.md, StarRocks: timeouts)
DEFAULT_LABEL_KEEP_S = 259200.0  # FE label_keep_max_second (docs/protocol.md, StarRocks: label retention)
# The FE also forgets the oldest finished labels of a database once it holds more transactions, running and
# finished together, than label_keep_max_num (docs/protocol.md, StarRocks: label retention; every release since 2.0/2.1).
DEFAULT_LABEL_KEEP_NUM = 1000


#: The option names shared with Doris (docs/configuration.md maps them to the connectors' names) ->
#: this target's own, older names, which stay accepted.
COMMON_NAMES = {
    "load_timeout_s": "timeout", "prepared_timeout_s": "prepared_timeout", "connect_timeout_s": "connect_timeout",
    "read_timeout_s": "read_timeout", "retries": "http_retries", "chunk_bytes": "load_chunk_bytes",
}


@dataclass(frozen=True)
class StarRocksOptions(SharedOptions):
    """Everything configurable besides the address and credentials; unknown names are refused."""

    column_separator: str = ","
    row_delimiter: str = "\n"
    enclose: str | None = '"'
    escape: str | None = "\\"
    timeout: int = 600  # begin: seconds the transaction may stay in PREPARE (the data phase)
    prepared_timeout: int | None = None  # prepare: seconds it may stay PREPARED (StarRocks 3.5.4+)
    publish_timeout: int | None = None  # commit: seconds the FE waits for publish before answering
    load_chunk_bytes: int = DEFAULT_CHUNK_BYTES  # Arrow bytes per load request
    properties: tuple[tuple[str, str], ...] = ()  # extra Stream Load headers, e.g. max_filter_ratio
    connect_timeout: float = 10.0
    read_timeout: float = 300.0
    http_retries: int = 3  # for requests that never reached the server, and idempotent ones
    busy_retries: int = 20  # TXN_IN_PROCESSING, write-lock timeouts, FE routing misses
    backoff_max_s: float = 5.0

    @classmethod
    def parse(cls, options: dict[str, Any]) -> "StarRocksOptions":
        values = option_values(cls, options, COMMON_NAMES, "StarRocksTarget", "properties", _MANAGED_HEADERS,
                               "format, column_separator, enclose, escape, strict_mode, timeout, prepared_timeout")
        # StarRocks reads header names in any case: the target sends them lower-cased
        values["properties"] = tuple((k.lower(), v) for k, v in values.get("properties", ()))
        parsed = cls(**values)
        parsed._validate()
        return parsed

    def _validate(self) -> None:
        if self.format not in ("csv", "json"):
            raise ConfigurationError(f"StarRocksTarget format={self.format!r}: use 'csv' or 'json'")
        for name in ("timeout", "load_chunk_bytes", "commit_parallelism"):
            if int(getattr(self, name)) <= 0:
                raise ConfigurationError(f"StarRocksTarget {name} must be positive, got {getattr(self, name)}")
        for name in ("prepared_timeout", "publish_timeout"):
            value = getattr(self, name)
            if value is not None and int(value) <= 0:
                raise ConfigurationError(f"StarRocksTarget {name} must be a positive number of seconds, got {value}")
        try:
            self.wire_format()
        except ValueError as error:
            raise ConfigurationError(f"StarRocksTarget CSV options: {error}") from None

    def wire_format(self) -> WireFormat:
        if self.format == "json":
            return JsonFormat(lines=False)
        return CsvFormat(self.column_separator, self.row_delimiter, self.enclose, self.escape)

    def format_headers(self, schema: pa.Schema) -> dict[str, str]:
        wire = self.wire_format()
        if isinstance(wire, CsvFormat):
            headers = wire.headers()
        else:  # one JSON array per request, as the StarRocks connectors send it
            headers = {"format": "json", "strip_outer_array": "true", "ignore_json_size": "true"}
        if isinstance(wire, CsvFormat) or all(header_safe(name) for name in schema.names):
            headers["columns"] = columns_header(schema)  # a JSON body names its columns itself
        headers["strict_mode"] = "true" if self.strict_mode else "false"
        headers.update(dict(self.properties))
        return headers


class StarRocksTarget(StreamLoadTarget):
    """StarRocks through the Stream Load transaction interface (2.4+; `prepared_timeout` needs 3.5.4+).

    The target tables must exist: the sink never creates StarRocks tables. Picklable: writers run
    in Spark tasks, one transaction per (table, task attempt).
    """

    kind = "starrocks"

    options_class = StarRocksOptions
    common_names = COMMON_NAMES
    http_options = dict(connect_timeout="connect_timeout", read_timeout="read_timeout", retries="http_retries",
                        backoff_s="backoff_s", backoff_max_s="backoff_max_s")

    # -- Target protocol -------------------------------------------------------------------------

    def routable_tables(self) -> set[str] | None:
        """Checks that an https FE may redirect to plain http, that the FE answers, the credentials work and the
        database exists; returns `tables`."""
        self.require_plain_http_consent()
        self.load_state(_PROBE_LABEL)
        return set(self.options.tables) if self.options.tables is not None else None

    def expiry_limits(self) -> list[ExpiryLimit]:
        """Server defaults unless configured: PREPARED lives `prepared_timeout` (FE default 86400 s); a
        finished label is remembered `label_keep_max_second` (FE default 3 days), and only while the
        database holds at most DEFAULT_LABEL_KEEP_NUM transactions, running ones included."""
        prepared = self.options.prepared_timeout or DEFAULT_PREPARED_TIMEOUT_S
        return [
            ExpiryLimit(
                "prepared transactions", float(prepared), kind=ExpiryKind.PREPARED,
                note="prepared data of a job that is down longer is rolled back by the server and loaded again "
                     "from Kafka (retention permitting); raise the prepared_timeout option (StarRocks 3.5.4+) or "
                     "prepared_transaction_default_timeout_second on the FE",
            ),
            ExpiryLimit(
                "label history (FE default)", DEFAULT_LABEL_KEEP_S, DEFAULT_LABEL_KEEP_NUM, kind=ExpiryKind.LABELS,
                note=FORGOTTEN_LABELS + "raise label_keep_max_second on the FE, or keep outages short. The FE also forgets the "
                     "oldest labels once running + finished transactions in the database exceed label_keep_max_num "
                     "(1000 by default): raise it too",
            ),
        ]

    def leftover_transactions(self, label_prefix: str) -> list[str] | None:
        """None: StarRocks does not list open transactions to the sink's user over HTTP.

        The transaction API addresses one label at a time (docs/protocol.md, StarRocks: endpoints).
        `GET /api/show_proc` (`/transactions/<db id>/running`) lists them but requires the admin role
        (ShowProcAction); the BE's `/api/transaction/list` (docs/protocol.md, StarRocks: get_load_state)
        shows only the data-phase contexts of that one BE, and a prepared transaction has none (the BE
        drops it at prepare: docs/protocol.md, StarRocks: routing). SHOW PROC and
        information_schema.loads need the MySQL protocol.
        """
        return None

    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        return _StarRocksTransaction(self, table, new_ref, record_intent)

    def commit(self, committable: Committable) -> CommitOutcome:
        """Commit; any answer but OK is resolved through the label state (publish timeouts do commit)."""
        label, table = committable.label, committable.table
        headers = self._headers(label, table)
        if self.options.publish_timeout is not None:
            headers["timeout"] = str(int(self.options.publish_timeout))
        attempts, pauses = 0, self.busy_retry.pauses()
        unclear = False  # a commit this call sent may have landed without our hearing of it
        while True:
            answer = self._call("commit", headers)
            if answer.ok:
                return CommitOutcome.COMMITTED
            unclear = unclear or answer.unclear
            state, reason = self.load_state(label)
            if state in _DONE:
                log.info("commit of %s answered %s, but the label is %s: committed", label, answer.brief, state)
                return CommitOutcome.COMMITTED
            if state == ABORTED or (state == UNKNOWN and _CACHED_ABORTED in answer.message):
                log.warning("commit of %s answered %s; the server rolled it back (%s): it was never visible",
                            label, answer.brief, reason or "no reason given")
                return CommitOutcome.ABORTED
            if state == UNKNOWN:
                log.warning(
                    "commit of %s answered %s; the label is unknown to the server: it never began, or it finished and "
                    "was forgotten (label_keep_max_second, 3 days by default, or more than label_keep_max_num "
                    "transactions, 1000 by default, in the database)%s. Whether it was committed cannot be told here: "
                    "the coordinator decides", label, answer.brief,
                    "; a commit of it this call sent may have landed just before" if unclear else "",
                )
                return CommitOutcome.LOST_AFTER_SEND if unclear else CommitOutcome.LOST
            attempts += 1  # PREPARED (write-lock timeout, routing miss) or PREPARE: commit again
            pause = next(pauses, None)
            if pause is None:
                raise TargetError(
                    f"StarRocks commit of label {label} (table {self.database}.{table}) still fails after "
                    f"{attempts} attempts; last answer {answer.brief}, label state {state}. The batch stays "
                    "PREPARED and the next run commits it; check the FE (write-lock contention, publish delays)."
                )
            wait(pause, f"StarRocks commit of {label}: {answer.brief}, label {state}")

    def abort(self, ref: TxnRef) -> None:
        """Roll back; harmless when the label never began or is already aborted; loud if it was committed."""
        answer = self._call("rollback", self._headers(ref.label, ref.table), idempotent=True)
        if answer.ok:
            return
        state, _ = self.load_state(ref.label)
        if state in _GONE:
            return
        if state in (PREPARE, PREPARED):
            cancel = self._cancel(ref)  # the BE lost the context (restart): the FE can still cancel it
            state, _ = self.load_state(ref.label)
            if state in _GONE:
                return
            raise TargetError(
                f"StarRocks could not roll back label {ref.label} (table {self.database}.{ref.table}): rollback "
                f"answered {answer.brief}, _cancel answered {cancel.brief}, the label is still {state}. It will "
                "expire after its timeout; the sink retries the abort on its next start."
            )
        raise CommittedNotChosenError(
            f"StarRocks label {ref.label} (table {self.database}.{ref.table}) is {state}, but the sink was "
            "aborting it: the journal does not name it, yet it was committed, so its rows may be duplicated. "
            + CommittedNotChosenError.RUNBOOK
        )

    def close(self) -> None:
        self.http.close()

    # -- protocol calls --------------------------------------------------------------------------

    def load_state(self, label: str) -> tuple[str, str]:
        """(state, reason) of a label from `get_load_state`; raises on credentials, database or FE errors."""
        try:
            response = self.http.request(
                "GET", api_path(self.database, "get_load_state"), params={"label": label}, idempotent=True
            )
        except AuthenticationError as error:
            raise ConfigurationError(f"StarRocks at {self.fe_url} refused the credentials: {error}") from None
        except HttpError as error:
            raise TargetError(
                f"StarRocks get_load_state for label {label} at {self.fe_url} failed: {error}. "
                "Is the FE up and fe_url its HTTP port (default 8030)?"
            ) from None
        body = response.json()
        status = str(body.get("status", "")).upper()
        if status != "OK":
            message = body.get("msg") or body.get("message") or body
            if "database" in str(message).lower():
                raise ConfigurationError(
                    f"StarRocks database {self.database!r} at {self.fe_url}: {message}; create it, or fix `database`"
                )
            raise TargetError(f"StarRocks get_load_state for label {label} failed: {message}")
        return str(body.get("state", UNKNOWN)).upper(), str(body.get("reason") or "")

    def _headers(self, label: str, table: str) -> dict[str, str]:
        return {"label": label, "db": self.database, "table": table}

    def _call(self, op: str, headers: dict[str, str], body: bytes | None = None, idempotent: bool = False) -> "_Answer":
        """One transaction-API request; connection failures become an answer (status `CONNECTION`)."""
        method = "PUT" if op == "load" else "POST"
        try:
            response = self.http.request(method, api_path("transaction", op), headers=headers, body=body, idempotent=idempotent)
        except AuthenticationError as error:
            raise ConfigurationError(f"StarRocks {op} refused the credentials: {error}") from None
        except HttpConnectionError as error:
            return _Answer.failed("CONNECTION", str(error), applied=error.maybe_applied)
        except HttpError as error:
            return _Answer.failed("HTTP_ERROR", str(error), applied=True)
        return _Answer.parse(op, response)

    def _cancel(self, ref: TxnRef) -> "_Answer":
        try:
            response = self.http.request(
                "POST", api_path(self.database, ref.table, "_cancel"), params={"label": ref.label}, idempotent=True
            )
        except HttpError as error:
            return _Answer.failed("HTTP_ERROR", str(error), applied=True)
        return _Answer.parse_rest("_cancel", response)

    @property
    def busy_retry(self) -> RetryPolicy:
        """How often a busy label, a write-lock timeout or an FE routing miss is tried again."""
        return RetryPolicy(self.options.busy_retries, self.options.backoff_s, self.options.backoff_max_s)


@dataclass(frozen=True)
class _Answer:
    """The parts of a transaction-API answer the target acts on."""

    status: str
    message: str
    body: dict[str, Any]
    applied: bool = True  # False only when the request surely never reached the server

    @property
    def ok(self) -> bool:
        return self.status == "OK"

    @property
    def unclear(self) -> bool:
        """No answer from the server, yet the request may have reached it and been acted on."""
        return self.status in ("CONNECTION", "HTTP_ERROR") and self.applied

    @property
    def brief(self) -> str:
        text = f"{self.status}: {self.message}" if self.message else self.status
        error_url = self.body.get("ErrorURL")
        return f"{text} (rejected rows: {error_url})" if error_url else text

    @classmethod
    def failed(cls, status: str, message: str, applied: bool) -> "_Answer":
        return cls(status, message, {}, applied)

    @classmethod
    def parse(cls, op: str, response: HttpResponse) -> "_Answer":
        body = response.json()
        if not isinstance(body, dict) or "Status" not in body:
            raise TargetError(
                f"StarRocks {op} at {response.url} answered without a 'Status' ({str(body)[:200]!r}); "
                "the transaction interface needs StarRocks 2.4 or later, and fe_url must be the FE HTTP port"
            )
        return cls(str(body["Status"]), str(body.get("Message") or ""), body)

    @classmethod
    def parse_rest(cls, op: str, response: HttpResponse) -> "_Answer":
        """A RestBaseResult, as `_cancel` answers: lower-case `status` (OK/FAILED) and `msg`
        (docs/protocol.md, StarRocks: endpoints)."""
        body = response.json()
        if not isinstance(body, dict) or "status" not in body:
            raise TargetError(f"StarRocks {op} at {response.url} answered without a 'status' ({str(body)[:200]!r})")
        return cls(str(body["status"]).upper(), str(body.get("msg") or ""), body)


class _StarRocksTransaction(TableTransaction):
    """One label for one (table, writer attempt): begin at the first write, load pieces, prepare."""

    def __init__(self, target: StarRocksTarget, table: str, new_ref: NewRef, record_intent: RecordIntent) -> None:
        self._target, self._table = target, table
        self._new_ref, self._record_intent = new_ref, record_intent
        self._ref: TxnRef | None = None
        self._txn_id: str | None = None
        self._format_headers: dict[str, str] | None = None
        self._rows = 0
        self._bytes = 0
        self._rejected = (0, 0)  # rows the server filtered and unselected, as the prepare reported

    # -- TableTransaction ------------------------------------------------------------------------

    def write(self, chunk: pa.Table) -> None:
        if chunk.num_rows == 0:
            return  # never begin for nothing (the writer does not send empty chunks anyway)
        target = self._target
        if self._format_headers is None:
            self._format_headers = target.options.format_headers(chunk.schema)
        if self._ref is None:
            self._begin()
        for piece in encode_chunks(chunk, target.options.wire_format(), target.options.load_chunk_bytes):
            self._load(piece)
            self._bytes += len(piece)
        self._rows += chunk.num_rows

    def prepare(self) -> list[PreparedPart]:
        if self._ref is None:
            return []
        ref, target = self._ref, self._target
        headers = target._headers(ref.label, ref.table)
        if target.options.prepared_timeout is not None:
            headers["prepared_timeout"] = str(int(target.options.prepared_timeout))
        pauses = target.busy_retry.pauses()
        while True:
            answer = self._retry_busy("prepare", headers)
            if answer.ok:
                self._check_counts(answer)
                break
            # A repeated prepare (our first answer was lost) gets TXN_NOT_EXISTS, a routing miss FAILED:
            # only the label state tells whether the transaction is prepared.
            state, reason = target.load_state(ref.label)
            if state == PREPARED:
                break
            lost_context = answer.status == "TXN_NOT_EXISTS"  # PREPARE on the FE, unknown to the BE: BE restart
            pause = None if state != PREPARE or lost_context else next(pauses, None)
            if pause is None:
                raise TargetError(self._failure("prepare", answer, state, reason))
            # the request did not get through: preparing again is safe (a prepare still running
            # answers TXN_IN_PROCESSING, a finished one TXN_NOT_EXISTS while the label is PREPARED)
            wait(pause, f"StarRocks prepare of {ref.label}: {answer.brief}, label still PREPARE")
        txn_id = answer.body.get("TxnId", self._txn_id)
        part = PreparedPart(ref, None if txn_id is None else str(txn_id), self._rows, self._bytes)
        part.filtered_rows, part.unselected_rows = self._rejected  # the sink counts them as accounted for, not lost
        return [part]

    def abort(self) -> None:
        if self._ref is not None:
            self._target.abort(self._ref)

    # -- steps -----------------------------------------------------------------------------------

    def _begin(self) -> None:
        target = self._target
        ref = self._new_ref(0)
        self._record_intent(ref)  # durable before anything exists on the server (I3)
        self._ref = ref
        headers = target._headers(ref.label, ref.table)
        headers["timeout"] = str(int(target.options.timeout))
        pauses = target.busy_retry.pauses()
        while True:
            answer = target._call("begin", headers)
            if answer.ok:
                self._txn_id = str(answer.body["TxnId"]) if answer.body.get("TxnId") is not None else None
                return
            if answer.status not in ("CONNECTION", "HTTP_ERROR", "LABEL_ALREADY_EXISTS"):
                break
            # Our own begin may have landed (the label is unique to this writer attempt): adopt it if so.
            state, _ = target.load_state(ref.label)
            if state == PREPARE:
                log.info("begin of %s answered %s, but the label is PREPARE: it is ours, going on", ref.label, answer.brief)
                return
            pause = None if answer.status == "LABEL_ALREADY_EXISTS" or state not in _GONE else next(pauses, None)
            if pause is None:
                break
            wait(pause, f"StarRocks begin of {ref.label}: {answer.brief}")  # nothing exists: begin again
        if _RUNNING_LIMIT in answer.message:
            raise TransactionLimitError(self._begin_failure(answer))
        raise TargetError(self._begin_failure(answer))

    def _load(self, piece: bytes) -> None:
        ref, target = self._ref, self._target
        assert ref is not None and self._format_headers is not None
        headers = {**target._headers(ref.label, ref.table), **self._format_headers, "Expect": "100-continue"}
        answer = self._retry_busy("load", headers, piece, retry_fe_miss=True)
        if not answer.ok:
            if not answer.applied or answer.status == "CONNECTION":
                detail = "the connection was lost, so whether the data was received is unknown"
            else:
                detail = f"StarRocks answered {answer.brief}"
            raise TargetError(
                f"StarRocks load into {self._target.database}.{ref.table} (label {ref.label}) failed: {detail}. "
                "The transaction is rolled back and the writer fails; Spark retries the task under a new label"
                + self._hint(answer)
            )

    def _retry_busy(self, op: str, headers: dict[str, str], body: bytes | None = None, retry_fe_miss: bool = False) -> _Answer:
        """TXN_IN_PROCESSING (another request holds the label) and FE routing misses did nothing: retry."""
        target = self._target
        pauses = target.busy_retry.pauses()
        while True:
            answer = target._call(op, headers, body)
            busy = answer.status == "TXN_IN_PROCESSING"
            fe_miss = retry_fe_miss and answer.status == "FAILED" and "Can't find the transaction" in answer.message
            never_sent = answer.status == "CONNECTION" and not answer.applied
            pause = next(pauses, None) if busy or fe_miss or never_sent else None
            if pause is None:
                return answer
            if fe_miss and target.load_state(headers["label"])[0] != PREPARE:
                return answer  # the transaction really is gone (timed out, aborted)
            wait(pause, f"StarRocks {op} of {headers['label']}: {answer.brief}")

    def _check_counts(self, answer: _Answer) -> None:
        body = answer.body
        loaded = body.get("NumberLoadedRows")
        if loaded is None:
            return
        filtered = int(body.get("NumberFilteredRows") or 0)
        unselected = int(body.get("NumberUnselectedRows") or 0)
        if int(loaded) + filtered + unselected != self._rows:
            raise TargetError(
                f"StarRocks prepared label {self._ref.label if self._ref else '?'} with {loaded} loaded + {filtered} "
                f"filtered + {unselected} unselected rows, but {self._rows} rows were sent; refusing to commit "
                "a transaction that does not hold exactly what was written. Check `row_delimiter`/`enclose` options."
            )
        if filtered or unselected:
            self._rejected = (filtered, unselected)
            log.warning(
                "StarRocks label %s: %d rows were filtered and %d unselected by the server (max_filter_ratio allows it); "
                "they will not be visible. Rejected rows: %s",
                self._ref.label if self._ref else "?", filtered, unselected, body.get("ErrorURL", "n/a"),
            )
        self._rows = int(loaded)

    # -- messages ----------------------------------------------------------------------------------

    def _begin_failure(self, answer: _Answer) -> str:
        ref = self._ref
        label, table = (ref.label, ref.table) if ref else ("?", self._table)
        where = f"{self._target.database}.{table}"
        text = answer.message.lower()
        if answer.status == "LABEL_ALREADY_EXISTS":
            return (
                f"StarRocks begin for {where}: label {label} is already used "
                f"({answer.body.get('ExistingJobStatus') or 'running'}). Labels are unique per job, checkpoint, "
                "batch and writer attempt, so another job is writing with the same job_id and checkpoint; stop it."
            )
        if "unknown table" in text or "unknown database" in text or "does not exist" in text:
            return (
                f"StarRocks begin for {where} failed: {answer.brief}. Create the table (the sink never creates "
                "StarRocks tables) or fix the routing."
            )
        if _RUNNING_LIMIT in answer.message:
            return f"StarRocks begin for {where} (label {label}) was refused: {answer.brief}"
        return f"StarRocks begin for {where} (label {label}) failed: {answer.brief}" + self._hint(answer)

    def _failure(self, op: str, answer: _Answer, state: str, reason: str) -> str:
        ref = self._ref
        label, table = (ref.label, ref.table) if ref else ("?", self._table)
        return (
            f"StarRocks {op} of label {label} ({self._target.database}.{table}) answered {answer.brief}; "
            f"the label is {state}{f' ({reason})' if reason else ''}. The writer fails and Spark retries "
            "the task under a new label" + self._hint(answer)
        )

    @staticmethod
    def _hint(answer: _Answer) -> str:
        text = answer.message.lower()
        if "filtered rows" in text:
            return (
                "; rows were rejected by the table's types or constraints: read the rejected rows at the "
                "ErrorURL, fix the data or the table, or allow some with properties={'max_filter_ratio': ...}"
            )
        if "timeout" in text or answer.status in ("TXN_NOT_EXISTS", "ABORTED"):
            return "; if this repeats, raise the `timeout` option (seconds a transaction may stay open)"
        return ""


DESCRIPTOR = TargetDescriptor(
    product=StarRocksTarget.kind,
    display_name="StarRocks",
    schemes={"starrocks": "http", "starrockss": "https"},
    url_forms=("starrocks://fe:8030", "starrockss://fe:8443"),
    factory=lambda url, database, user, password, options: StarRocksTarget(
        fe_url=url, database=database, user=user, password=password or "", **options),
    option_names=frozenset(StarRocksTarget.option_names()),
    columns=STARROCKS_COLUMNS,
    needs_user=True,
    trigger_timeouts=(("load_timeout_s", 1), ("timeout", 1), ("prepared_timeout_s", 2), ("prepared_timeout", 2)),
    scheme_hints={"mysql": "the FE's HTTP port, e.g. starrocks://fe-host:8030"},
)
