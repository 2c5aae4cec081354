"""The twin: the same statements run directly in chdb (clickhouse-connect's chdb client) on another path.

chdb opens one data path per process, and the front holds its own in this one, so the twin runs in
a spawned process and answers over a pipe. Answers are normalised to plain data (`outcome`) so the
front's and the twin's can be compared with `==`: for a query its column names, type names and
rows; for a command its value (or that it gave a summary), for an insert its written rows; for an error its code and name.
"""
from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection
from typing import Any


def outcome(client: Any, method: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """Call `client.<method>` and describe what came back as plain, comparable data."""
    from clickhouse_connect.driver.exceptions import DatabaseError
    from clickhouse_connect.driver.summary import QuerySummary

    try:
        result = getattr(client, method)(*args, **kwargs)
    except DatabaseError as error:
        return ("error", error.code, error.name)
    if isinstance(result, QuerySummary):  # chdb's client reports written rows for inserts only (a server: always)
        return ("summary", int(result.summary.get("written_rows", 0) or 0)) if method.startswith("insert") else ("summary",)
    if hasattr(result, "result_rows"):
        return ("rows", tuple(result.column_names), tuple(t.name for t in result.column_types), [tuple(r) for r in result.result_rows])
    if hasattr(result, "schema") and hasattr(result, "to_pylist"):  # an Arrow table
        return ("arrow", str(result.schema), result.to_pylist())
    return ("value", result)


def _serve(conn: Connection, path: str) -> None:
    import clickhouse_connect

    client = clickhouse_connect.get_client(dsn=f"chdb://{path}")
    try:
        while True:
            request = conn.recv()
            if request is None:
                return
            method, args, kwargs = request
            try:
                conn.send(outcome(client, method, *args, **kwargs))
            except Exception as error:  # the caller sees it, typed by name
                conn.send(("exception", type(error).__name__, str(error)))
    finally:
        client.close()


class Twin:
    """A chdb client on `path` in its own process: `twin.run("query", sql, parameters=...)` gives `outcome(...)`."""

    def __init__(self, path: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, path), daemon=True)
        self._process.start()
        child.close()

    def run(self, method: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        self._conn.send((method, args, kwargs))
        return self._conn.recv()

    def close(self) -> None:
        try:
            self._conn.send(None)
        except OSError:
            pass
        self._process.join(30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
