"""Moved to tests/support/doubles/clickhouse_front; `tests.clickhouse_front[.server|.twin]` stays importable for one
release (the same module objects, not copies)."""
import importlib
import sys

for _name in ("server", "twin"):
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"tests.support.doubles.clickhouse_front.{_name}")

from tests.support.doubles.clickhouse_front import ClickHouseFront, Fault, Faults  # noqa: E402

__all__ = ["ClickHouseFront", "Fault", "Faults"]
