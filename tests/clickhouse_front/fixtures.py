"""Pytest fixtures for the ClickHouse HTTP front (imported by tests/conftest.py).

* ``clickhouse_front`` (function): a started ``ClickHouseFront`` over chdb at ``tmp_path/clickhouse-front``;
  its faults are reset and the engine closed at the end. chdb opens one data path per process, so a
  test using it must not hold another chdb path open in the same process (run a twin elsewhere).
* ``clickhouse_url`` (function, parametrized ``chdb`` / ``http``): the real engine at ``tmp_path/ch`` as a
  ``ClickHouseTarget`` (or a job's ``target_url``) reaches it: embedded, ``chdb://…`` (writers in the driver),
  or over HTTP through a front started on that path, ``http://127.0.0.1:<port>`` (writers in Spark tasks).
  A test that takes it runs once each way: the HTTP path must pass what the embedded one passes.
* ``clickhouse_target`` (function, through ``clickhouse_url``): a ``ClickHouseTarget`` there for the database
  ``analytics``, created empty; closed at the end.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from streaming_sink.targets.clickhouse import ClickHouseTarget

from .server import ClickHouseFront

__all__ = ["clickhouse_front", "clickhouse_target", "clickhouse_url"]


@pytest.fixture
def clickhouse_front(tmp_path: Path) -> Iterator[ClickHouseFront]:
    """A ClickHouse HTTP server on 127.0.0.1 (free port) executing in chdb; `.url`, `.target_url`, `.faults`."""
    front = ClickHouseFront(tmp_path / "clickhouse-front").start()
    try:
        yield front
    finally:
        front.stop()


@pytest.fixture(params=["chdb", "http"])
def clickhouse_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """`chdb://<tmp_path>/ch`, or `http://…` of a front on that path (stopped after the test's own teardown)."""
    if request.param == "chdb":
        yield f"chdb://{tmp_path / 'ch'}"
        return
    with ClickHouseFront(tmp_path / "ch") as front:
        yield front.url


@pytest.fixture
def clickhouse_target(clickhouse_url: str) -> Iterator[ClickHouseTarget]:
    """The target of `clickhouse_url` for database `analytics` (created here, empty)."""
    target = ClickHouseTarget(clickhouse_url, database="analytics")
    try:
        target.client().command("CREATE DATABASE analytics")
        yield target
    finally:
        target.close()
