"""A small HTTP client for the load protocols: follows redirects itself, keeps credentials, retries safely.

Why not plain `requests`: StarRocks and Doris FEs answer with `307` to a BE on another host, and
the client must re-send the method, every header (including `Authorization`) and the body there;
`requests` drops `Authorization` on a cross-host redirect (docs/protocol.md, Common: redirects). So redirects
are followed here, by hand, re-sending everything.

Retries: a request that never reached the server (connection refused, connect timeout) is always
retried with backoff. A request that may have reached it (reset, read timeout, 5xx) is retried
only when the caller says it is idempotent; otherwise the caller gets `HttpConnectionError` with
`maybe_applied=True` and must find out what happened (e.g. through the label state).

Bodies are `bytes` or a zero-argument callable returning an iterable of byte chunks (sent with
chunked transfer encoding, re-created for every redirect hop and retry), so a large body never
has to exist in memory at once.
"""
from __future__ import annotations

import base64
import json
import logging
import threading
from time import sleep  # a module global, so tests can replace it here and nowhere else
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Union
from urllib.parse import quote, urljoin, urlsplit

import requests

from .errors import StreamingSinkError

log = logging.getLogger(__name__)

Body = Union[bytes, Callable[[], Iterable[bytes]], None]

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: The only redirects followed: they keep the method and body, as the StarRocks and Doris FEs use them.
#: Credentials go to their Location only on these, and never from https to plain http.
FOLLOWED_REDIRECTS = frozenset({307, 308})
_EXCERPT = 300


class HttpError(StreamingSinkError, RuntimeError):
    """Base of the errors this client raises; the message says what happened and what to do."""


class HttpConnectionError(HttpError):
    """No answer. `maybe_applied` is False only when the request surely never reached the server."""

    maybe_applied: bool = True  # what an error rebuilt from a Spark task's text reads: the safe unknown

    def __init__(self, message: str, maybe_applied: bool) -> None:
        super().__init__(message)
        self.maybe_applied = maybe_applied


class HttpStatusError(HttpError):
    """The server answered with an HTTP error status (after any retries)."""

    response: "HttpResponse | None" = None  # None in an error rebuilt from a Spark task's text

    def __init__(self, message: str, response: "HttpResponse") -> None:
        super().__init__(message)
        self.response = response


class AuthenticationError(HttpStatusError):
    """401/403: wrong user or password, or missing privilege. Retrying will not help."""


class HttpProtocolError(HttpError):
    """The answer was not what the protocol promises (e.g. not JSON, a redirect loop)."""


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


def api_path(*segments: str) -> str:
    """`/api/<segment>/...` with each segment percent-encoded whole: a routed table name such as
    `../other_db/t` or `t?label=x` stays one path segment instead of reaching another endpoint."""
    return "/api/" + "/".join(quote(segment, safe="") for segment in segments)


def basic_auth_header(user: str, password: str) -> str:
    token = base64.b64encode(f"{user}:{password}".encode("utf-8")).decode("ascii")
    return f"Basic {token}"


class HttpClient:
    """One service (base URL + credentials). Thread-safe: one `requests.Session` per thread. Picklable.

    `base_url` may list several addresses of one service, comma-separated (StarRocks or Doris FEs):
    a request that could not connect to one goes to the next at once; every request starts at the
    address that last answered.
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
        max_redirects: int = 5,
        verify: bool | str = True,
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
        self.retries, self.backoff_s, self.backoff_max_s = retries, backoff_s, backoff_max_s
        self.max_redirects = max_redirects
        self.verify = verify  # https: True (the system's CAs), a CA bundle's path, or False (no check)
        self._local = threading.local()

    # -- pickling: sessions stay behind ---------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_local")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def __repr__(self) -> str:  # never shows the password
        return f"HttpClient({self.base_url!r}, user={self.user!r})"

    # -- requests --------------------------------------------------------------------------------

    def url(self, path_or_url: str) -> str:
        if path_or_url.startswith(("http://", "https://")):
            return path_or_url
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
                if (error.maybe_applied and not idempotent) or attempt >= self.retries:
                    raise
                self._pause(attempt, f"{method} {path_or_url}: {error}")
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
            if status >= 500 and idempotent and attempt < self.retries:
                self._pause(attempt, f"{method} {path_or_url}: HTTP {status}")
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

    def _pause(self, attempt: int, why: str) -> None:
        delay = min(self.backoff_max_s, self.backoff_s * (2**attempt))
        log.warning("retrying in %.2fs (attempt %d of %d): %s", delay, attempt + 2, self.retries + 1, why)
        sleep(delay)

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
        hops: list[str] = []
        first_hop = True
        while True:
            data = body() if callable(body) else body
            response = self._send(method, url, sent_headers, data, params if first_hop else None, timeout)
            if response.status_code not in REDIRECT_STATUSES:
                return HttpResponse(response.status_code, response.content, response.headers, url, tuple(hops))
            location = response.headers.get("Location")
            if response.status_code not in FOLLOWED_REDIRECTS:
                raise HttpProtocolError(
                    f"{method} {url} answered HTTP {response.status_code} to {location!r}: only 307/308 redirects are "
                    "followed (they keep the method and body); check the URL"
                )
            if not location:
                raise HttpProtocolError(f"{method} {url} answered HTTP {response.status_code} without a Location header")
            target = urljoin(url, location)
            if urlsplit(url).scheme == "https" and urlsplit(target).scheme != "https":
                raise HttpProtocolError(
                    f"{method} {url} redirected to {target}: refusing to send credentials from https to plain http"
                )
            hops.append(url)
            if len(hops) > self.max_redirects:
                raise HttpProtocolError(f"{method}: more than {self.max_redirects} redirects: {hops + [target]}")
            url, first_hop = target, False

    def _send(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        data: bytes | Iterable[bytes] | None,
        params: Mapping[str, str] | None,
        timeout: float | None,
    ) -> requests.Response:
        try:
            return self._session().request(
                method,
                url,
                headers=headers,
                data=data,
                params=params,
                allow_redirects=False,
                timeout=(self.connect_timeout, timeout if timeout is not None else self.read_timeout),
            )
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
