"""The HTTP client against real local servers: redirects re-send everything, retries only when safe."""
from __future__ import annotations

import base64
import pickle
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from streaming_sink import retry as retry_module
from streaming_sink.targets.streamload import http as http_module
from streaming_sink.targets.streamload.http import (
    AuthenticationError,
    HttpClient,
    HttpConnectionError,
    HttpProtocolError,
    HttpStatusError,
)
from tests.support.tls import issue_certificates

AUTH = "Basic " + base64.b64encode(b"root:pw").decode()


class Recorder:
    """A programmable server: `script(handler)` answers; every request is recorded."""

    def __init__(self, script: Callable[[BaseHTTPRequestHandler, int], None]) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        recorder = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = b""
                    while True:
                        size = int(self.rfile.readline().strip(), 16)
                        if size == 0:
                            self.rfile.readline()
                            break
                        body += self.rfile.read(size)
                        self.rfile.readline()
                else:
                    body = self.rfile.read(length) if length else b""
                recorder.requests.append(
                    {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
                )
                recorder.script(self, len(recorder.requests))

            do_GET = do_POST = do_PUT = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def answer(handler: BaseHTTPRequestHandler, status: int, body: bytes = b"{}", headers: dict[str, str] | None = None) -> None:
    handler.send_response(status)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def drop(handler: BaseHTTPRequestHandler) -> None:
    handler.close_connection = True
    handler.connection.shutdown(socket.SHUT_RDWR)


class EarlyAnswer:
    """An FE as the StarRocks and Doris ones behave: never sends `100 Continue`, answers at once from the
    headers without reading the body, then counts the body bytes that still arrive (docs/protocol.md,
    Common: redirects)."""

    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.received: list[int] = []  # body bytes that arrived, per request
        early = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def handle_expect_100(self) -> bool:
                return True  # no `100 Continue`, ever

            def _any(self) -> None:
                self.close_connection = True
                answer(self, status, b"", {**headers, "Connection": "close"})
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_WR)
                received = 0
                while chunk := self.rfile.read1(65536):  # until the client closes
                    received += len(chunk)
                early.received.append(received)

            do_PUT = do_POST = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def servers() -> Iterator[Callable[[Callable], Recorder]]:
    made: list[Recorder] = []

    def make(script: Callable) -> Recorder:
        made.append(Recorder(script))
        return made[-1]

    yield make
    for recorder in made:
        recorder.close()


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(retry_module, "sleep", slept.append)  # the sink's pauses only, not the process's
    return slept


def test_a_307_to_another_host_is_followed_with_method_headers_credentials_and_body(servers) -> None:
    be = servers(lambda h, n: answer(h, 200, b'{"Status": "OK"}'))
    fe = servers(lambda h, n: answer(h, 307, b"", {"Location": f"{be.url}/api/transaction/load?x=1"}))
    client = HttpClient(fe.url, "root", "pw")
    response = client.request("PUT", "/api/transaction/load", headers={"label": "L", "db": "d"}, body=b"1,a\n")
    assert response.json() == {"Status": "OK"} and response.redirects == (f"{fe.url}/api/transaction/load",)
    (hop,) = be.requests
    assert hop["method"] == "PUT" and hop["path"] == "/api/transaction/load?x=1" and hop["body"] == b"1,a\n"
    assert hop["headers"]["Authorization"] == AUTH and hop["headers"]["label"] == "L" and hop["headers"]["db"] == "d"
    assert fe.requests[0]["headers"]["Authorization"] == AUTH


def test_a_streamed_body_is_recreated_for_every_hop(servers) -> None:
    be = servers(lambda h, n: answer(h, 200))
    fe = servers(lambda h, n: answer(h, 307, b"", {"Location": be.url + "/load"}))
    made = []

    def body() -> Iterator[bytes]:
        made.append(1)
        yield b"1,a\n"
        yield b"2,b\n"

    HttpClient(fe.url).request("PUT", "/load", body=body)
    assert len(made) == 2 and fe.requests[0]["body"] == be.requests[0]["body"] == b"1,a\n2,b\n"
    assert "Authorization" not in be.requests[0]["headers"]  # no user: no credentials invented


def test_redirect_loops_and_https_downgrades_are_refused(servers, monkeypatch) -> None:
    looping = servers(lambda h, n: answer(h, 307, b"", {"Location": "/again"}))
    with pytest.raises(HttpProtocolError, match="more than 2 redirects"):
        HttpClient(looping.url, max_redirects=2).request("GET", "/")

    client = HttpClient("https://fe:8030", "root", "pw")
    monkeypatch.setattr(client, "_send", lambda *args: http_module._Reply(307, b"", {"Location": "http://be:8040/x"}))
    with pytest.raises(HttpProtocolError, match="refusing to send credentials from https to plain http.*allow_plain_http_redirect"):
        client.request("POST", "/x")


def test_an_allowed_plain_http_redirect_from_https_is_followed(tmp_path, servers) -> None:
    """The StarRocks FE redirects to `http://` even when it serves https (SR-RBA): with consent, the hop is made."""
    import ssl

    ca, cert, key = issue_certificates(tmp_path)
    be = servers(lambda h, n: answer(h, 200, b'{"Status": "OK"}'))
    fe = servers(lambda h, n: answer(h, 307, b"", {"Location": f"{be.url}/api/transaction/load?"}))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    fe.server.socket = context.wrap_socket(fe.server.socket, server_side=True)
    url = fe.url.replace("http://", "https://")
    with pytest.raises(HttpProtocolError, match="from https to plain http"):
        HttpClient(url, "root", "pw", verify=ca).request("PUT", "/api/transaction/load", body=b"1,a\n")
    assert be.requests == []
    with pytest.raises(HttpConnectionError, match="CERTIFICATE_VERIFY_FAILED") as caught:
        HttpClient(url, retries=0, allow_plain_redirect=True).request("PUT", "/api/transaction/load", body=b"1,a\n")
    assert caught.value.maybe_applied is False and be.requests == []  # the certificate is checked for bodies too
    client = HttpClient(url, "root", "pw", verify=ca, allow_plain_redirect=True)
    assert client.request("PUT", "/api/transaction/load", body=b"1,a\n").json() == {"Status": "OK"}
    assert be.requests[0]["body"] == b"1,a\n" and be.requests[0]["headers"]["Authorization"] == AUTH


@pytest.mark.parametrize("streamed", [False, True])
def test_a_body_is_not_uploaded_to_a_server_that_answers_before_asking_for_it(servers, streamed) -> None:
    """`Expect: 100-continue` is honoured: the FE's 307 comes before any body byte is sent, and the body
    goes to the BE only, which asks for it with `100 Continue`."""
    be = servers(lambda h, n: answer(h, 200, b'{"Status": "OK"}'))
    fe = EarlyAnswer(307, {"Location": f"{be.url}/api/transaction/load?"})
    made: list[int] = []
    payload = b"x" * (3 * 1024 * 1024)

    def body() -> Iterator[bytes]:
        made.append(1)
        yield payload[: len(payload) // 2]
        yield payload[len(payload) // 2:]

    try:
        client = HttpClient(fe.url, "root", "pw", continue_timeout=30)  # the 307 must not wait for the timeout
        response = client.request("PUT", "/api/transaction/load", headers={"label": "L"}, body=body if streamed else payload)
    finally:
        fe.close()
    assert response.json() == {"Status": "OK"} and response.redirects == (f"{fe.url}/api/transaction/load",)
    assert fe.received == [0]  # not a byte of the body went to the FE
    (hop,) = be.requests
    assert hop["body"] == payload and hop["headers"]["Expect"] == "100-continue"
    assert made == ([1] if streamed else [])  # a streamed body is made only for the hop that sends it


def test_a_body_goes_after_the_continue_timeout_to_a_server_that_never_asks(servers) -> None:
    """A server that wants the body but never sends `100 Continue` still gets it, once the wait runs out."""
    seen: list[bytes] = []

    class Silent(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def handle_expect_100(self) -> bool:
            return True

        def do_PUT(self) -> None:
            seen.append(self.rfile.read(int(self.headers["Content-Length"])))
            answer(self, 200, b'{"ok": 1}')

    server = ThreadingHTTPServer(("127.0.0.1", 0), Silent)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        client = HttpClient(f"http://127.0.0.1:{server.server_address[1]}", continue_timeout=0.2)
        assert client.request("PUT", "/load", body=b"1,a\n").json() == {"ok": 1}
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [b"1,a\n"]


def test_an_error_answered_before_the_body_is_returned_without_sending_it(servers) -> None:
    fe = EarlyAnswer(401, {"WWW-Authenticate": 'Basic realm=""'})
    try:
        with pytest.raises(AuthenticationError, match="HTTP 401"):
            HttpClient(fe.url, "root", "bad").request("PUT", "/api/transaction/load", body=b"1,a\n" * 1000)
    finally:
        fe.close()
    assert fe.received == [0]


@pytest.mark.parametrize("status", [301, 302, 303])
def test_credentials_follow_only_307_and_308(servers, status) -> None:
    elsewhere = servers(lambda h, n: answer(h, 200, b"{}"))
    fe = servers(lambda h, n: answer(h, status, b"", {"Location": f"{elsewhere.url}/x"}))
    with pytest.raises(HttpProtocolError, match=f"answered HTTP {status} to .*: only 307/308 redirects are followed"):
        HttpClient(fe.url, "root", "pw").request("PUT", "/load", body=b"1,a\n")
    assert elsewhere.requests == []  # nothing, and no credentials, went to the Location


def test_a_request_fails_over_to_the_next_address_that_answers(servers) -> None:
    down = socket.socket()
    down.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    dead = f"http://127.0.0.1:{down.getsockname()[1]}"
    fe2 = servers(lambda h, n: answer(h, 200, b"{}"))
    client = HttpClient(f"{dead},{fe2.url}", "root", "pw", retries=0)
    try:
        assert client.request("PUT", "/load", body=b"x").status == 200  # not idempotent, yet safe: the first saw nothing
        assert client.request("GET", "/again").status == 200
    finally:
        down.close()
    assert [r["path"] for r in fe2.requests] == ["/load", "/again"] and client.base_urls[client._current] == fe2.url
    assert repr(client) == f"HttpClient({dead + ',' + fe2.url!r}, user='root')"


def test_401_is_an_authentication_error_that_names_the_user(servers) -> None:
    fe = servers(lambda h, n: answer(h, 401, b'{"msg": "Access denied"}'))
    with pytest.raises(AuthenticationError, match="check the user \\('root'\\) and password"):
        HttpClient(fe.url, "root", "bad").request("GET", "/", idempotent=True)
    assert len(fe.requests) == 1  # never retried


def test_5xx_is_retried_only_for_idempotent_requests(servers, no_sleep) -> None:
    flaky = servers(lambda h, n: answer(h, 503, b"busy") if n < 3 else answer(h, 200, b'{"ok": 1}'))
    assert HttpClient(flaky.url, retries=3).request("GET", "/", idempotent=True).json() == {"ok": 1}
    assert len(flaky.requests) == 3 and no_sleep == [0.5, 1.0]
    failing = servers(lambda h, n: answer(h, 500, b"boom"))
    with pytest.raises(HttpStatusError, match="answered HTTP 500: 'boom'") as caught:
        HttpClient(failing.url).request("POST", "/commit")
    assert len(failing.requests) == 1 and caught.value.response.status == 500


def test_allowed_error_statuses_are_returned(servers) -> None:
    fe = servers(lambda h, n: answer(h, 404, b"nope"))
    assert HttpClient(fe.url).request("GET", "/", allow_status=[404]).status == 404


def test_a_refused_connection_is_retried_even_when_not_idempotent(no_sleep) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    client = HttpClient(f"http://127.0.0.1:{port}", retries=2, backoff_s=0.1)
    with pytest.raises(HttpConnectionError, match="could not connect") as caught:
        client.request("POST", "/begin")
    assert caught.value.maybe_applied is False and len(no_sleep) == 2


def test_a_dropped_answer_may_have_applied_and_is_retried_only_when_idempotent(servers) -> None:
    dropping = servers(lambda h, n: drop(h) if n <= 2 else answer(h, 200))
    with pytest.raises(HttpConnectionError, match="connection lost before an answer") as caught:
        HttpClient(dropping.url).request("POST", "/commit", body=b"x")
    assert caught.value.maybe_applied is True and len(dropping.requests) == 1
    assert HttpClient(dropping.url).request("GET", "/state", idempotent=True).status == 200
    assert len(dropping.requests) == 3


def test_a_read_timeout_may_have_applied(servers) -> None:
    release = threading.Event()
    slow = servers(lambda h, n: (release.wait(5), answer(h, 200)))
    try:
        with pytest.raises(HttpConnectionError, match="no answer within 0.2s") as caught:
            HttpClient(slow.url, read_timeout=0.2).request("POST", "/prepare")
        assert caught.value.maybe_applied is True
    finally:
        release.set()


def test_non_json_answers_say_where_they_came_from(servers) -> None:
    fe = servers(lambda h, n: answer(h, 200, b"<html>proxy</html>"))
    response = HttpClient(fe.url).request("GET", "/")
    with pytest.raises(HttpProtocolError, match="not JSON: '<html>proxy</html>'.*right service and port"):
        response.json()


def test_the_client_pickles_without_its_connections_and_hides_the_password(servers) -> None:
    fe = servers(lambda h, n: answer(h, 200))
    client = HttpClient(fe.url, "root", "pw")
    client.request("GET", "/")
    copy = pickle.loads(pickle.dumps(client))
    assert copy.request("GET", "/").status == 200 and copy.password == "pw"
    assert "pw" not in repr(copy)


def test_urls_with_credentials_or_without_a_host_are_refused() -> None:
    with pytest.raises(ValueError, match="not inside the URL"):
        HttpClient("http://root:pw@fe:8030")
    with pytest.raises(ValueError, match="expected http"):
        HttpClient("fe:8030")


def test_https_checks_the_certificate_against_the_configured_ca_bundle(tmp_path, monkeypatch) -> None:
    import ssl

    from streaming_sink.targets import target_from_url
    from streaming_sink.targets.starrocks import StarRocksTarget

    ca, cert, key = issue_certificates(tmp_path)
    server = Recorder(lambda h, n: answer(h, 200, b"{}"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.server.socket = context.wrap_socket(server.server.socket, server_side=True)
    url = server.url.replace("http://", "https://")
    try:
        assert HttpClient(url, verify=ca).request("GET", "/x").status == 200
        with pytest.raises(HttpConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            HttpClient(url, retries=0).request("GET", "/x")  # the system's CAs do not know the test CA
        from urllib3.exceptions import InsecureRequestWarning

        with pytest.warns(InsecureRequestWarning):
            assert HttpClient(url, verify=False).request("GET", "/x").status == 200
    finally:
        server.close()
    assert StarRocksTarget(url, "db", "u", ca_bundle=ca).http.verify == ca
    monkeypatch.setenv("STREAMING_SINK_TARGET_USER", "u")
    over_tls = target_from_url("doriss://fe1:8443,fe2:8443", "db", {"verify": False})
    assert over_tls.http.base_urls == ["https://fe1:8443", "https://fe2:8443"] and over_tls.http.verify is False
