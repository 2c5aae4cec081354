"""fetch_table_columns against both emulators' `_schema` endpoints (docs/protocol.md, "Common: table schema endpoint")."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from streaming_sink.errors import ConfigurationError
from streaming_sink.targets.streamload.http import HttpClient
from streaming_sink.targets.streamload.table_schema import fetch_table_columns
from tests.support.doubles.emulators.doris import DorisEmulator
from tests.support.doubles.emulators.starrocks import StarRocksEmulator

COLUMNS = [("id", "BIGINT NOT NULL"), ("name", "VARCHAR(10)"), ("price", "DECIMAL(10,2)"), ("big", "DECIMAL(30,4)"),
           ("ts", "DATETIME"), ("day", "DATE"), ("doc", "JSON"), ("tags", "ARRAY<INT>"), ("attrs", "MAP<VARCHAR(10),INT>"),
           ("ok", "BOOLEAN"), ("text", "STRING")]


@pytest.fixture(params=["starrocks", "doris", "doris-4.0"])
def emulator(request: Any, tmp_path: Any) -> Iterator[Any]:
    if request.param == "starrocks":
        emu: Any = StarRocksEmulator(tmp_path / "sr", password="pw")
    else:
        version = "4.0.1" if request.param == "doris-4.0" else "2.1.8"
        emu = DorisEmulator(tmp_path / "doris", password="pw", version=version)
    with emu:
        emu.create_table("db", "t", COLUMNS)
        yield emu


def client(emu: Any, password: str = "pw") -> HttpClient:
    return HttpClient(emu.fe_url, "root", password, retries=0)


def test_columns_in_table_order_with_decimal_arguments(emulator: Any) -> None:
    columns = fetch_table_columns(client(emulator), "db", "t")
    assert columns is not None and list(columns) == [name for name, _ in COLUMNS]
    doris_4 = isinstance(emulator, DorisEmulator) and emulator.profile.schema_nullability
    nested = "INVALID_TYPE" if isinstance(emulator, StarRocksEmulator) else None
    assert columns == {
        "id": "BIGINT NOT NULL" if doris_4 else "BIGINT",  # nullability only where the server reports it
        "name": "VARCHAR",  # no lengths in the answer
        "price": "DECIMAL(10,2)", "big": "DECIMAL(30,4)", "ts": "DATETIME", "day": "DATE", "doc": "JSON",
        "tags": nested or "ARRAY", "attrs": nested or "MAP", "ok": "BOOLEAN",
        "text": "VARCHAR" if isinstance(emulator, StarRocksEmulator) else "STRING",
    }


def test_unknown_table_and_database_name_the_table(emulator: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"db\.missing"):
        fetch_table_columns(client(emulator), "db", "missing")
    with pytest.raises(ConfigurationError, match=r"nodb\.t"):
        fetch_table_columns(client(emulator), "nodb", "t")


def test_refused_credentials_name_the_table(emulator: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"db\.t.*refused"):
        fetch_table_columns(client(emulator, "wrong"), "db", "t")


def test_server_without_the_endpoint_gives_none(emulator: Any) -> None:
    # The BE listener serves no `_schema`: a plain 404, as from a server that lacks the endpoint.
    assert fetch_table_columns(HttpClient(emulator.be_url, "root", "pw", retries=0), "db", "t") is None


def test_table_names_are_one_path_segment(emulator: Any) -> None:
    with pytest.raises(ConfigurationError):
        fetch_table_columns(client(emulator), "db", "t/../../x")
