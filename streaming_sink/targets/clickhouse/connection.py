"""How the ClickHouse target talks to its server: one client per thread over HTTP, or the process's one
embedded chdb engine per path, statements repeated after transport errors, and clickhouse-connect's
errors translated into the sink's own at this edge.

Two levels of repeat, both bounded by the target's `retries` and backoff:

* a statement (`StatementRetries`): one that failed on a transient fault (`errors.TRANSIENT_CAUSES`) is sent again
  when that is safe whatever the server did with it (`repeatable_statement`: reads, `SYSTEM SYNC REPLICA`, DDL with
  IF [NOT] EXISTS), or when the fault proves the request never reached the server (connection refused). Anything
  else (an INSERT, a MOVE, a CREATE of a staging table whose answer was lost) raises: its caller knows how to resume
  (a staging insert counts its rows, a commit repeats itself from the ledger, a writer's pass is written again by the
  sink under fresh labels);
* a sequence (`Connection.repeating`): a commit, an abort or a check repeated whole after a transport error or an
  error answer, each repeat resuming where the last stopped.
"""
from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlparse

from ...errors import transient_cause
from ...retry import RetryPolicy
from ..base import TargetError
from ..per_thread import PerThread

_T = TypeVar("_T")
_CHDB_CLIENTS: dict[str, Any] = {}  # one embedded engine per path per process
_CHDB_LOCK = threading.Lock()


class ClickHouseError(TargetError):
    """clickhouse-connect's error (unreachable, refused, failing) as the sink's own, past the target's edge."""

    headline = "ClickHouse failed: {error}; check that it runs and that target.url (or --target) names it"


#: Statements whose second run leaves the server as one run would, whatever became of the first.
_REPEATABLE = re.compile(
    r"\s*(?:SELECT|WITH|EXISTS|SHOW|DESC|DESCRIBE|SYSTEM\s+(?:SYNC\s+REPLICA|STOP\s+MERGES|START\s+MERGES)|"
    r"CREATE\s+(?:TABLE|DATABASE)\s+IF\s+NOT\s+EXISTS|DROP\s+(?:TABLE|DATABASE)\s+IF\s+EXISTS|"
    r"ALTER\s+TABLE\s+\S+\s+ADD\s+COLUMN\s+IF\s+NOT\s+EXISTS)\b", re.IGNORECASE)
#: An ALTER that does more than add columns if missing (a name that merely reads like one is taken as one: no repeat).
_OTHER_ALTERATIONS = re.compile(r"\b(?:MOVE|DELETE|UPDATE|DROP|ATTACH|DETACH|REPLACE|MODIFY|RENAME|FREEZE|CLEAR|"
                                r"MATERIALIZE)\b", re.IGNORECASE)
_SYNC_REPLICA = re.compile(r"\s*SYSTEM\s+SYNC\s+REPLICA\b", re.IGNORECASE)


def repeatable_statement(sql: str) -> bool:
    """Whether `sql` may be sent again after a fault that may have cut it after the server ran it."""
    if not _REPEATABLE.match(sql):
        return False
    return not (re.match(r"\s*ALTER\b", sql, re.IGNORECASE) and _OTHER_ALTERATIONS.search(sql))


class StatementRetries:
    """A clickhouse-connect client whose statements are sent again after a transient fault where that is safe (the
    module says when), with the connection's policy; everything else is the client's own.

    A read that followed a `SYSTEM SYNC REPLICA` is sent again with it: a new connection may reach another replica,
    which the sync must bring up to date first (ledger.py reads that way)."""

    def __init__(self, client: Any, policy: RetryPolicy) -> None:
        self._client, self._policy = client, policy
        self._synced: Callable[[], Any] | None = None  # the last statement, if it synced a replica

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def command(self, cmd: str, *args: Any, **kwargs: Any) -> Any:
        synced, self._synced = self._synced, None
        result = self._send(cmd, repeatable_statement(cmd), lambda: self._client.command(cmd, *args, **kwargs), synced)
        if _SYNC_REPLICA.match(cmd):
            self._synced = lambda: self._client.command(cmd, *args, **kwargs)
        return result

    def query(self, query: str, *args: Any, **kwargs: Any) -> Any:
        synced, self._synced = self._synced, None
        return self._send(query, repeatable_statement(query), lambda: self._client.query(query, *args, **kwargs), synced)

    def insert_arrow(self, table: str, *args: Any, **kwargs: Any) -> Any:
        """Sent again only when it never reached the server: an insert that may have landed is its caller's to judge."""
        self._synced = None
        return self._send(f"INSERT INTO {table}", False, lambda: self._client.insert_arrow(table, *args, **kwargs), None)

    def _send(self, sql: str, repeatable: bool, step: Callable[[], _T], synced: Callable[[], Any] | None) -> _T:
        first = [True]

        def attempt() -> _T:
            if synced is not None and not first[0]:
                synced()
            first[0] = False
            return step()

        def transient(error: BaseException) -> bool:
            cause = transient_cause(error)
            return cause is not None and (repeatable or not cause.reached_server)

        return self._policy.run(f"ClickHouse statement {sql.strip()[:60]!r}", attempt, transient)


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
            client = self._client(clickhouse_connect)
        except Error as error:
            raise ClickHouseError(str(error)) from error
        return client

    def _policy(self) -> RetryPolicy:
        return RetryPolicy(0 if self.embedded else self.retries, self.backoff_s, self.backoff_max_s)

    def _client(self, clickhouse_connect: Any) -> Any:
        if self.embedded:
            with _CHDB_LOCK:
                if self.url not in _CHDB_CLIENTS:
                    _CHDB_CLIENTS[self.url] = clickhouse_connect.get_client(dsn=self.url)
                return _CHDB_CLIENTS[self.url]
        if getattr(self._local, "client", None) is None:
            parsed = urlparse(self.url)
            client = clickhouse_connect.get_client(
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
            # one wrapper per client, kept with it: a statement's re-send knows the sync before it (StatementRetries)
            self._local.client = StatementRetries(client, self._policy()) if self.retries else client
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
            return self._policy().run(f"ClickHouse {what}", step, repeatable)
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
