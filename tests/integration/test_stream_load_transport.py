"""How StarRocks and Doris loads travel: bodies go to the BE only, and an https FE's plain-http BE hop.

Both FEs answer a load with a 307 to a BE without reading its body, and never send `100 Continue`
(docs/protocol.md, Common: redirects). A client that uploads before it knows where to send the body
uploads it twice, and newer StarRocks FEs reset such connections; so the emulators count the body
bytes each listener receives, and a load must leave the FE's count at zero.

The StarRocks FE builds every 307 with scheme `http` (SR-RBA), also when it serves https: the
target option `allow_plain_http_redirect` is the explicit consent to that hop, and without it an
https StarRocks FE is refused at start, before anything is loaded.
"""
from __future__ import annotations

import base64
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink.committable import TxnRef
from streaming_sink.doctor import diagnose
from streaming_sink.targets import PASSWORD_ENV, USER_ENV, ConfigurationError
from streaming_sink.targets.base import CommitOutcome
from streaming_sink.targets.doris import DorisTarget
from streaming_sink.targets.starrocks import StarRocksTarget
from tests.support.doubles.emulators.doris import DorisEmulator
from tests.support.doubles.emulators.starrocks import StarRocksEmulator
from tests.support.tls import issue_certificates

DB, TABLE, PASSWORD = "db", "t", "pw"
COLUMNS = [("id", "BIGINT"), ("name", "VARCHAR(256)")]
MiB = 1024 * 1024


def big_rows(count: int = 24_000) -> pa.Table:
    """About 3 MiB of CSV: several load pieces at a small chunk size."""
    ids = list(range(count))
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"{i:08d}-" + "x" * 120 for i in ids]})


def as_tuples(table: pa.Table) -> list[tuple[Any, ...]]:
    return [tuple(row.values()) for row in table.to_pylist()]


def starrocks_load(target: StarRocksTarget, table: pa.Table, label: str = "L1") -> CommitOutcome:
    ref = TxnRef("starrocks", DB, TABLE, label, 0, "e1w0t0")
    txn = target.begin(TABLE, lambda chunk: ref, lambda recorded: None)
    txn.write(table)
    (part,) = txn.prepare()
    return target.commit(part.committable("checksum"))


@pytest.fixture
def sr(starrocks_emulator: Callable[..., StarRocksEmulator]) -> StarRocksEmulator:
    return starrocks_emulator(password=PASSWORD, columns=COLUMNS)


@pytest.fixture
def certificates(tmp_path: Path) -> tuple[str, str, str]:
    directory = tmp_path / "tls"
    directory.mkdir()
    return issue_certificates(directory)


@pytest.fixture
def sr_tls(tmp_path: Path, certificates: tuple[str, str, str]) -> Iterator[StarRocksEmulator]:
    """A StarRocks emulator whose FE serves https with a test CA's certificate; its BE stays plain http."""
    _, cert, key = certificates
    emu = StarRocksEmulator(tmp_path / "sr_tls", password=PASSWORD)
    emu.serve_fe_over_tls(cert, key)
    with emu:
        emu.create_table(DB, TABLE, COLUMNS)
        yield emu


def sr_target(url: str, **options: Any) -> StarRocksTarget:
    return StarRocksTarget(url, DB, "root", PASSWORD, backoff_s=0.0, backoff_max_s=0.0, read_timeout=30.0, **options)


# -- bodies go to the BE only ----------------------------------------------------------------------


def first_answer_line(port: int, head: str) -> bytes:
    """Send only a request's head, announcing a body with `Expect: 100-continue`; the status line that comes back."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(head.encode("latin-1"))
        return conn.makefile("rb").readline()


@pytest.mark.parametrize("product", ["starrocks", "doris"])
def test_the_emulators_answer_an_expected_body_as_the_servers_do(tmp_path: Path, product: str) -> None:
    """The FE answers the 307 from the headers and never sends `100 Continue`; the BE asks for the body."""
    emulator = StarRocksEmulator(tmp_path / "sr", password=PASSWORD) if product == "starrocks" else DorisEmulator(
        tmp_path / "doris", password=PASSWORD)
    auth = base64.b64encode(f"root:{PASSWORD}".encode()).decode()
    path = "/api/transaction/load" if product == "starrocks" else f"/api/{DB}/{TABLE}/_stream_load"
    with emulator as emu:
        emu.create_table(DB, TABLE, COLUMNS)
        if product == "starrocks":  # a load needs a begun transaction whose coordinator the FE knows
            begin = f"POST /api/transaction/begin HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\nlabel: L\r\n" \
                    f"db: {DB}\r\ntable: {TABLE}\r\nContent-Length: 0\r\n\r\n"
            assert first_answer_line(emu.fe_port, begin).startswith(b"HTTP/1.1 307")
            assert first_answer_line(emu.be_port, begin).startswith(b"HTTP/1.1 200")
        head = (f"PUT {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\nlabel: L\r\ndb: {DB}\r\n"
                f"table: {TABLE}\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
        assert first_answer_line(emu.fe_port, head).startswith(b"HTTP/1.1 307")
        assert first_answer_line(emu.be_port, head) == b"HTTP/1.1 100 Continue\r\n"
        assert emu.body_bytes == {"fe": 0, "be": 0}


def test_a_starrocks_load_of_several_mib_sends_no_body_byte_to_the_fe(sr: StarRocksEmulator) -> None:
    table = big_rows()
    target = sr_target(sr.fe_url, load_chunk_bytes=MiB)
    assert starrocks_load(target, table) is CommitOutcome.COMMITTED
    assert sorted(sr.visible_rows(DB, TABLE)) == as_tuples(table)
    assert sr.body_bytes["be"] > 2 * MiB  # every piece reached the BE once ...
    assert sr.body_bytes["fe"] == 0  # ... and none was uploaded to the FE first


def test_a_doris_load_of_several_mib_sends_no_body_byte_to_the_fe(tmp_path: Path) -> None:
    table = big_rows()
    with DorisEmulator(tmp_path / "doris") as emu:
        emu.create_table(DB, TABLE, COLUMNS)
        target = DorisTarget(emu.fe_url, DB, "root", "", backoff_s=0.01, piece_bytes=MiB)
        ref = TxnRef("doris", DB, TABLE, "L_c0", 0, "e1w0t0")
        txn = target.begin(TABLE, lambda chunk: ref, lambda recorded: None)
        txn.write(table)
        (part,) = txn.prepare()
        assert target.commit(part.committable("sum")) is CommitOutcome.COMMITTED
        assert sorted(emu.visible_rows(DB, TABLE)) == as_tuples(table)
        assert emu.body_bytes["be"] > 2 * MiB
        assert emu.body_bytes["fe"] == 0


# -- an https StarRocks FE -----------------------------------------------------------------------------


def test_an_https_starrocks_fe_loads_over_its_plain_http_be_when_allowed(
        sr_tls: StarRocksEmulator, certificates: tuple[str, str, str]) -> None:
    ca, _, _ = certificates
    assert sr_tls.fe_url.startswith("https://") and sr_tls.be_url.startswith("http://")
    target = sr_target(sr_tls.fe_url, ca_bundle=ca, allow_plain_http_redirect=True, load_chunk_bytes=MiB)
    assert target.routable_tables() is None
    table = big_rows(6000)
    assert starrocks_load(target, table) is CommitOutcome.COMMITTED
    assert sorted(sr_tls.visible_rows(DB, TABLE)) == as_tuples(table)
    assert sr_tls.body_bytes["fe"] == 0


def test_an_https_starrocks_fe_without_the_option_is_refused_at_start(
        sr_tls: StarRocksEmulator, certificates: tuple[str, str, str]) -> None:
    ca, _, _ = certificates
    target = sr_target(sr_tls.fe_url, ca_bundle=ca)
    with pytest.raises(ConfigurationError, match="allow_plain_http_redirect") as caught:
        target.routable_tables()
    message = str(caught.value)
    assert "\n" not in message and "plain http" in message
    with pytest.raises(ConfigurationError, match="allow_plain_http_redirect must be true or false, got 'false'"):
        sr_target(sr_tls.fe_url, ca_bundle=ca, allow_plain_http_redirect="false")
    assert sr_tls.transactions(DB) == [] and sr_tls.body_bytes == {"fe": 0, "be": 0}  # nothing was loaded


def test_an_https_doris_fe_without_the_option_is_refused_at_start(tmp_path: Path, certificates: tuple[str, str, str]) -> None:
    """The Doris FE also redirects to plain http (D-RBC), so the same start-up refusal holds."""
    ca, cert, key = certificates
    emu = DorisEmulator(tmp_path / "doris_tls")
    emu.serve_fe_over_tls(cert, key)
    with emu:
        target = DorisTarget(emu.fe_url, DB, "root", "", ca_bundle=ca)
        with pytest.raises(ConfigurationError, match="FE redirects every load to a BE over plain http.*allow_plain_http_redirect"):
            target.routable_tables()
        assert emu.transactions() == [] and emu.body_bytes == {"fe": 0, "be": 0}


def test_the_doctor_names_the_plain_http_hop(
        sr_tls: StarRocksEmulator, certificates: tuple[str, str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ca, _, _ = certificates
    monkeypatch.setenv(USER_ENV, "root")
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)

    def no_kafka() -> None:
        raise RuntimeError("no Kafka in this test")

    def checks(**options: Any) -> dict[str, Any]:
        spec = SimpleNamespace(
            job_id="doc", target_url=sr_tls.fe_url.replace("https://", "starrockss://"), database=DB,
            target_options={"ca_bundle": ca, **options}, state_url=f"file://{tmp_path / 'state'}", kafka_source=no_kafka,
        )
        return {check.name: check for check in diagnose(spec, 3600, spark=None)}  # type: ignore[arg-type]

    refused = checks()
    with pytest.raises(ConfigurationError) as caught:
        sr_target(sr_tls.fe_url, ca_bundle=ca).routable_tables()
    assert refused["target"].verdict == "FAIL" and refused["target"].detail == f"ConfigurationError: {caught.value}"

    allowed = checks(allow_plain_http_redirect=True)
    assert allowed["target"].verdict == "OK"
    hop = allowed["target transport"]
    assert hop.verdict == "WARN" and "plain http" in hop.detail and "allow_plain_http_redirect" in hop.detail
