"""What the StarRocks and Doris emulators share: the FE and BE listeners over one store, and their lifecycle.

The emulators are test doubles of the *wire protocol* described in docs/protocol.md (cited by its source
keys, e.g. SR-RBA, D-DTM, or by section name, e.g. "StarRocks: responses"). ``BaseEmulator`` holds what does
not depend on the product: Basic auth, lazy expiry (``tick``), the generic fault knobs, the ``/__emulator/``
admin API, the Python API both emulators expose, and ``run_main`` to run one as a process. Subclasses
implement ``describe`` and ``route``: their product's state machine.
"""
from __future__ import annotations

import itertools
import json
import os
import socket
import ssl
import threading
import traceback
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from tests.support.doubles.emulators.clock import Clock
from tests.support.doubles.emulators.conversion import STARROCKS_RULES, ConversionRules, to_storage
from tests.support.doubles.emulators.faults import GENERIC_KNOBS, Call, Faults
from tests.support.doubles.emulators.http_server import Listener, Request, RequestHandler, Response
from tests.support.doubles.emulators.key_models import DUP_KEYS, KeyModel, default_sort_key
from tests.support.doubles.emulators.load_formats import ParseResult
from tests.support.doubles.emulators.store import ABORTED, COMMITTED, TIMEOUT_REASON, VISIBLE, Store, Txn


class BaseEmulator:
    """FE + BE listeners over one ``Store``; subclasses implement ``describe`` and ``route``.

    Expiry (timeouts, publish delay, label retention) is evaluated lazily: at the start of every
    request and by ``tick()``. Generic fault knobs are applied here so both products share them.
    """

    PRODUCT = "base"
    RULES: ConversionRules = STARROCKS_RULES
    EXPIRING_STATES: frozenset[str] = frozenset()
    EXTRA_KNOBS: dict[str, str] = {}

    def __init__(self, data_dir: str, user: str = "root", password: str = "") -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.user = user
        self.password = password
        self.clock = Clock()
        self.faults = Faults({**GENERIC_KNOBS, **self.EXTRA_KNOBS})
        self.lock = threading.RLock()
        self.store = Store(os.path.join(self.data_dir, f"{self.PRODUCT}.sqlite3"), self.clock, self.conversion_rules())
        self.clock.on_change(lambda _now: self._persist_clock())
        self._fe: Listener | None = None
        self._be: Listener | None = None
        self._proxy: Listener | None = None
        self._proxied = False  # serve_behind_proxy: a front that takes bodies before the FE sees the request
        self.proxy_port = 0
        self._threads: list[threading.Thread] = []
        self.fe_port = 0
        self.be_port = 0
        self.error_logs: dict[str, list[str]] = {}
        self._fe_tls: ssl.SSLContext | None = None
        #: request-body bytes each listener received, but the SQL API's statements: read as a body, or drained unread
        #: after an early answer (then chunk framing included); a client that sends loads to the BE only leaves "fe" at 0
        self.body_bytes: dict[str, int] = {"fe": 0, "be": 0}
        self._count_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> BaseEmulator:
        if self._fe is not None:
            return self
        self._fe = Listener(self.fe_port, self, "fe", tls=self._fe_tls)
        self._be = Listener(self.be_port, self, "be")
        self.fe_port = self._fe.server_address[1]
        self.be_port = self._be.server_address[1]
        self._threads = [self._serve_in_thread(self._fe), self._serve_in_thread(self._be)]
        if self._proxied:
            self._proxy = Listener(self.proxy_port, self, "proxy")
            self.proxy_port = self._proxy.server_address[1]
            self._threads.append(self._serve_in_thread(self._proxy))
        return self

    def _serve_in_thread(self, server: Listener) -> threading.Thread:
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                                  name=f"{self.PRODUCT}-{server.role}", daemon=True)
        thread.start()
        return thread

    @staticmethod
    def _shutdown(servers: list[Listener | None]) -> None:
        """Stop listeners in parallel (each waits up to a poll interval), then cut connections."""
        live = [s for s in servers if s is not None]
        waiters = [threading.Thread(target=s.shutdown, daemon=True) for s in live]
        for waiter in waiters:
            waiter.start()
        for waiter in waiters:
            waiter.join(timeout=5)
        for server in live:
            server.server_close()
            server.close_connections()

    def stop(self) -> None:
        self.faults.release()  # let delayed answers go
        self._shutdown([self._fe, self._be, self._proxy])
        for thread in self._threads:
            thread.join(timeout=5)
        self._fe = self._be = self._proxy = None

    def restart(self) -> None:
        """Whole-cluster restart: same ports and data dir; memory (BE contexts, caches) is lost."""
        self.stop()
        with self.lock:
            self.store.close()
            self.store = Store(self.store.path, self.clock, self.conversion_rules())
            self._reset_memory()
        self.start()

    def restart_be(self) -> None:
        """BE restart: stream contexts are lost, FE state is kept (StarRocks: routing)."""
        self._shutdown([self._be])
        with self.lock:
            self._reset_be_memory()
        self._be = Listener(self.be_port, self, "be")
        self._threads.append(self._serve_in_thread(self._be))

    def close(self) -> None:
        self.stop()
        with self.lock:  # a handler may still be rolling back a load whose sender went away
            self.store.close()

    def serve_fe_over_tls(self, certfile: str, keyfile: str) -> BaseEmulator:
        """Serve the FE over https (call before ``start``). The BE stays plain http and the FE's 307s
        keep ``http://`` Locations, as a real StarRocks FE's do (SR-RBA; docs/protocol.md, Common: redirects)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certfile, keyfile)
        self._fe_tls = context
        return self

    def serve_behind_proxy(self) -> BaseEmulator:
        """Also serve a front (``proxy_url``, call before ``start``) as nginx or a cloud load balancer in front of
        the FE: it answers ``100 Continue`` itself, reads the whole body, then passes the request to the FE and
        relays its answer, the FE's 307 included (docs/protocol.md, Common: proxies in front of the FE)."""
        self._proxied = True
        return self

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def __enter__(self) -> BaseEmulator:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _reset_memory(self) -> None:
        """Forget everything a process keeps only in memory (subclasses extend)."""
        self._reset_be_memory()

    def _reset_be_memory(self) -> None:
        """Forget BE-only memory (subclasses extend)."""

    @property
    def fe_url(self) -> str:
        return f"{'https' if self._fe_tls is not None else 'http'}://127.0.0.1:{self.fe_port}"

    def _count_body(self, role: str, size: int) -> None:
        with self._count_lock:
            self.body_bytes[role] = self.body_bytes.get(role, 0) + size

    @property
    def be_url(self) -> str:
        return f"http://127.0.0.1:{self.be_port}"

    # -- catalog and inspection API ----------------------------------------------------------

    def create_database(self, db: str) -> None:
        with self.lock:
            self.store.create_database(db)

    def create_table(self, db: str, table: str, columns: list[tuple[str, str]], keys_type: str = DUP_KEYS,
                     key: tuple[str, ...] = (), **properties: Any) -> None:
        """CREATE TABLE: a DUPLICATE table unless `keys_type` says PRIMARY_KEYS (StarRocks) or UNIQUE_KEYS (Doris),
        keyed by `key`, the leading columns (a DUPLICATE table's sort key, when not given, as the servers choose it);
        `properties`: the model's other fields (key_models.KeyModel)."""
        key = tuple(key) or (default_sort_key(columns) if keys_type == DUP_KEYS else ())
        model = KeyModel(self.PRODUCT, keys_type, key, **properties)
        with self.lock:
            if db not in self.store.dbs:
                self.store.create_database(db)
            self.store.create_table(db, table, columns, model)

    def conversion_rules(self) -> ConversionRules:
        """The product's value-conversion rules (docs/protocol.md, "Common: value conversion")."""
        return self.RULES

    def visible_rows(self, db: str, table: str) -> list[tuple[Any, ...]]:
        """Visible rows in commit order, values typed (int, Decimal, float, str, bytes, date, datetime, list,
        dict; JSON columns hold the parsed JSON value; NULL is None)."""
        with self.lock:
            self._tick_locked()
            return self.store.visible_rows(db, table)

    def visible_dicts(self, db: str, table: str) -> list[dict[str, Any]]:
        """``visible_rows`` keyed by column name, for tests that read wide tables."""
        with self.lock:
            schema = self.store.schema(db, table)
            names = [name for name, _ in schema.columns] if schema is not None else []
        return [dict(zip(names, row)) for row in self.visible_rows(db, table)]

    def transactions(self, db: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            self._tick_locked()
            return [t.public() for t in sorted(self.store.txns.values(), key=lambda t: t.txn_id)
                    if db is None or t.db == db]

    def tick(self) -> None:
        """Evaluate timeouts, publish delays and label retention against the clock now."""
        with self.lock:
            self._tick_locked()

    # -- state transitions shared by both products --------------------------------------------

    def _persist_clock(self) -> None:
        with self.lock:
            self.store.save_clock()

    def _tick_locked(self) -> None:
        now = self.clock.now()
        for txn in self.store.running():
            expired = txn.deadline is not None and now > txn.deadline
            if txn.state in self.EXPIRING_STATES and expired:
                self._abort(txn, TIMEOUT_REASON)
            elif txn.state == COMMITTED and txn.visible_at is not None and now >= txn.visible_at:
                self._publish(txn)
        for db in self.store.finished_databases():
            # StarRocks: label retention / D-DTM isExpired: like the FE, walk the finished txns oldest
            # first and stop at the first one still kept.
            for txn in list(itertools.takewhile(
                    lambda t: t.finish_time is not None and now - t.finish_time > t.keep_s,
                    self.store.finished(db))):
                txn.evicted = True
                self.store.save(txn)
        self._tick_extra(now)

    def _tick_extra(self, now: float) -> None:
        """Product-specific lazy expiry (e.g. BE idle timeouts, label eviction by count)."""

    def _evict_beyond_count(self, limit: int, count_running: bool) -> None:
        """Label eviction by count: while a database holds more than ``limit`` transactions, forget
        its oldest finished (VISIBLE/ABORTED) ones, whatever their age. ``count_running`` says
        whether running transactions count towards the limit (StarRocks) or only finished ones do
        (Doris). The label then reads UNKNOWN and its txn id "not found", as after retention by age."""
        for db in self.store.finished_databases():
            excess = (self.store.finished_count(db) - limit
                      + (self.store.running_count(db) if count_running else 0))
            for txn in list(itertools.islice(self.store.finished(db), max(excess, 0))):
                txn.evicted = True
                self.store.save(txn)

    def _abort(self, txn: Txn, reason: str) -> None:
        txn.state = ABORTED
        txn.reason = reason
        txn.deadline = None
        txn.finish_time = self.clock.now()
        self.store.save(txn)
        self._on_aborted(txn)

    def _on_aborted(self, txn: Txn) -> None:
        """Hook: drop whatever in-memory context belonged to an aborted txn."""

    def _publish(self, txn: Txn) -> None:
        txn.state = VISIBLE
        txn.visible_at = None
        txn.deadline = None
        txn.finish_time = self.clock.now()
        txn.visible_seq = self.store.take_visible_seq()
        self.store.save(txn)

    def _commit(self, txn: Txn, visible_after: float | None = None) -> None:
        """COMMITTED now; VISIBLE now (default) or once the clock reaches the publish delay."""
        txn.state = COMMITTED
        txn.deadline = None
        txn.commit_time = self.clock.now()
        if visible_after is None:
            self._publish(txn)
        else:
            txn.visible_at = self.clock.now() + float(visible_after)
            self.store.save(txn)

    def _attach(self, txn: Txn, parsed: ParseResult, load_bytes: int) -> None:
        txn.rows = parsed.rows
        txn.total_rows = parsed.total
        txn.loaded_rows = len(parsed.rows)
        txn.filtered_rows = parsed.filtered
        txn.unselected_rows = parsed.unselected
        txn.load_bytes = load_bytes
        self.store.save(txn, with_rows=True)

    def _error_url(self, txn_id: int, errors: list[str]) -> str:
        """Keep rejected rows where the returned ErrorURL points (served by the BE)."""
        key = f"error_log_{txn_id}_{uuid.uuid4().hex[:8]}"
        self.error_logs[key] = errors
        return f"{self.be_url}/api/_load_error_log?file={key}"

    def _expire_label(self, db: str | None, label: str | None) -> None:
        """``expire_prepared`` knob: as if the prepared/pre-committed timeout had passed."""
        if db is None or label is None:
            return
        for txn in self.store.label_txns(db, label):
            if txn.state in self.EXPIRING_STATES:
                self._abort(txn, TIMEOUT_REASON)

    # -- auth --------------------------------------------------------------------------------

    def credentials_ok(self, req: Request) -> bool:
        return req.basic_auth() == (self.user, self.password)

    # -- request serving ---------------------------------------------------------------------

    def describe(self, role: str, req: Request) -> Call:
        """Classify a request for the knobs (op, label, db). Subclasses override."""
        return Call(op="other", role=role)

    def route(self, role: str, req: Request, call: Call) -> Response:
        raise NotImplementedError

    def _serve(self, role: str, handler: RequestHandler) -> None:
        req = Request(handler, role)
        try:
            if role == "proxy":  # the front asks for the body and buffers it whole, then the FE answers
                req.body()
            resp = self._handle("fe" if role == "proxy" else role, req)
        except Exception:  # an emulator bug must answer, never hang the client
            resp = Response.text("emulator error:\n" + traceback.format_exc(), status=500)
        self._send(handler, req, resp)

    def _handle(self, role: str, req: Request) -> Response:
        if req.path.startswith("/__emulator/"):
            return self._admin(req) if role == "fe" else Response.text("not found", 404)
        if role == "be" and req.path == "/api/_load_error_log":
            lines = self.error_logs.get(req.query.get("file", ""))
            return Response.text("\n".join(lines) + "\n") if lines is not None else \
                Response.text("not found", 404)
        self.tick()
        call = self.describe(role, req)
        if self.faults.drop_connection_before.take(call) is not None:
            return Response.dropped()
        params = self.faults.http_5xx.take(call)
        if params is not None:
            status = int(params.get("status", 503))
            return Response.text(f"emulated HTTP {status}", status=status)
        if self.faults.expire_prepared.take(call) is not None:
            with self.lock:
                self._expire_label(call.db, call.label)
        resp = self.route(role, req, call)
        if resp.status != 307 and (  # a redirect acts on nothing: the hop that acts loses its answer
                self.faults.drop_connection_after.take(call) is not None
                or (call.op == "commit" and self.faults.drop_connection_after_commit.take(call) is not None)):
            return Response.dropped()
        slow = self.faults.slow_response.take(call)
        if slow is not None:
            self.faults.wake.wait(float(slow.get("seconds", 1.0)))
        return resp

    def _send(self, h: RequestHandler, req: Request, resp: Response) -> None:
        if resp.drop:
            h.close_connection = True
            try:
                if not req.body_read and not req.expect_continue:
                    req.body()  # so the close is a clean FIN, not a RST
            except (OSError, ValueError):
                pass
            try:
                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        unread = not req.body_read
        close = resp.close or unread
        try:
            h.send_response(resp.status)
            for name, value in resp.headers.items():
                h.send_header(name, value)
            h.send_header("Content-Length", str(len(resp.body)))
            if close:
                h.send_header("Connection", "close")
            h.end_headers()
            if req.method != "HEAD":
                h.wfile.write(resp.body)
            h.wfile.flush()
        except OSError:
            h.close_connection = True
            return
        if close:
            h.close_connection = True
        if unread:
            self._linger(h, req.role)

    def _linger(self, h: RequestHandler, role: str) -> None:
        """Half-close, then drain (and count) what the client still sends, so it reads our answer, not RST."""
        try:
            h.connection.shutdown(socket.SHUT_WR)
            h.connection.settimeout(2.0)
            while True:
                drained = h.rfile.read1(65536)
                if not drained:
                    break
                self._count_body(role, len(drained))
        except (OSError, ValueError):
            pass

    # -- admin API (for other processes) ------------------------------------------------------

    def _admin(self, req: Request) -> Response:
        """JSON admin endpoints under ``/__emulator/`` on the FE (no auth, no knobs)."""
        parts = req.segments[1:]
        try:
            payload = json.loads(req.body() or b"{}") if req.method in ("POST", "PUT") else {}
        except json.JSONDecodeError:
            return Response.json({"error": "body must be JSON"}, status=400)
        if parts == ["rows"] and req.method == "GET":
            rows = self.visible_rows(req.query["db"], req.query["table"])
            schema = self.store.schema(req.query["db"], req.query["table"])
            types = [c for _, c in schema.columns] if schema is not None else []
            return Response.json({"rows": [[to_storage(v, c) for v, c in zip(r, types)] for r in rows]})
        if parts == ["transactions"] and req.method == "GET":
            return Response.json({"transactions": self.transactions(req.query.get("db"))})
        if parts == ["clock"] and req.method == "GET":
            return Response.json({"now": self.clock.now()})
        if parts == ["clock", "advance"] and req.method == "POST":
            now = self.clock.advance(float(payload.get("seconds", 0)))
            self.tick()
            return Response.json({"now": now})
        if parts == ["tick"] and req.method == "POST":
            self.tick()
            return Response.json({"now": self.clock.now()})
        if parts == ["databases"] and req.method == "POST":
            self.create_database(payload["db"])
            return Response.json({"ok": True})
        if parts == ["tables"] and req.method == "POST":
            self.create_table(payload["db"], payload["table"],
                              [tuple(c) for c in payload["columns"]], **payload.get("model", {}))
            return Response.json({"ok": True})
        if parts == ["faults"] and req.method == "GET":
            return Response.json({"knobs": {n: getattr(self.faults, n).__doc__
                                            for n in self.faults.names()}})
        if parts == ["faults", "reset"] and req.method == "POST":
            self.faults.reset()
            return Response.json({"ok": True})
        if parts == ["faults", "release"] and req.method == "POST":
            self.faults.release()
            return Response.json({"ok": True})
        if len(parts) == 2 and parts[0] == "faults" and req.method == "POST":
            try:
                knob = getattr(self.faults, parts[1])
            except AttributeError as exc:
                return Response.json({"error": str(exc)}, status=404)
            knob.arm(times=int(payload.get("times", 1)), label=payload.get("label"),
                     op=payload.get("op"), role=payload.get("role"),
                     **payload.get("params", {}))
            return Response.json({"ok": True})
        if parts == ["restart_be"] and req.method == "POST":
            threading.Thread(target=self.restart_be, daemon=True).start()
            return Response.json({"ok": True})
        return Response.json({"error": f"unknown admin endpoint {req.path}"}, status=404)


def run_main(factory: Callable[..., BaseEmulator], argv: Iterable[str] | None = None) -> None:
    """Run an emulator as a process: prints one JSON line with the URLs, serves until killed."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description=f"run the {factory.__name__}")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--user", default="root")
    parser.add_argument("--password", default="")
    parser.add_argument("--fe-port", type=int, default=0)
    parser.add_argument("--be-port", type=int, default=0)
    parser.add_argument("--profile", default="{}", help="JSON object of profile settings")
    args = parser.parse_args(list(argv) if argv is not None else None)
    emu = factory(args.data_dir, user=args.user, password=args.password,
                  **json.loads(args.profile))
    emu.fe_port, emu.be_port = args.fe_port, args.be_port
    emu.start()
    print(json.dumps({"fe_url": emu.fe_url, "be_url": emu.be_url, "pid": os.getpid()}),
          flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    emu.close()
