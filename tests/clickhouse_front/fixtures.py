"""Pytest fixture for the ClickHouse HTTP front (imported by tests/conftest.py).

* ``clickhouse_front`` (function): a started ``ClickHouseFront`` over chdb at ``tmp_path/clickhouse-front``;
  its faults are reset and the engine closed at the end. chdb opens one data path per process, so a
  test using it must not hold another chdb path open in the same process (run a twin elsewhere).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from .server import ClickHouseFront

__all__ = ["clickhouse_front"]


@pytest.fixture
def clickhouse_front(tmp_path: Path) -> Iterator[ClickHouseFront]:
    """A ClickHouse HTTP server on 127.0.0.1 (free port) executing in chdb; `.url`, `.target_url`, `.faults`."""
    front = ClickHouseFront(tmp_path / "clickhouse-front").start()
    try:
        yield front
    finally:
        front.stop()
