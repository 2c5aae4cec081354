"""How the ClickHouse target talks to its server: one client per thread over HTTP, or the process's one
embedded chdb engine per path, statements repeated after transport errors, and clickhouse-connect's
errors translated into the sink's own at this edge."""
from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlparse

from ...retry import RetryPolicy
from ..base import TargetError
from ..per_thread import PerThread

_T = TypeVar("_T")
_CHDB_CLIENTS: dict[str, Any] = {}  # one embedded engine per path per process
_CHDB_LOCK = threading.Lock()


class ClickHouseError(TargetError):
    """clickhouse-connect's error (unreachable, refused, failing) as the sink's own, past the target's edge."""

    headline = "ClickHouse failed: {error}; check that it runs and that target.url (or --target) names it"


def quote(identifier: str) -> str:
    return "`" + identifier.replace("\\", "\\\\").replace("`", "\\`") + "`"


def literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Connection(PerThread):
    """The server of one target database: clients, repeats, and the few questions every part asks of it.

    Pickled to Spark tasks without its clients (each thread opens its own)."""

    def __init__(self, url: str, database: str, user: str | None, password: str | None, settings: dict[str, Any],
                 verify: bool, ca_bundle: str | None, connect_timeout_s: float, read_timeout_s: float,
                 retries: int, backoff_s: float, backoff_max_s: float) -> None:
        self.url, self.database = url, database
        self.user, self.password = user, password
        self.settings = settings
        self.verify, self.ca_bundle = verify, ca_bundle  # https: check the certificate, against these CAs
        # HTTP: how long the client waits to connect and for an answer, and how often a statement sequence is
        # repeated after a transport error or an error answer of the server (each repeat resumes where it stopped)
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.retries, self.backoff_s, self.backoff_max_s = retries, backoff_s, backoff_max_s
        super().__init__()  # this thread's client, left behind by pickling

    @property
    def embedded(self) -> bool:
        return self.url.startswith("chdb:")

    def client(self) -> Any:
        """A client for this thread (HTTP) or the process's one engine for the path (chdb)."""
        import clickhouse_connect
        from clickhouse_connect.driver.exceptions import Error

        try:
            return self._client(clickhouse_connect)
        except Error as error:
            raise ClickHouseError(str(error)) from error

    def _client(self, clickhouse_connect: Any) -> Any:
        if self.embedded:
            with _CHDB_LOCK:
                if self.url not in _CHDB_CLIENTS:
                    _CHDB_CLIENTS[self.url] = clickhouse_connect.get_client(dsn=self.url)
                return _CHDB_CLIENTS[self.url]
        if getattr(self._local, "client", None) is None:
            parsed = urlparse(self.url)
            self._local.client = clickhouse_connect.get_client(
                host=parsed.hostname,
                port=parsed.port or (8443 if parsed.scheme == "https" else 8123),
                secure=parsed.scheme == "https",
                username=self.user or "default",
                password=self.password or "",
                settings=self.settings,
                verify=self.verify,
                ca_cert=self.ca_bundle,
                connect_timeout=math.ceil(self.connect_timeout_s),  # clickhouse-connect takes whole seconds
                send_receive_timeout=math.ceil(self.read_timeout_s),
            )
        return self._local.client

    def repeating(self, what: str, step: Callable[[], _T]) -> _T:
        """`step()`, repeated with the retry policy after a transport error or an error answer of the server
        (clickhouse-connect's DatabaseError, OperationalError included), each time on a fresh connection; the
        sink's own errors raise at once. Embedded chdb has no transport: nothing is repeated."""
        from clickhouse_connect.driver.exceptions import DatabaseError

        def repeatable(error: BaseException) -> bool:
            if not isinstance(error, (DatabaseError, ClickHouseError)):
                return False
            self.close()
            return True

        try:
            return RetryPolicy(0 if self.embedded else self.retries, self.backoff_s, self.backoff_max_s).run(
                f"ClickHouse {what}", step, repeatable)
        except DatabaseError as error:  # the last one, as the sink's own
            raise ClickHouseError(str(error)) from error

    def close(self) -> None:
        """Close this thread's HTTP client, or the process's chdb engine (a process opens one path at a time)."""
        if self.embedded:
            with _CHDB_LOCK:
                client = _CHDB_CLIENTS.pop(self.url, None)
        else:
            client = getattr(self._local, "client", None)
            self._local.client = None
        if client is not None:
            client.close()

    def table(self, name: str) -> str:
        """`name` of the target database, quoted for SQL."""
        return f"{quote(self.database)}.{quote(name)}"

    def exists(self, table: str) -> bool:
        return bool(self.client().command(f"EXISTS TABLE {self.table(table)}"))

    def sync_replica(self, table: str) -> None:
        """Make this session's replica fetch every part the replicated table's log names (`SYSTEM SYNC REPLICA …
        LIGHTWEIGHT`, ClickHouse 23.4+), so reads after it in the same session see every part written before."""
        self.client().command(f"SYSTEM SYNC REPLICA {self.table(table)} LIGHTWEIGHT")

    def count_rows(self, table: str) -> int:
        return int(self.client().query(f"SELECT count() FROM {self.table(table)}").result_rows[0][0])

    def partition_sizes(self, table: str) -> dict[str, tuple[int, int]]:
        """partition id -> (rows, uncompressed bytes) of the table's active parts; an error if the table is gone. An
        empty listing is checked after it (so it means empty, not gone); a listed part is a table that was there."""
        rows = self.client().query(
            "SELECT partition_id, sum(rows), sum(data_uncompressed_bytes) FROM system.parts "
            "WHERE database = {db:String} AND table = {t:String} AND active GROUP BY partition_id",
            parameters={"db": self.database, "t": table},
        ).result_rows
        if not rows and not self.exists(table):
            raise TargetError(f"staging table {self.table(table)} does not exist")
        return {str(r[0]): (int(r[1]), int(r[2])) for r in rows}

    def drop(self, table: str) -> None:
        self.client().command(f"DROP TABLE IF EXISTS {self.table(table)} SYNC")
