"""A small HTTP client for the load protocols: follows redirects itself, keeps credentials, retries safely.

Why not plain `requests`: StarRocks and Doris FEs answer with `307` to a BE on another host, and
the client must re-send the method, every header (including `Authorization`) and the body there;
`requests` drops `Authorization` on a cross-host redirect (docs/protocol.md, Common: redirects). So redirects
are followed here, by hand, re-sending everything.

Retries (with the backoff and deadline of streaming_sink/retry.py): a request that never reached the
server (connection refused, connect timeout) is always retried. A request that may have reached it
(reset, read timeout, 5xx) is retried only when the caller says it is idempotent; otherwise the caller gets `HttpConnectionError` with
`maybe_applied=True` and must find out what happened (e.g. through the label state).

Bodies are `bytes` or a zero-argument callable returning an iterable of byte chunks (sent with
chunked transfer encoding, re-created for every hop and retry that sends it), so a large body never
has to exist in memory at once. A request with a body goes out with `Expect: 100-continue` and its
body is sent only to a server that asks for it (`_send_body` says why and how): a load's body goes
to the BE once, not to the FE first.
"""
from __future__ import annotations

import base64
import http.client
import io
import json
import logging
import os
import socket
import ssl
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple
from urllib.parse import quote, urlencode, urljoin, urlsplit, urlunsplit

import requests
from requests.structures import CaseInsensitiveDict

from ...errors import ExitCode, StreamingSinkError
from ...retry import RetryPolicy, wait
from ..per_thread import PerThread

log = logging.getLogger(__name__)

Body = bytes | Callable[[], Iterable[bytes]] | None


class AskedBody:
    """A body sent only once the server asks for it (`100 Continue`), never on the `continue_timeout` guess: whoever
    makes it learns from being called that the server asked (a Doris BE asks once it began the load's transaction).
    A server that neither asks nor answers within the read timeout still gets it (RFC 9110, 10.1.1).

    It is made once per request: when the first address asks for it and then redirects (a proxy in front of the
    FE, `_follow`), what it gave is sent again from a `_Spool`, not made anew."""

    def __init__(self, source: Callable[[], Iterable[bytes]]) -> None:
        self.source = source

    def __call__(self) -> Iterable[bytes]:
        return self.source()


#: How much of a body a `_Spool` keeps in memory before it moves to a temporary file.
SPOOL_MEMORY_BYTES = 8 * 1024 * 1024


class _Spool(AskedBody):
    """An `AskedBody` sent to the first address, kept as it goes so that it can be sent again once.

    Why: a proxy in front of the FE (nginx, a cloud load balancer) answers `100 Continue` itself and takes the whole
    body before the FE's 307 comes back; the BE then needs the body the proxy was given. The FE itself never asks
    for a body, so behind no proxy nothing is kept. Memory stays bounded: past `SPOOL_MEMORY_BYTES` the copy is on
    disk (docs/protocol.md, Common: proxies in front of the FE)."""

    def __init__(self, body: AskedBody) -> None:
        super().__init__(body.source)
        self._copy: tempfile.SpooledTemporaryFile[bytes] | None = None
        self._rest: Iterator[bytes] = iter(())

    @property
    def taken(self) -> bool:
        """Whether the address asked for the body (and got some of it)."""
        return self._copy is not None

    def __call__(self) -> Iterator[bytes]:
        self._copy = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)  # noqa: SIM115 - `close` ends it
        self._rest = iter(self.source())
        return self._kept(self._copy)

    def _kept(self, copy: IO[bytes]) -> Iterator[bytes]:
        for chunk in self._rest:
            copy.write(chunk)
            yield chunk

    def next_hop(self) -> AskedBody:
        """The body for the address the first one redirected to: when the first took it, what it was sent and then
        whatever it did not take; else the body itself, nothing kept."""
        if self._copy is None:
            return AskedBody(self.source)

        def replay() -> Iterator[bytes]:
            copy = self._copy
            assert copy is not None
            copy.seek(0)
            while chunk := copy.read(1024 * 1024):
                yield chunk
            yield from self._rest
        return AskedBody(replay)

    def close(self) -> None:
        if self._copy is not None:
            self._copy.close()


REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: The only redirects followed: they keep the method and body, as the StarRocks and Doris FEs use them.
#: Credentials go to their Location only on these, and from https to plain http only when allowed.
FOLLOWED_REDIRECTS = frozenset({307, 308})
_EXCERPT = 300
_MAX_LINE = 65536  # longest status or header line read from an early answer


class HttpError(StreamingSinkError, RuntimeError):
    """Base of the errors this client raises; the message says what happened and what to do."""

    exit_code = ExitCode.SERVICE
    headline = "the target failed: {error}"


class HttpConnectionError(HttpError):
    """No answer. `maybe_applied` is False only when the request surely never reached the server."""

    maybe_applied: bool = True  # what an error rebuilt from a Spark task's text reads: the safe unknown

    def __init__(self, message: str, maybe_applied: bool) -> None:
        super().__init__(message)
        self.maybe_applied = maybe_applied


class HttpStatusError(HttpError):
    """The server answered with an HTTP error status (after any retries)."""

    response: HttpResponse | None = None  # None in an error rebuilt from a Spark task's text

    def __init__(self, message: str, response: HttpResponse) -> None:
        super().__init__(message)
        self.response = response


class AuthenticationError(HttpStatusError):
    """401/403: wrong user or password, or missing privilege. Retrying will not help."""

    exit_code = ExitCode.USAGE
    headline = ("the target refused the credentials: {error}; check STREAMING_SINK_TARGET_USER and "
                "STREAMING_SINK_TARGET_PASSWORD")


class HttpProtocolError(HttpError):
    """The answer was not what the protocol promises (e.g. not JSON, a redirect loop)."""


class _Reply(NamedTuple):
    """One hop's answer, whichever way it was sent."""

    status: int
    body: bytes
    headers: Mapping[str, str]


@dataclass(frozen=True)
class HttpResponse:
    """The final answer of a request, after redirects."""

    status: int
    body: bytes
    headers: Mapping[str, str]
    url: str
    redirects: tuple[str, ...] = field(default=())  # the URLs that answered with a redirect

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON; raises HttpProtocolError naming the URL and a body excerpt if it is not."""
        try:
            return json.loads(self.body)
        except ValueError:
            raise HttpProtocolError(
                f"{self.url} answered HTTP {self.status} with a body that is not JSON: {excerpt(self.text)!r}; "
                "is the URL pointing at the right service and port?"
            ) from None


def excerpt(text: str, limit: int = _EXCERPT) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def without_userinfo(url: str) -> str:
    """`url` without the `user:password@` a Doris FE puts into its redirect's Location (docs/protocol.md, Common:
    redirects): every URL this client keeps, sends or prints goes through here, so the password travels only in
    `Authorization` and never reaches an error text or a log."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def api_path(*segments: str) -> str:
    """`/api/<segment>/...` with each segment percent-encoded whole: a routed table name such as
    `../other_db/t` or `t?label=x` stays one path segment instead of reaching another endpoint."""
    return "/api/" + "/".join(quote(segment, safe="") for segment in segments)


def basic_auth_header(user: str, password: str) -> str:
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return f"Basic {token}"


class HttpClient(PerThread):
    """One service (base URL + credentials). Thread-safe: one `requests.Session` per thread. Picklable.

    `base_url` may list several addresses of one service, comma-separated (StarRocks or Doris FEs):
    a request that could not connect to one goes to the next at once; every request starts at the
    address that last answered.

    `allow_plain_redirect` lets a redirect lead from https to plain http, credentials and body
    included: the StarRocks FE always redirects loads to `http://` BEs (docs/protocol.md, Common:
    redirects). `continue_timeout` is how long a request with a body waits for the server to ask for
    it (`100 Continue`) or to answer without it, before sending it anyway.
    """

    def __init__(
        self,
        base_url: str,
        user: str | None = None,
        password: str | None = None,
        *,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
        deadline_s: float = RetryPolicy.deadline_s,
        max_redirects: int = 5,
        verify: bool | str = True,
        allow_plain_redirect: bool = False,
        continue_timeout: float = 3.0,
    ) -> None:
        self.base_urls = [url.strip().rstrip("/") for url in base_url.split(",") if url.strip()]
        for url in self.base_urls or [base_url]:
            parsed = urlsplit(url)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise ValueError(f"base url {url!r}: expected http(s)://host:port")
            if parsed.username or parsed.password:
                raise ValueError("base url: pass credentials as user/password, not inside the URL (it is logged)")
        self.base_url = ",".join(self.base_urls)
        self._current = 0  # index of the address that last answered; shared by threads, any value is valid
        self.user, self.password = user, password
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.retry = RetryPolicy(retries, backoff_s, backoff_max_s, deadline_s)
        self.max_redirects = max_redirects
        self.verify = verify  # https: True (the CAs `requests` trusts), a CA bundle's path, or False (no check)
        self.allow_plain_redirect = allow_plain_redirect
        self.continue_timeout = continue_timeout
        self._proxy_seen = False  # a redirect came after the body was asked for (`_proxy_noticed`)
        super().__init__()  # this thread's session and SSL context, left behind by pickling

    @property
    def uses_https(self) -> bool:
        """Whether any of the service's addresses is https."""
        return any(url.startswith("https://") for url in self.base_urls)

    def __repr__(self) -> str:  # never shows the password
        return f"HttpClient({self.base_url!r}, user={self.user!r})"

    # -- requests --------------------------------------------------------------------------------

    def url(self, path_or_url: str) -> str:
        if path_or_url.startswith(("http://", "https://")):
            return without_userinfo(path_or_url)
        return self.base_urls[self._current] + "/" + path_or_url.lstrip("/")

    def request(
        self,
        method: str,
        path_or_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: Body = None,
        params: Mapping[str, str] | None = None,
        idempotent: bool = False,
        timeout: float | None = None,
        allow_status: Iterable[int] = (),
    ) -> HttpResponse:
        """Send, following redirects with the same method, headers, credentials and body.

        Returns the final response when its status is < 400 or in `allow_status`; raises
        AuthenticationError on 401/403, HttpStatusError on other error statuses, and
        HttpConnectionError when no answer came (after the retries the rules above allow).
        """
        allowed = frozenset(allow_status)
        pauses = self.retry.pauses()
        attempt = 0
        failovers = 0
        while True:
            start = self._current
            try:
                response = self._follow(method, self.url(path_or_url), headers, body, params, timeout)
            except HttpConnectionError as error:
                if not error.maybe_applied and failovers < len(self.base_urls) - 1:
                    failovers += 1  # that address saw nothing: the next one, without waiting
                    self._current = (start + 1) % len(self.base_urls)
                    log.warning("%s %s: %s; trying %s", method, path_or_url, error, self.base_urls[self._current])
                    continue
                pause = None if error.maybe_applied and not idempotent else next(pauses, None)
                if pause is None:
                    raise
                wait(pause, f"{method} {path_or_url} (attempt {attempt + 2}): {error}")
                attempt += 1
                continue
            status = response.status
            if status < 400 or status in allowed:
                return response
            if status in (401, 403):
                raise AuthenticationError(
                    f"{method} {response.url} was refused with HTTP {status} ({excerpt(response.text, 160)!r}): "
                    f"check the user ({self.user!r}) and password, and that the user may load into this database",
                    response,
                )
            pause = next(pauses, None) if status >= 500 and idempotent else None
            if pause is not None:
                wait(pause, f"{method} {path_or_url} (attempt {attempt + 2}): HTTP {status}")
                attempt += 1
                continue
            raise HttpStatusError(
                f"{method} {response.url} answered HTTP {status}: {excerpt(response.text)!r}"
                + (f" (after {attempt + 1} attempts)" if attempt else "")
                + ("; the server is failing, retry later or check its logs" if status >= 500 else ""),
                response,
            )

    def close(self) -> None:
        """Close this thread's connections."""
        session = getattr(self._local, "session", None)
        if session is not None:
            session.close()
            self._local.session = None

    # -- internals -------------------------------------------------------------------------------

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.trust_env = False  # no proxies or .netrc credentials sneaking in
            session.verify = self.verify
            self._local.session = session
        return session

    def _follow(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None,
        body: Body,
        params: Mapping[str, str] | None,
        timeout: float | None,
    ) -> HttpResponse:
        sent_headers = dict(headers or {})
        if self.user is not None:
            sent_headers["Authorization"] = basic_auth_header(self.user, self.password or "")
        spool = _Spool(body) if isinstance(body, AskedBody) else None
        try:
            return self._hops(method, url, sent_headers, spool or body, params, timeout, spool)
        finally:
            if spool is not None:
                spool.close()

    def _hops(
        self,
        method: str,
        url: str,
        sent_headers: dict[str, str],
        body: Body,
        params: Mapping[str, str] | None,
        timeout: float | None,
        spool: _Spool | None,
    ) -> HttpResponse:
        """`_follow`'s hops. `spool`: the one-shot body as the first hop sends it, kept in case that hop redirects
        after it took the body (a proxy in front of the FE); then the next hop sends the copy."""
        hops: list[str] = []
        first_hop = True
        while True:
            hop_params = params if first_hop else None
            if body is None or body == b"":
                reply = self._send(method, url, sent_headers, body, hop_params, timeout)
            else:
                reply = self._send_body(method, url, sent_headers, body, hop_params, timeout)
            if reply.status not in REDIRECT_STATUSES:
                return HttpResponse(reply.status, reply.body, reply.headers, url, tuple(hops))
            if first_hop and spool is not None:
                if spool.taken:
                    self._proxy_noticed(method, url)
                body = spool.next_hop()
            location = reply.headers.get("Location")
            if reply.status not in FOLLOWED_REDIRECTS:
                raise HttpProtocolError(
                    f"{method} {url} answered HTTP {reply.status} to {location!r}: only 307/308 redirects are "
                    "followed (they keep the method and body); check the URL"
                )
            if not location:
                raise HttpProtocolError(f"{method} {url} answered HTTP {reply.status} without a Location header")
            target = without_userinfo(urljoin(url, location))  # a Doris FE puts `user:password@` there
            if urlsplit(url).scheme == "https" and urlsplit(target).scheme != "https" and not self.allow_plain_redirect:
                raise HttpProtocolError(
                    f"{method} {url} redirected to {target}: refusing to send credentials from https to plain http; "
                    "if the server only redirects to plain http (StarRocks FEs do), set the target option "
                    "allow_plain_http_redirect"
                )
            hops.append(url)
            if len(hops) > self.max_redirects:
                raise HttpProtocolError(f"{method}: more than {self.max_redirects} redirects: {hops + [target]}")
            url, first_hop = target, False

    def _proxy_noticed(self, method: str, url: str) -> None:
        """Say once per client why each load's body crosses the network twice."""
        if self._proxy_seen:
            return
        self._proxy_seen = True
        log.warning(
            "%s %s asked for the body (100 Continue) and then redirected: a proxy in front of the FE takes each load's "
            "body before the FE answers, so the sink keeps a copy (in memory up to %d MiB, then on disk) and sends it "
            "again to the BE. To send it once, let the proxy pass Expect: 100-continue to the FE unanswered, or point "
            "the target at an FE directly", method, url, SPOOL_MEMORY_BYTES // (1024 * 1024))

    def _send(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        data: bytes | None,
        params: Mapping[str, str] | None,
        timeout: float | None,
    ) -> _Reply:
        """A request without a body, through this thread's `requests` session (kept-alive connections)."""
        try:
            response = self._session().request(
                method,
                url,
                headers=headers,
                data=data,
                params=params,
                allow_redirects=False,
                timeout=(self.connect_timeout, timeout if timeout is not None else self.read_timeout),
            )
            return _Reply(response.status_code, response.content, response.headers)
        except requests.ConnectTimeout as error:
            raise HttpConnectionError(f"{method} {url}: could not connect ({_reason(error)})", maybe_applied=False) from error
        except requests.ConnectionError as error:
            applied = not _never_connected(error)
            what = "connection lost before an answer" if applied else "could not connect"
            raise HttpConnectionError(f"{method} {url}: {what} ({_reason(error)})", maybe_applied=applied) from error
        except requests.Timeout as error:
            raise HttpConnectionError(
                f"{method} {url}: no answer within {timeout or self.read_timeout}s", maybe_applied=True
            ) from error

    def _send_body(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        body: bytes | Callable[[], Iterable[bytes]],
        params: Mapping[str, str] | None,
        timeout: float | None,
    ) -> _Reply:
        """A request with a body, whose body goes only to a server that asks for it.

        It is sent with `Expect: 100-continue`; the body follows a `100 Continue`, or `continue_timeout`
        seconds without any answer; an answer that comes first (an FE's 307, an error) is the reply, and
        the body is never sent. Why: both FEs answer a load from its headers with a 307 to a BE, without
        reading the body and without `100 Continue` (the StarRocks FE's `newContinueResponse` returns
        null; Doris's LoadAction redirects first), while `requests` never waits, so it uploaded every
        body to the FE, which dropped it, and then to the BE; newer StarRocks FEs reset such connections
        (StarRocks/demo issue #79). The BEs send `100 Continue` when they want the body, so it goes at
        once; a server that neither asks nor answers still gets it after the wait (RFC 9110, 10.1.1).
        Probing with an empty body first was not chosen: a server that acts instead of redirecting (a BE
        given as fe_url, an FE that loads itself) would run an empty load.

        One new connection per request, closed after it: a connection whose announced body was never
        sent cannot carry another request, and reusing one after an early answer has broken the next
        request (StarRocks issue #52516). Loads are large, so the connection costs little.
        """
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if params:
            target += ("&" if parts.query else "?") + urlencode(params)
        read_timeout = timeout if timeout is not None else self.read_timeout
        connection = self._connection(parts.scheme, parts.hostname or "", parts.port)
        try:
            try:
                connection.connect()
            except OSError as error:  # refused, unreachable, DNS, connect timeout, TLS handshake: nothing was sent
                raise HttpConnectionError(f"{method} {url}: could not connect ({_reason(error)})", maybe_applied=False) from error
            try:
                return self._exchange(connection, method, target, headers, body, read_timeout)
            except TimeoutError as error:
                raise HttpConnectionError(f"{method} {url}: no answer within {read_timeout}s", maybe_applied=True) from error
            except (OSError, http.client.HTTPException) as error:
                raise HttpConnectionError(
                    f"{method} {url}: connection lost before an answer ({_reason(error)})", maybe_applied=True
                ) from error
        finally:
            connection.close()

    def _exchange(
        self,
        connection: http.client.HTTPConnection,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | Callable[[], Iterable[bytes]],
        read_timeout: float,
    ) -> _Reply:
        """Headers, then the body only if it is wanted (see `_send_body`), then the answer."""
        sock = connection.sock
        assert sock is not None
        sock.settimeout(read_timeout)
        connection.putrequest(method, target, skip_accept_encoding=True)
        for name, value in headers.items():
            if name.lower() not in ("expect", "connection", "content-length", "transfer-encoding"):
                connection.putheader(name, value)
        connection.putheader("Expect", "100-continue")
        connection.putheader("Connection", "close")
        if isinstance(body, bytes):
            connection.putheader("Content-Length", str(len(body)))
        else:
            connection.putheader("Transfer-Encoding", "chunked")
        connection.endheaders()
        wait = read_timeout if isinstance(body, AskedBody) else self.continue_timeout
        status_line = _early_status_line(sock, wait, read_timeout)
        if status_line is None:  # asked for, or no answer in time: send it
            try:
                _write_body(sock, body() if callable(body) else body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server stopped reading: its answer, if it sent one, says why
            status_line = b""
        return _read_reply(sock, status_line, method)

    def _connection(self, scheme: str, host: str, port: int | None) -> http.client.HTTPConnection:
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=self.connect_timeout, context=self._ssl_context(host))
        return http.client.HTTPConnection(host, port, timeout=self.connect_timeout)

    def _ssl_context(self, host: str) -> ssl.SSLContext:
        """The certificate checks `requests` makes for `verify`, for the connections `_send_body` makes."""
        if self.verify is False:
            from urllib3.exceptions import InsecureRequestWarning

            warnings.warn(f"unverified https request to {host}: its certificate is not checked (verify=false)",
                          InsecureRequestWarning, stacklevel=2)
        context: ssl.SSLContext | None = getattr(self._local, "ssl_context", None)
        if context is None:
            if self.verify is False:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            elif isinstance(self.verify, str) and os.path.isdir(self.verify):
                context = ssl.create_default_context(capath=self.verify)
            else:
                context = ssl.create_default_context(
                    cafile=self.verify if isinstance(self.verify, str) else requests.certs.where()
                )
            self._local.ssl_context = context
        return context


def _early_status_line(sock: socket.socket, wait: float, read_timeout: float) -> bytes | None:
    """The status line of a final answer that came before the body was asked for, or None when the body is to
    be sent: a `100 Continue` came, or nothing did within `wait` seconds. Read a byte at a time, so nothing
    after an interim answer is consumed."""
    deadline = time.monotonic() + wait
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        sock.settimeout(remaining)
        try:
            first = sock.recv(1)
        except TimeoutError:
            return None
        finally:
            sock.settimeout(read_timeout)
        if not first:
            raise http.client.RemoteDisconnected("the server closed the connection without an answer")
        line = first + _read_line(sock)
        status = _status_code(line)
        if not 100 <= status < 200:
            return line
        while _read_line(sock) not in (b"\r\n", b"\n", b""):
            pass  # the interim answer's headers
        if status == 100:
            return None


def _read_line(sock: socket.socket) -> bytes:
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = sock.recv(1)
        if not byte:
            break
        line += byte
        if len(line) > _MAX_LINE:
            raise http.client.LineTooLong("status or header line")
    return bytes(line)


def _status_code(line: bytes) -> int:
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise http.client.BadStatusLine(excerpt(line.decode("latin-1"), 100))
    return int(parts[1])


def _write_body(sock: socket.socket, data: bytes | Iterable[bytes]) -> None:
    if isinstance(data, bytes):
        sock.sendall(data)
        return
    for chunk in data:
        if chunk:  # an empty chunk would end the body
            sock.sendall(b"%X\r\n" % len(chunk))
            sock.sendall(chunk)
            sock.sendall(b"\r\n")
    sock.sendall(b"0\r\n\r\n")


def _read_reply(sock: socket.socket, status_line: bytes, method: str) -> _Reply:
    """The answer on `sock`, parsed by `http.client`; `status_line` is its first line when it was read already."""
    reader = io.BufferedReader(_Replay(status_line, sock))
    response = http.client.HTTPResponse(_Source(reader), method=method)  # type: ignore[arg-type]  # only makefile is used
    try:
        response.begin()
        return _Reply(response.status, response.read(), CaseInsensitiveDict(response.getheaders()))
    finally:
        response.close()
        reader.close()


class _Replay(io.RawIOBase):
    """Bytes already read from a socket, then the socket itself."""

    def __init__(self, head: bytes, sock: socket.socket) -> None:
        self._head, self._sock = head, sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            size = min(len(buffer), len(self._head))
            buffer[:size] = self._head[:size]
            self._head = self._head[size:]
            return size
        return self._sock.recv_into(buffer)


class _Source:
    """What `http.client.HTTPResponse` takes for a socket: it only calls `makefile`."""

    def __init__(self, reader: io.BufferedReader) -> None:
        self._reader = reader

    def makefile(self, mode: str) -> io.BufferedReader:
        return self._reader


def _never_connected(error: BaseException) -> bool:
    """True when the TCP connection itself failed (refused, DNS): the server saw nothing."""
    from urllib3.exceptions import NameResolutionError, NewConnectionError

    pending: list[object] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, (NewConnectionError, NameResolutionError, ConnectionRefusedError)):
            return True
        pending.extend([getattr(current, "reason", None), current.__cause__, *current.args])
    return False


def _reason(error: BaseException) -> str:
    return excerpt(str(error), 200)
