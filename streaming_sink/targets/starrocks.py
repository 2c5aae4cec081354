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
errors come back as HTTP 200 with a `Status` field; `OK` is the only success. Answers, label states and
the label-state call are the Stream Load kit's (targets/streamload/fe.py).

Wire facts (paths, headers, answers, label states): docs/protocol.md, the "StarRocks: ..." sections.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..changes import VERSION_COLUMN, is_change_schema
from ..committable import Committable, TxnRef
from ..errors import CommittedNotChosenError, ConfigurationError, TargetError, TransactionLimitError
from ..retry import RetryPolicy, wait
from .base import CommitOutcome, ExpiryLimit, NewRef, PreparedPart, RecordIntent, TableTransaction
from .descriptor import TargetDescriptor
from .encoding import DEFAULT_CHUNK_BYTES, CsvFormat, JsonFormat, WireFormat, columns_entry, encode_chunks
from .olap_types import STARROCKS_COLUMNS
from .streamload.accounting import RowCounts
from .streamload.fe import HTTP_ERROR, NO_ANSWER, Answer, Dialect, FeClient, LabelState
from .streamload.http import AuthenticationError, HttpClient, HttpConnectionError, HttpError, api_path, excerpt
from .streamload.table_schema import TableModel, fetch_table_model_v2
from .streamload.target import LabelRetention, Release, SharedOptions, StreamLoadTarget, release_numbers

log = logging.getLogger(__name__)

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
# How the FE refuses a begin past max_running_txn_num_per_db (docs/protocol.md, StarRocks: concurrency and limits).
_RUNNING_LIMIT = "current running txns on db"
DEFAULT_PREPARED_TIMEOUT_S = 86400.0  # FE prepared_transaction_default_timeout_second (docs/protocol.md, StarRocks: timeouts)
# The FE forgets a finished label after label_keep_max_second, and the oldest finished labels of a database once it
# holds more transactions, running and finished together, than label_keep_max_num (docs/protocol.md, StarRocks:
# label retention; every release since 2.0/2.1).
LABEL_RETENTION = LabelRetention("label_keep_max_second", 259200.0, "label_keep_max_num", 1000,
                                 "transactions in the database, running ones included")


#: The option names shared with Doris (docs/configuration.md maps them to the connectors' names) ->
#: this target's own, older names, which stay accepted.
COMMON_NAMES = {
    "load_timeout_s": "timeout", "prepared_timeout_s": "prepared_timeout", "connect_timeout_s": "connect_timeout",
    "read_timeout_s": "read_timeout", "retries": "http_retries", "chunk_bytes": "load_chunk_bytes",
}


@dataclass(frozen=True)
class StarRocksOptions(SharedOptions):
    """Everything configurable besides the address and credentials; unknown names are refused."""

    target = "StarRocksTarget"
    common_names = COMMON_NAMES
    headers_option = "properties"
    managed_headers = _MANAGED_HEADERS
    managed_by = "format, column_separator, enclose, escape, strict_mode, timeout, prepared_timeout"

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
    label_keep_max_num: int | None = None  # the FE's label memory per database, when not its default (1000)
    # change tables the operator vouches are PRIMARY KEY, for an FE that does not tell a table's model (before 3.3)
    primary_key_tables: tuple[str, ...] = ()

    @classmethod
    def _adjusted(cls, values: dict[str, Any]) -> dict[str, Any]:
        """StarRocks reads header names in any case: the target sends them lower-cased."""
        vouched = values.get("primary_key_tables", ())
        if isinstance(vouched, str):
            raise ConfigurationError("StarRocksTarget: `primary_key_tables` must be a list of table names, not one string")
        return {**values, "properties": tuple((k.lower(), v) for k, v in values.get("properties", ())),
                "primary_key_tables": tuple(str(t) for t in vouched)}

    def _validate(self) -> None:
        if self.format not in ("csv", "json"):
            raise ConfigurationError(f"StarRocksTarget format={self.format!r}: use 'csv' or 'json'")
        for name in ("timeout", "load_chunk_bytes", "commit_parallelism"):
            if int(getattr(self, name)) <= 0:
                raise ConfigurationError(f"StarRocksTarget {name} must be positive, got {getattr(self, name)}")
        for name in ("prepared_timeout", "publish_timeout", "label_keep_max_num"):
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
        headers.update(columns_entry(schema, wire))
        headers["strict_mode"] = "true" if self.strict_mode else "false"
        headers.update(dict(self.properties))
        return headers


def load_rows(chunk: pa.Table) -> pa.Table:
    """The rows as StarRocks loads them: a change's `__op` travels as the load's op column (named in `columns`);
    its `__version` stays behind, since a PRIMARY KEY table applies a key's rows in load and commit order, which
    exactly-once batches keep (docs/change-streams.md, StarRocks)."""
    if is_change_schema(chunk.schema) and VERSION_COLUMN in chunk.schema.names:
        return chunk.drop_columns([VERSION_COLUMN])
    return chunk


class TxnApi:
    """StarRocks' transaction API at one FE for one database: each request one `Answer`, never an exception for a
    connection that failed (status NO_ANSWER) or an HTTP error (HTTP_ERROR), so callers resolve those by the label state.

    What the target's commit and abort and a writer's transaction share; picklable, it travels to the tasks.
    """

    def __init__(self, http: HttpClient, fe: FeClient, database: str, busy_retry: RetryPolicy) -> None:
        self.http, self.fe, self.database = http, fe, database
        self.busy_retry = busy_retry  # how often a busy label, a write-lock timeout or an FE routing miss is tried again

    def call(self, op: str, ref: TxnRef, headers: dict[str, str] | None = None, body: bytes | None = None,
             idempotent: bool = False) -> Answer:
        """`POST /api/transaction/<op>` (`PUT` for `load`) for the label of `ref`, with `headers` besides the label's own."""
        method = "PUT" if op == "load" else "POST"
        sent = {"label": ref.label, "db": self.database, "table": ref.table, **(headers or {})}
        try:
            response = self.http.request(method, api_path("transaction", op), headers=sent, body=body, idempotent=idempotent)
        except AuthenticationError as error:
            raise ConfigurationError(f"StarRocks {op} refused the credentials: {error}") from None
        except HttpConnectionError as error:
            return Answer.failed(NO_ANSWER, str(error), applied=error.maybe_applied)
        except HttpError as error:
            return Answer.failed(HTTP_ERROR, str(error), applied=True)
        return Answer.expect(response.json(), Dialect.LOAD, f"StarRocks {op} at {response.url} (the transaction "
                             "interface needs StarRocks 2.4 or later, and fe_url must be the FE HTTP port)")

    def cancel(self, ref: TxnRef) -> Answer:
        """`_cancel`: the FE ends a transaction whose BE forgot it (docs/protocol.md, StarRocks: endpoints)."""
        try:
            response = self.http.request(
                "POST", api_path(self.database, ref.table, "_cancel"), params={"label": ref.label}, idempotent=True
            )
        except HttpError as error:
            return Answer.failed(HTTP_ERROR, str(error), applied=True)
        return Answer.expect(response.json(), Dialect.REST, f"StarRocks _cancel at {response.url}")


class StarRocksTarget(StreamLoadTarget):
    """StarRocks through the Stream Load transaction interface (2.4+; `prepared_timeout` needs 3.5.4+).

    The target tables must exist: the sink never creates StarRocks tables. Picklable: writers run
    in Spark tasks, one transaction per (table, task attempt).
    """

    kind = "starrocks"
    display_name = "StarRocks"
    label_retention = LABEL_RETENTION
    # Config.max_running_txn_num_per_db: 1000 in the 3.x Config.java, 100 in an older one (2.x; the release of the
    # change is UNCONFIRMED, 3.0 assumed). docs/protocol.md, StarRocks: concurrency and limits.
    running_defaults = (((0,), 100), ((3, 0), 1000))

    options_class = StarRocksOptions
    change_model = ("PRIMARY_KEYS", "CREATE TABLE ... PRIMARY KEY (...)")

    def _read_model(self, table: str) -> TableModel | None:
        """From the v2 schema API (3.3 on, assumed); the `_schema` endpoint the target reads columns from does not
        tell it (docs/protocol.md, StarRocks: primary key tables and `__op`)."""
        return fetch_table_model_v2(self.http, self.database, table)

    def _read_release(self) -> Release:
        """`select current_version()` through the HTTP SQL API (StarRocks 3.2+; StarRocks' docs, reference/HTTP_API/SQL.md),
        which any user may run: newline-delimited JSON whose `data` row is `"<release> <commit>"`. An FE without the
        API answers 404 (a release before 3.2, which does not tell its release over HTTP to the sink's user)."""
        path = api_path("v1", "catalogs", "default_catalog", "sql")
        try:
            response = self.http.request("POST", path, headers={"Content-Type": "application/json"},
                                         body=json.dumps({"query": "select current_version();"}).encode(),
                                         idempotent=True, allow_status=(400, 404, 405))
        except HttpError as error:
            return Release(None, f"StarRocks did not tell its release ({error})")
        if response.status in (404, 405):
            return Release(None, "StarRocks before 3.2 (no HTTP SQL API tells the release)")
        for line in response.text.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            data = row.get("data") if isinstance(row, dict) else None
            numbers = release_numbers(str(data[0])) if isinstance(data, list) and data else None
            if numbers is not None:
                return Release(numbers, f"StarRocks {'.'.join(map(str, numbers))}, read from the HTTP SQL API")
        return Release(None, f"StarRocks did not tell its release ({excerpt(response.text, 120)!r})")

    def _unknown_model(self, table: str) -> None:
        """Refused unless vouched for: StarRocks loads `__op` into a table that is not PRIMARY KEY without an error,
        dropping it, so every delete would land as a row (docs/protocol.md, StarRocks: primary key tables and `__op`)."""
        if table not in self.options.primary_key_tables:
            raise ConfigurationError(
                f"table {self.database}.{table} takes changes, but this StarRocks FE does not tell whether it is a "
                "PRIMARY KEY table (its v2 schema API, StarRocks 3.3+, is missing), and StarRocks would load the "
                "deletes of any other table as rows: check it is PRIMARY KEY and list it in the target option "
                "primary_key_tables")

    def _started(self) -> None:
        busy_retry = RetryPolicy(self.options.busy_retries, self.options.backoff_s, self.options.backoff_max_s)
        self.api = TxnApi(self.http, self.fe, self.database, busy_retry)

    # -- Target protocol -------------------------------------------------------------------------

    def expiry_limits(self) -> list[ExpiryLimit]:
        """Server defaults unless configured: PREPARED lives `prepared_timeout` (FE default 86400 s); a
        finished label is remembered `label_keep_max_second` (FE default 3 days), and only while the
        database holds at most `label_keep_max_num` transactions, running ones included (LABEL_RETENTION)."""
        return self.outage_limits(
            "prepared transactions", float(self.options.prepared_timeout or DEFAULT_PREPARED_TIMEOUT_S),
            "raise the prepared_timeout option (StarRocks 3.5.4+) or prepared_transaction_default_timeout_second on the FE",
            "raise label_keep_max_second on the FE, or keep outages short. The FE also forgets the oldest labels once "
            "running + finished transactions in the database exceed label_keep_max_num (1000 by default): raise it too",
        )

    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        return _StarRocksTransaction(self.api, self.options, table, new_ref, record_intent, self.abort)

    def commit(self, committable: Committable) -> CommitOutcome:
        """Commit; any answer but OK is resolved through the label state (publish timeouts do commit)."""
        label, table, api = committable.label, committable.table, self.api
        headers = {} if self.options.publish_timeout is None else {"timeout": str(int(self.options.publish_timeout))}
        attempts, pauses = 0, api.busy_retry.pauses()
        unclear = False  # a commit this call sent may have landed without our hearing of it
        while True:
            answer = api.call("commit", committable.ref(), headers)
            if answer.ok:
                return CommitOutcome.COMMITTED
            unclear = unclear or answer.unclear
            state, reason = api.fe.label_state(api.database, label)
            if state.committed:
                log.info("commit of %s answered %s, but the label is %s: committed", label, answer.brief, state)
                return CommitOutcome.COMMITTED
            if state == LabelState.ABORTED or (state == LabelState.UNKNOWN and _CACHED_ABORTED in answer.message):
                log.warning("commit of %s answered %s; the server rolled it back (%s): it was never visible",
                            label, answer.brief, reason or "no reason given")
                return CommitOutcome.ABORTED
            if state == LabelState.UNKNOWN:
                return self.forgotten(f"commit of {label} answered {answer.brief}; the label is unknown to the server",
                                      unclear)
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
        api = self.api
        answer = api.call("rollback", ref, idempotent=True)
        if answer.ok:
            return
        state, _ = api.fe.label_state(api.database, ref.label)
        if state.gone:
            return
        if state in (LabelState.PREPARE, LabelState.PREPARED):
            cancel = api.cancel(ref)  # the BE lost the context (restart): the FE can still cancel it
            state, _ = api.fe.label_state(api.database, ref.label)
            if state.gone:
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


class _StarRocksTransaction(TableTransaction):
    """One label for one (table, writer attempt): begin at the first write, load pieces, prepare."""

    def __init__(self, api: TxnApi, options: StarRocksOptions, table: str, new_ref: NewRef, record_intent: RecordIntent,
                 abort: Callable[[TxnRef], None]) -> None:
        self._api, self._options, self._table = api, options, table
        self._new_ref, self._record_intent, self._abort = new_ref, record_intent, abort
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
        chunk = load_rows(chunk)
        if self._format_headers is None:
            self._format_headers = self._options.format_headers(chunk.schema)
        if self._ref is None:
            self._begin()
        for piece in encode_chunks(chunk, self._options.wire_format(), self._options.load_chunk_bytes):
            self._load(piece)
            self._bytes += len(piece)
        self._rows += chunk.num_rows

    def prepare(self) -> list[PreparedPart]:
        if self._ref is None:
            return []
        ref, api = self._ref, self._api
        timeout = self._options.prepared_timeout
        headers = {} if timeout is None else {"prepared_timeout": str(int(timeout))}
        pauses = api.busy_retry.pauses()
        while True:
            answer = self._retry_busy("prepare", headers)
            if answer.ok:
                self._check_counts(answer)
                break
            # A repeated prepare (our first answer was lost) gets TXN_NOT_EXISTS, a routing miss FAILED:
            # only the label state tells whether the transaction is prepared.
            state, reason = api.fe.label_state(api.database, ref.label)
            if state == LabelState.PREPARED:
                break
            lost_context = answer.status == "TXN_NOT_EXISTS"  # PREPARE on the FE, unknown to the BE: BE restart
            pause = None if state != LabelState.PREPARE or lost_context else next(pauses, None)
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
            self._abort(self._ref)

    # -- steps -----------------------------------------------------------------------------------

    def _begin(self) -> None:
        api = self._api
        ref = self._new_ref(0)
        self._record_intent(ref)  # durable before anything exists on the server (I3)
        self._ref = ref
        headers = {"timeout": str(int(self._options.timeout))}
        pauses = api.busy_retry.pauses()
        while True:
            answer = api.call("begin", ref, headers)
            if answer.ok:
                self._txn_id = str(answer.body["TxnId"]) if answer.body.get("TxnId") is not None else None
                return
            if answer.status not in (NO_ANSWER, HTTP_ERROR, "LABEL_ALREADY_EXISTS"):
                break
            # Our own begin may have landed (the label is unique to this writer attempt): adopt it if so.
            state, _ = api.fe.label_state(api.database, ref.label)
            if state == LabelState.PREPARE:
                log.info("begin of %s answered %s, but the label is PREPARE: it is ours, going on", ref.label, answer.brief)
                return
            pause = None if answer.status == "LABEL_ALREADY_EXISTS" or not state.gone else next(pauses, None)
            if pause is None:
                break
            wait(pause, f"StarRocks begin of {ref.label}: {answer.brief}")  # nothing exists: begin again
        if _RUNNING_LIMIT in answer.message:
            raise TransactionLimitError(self._begin_failure(answer))
        raise TargetError(self._begin_failure(answer))

    def _load(self, piece: bytes) -> None:
        ref = self._ref
        assert ref is not None and self._format_headers is not None
        answer = self._retry_busy("load", {**self._format_headers, "Expect": "100-continue"}, piece, retry_fe_miss=True)
        if not answer.ok:
            if not answer.applied or answer.status == NO_ANSWER:
                detail = "the connection was lost, so whether the data was received is unknown"
            else:
                detail = f"StarRocks answered {answer.brief}"
            raise TargetError(
                f"StarRocks load into {self._api.database}.{ref.table} (label {ref.label}) failed: {detail}. "
                "The transaction is rolled back and the writer fails; Spark retries the task under a new label"
                + self._hint(answer)
            )

    def _retry_busy(self, op: str, headers: dict[str, str], body: bytes | None = None, retry_fe_miss: bool = False) -> Answer:
        """TXN_IN_PROCESSING (another request holds the label) and FE routing misses did nothing: retry."""
        ref, api = self._ref, self._api
        assert ref is not None
        pauses = api.busy_retry.pauses()
        while True:
            answer = api.call(op, ref, headers, body)
            busy = answer.status == "TXN_IN_PROCESSING"
            fe_miss = retry_fe_miss and answer.status == "FAILED" and "Can't find the transaction" in answer.message
            never_sent = answer.status == NO_ANSWER and not answer.applied
            pause = next(pauses, None) if busy or fe_miss or never_sent else None
            if pause is None:
                return answer
            if fe_miss and api.fe.label_state(api.database, ref.label)[0] != LabelState.PREPARE:
                return answer  # the transaction really is gone (timed out, aborted)
            wait(pause, f"StarRocks {op} of {ref.label}: {answer.brief}")

    def _check_counts(self, answer: Answer) -> None:
        counts = RowCounts.of(answer)
        if counts is None:
            return
        label = self._ref.label if self._ref else "?"
        if not counts.adds_up_to(self._rows):
            raise TargetError(counts.mismatch("StarRocks", label, self._rows) + "; refusing to commit a transaction "
                              "that does not hold exactly what was written")
        counts.log_rejected("StarRocks", label, answer)
        self._rejected = (counts.filtered, counts.unselected)
        self._rows = counts.loaded

    # -- messages ----------------------------------------------------------------------------------

    def _begin_failure(self, answer: Answer) -> str:
        ref = self._ref
        label, table = (ref.label, ref.table) if ref else ("?", self._table)
        where = f"{self._api.database}.{table}"
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

    def _failure(self, op: str, answer: Answer, state: LabelState, reason: str) -> str:
        ref = self._ref
        label, table = (ref.label, ref.table) if ref else ("?", self._table)
        return (
            f"StarRocks {op} of label {label} ({self._api.database}.{table}) answered {answer.brief}; "
            f"the label is {state}{f' ({reason})' if reason else ''}. The writer fails and Spark retries "
            "the task under a new label" + self._hint(answer)
        )

    @staticmethod
    def _hint(answer: Answer) -> str:
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
    display_name=StarRocksTarget.display_name,
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
