"""The HTTP plumbing under both emulators: parsed requests, answers, and the threaded FE / BE listeners.

Written on ``http.server`` so the emulators need only the stdlib. It does what the clients of a real FE and
BE can observe: a body read lazily so a 307 never waits for it, ``100 Continue`` from the BE only and only
when the body is wanted (the FE never sends one), chunked bodies, dropped connections, an optional TLS FE,
and the redirect whose Location keeps path and query byte for byte, is always ``http://`` and, from a Doris FE,
carries the request's credentials in its userinfo (docs/protocol.md, "Common: redirects"). What a request means
is for ``BaseEmulator`` to say.
"""
from __future__ import annotations

import base64
import json
import socket
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

if TYPE_CHECKING:
    from tests.support.doubles.emulators.base_emulator import BaseEmulator


class Request:
    """One parsed request. The body is read lazily so a 307 never waits for it (Common: redirects)."""

    def __init__(self, handler: RequestHandler, role: str) -> None:
        self._h = handler
        self.role = role
        self.method = handler.command
        self.http_version = handler.request_version
        self.raw_path = handler.path
        parts = urlsplit(handler.path)
        self.path = parts.path
        self.query_string = parts.query
        self.query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        self.segments = [unquote(s) for s in parts.path.split("/") if s]
        self.headers = handler.headers
        self._body: bytes | None = None
        self.expect_continue = (handler.headers.get("Expect", "").strip().lower()
                                == "100-continue")
        te = handler.headers.get("Transfer-Encoding", "").lower()
        self.chunked = "chunked" in te
        self.content_length = int(handler.headers.get("Content-Length") or 0)

    def header(self, name: str, default: str = "") -> str:
        value = self.headers.get(name)
        return default if value is None else str(value).strip()

    def has_header(self, name: str) -> bool:
        return self.headers.get(name) is not None

    @property
    def has_body(self) -> bool:
        return self.chunked or self.content_length > 0

    @property
    def body_read(self) -> bool:
        return self._body is not None or not self.has_body

    def body(self) -> bytes:
        """Read the body, sending ``100 Continue`` first when the client asked for it and this is a BE.

        The FE never sends one: the StarRocks FE's HTTP aggregator answers ``newContinueResponse`` with
        null, and both FEs answer data requests with a 307 without reading the body (docs/protocol.md,
        Common: redirects). The bytes read are counted per role (``BaseEmulator.body_bytes``).
        """
        if self._body is None:
            if self.expect_continue and self.role != "fe":
                self._h.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                self._h.wfile.flush()
            rfile = self._h.rfile
            if self.chunked:
                parts = []
                while True:
                    line = rfile.readline(65537)
                    if not line:
                        raise ConnectionError("client went away inside a chunked body")
                    size = int(line.split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                            pass
                        break
                    parts.append(rfile.read(size))
                    rfile.readline(65537)
                self._body = b"".join(parts)
            else:
                self._body = rfile.read(self.content_length) if self.content_length else b""
            if not self.path.endswith("/sql"):  # a statement of the SQL API (the release read at start) is no load
                self._h.server.emulator._count_body(self.role, len(self._body))
        return self._body

    def basic_auth(self) -> tuple[str, str] | None:
        """(user, password) from ``Authorization: Basic``, or None if absent/unparseable."""
        value = self.header("Authorization")
        if not value.lower().startswith("basic "):
            return None
        try:
            decoded = base64.b64decode(value[6:].strip(), validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return None
        if ":" not in decoded:
            return None
        user, password = decoded.split(":", 1)
        return user, password


@dataclass
class Response:
    """An answer to send, or an instruction to drop the connection without one."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False
    drop: bool = False

    @classmethod
    def json(cls, obj: Any, indent: int | None = 4, status: int = 200,
             headers: dict[str, str] | None = None) -> Response:
        separators = None if indent is not None else (",", ":")
        text = json.dumps(obj, indent=indent, separators=separators, ensure_ascii=False)
        return cls(status=status, body=text.encode("utf-8"),
                   headers={"Content-Type": "application/json", **(headers or {})})

    @classmethod
    def text(cls, text: str, status: int = 200) -> Response:
        return cls(status=status, body=text.encode("utf-8"),
                   headers={"Content-Type": "text/plain; charset=utf-8"})

    @classmethod
    def dropped(cls) -> Response:
        return cls(drop=True)


class RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Listener

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet: tests read state through the API, not logs."""

    def handle_expect_100(self) -> bool:
        """Defer ``100 Continue`` until the body is really wanted (so a 307 skips it)."""
        return True

    def setup(self) -> None:
        super().setup()
        # Without it Nagle's algorithm and delayed ACKs add ~40 ms to every small answer.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def _dispatch(self) -> None:
        self.server.emulator._serve(self.server.role, self)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _dispatch


class Listener(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, emulator: BaseEmulator, role: str,
                 tls: ssl.SSLContext | None = None) -> None:
        self.emulator = emulator
        self.role = role
        self.tls = tls  # serve https with this context (the FE only: BEs serve Stream Load over http)
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(("127.0.0.1", port), RequestHandler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """With TLS, the handshake happens here, in the connection's own thread, so a client that stalls
        or refuses the certificate never blocks the accepting loop."""
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        try:
            wrapped = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return  # e.g. a client that does not trust the certificate: it sees the handshake fail
        try:
            super().finish_request(wrapped, client_address)
        finally:
            wrapped.close()

    def track(self, conn: socket.socket, add: bool) -> None:
        with self._conns_lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def close_connections(self) -> None:
        """Cut kept-alive connections so clients see the restart like a real server crash."""
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def redirect(req: Request, be_port: int, close: bool = False, credentials: tuple[str, str] | None = None) -> Response:
    """307 to the BE: ``http://127.0.0.1:<be_port><path>?<query>``, empty body (SR-RBA; Common: redirects).

    Like the servers (which build the URI with an empty query then append the original query),
    the Location always carries the ``?`` and keeps path and query byte for byte. Its scheme is
    ``http`` even from a TLS FE, as the StarRocks FE builds it (``new URI("http", …)``, SR-RBA).
    ``credentials``: the Doris FE puts the request's ``user:password`` into the Location's userinfo
    (conformance 2026-11-27 D9, ``RestBaseController.getRedirectUrL``); the StarRocks FE never does.
    """
    userinfo = ""
    if credentials is not None:
        userinfo = ":".join(quote(part, safe="!$&'()*+,;=") for part in credentials) + "@"
    location = f"http://{userinfo}127.0.0.1:{be_port}{req.path}?{req.query_string}"
    return Response(status=307, headers={"Location": location}, close=close)
