"""What a replicated ClickHouse target needs from its server before a commit can trust what one replica says, checked
for `doctor` (conformance review 2026-11-27, divergence 9; docs/clickhouse-clusters.md, "Replicas behind a load
balancer"): every commit on replicated tables syncs the ledger and the staging table with `SYSTEM SYNC REPLICA …
LIGHTWEIGHT`, which needs ClickHouse 23.4 or newer (ClickHouse PR 48085) and the `SYSTEM SYNC REPLICA` grant on the
target database (the staging tables are made per label, so a grant on the ledger alone is not enough)."""
from __future__ import annotations

import re

from ..base import ConfigurationError
from .connection import Connection
from .engines import REPLICATED_PREFIXES
from .ledger import LEDGER_TABLE

#: the first release with `SYSTEM SYNC REPLICA … LIGHTWEIGHT`
LIGHTWEIGHT_SYNC_SINCE = (23, 4)
_REPLICATED_DATABASES = ("Replicated", "Shared")


def version_refusal(version: str) -> str | None:
    """Why a server of this version cannot commit into replicated tables (None: it can, or the version is unreadable)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or (int(found.group(1)), int(found.group(2))) >= LIGHTWEIGHT_SYNC_SINCE:
        return None
    return (f"ClickHouse {version} has no SYSTEM SYNC REPLICA … LIGHTWEIGHT (23.4 and newer), which every commit into "
            "replicated tables runs before it reads the ledger or lists a staging table: upgrade the server")


def replica_readiness(connection: Connection) -> str:
    """For doctor: the server's version and, where the target database is replicated, that the ledger can be synced
    (version and grant together); raises ConfigurationError naming what to change."""
    client, database = connection.client(), connection.database
    version = str(client.query("SELECT version()").result_rows[0][0])
    database_engine = client.query("SELECT engine FROM system.databases WHERE name = {db:String}",
                                   parameters={"db": database}).result_rows
    engines = {str(name): str(engine) for name, engine in client.query(
        "SELECT name, engine FROM system.tables WHERE database = {db:String}", parameters={"db": database}).result_rows}
    replicated = (bool(database_engine) and str(database_engine[0][0]) in _REPLICATED_DATABASES) or any(
        engine.startswith(REPLICATED_PREFIXES) for engine in engines.values())
    if not replicated:
        return f"ClickHouse {version}; the tables of {database!r} are one server's: nothing to sync between replicas"
    why = version_refusal(version)
    if why:
        raise ConfigurationError(why)
    ledger = connection.table(LEDGER_TABLE)
    if LEDGER_TABLE not in engines:
        return f"ClickHouse {version}, replicated; the ledger {ledger} does not exist yet, so the sync grant is not checked"
    if not engines[LEDGER_TABLE].startswith(REPLICATED_PREFIXES):
        raise ConfigurationError(
            f"the ledger {ledger} is a {engines[LEDGER_TABLE]} in a replicated database: each server keeps its own, so a "
            "replica that did not write a commit's rows cannot see them; create it as ReplicatedMergeTree "
            "(docs/clickhouse-clusters.md, \"Replicas behind a load balancer\")")
    try:
        connection.sync_replica(LEDGER_TABLE)
    except Exception as error:  # the server's answer names the missing grant (ACCESS_DENIED) or the timeout
        raise ConfigurationError(
            f"SYSTEM SYNC REPLICA {ledger} LIGHTWEIGHT failed ({error}); every commit runs it, on the ledger and on "
            f"each staging table: GRANT SYSTEM SYNC REPLICA ON {database}.* TO <the sink's user>") from None
    return (f"ClickHouse {version}, replicated: SYSTEM SYNC REPLICA … LIGHTWEIGHT works on the ledger (the staging tables "
            f"need the grant on {database}.* as well)")
