"""The bench's null Stream Load server speaks what the real StarRocks and Doris targets send (no timing here).

In the fast loop (`-m "not slow"`): no Spark, one in-process server, well under a second."""
from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest

from bench.null_server import NullServer
from streaming_sink.committable import TxnRef
from streaming_sink.targets.base import CommitOutcome
from streaming_sink.targets.doris import DorisTarget
from streaming_sink.targets.starrocks import StarRocksTarget

ROWS = pa.table({"id": pa.array(range(1000), pa.int64()), "name": [f"n-{i}, \"q\"" for i in range(1000)],
                 "amount": [i / 4 for i in range(1000)]})


@pytest.fixture
def server() -> Iterator[NullServer]:
    with NullServer() as running:
        yield running


def _ref(kind: str, label: str) -> TxnRef:
    return TxnRef(kind, "bench", "orders", label, 0, "e1w0t0")


def _write(target: StarRocksTarget | DorisTarget, label: str, chunks: int) -> list:
    intents: list[TxnRef] = []
    transaction = target.begin("orders", lambda chunk: _ref(target.kind, f"{label}_{chunk}"), intents.append)
    for _ in range(chunks):
        transaction.write(ROWS)
    parts = transaction.prepare()
    assert intents, "the target records an intent before it begins"
    return parts


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_starrocks_transaction(server: NullServer, fmt: str) -> None:
    target = StarRocksTarget(server.url, database="bench", user="u", password="p", format=fmt, load_chunk_bytes=4096)
    assert target.routable_tables() is None
    (part,) = _write(target, "sr", chunks=2)
    assert part.rows == 2 * ROWS.num_rows
    stats = server.stats()
    assert stats["prepared"] == 1 and stats["by_op"]["api/transaction"] > 3  # many load pieces
    if fmt == "csv":
        assert stats["rows"] == 2 * ROWS.num_rows
    assert stats["body_bytes"] == part.bytes > 0
    assert target.commit(part.committable("0:x")) is CommitOutcome.COMMITTED
    assert target.commit(part.committable("0:x")) is CommitOutcome.COMMITTED  # idempotent
    stats = server.stats()
    assert (stats["committed"], stats["committed_bytes"], stats["open"]) == (1, part.bytes, 0)
    if fmt == "csv":
        assert stats["committed_rows"] == 2 * ROWS.num_rows
    target.close()


def test_starrocks_abort(server: NullServer) -> None:
    target = StarRocksTarget(server.url, database="bench", user="u", password="p")
    (part,) = _write(target, "sr_abort", chunks=1)
    target.abort(part.ref)
    target.abort(part.ref)  # harmless again
    assert target.commit(part.committable("0:x")) is CommitOutcome.ABORTED
    assert server.stats()["aborted"] == 1 and server.stats()["committed"] == 0


def test_doris_two_phase_commit(server: NullServer) -> None:
    target = DorisTarget(server.url, database="bench", user="u", password="p", piece_bytes=4096)
    assert target.routable_tables() is None
    parts = _write(target, "doris", chunks=3)  # every write streamed into one pre-committed transaction
    assert [p.rows for p in parts] == [3 * ROWS.num_rows]
    stats = server.stats()
    assert (stats["prepared"], stats["rows"]) == (1, 3 * ROWS.num_rows)
    for part in parts:
        assert target.commit(part.committable("0:x")) is CommitOutcome.COMMITTED
    assert target.commit(parts[0].committable("0:x")) is CommitOutcome.COMMITTED  # "already" committed
    stats = server.stats()
    assert (stats["committed"], stats["committed_rows"], stats["open"]) == (1, 3 * ROWS.num_rows, 0)
    target.close()


def test_doris_abort_by_label_and_txn(server: NullServer) -> None:
    target = DorisTarget(server.url, database="bench", user="u", password="p")
    (first,) = _write(target, "doris_abort_a", chunks=1)
    (second,) = _write(target, "doris_abort_b", chunks=1)
    target.abort(first.ref)  # by label
    target.api.abort_txn(int(second.txn_id or 0), second.ref)  # by txn id, as a writer's own abort does
    assert target.commit(first.committable("0:x")) is CommitOutcome.ABORTED
    assert server.stats()["aborted"] == 2


def test_doris_arrow_rows_counted(server: NullServer) -> None:
    """format "arrow": the target reads the column types from `_schema`, then every load is an Arrow IPC body
    (several streams when the chunk is encoded in pieces) whose record batches the server counts."""
    target = DorisTarget(server.url, database="bench", user="u", password="p", format="arrow", piece_bytes=4096)
    parts = _write(target, "doris_arrow", chunks=2)  # both writes streamed into one body
    assert [p.rows for p in parts] == [2 * ROWS.num_rows]
    stats = server.stats()
    assert stats["by_op"]["_schema"] == 1  # once per table and target: then cached
    assert (stats["prepared"], stats["rows"]) == (1, 2 * ROWS.num_rows)
    assert stats["body_bytes"] > 2 * 4 * 4096  # pieces of ~4 KiB: several streams per body, all of them counted
    for part in parts:
        assert target.commit(part.committable("0:x")) is CommitOutcome.COMMITTED
    stats = server.stats()
    assert (stats["committed"], stats["committed_rows"], stats["open"]) == (1, 2 * ROWS.num_rows, 0)
    target.close()


def test_arrow_body_that_is_not_arrow_fails_the_load(server: NullServer) -> None:
    import requests

    answer = requests.put(f"{server.url}/api/bench/orders/_stream_load", data=b"1,2\n3,4\n",
                          headers={"format": "arrow", "label": "bad", "two_phase_commit": "true"}, timeout=10).json()
    assert answer["Status"] == "Fail" and "Arrow" in answer["Message"]
    assert server.stats()["prepared"] == 0


def test_schema_endpoint_answers_the_bench_columns(server: NullServer) -> None:
    from bench.null_server import COLUMNS

    target = DorisTarget(server.url, database="bench", user="u", password="p", format="arrow")
    assert target.table_columns("payments") == dict(COLUMNS)
    target.close()
