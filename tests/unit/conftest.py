"""Unit tests start nothing: no server, no service, no embedded database. Those tests live in tests/integration.

Three checks, each simple and on what a test does rather than on how it is spelled:

* the fixtures that start a service (Redis, Kafka, Spark, the ClickHouse HTTP front) are redefined here to fail,
  so a unit test that asks for one, even through `request.getfixturevalue`, fails before anything starts;
* `socket.listen` fails inside a unit test: that is what every in-process server does (the StarRocks and Doris
  emulators, an `http.server`, the metrics exporter), whatever module it comes from;
* a unit test after which chdb (the embedded ClickHouse) is imported and was not before fails.

A subprocess that starts a server is not seen by these checks: the fixtures above are the way tests start one.
"""
from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

#: Fixture name -> what it would start (tests/support/fixtures.py).
SERVICE_FIXTURES = {
    "redis_server": "a Redis server",
    "kafka_broker": "a Kafka broker",
    "secured_kafka_broker": "a Kafka broker",
    "new_topic": "a Kafka broker",
    "spark_session": "a Spark session",
    "spark": "a Spark session",
    "clickhouse_front": "the ClickHouse HTTP front",
    "starrocks_emulator": "the StarRocks emulator",
    "sr": "the StarRocks emulator",
}

MOVE_IT = "unit tests start nothing: move this test to tests/integration"


def _refusing(name: str, what: str) -> Any:
    @pytest.fixture(name=name)
    def refuse(request: pytest.FixtureRequest) -> Any:
        pytest.fail(f"{MOVE_IT} (it asks for `{name}`, which starts {what})", pytrace=False)

    return refuse


for _name, _what in SERVICE_FIXTURES.items():
    globals()[f"_refuse_{_name}"] = _refusing(_name, _what)


@pytest.fixture(autouse=True)
def _starts_nothing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def listen(self: socket.socket, *args: Any) -> None:
        pytest.fail(f"{MOVE_IT} (it opened a listening socket on {self.getsockname()})", pytrace=False)

    monkeypatch.setattr(socket.socket, "listen", listen)
    chdb_before = "chdb" in sys.modules
    yield
    if not chdb_before and "chdb" in sys.modules:
        pytest.fail(f"{MOVE_IT} (it imported chdb, the embedded ClickHouse)", pytrace=False)
