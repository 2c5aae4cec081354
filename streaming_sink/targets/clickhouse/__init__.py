"""The ClickHouse target: stock ClickHouse has no prepared transactions, so a staging table plays one
(target.py has the protocol; connection.py the server; ledger.py how far each commit got; catalog.py and
engines.py which tables a commit mode can load; insert_commit.py the commit that views see; staging.py the
data phase; change_tables.py upserts and deletes into ReplacingMergeTree; column_types.py the value rules;
readiness.py what `doctor` checks of the server)."""
from .connection import ClickHouseError, literal, quote
from .ledger import COMMITTED, INSERTING, LEDGER_TABLE, MOVING
from .target import DESCRIPTOR, INSERT_CRASH_POINT, ClickHouseTarget, clickhouse_type

__all__ = ["COMMITTED", "DESCRIPTOR", "INSERTING", "INSERT_CRASH_POINT", "LEDGER_TABLE", "MOVING", "ClickHouseError",
           "ClickHouseTarget", "clickhouse_type", "literal", "quote"]
