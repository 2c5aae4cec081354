"""A fast *null* Stream Load server: StarRocks' transaction API and Doris' two-phase commit, data discarded.

Why: the emulators in tests/support/doubles/emulators parse every row in Python, so a benchmark against them measures
the emulator. This server speaks just enough of both protocols (docs/protocol.md; the calls
streaming_sink/targets/starrocks.py and doris.py make) to let the real targets begin, load, prepare,
commit and abort, and only counts what arrives: bytes, and rows as row delimiters (the bench's rows
hold no delimiter inside a value) or, for Doris `format: arrow` loads, as the lengths of the record batches
of the body's Arrow IPC streams (read with pyarrow, which only reads the batches' headers; such a body is
held whole while it is counted). What it answers:

StarRocks (one FE that is also the BE: no 307 redirect):
  POST /api/transaction/{begin,prepare,commit,rollback}, PUT /api/transaction/load,
  POST /api/{db}/{table}/_cancel; answers `{"Status": "OK", ...}` with the counts the client checks.
Doris:
  PUT /api/{db}/{table}/_stream_load (two_phase_commit: ends PRECOMMITTED), PUT /api/{db}/_stream_load_2pc
  (txn_operation commit/abort by txn_id or label); answers `{"Status": "Success", ...}` / `{"status": ...}`.
  A load whose Arrow body cannot be read answers `{"Status": "Fail", ...}`.
Both:
  A request with `Expect: 100-continue` gets `100 Continue` before its body is read, as a BE answers it.
  GET /api/{db}/get_load_state?label=L answers in both shapes at once (StarRocks reads `status`/`state`,
  Doris `code`/`data`).
  GET /api/{db}/{table}/_schema answers, in Doris' envelope (which streaming_sink/targets/streamload/table_schema.py
  also reads for StarRocks), the bench tables' columns (`COLUMNS`) for every table; the Doris target reads
  them for `format: arrow` (docs/protocol.md, "Common: table schema endpoint").
Bench only: GET /bench/stats (the counters as JSON), POST /bench/reset.

Run alone: `python -m bench.null_server [--port P]` prints `listening on http://127.0.0.1:P` once it accepts.
"""
from __future__ import annotations

import argparse
import itertools
import json
import socket
import socketserver
import sys
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pyarrow as pa  # imported up front: not during the first Arrow load, which the client would wait for

_READ = 1 << 20  # body bytes read at a time into one reused buffer
#: The releases the server tells the targets (the emulators' defaults): the budgets take their running-transaction limits.
STARROCKS_RELEASE, DORIS_RELEASE = "3.5.4", "2.1.8"
#: The bench tables' columns (orders and payments alike) as a Doris FE's `_schema` names them: the events'
#: fields but `table` (it routes a row), in the types of bench/driver.py's SCHEMA and CH_DDL.
COLUMNS = (("id", "BIGINT"), ("user_id", "BIGINT"), ("name", "VARCHAR"), ("amount", "DOUBLE"), ("currency", "VARCHAR"),
           ("country", "VARCHAR"), ("status", "VARCHAR"), ("created_at", "VARCHAR"), ("note", "STRING"))
_ARROW = b"arrow"  # not a delimiter: the load's rows are its Arrow record batches' lengths


@dataclass
class _Txn:
    label: str
    txn_id: int
    db: str
    table: str
    state: str  # PREPARE | PREPARED | PRECOMMITTED | VISIBLE | ABORTED
    rows: int = 0
    bytes: int = 0


@dataclass
class Stats:
    """What the server received and decided; read by the bench and the tests."""

    requests: int = 0
    body_bytes: int = 0  # every body byte received (loads)
    rows: int = 0  # row delimiters received in loads
    begun: int = 0
    prepared: int = 0  # StarRocks prepares and Doris 2PC loads
    committed: int = 0
    aborted: int = 0
    committed_rows: int = 0
    committed_bytes: int = 0
    by_op: dict[str, int] = field(default_factory=dict)


class NullState:
    """Labels and counters, behind one lock (every operation is a few dict updates)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stats = Stats()
        self.by_label: dict[str, _Txn] = {}
        self.by_id: dict[int, _Txn] = {}
        self._ids = itertools.count(1000)

    def reset(self) -> None:
        with self.lock:
            self.stats = Stats()
            self.by_label.clear()
            self.by_id.clear()

    def new_txn(self, label: str, db: str, table: str, state: str) -> _Txn:
        with self.lock:
            txn = _Txn(label, next(self._ids), db, table, state)
            self.by_label[label] = txn
            self.by_id[txn.txn_id] = txn
            self.stats.begun += 1
            return txn

    def finish(self, txn: _Txn, state: str) -> None:
        """Move a transaction to VISIBLE or ABORTED once, counting it."""
        with self.lock:
            if txn.state in ("VISIBLE", "ABORTED"):
                return
            txn.state = state
            if state == "VISIBLE":
                self.stats.committed += 1
                self.stats.committed_rows += txn.rows
                self.stats.committed_bytes += txn.bytes
            else:
                self.stats.aborted += 1

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            data = dict(self.stats.__dict__)
            data["by_op"] = dict(self.stats.by_op)
            data["open"] = sum(1 for t in self.by_label.values() if t.state not in ("VISIBLE", "ABORTED"))
            return data


class _Request:
    """One parsed request head; the body is read (and counted) by the handler."""

    def __init__(self, method: str, target: str, headers: dict[str, str]) -> None:
        parts = urlsplit(target)
        self.method, self.headers = method, headers
        self.body_error = ""  # why the body could not be counted (an Arrow body pyarrow cannot read)
        self.segments = [unquote(s) for s in parts.path.split("/") if s]
        self.query = {k: v[0] for k, v in parse_qs(parts.query).items()}

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)


class _Handler(socketserver.StreamRequestHandler):
    """HTTP/1.1 with keep-alive, Content-Length and chunked bodies; nothing else."""

    rbufsize = 1 << 16
    server: _Server

    def handle(self) -> None:
        self._buffer = bytearray(_READ)
        while True:
            line = self.rfile.readline(65537)
            if not line:
                return
            if line in (b"\r\n", b"\n"):
                continue
            method, target, _ = line.decode("latin-1").split(" ", 2)
            headers: dict[str, str] = {}
            while True:
                header = self.rfile.readline(65537)
                if header in (b"\r\n", b"\n", b""):
                    break
                name, _, value = header.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            request = _Request(method, target, headers)
            if request.header("expect").lower() == "100-continue":  # as the BEs' HTTP server (libevent) does
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                self.wfile.flush()
            delimiter = _row_delimiter(request)
            size, rows = self._read_body(request, delimiter)
            status, body = self.server.protocol.answer(request, size, rows)
            # a list is newline-delimited JSON, one line an item (StarRocks' HTTP SQL API answers so)
            payload = ("".join(json.dumps(item) + "\n" for item in body) if isinstance(body, list) else json.dumps(body)).encode()
            self.wfile.write(
                b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (status, b"OK" if status == 200 else b"ERROR", len(payload), payload)
            )
            self.wfile.flush()
            if request.header("connection").lower() == "close":
                return

    def _read_body(self, request: _Request, delimiter: bytes) -> tuple[int, int]:
        """(bytes, rows) of the body, read into one reused buffer: nothing is kept (an Arrow body: until counted)."""
        self._kept: bytearray | None = bytearray() if delimiter == _ARROW else None
        size, rows = self._read_raw(request, delimiter)
        if self._kept is not None:
            rows, request.body_error = _arrow_rows(self._kept)
            self._kept = None
        return size, rows

    def _read_raw(self, request: _Request, delimiter: bytes) -> tuple[int, int]:
        if request.header("transfer-encoding").lower() == "chunked":
            size = rows = 0
            while True:
                length = int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
                if length == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return size, rows
                chunk_rows = self._consume(length, delimiter)
                self.rfile.readline(8)  # the CRLF after the chunk
                size += length
                rows += chunk_rows
        length = int(request.header("content-length", "0") or 0)
        return length, self._consume(length, delimiter)

    def _consume(self, length: int, delimiter: bytes) -> int:
        rows = 0
        view = memoryview(self._buffer)
        left = length
        while left:
            got = self.rfile.readinto(view[: min(left, _READ)])
            if not got:
                raise ConnectionError("body cut short")
            if self._kept is not None:
                self._kept += view[:got]
            else:
                rows += self._buffer.count(delimiter, 0, got)
            left -= got
        return rows


def _arrow_rows(body: bytearray) -> tuple[int, str]:
    """(rows, error) of a body of Arrow IPC streams, one after another as Doris reads them (ArrowFormat)."""
    reader, rows = pa.BufferReader(pa.py_buffer(body)), 0
    try:
        while reader.tell() < len(body):
            rows += sum(batch.num_rows for batch in pa.ipc.open_stream(reader))
    except (pa.ArrowInvalid, OSError) as error:
        return rows, f"not an Arrow IPC stream at byte {reader.tell()}: {error}"
    return rows, ""


def _row_delimiter(request: _Request) -> bytes:
    """What marks a row in this load: `_ARROW` for Arrow bodies (rows are counted from the batches), `{` for a
    JSON array (StarRocks `strip_outer_array`: the bench's values hold no braces), else the
    `row_delimiter`/`line_delimiter` header (hex `\\xNN` or text), else newline."""
    if request.header("format").lower() == "arrow":
        return _ARROW
    if request.header("format").lower() == "json" and request.header("strip_outer_array").lower() == "true":
        return b"{"
    text = request.header("row_delimiter") or request.header("line_delimiter") or "\n"
    if text.startswith("\\x"):
        return bytes.fromhex(text.replace("\\x", ""))
    return text.encode()


class NullProtocol:
    """The answers of both protocols over one `NullState`."""

    def __init__(self, state: NullState) -> None:
        self.state = state

    def answer(self, request: _Request, size: int, rows: int) -> tuple[int, dict[str, Any] | list[dict[str, Any]]]:
        state, seg = self.state, request.segments
        op = "/".join(seg[:2]) if seg[:2] == ["api", "transaction"] else (seg[-1] if seg else "")
        release = seg[-1:] == ["sql"] or seg == ["api", "fe_version_info"]  # what the targets read once at start
        with state.lock:
            state.stats.requests += 1
            state.stats.by_op[op] = state.stats.by_op.get(op, 0) + 1
            if size and not release:
                state.stats.body_bytes += size
                state.stats.rows += rows
        if release:
            return 200, self._release(seg)
        if seg[:1] == ["bench"]:
            if seg[1:] == ["reset"]:
                state.reset()
            return 200, state.snapshot()
        if seg[:2] == ["api", "transaction"] and len(seg) == 3:
            return 200, self._starrocks(seg[2], request, size, rows)
        if len(seg) == 3 and seg[0] == "api" and seg[2] == "get_load_state":
            txn = state.by_label.get(request.query.get("label", ""))
            label_state = "UNKNOWN" if txn is None else ("VISIBLE" if txn.state == "VISIBLE" else txn.state)
            return 200, {"status": "OK", "state": label_state, "code": 0, "data": label_state, "msg": "success"}
        if len(seg) == 4 and seg[0] == "api" and seg[3] == "_schema":
            properties = [{"name": name, "type": kind, "comment": "", "aggregation_type": ""} for name, kind in COLUMNS]
            return 200, {"msg": "success", "code": 0, "count": 0,
                         "data": {"keysType": "DUP_KEYS", "properties": properties, "status": 200}}
        if len(seg) == 4 and seg[0] == "api" and seg[3] == "_stream_load":
            if request.body_error:
                return 200, {"TxnId": -1, "Label": request.header("label"), "Status": "Fail", "Message": request.body_error,
                             "NumberTotalRows": 0, "NumberLoadedRows": 0}
            return 200, self._doris_load(seg[1], seg[2], request, size, rows)
        if len(seg) == 3 and seg[0] == "api" and seg[2] == "_stream_load_2pc":
            return 200, self._doris_2pc(request)
        if len(seg) == 4 and seg[0] == "api" and seg[3] == "_cancel":
            txn = state.by_label.get(request.query.get("label", ""))
            if txn is not None and txn.state != "VISIBLE":
                state.finish(txn, "ABORTED")
            return 200, {"Status": "OK", "status": "OK"}
        return 404, {"Status": "FAILED", "Message": f"null server: no such endpoint {'/'.join(seg)}"}

    @staticmethod
    def _release(seg: list[str]) -> dict[str, Any] | list[dict[str, Any]]:
        """The release the server plays, as each FE tells it (docs/protocol.md, versions): a StarRocks and a Doris of
        the emulators' default releases, whose running-transaction limits the budgets then take."""
        if seg[-1] == "sql":  # StarRocks' HTTP SQL API: newline-delimited JSON (`_send` writes a list one per line)
            return [{"connectionId": 1}, {"meta": [{"name": "current_version()", "type": "varchar"}]},
                    {"data": [f"{STARROCKS_RELEASE} null"]}]
        major, minor, patch = DORIS_RELEASE.split(".")
        return {"msg": "success", "code": 0, "count": 0, "data": {"feVersionInfo": {
            "dorisBuildVersionMajor": int(major), "dorisBuildVersionMinor": int(minor),
            "dorisBuildVersionPatch": int(patch), "dorisBuildVersion": f"doris-{DORIS_RELEASE}"}}}

    # -- StarRocks ---------------------------------------------------------------------------------

    def _starrocks(self, op: str, request: _Request, size: int, rows: int) -> dict[str, Any]:
        state = self.state
        label = request.header("label")
        txn = state.by_label.get(label)
        if op == "begin":
            if txn is not None:
                return {"Status": "LABEL_ALREADY_EXISTS", "Message": f"Label [{label}] has already been used.",
                        "ExistingJobStatus": txn.state}
            txn = state.new_txn(label, request.header("db"), request.header("table"), "PREPARE")
            return {"Status": "OK", "Message": "", "Label": label, "TxnId": txn.txn_id}
        if txn is None:
            return {"Status": "TXN_NOT_EXISTS", "Message": f"transaction with label {label} not exists"}
        if op == "load":
            if txn.state != "PREPARE":
                return {"Status": "FAILED", "Message": f"transaction {label} is {txn.state}"}
            with state.lock:
                txn.rows += rows
                txn.bytes += size
            return {"Status": "OK", "Message": "", "Label": label, "TxnId": txn.txn_id,
                    "NumberTotalRows": rows, "NumberLoadedRows": rows, "LoadBytes": size}
        if op == "prepare":
            if txn.state == "PREPARE":
                with state.lock:
                    txn.state = "PREPARED"
                    state.stats.prepared += 1
            elif txn.state != "PREPARED":
                return {"Status": "FAILED", "Message": f"transaction {label} is {txn.state}"}
            return {"Status": "OK", "Message": "", "Label": label, "TxnId": txn.txn_id, "NumberTotalRows": txn.rows,
                    "NumberLoadedRows": txn.rows, "NumberFilteredRows": 0, "NumberUnselectedRows": 0, "LoadBytes": txn.bytes}
        if op == "commit":
            if txn.state == "ABORTED":
                return {"Status": "FAILED", "Message": f"Can not commit ABORTED transaction, label is {label}"}
            state.finish(txn, "VISIBLE")
            return {"Status": "OK", "Message": "", "Label": label, "TxnId": txn.txn_id}
        if op == "rollback":
            if txn.state == "VISIBLE":
                return {"Status": "FAILED", "Message": f"transaction {label} is VISIBLE, can not abort"}
            state.finish(txn, "ABORTED")
            return {"Status": "OK", "Message": "", "Label": label, "TxnId": txn.txn_id}
        return {"Status": "FAILED", "Message": f"null server: unknown transaction operation {op}"}

    # -- Doris -------------------------------------------------------------------------------------

    def _doris_load(self, db: str, table: str, request: _Request, size: int, rows: int) -> dict[str, Any]:
        state = self.state
        label = request.header("label")
        existing = state.by_label.get(label)
        if existing is not None and existing.state != "ABORTED":
            status = "FINISHED" if existing.state == "VISIBLE" else "PRECOMMITTED"
            return {"Status": "Label Already Exists", "ExistingJobStatus": status, "TxnId": -1,
                    "Message": f"Label [{label}] has already been used, relate to txn [{existing.txn_id}]"}
        two_phase = request.header("two_phase_commit").lower() == "true"
        txn = state.new_txn(label, db, table, "PRECOMMITTED" if two_phase else "VISIBLE")
        with state.lock:
            txn.rows, txn.bytes = rows, size
            state.stats.prepared += 1
        if not two_phase:
            txn.state = "PREPARE"
            state.finish(txn, "VISIBLE")
        return {"TxnId": txn.txn_id, "Label": label, "TwoPhaseCommit": "true" if two_phase else "false",
                "Status": "Success", "Message": "OK", "NumberTotalRows": rows, "NumberLoadedRows": rows,
                "NumberFilteredRows": 0, "NumberUnselectedRows": 0, "LoadBytes": size}

    def _doris_2pc(self, request: _Request) -> dict[str, Any]:
        state = self.state
        operation = request.header("txn_operation").lower()
        txn_id, label = request.header("txn_id"), request.header("label")
        txn = state.by_id.get(int(txn_id)) if txn_id else state.by_label.get(label)
        if txn is None:
            what = f"transaction [{txn_id}] not found" if txn_id else f"running transaction not found, label={label}"
            return {"status": "ANALYSIS_ERROR", "msg": f"errCode = 2, detailMessage = {what}"}
        if operation == "commit":
            if txn.state == "ABORTED":
                return {"status": "ANALYSIS_ERROR", "msg": f"transaction [{txn.txn_id}] is already aborted. abort reason: user"}
            state.finish(txn, "VISIBLE")
            return {"status": "Success", "msg": f"transaction [{txn.txn_id}] commit successfully."}
        if operation == "abort":
            if txn.state == "VISIBLE":
                return {"status": "ANALYSIS_ERROR", "msg": f"transaction [{txn.txn_id}] is already VISIBLE, could not abort."}
            state.finish(txn, "ABORTED")
            return {"status": "Success", "msg": f"transaction [{txn.txn_id}] abort successfully."}
        return {"status": "ANALYSIS_ERROR", "msg": f"unknown txn_operation {operation}"}


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    protocol: NullProtocol

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().server_bind()


class NullServer:
    """The server in a background thread of this process (tests), or run by `main` as its own process (bench)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.state = NullState()
        self._server = _Server((host, port), _Handler, bind_and_activate=True)
        self._server.protocol = NullProtocol(self.state)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> NullServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="null-stream-load", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()

    def stats(self) -> dict[str, Any]:
        return self.state.snapshot()

    def __enter__(self) -> NullServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--exit-with-stdin", action="store_true", help="stop when stdin closes (the parent died)")
    args = parser.parse_args(argv)
    server = NullServer(port=args.port)
    if args.exit_with_stdin:  # the parent holds our stdin: when it dies, however, so do we
        threading.Thread(target=lambda: (sys.stdin.read(), server._server.shutdown()), daemon=True).start()
    print(f"listening on {server.url}", flush=True)  # the parent reads this line: the socket already accepts
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
