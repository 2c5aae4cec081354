"""In-process measurements without Spark: the commit phase alone, and encode + send per core.

Both run against the null server in its own process, so the numbers are the client's.
"""
from __future__ import annotations

import random
import statistics
import tempfile
import time
from typing import Any

import pyarrow as pa

from state import FileStateStore, StateStore
from streaming_sink import ExactlyOnceSink
from streaming_sink.routing import Router
from streaming_sink.targets.base import Target
from streaming_sink.writer import PartitionResult, PartitionWriter, WriteContext

from bench.driver import DATABASE, TABLES


def event_table(rows: int, seed: int = 7) -> pa.Table:
    """The bench's events as Spark hands them to a writer (the 10 parsed fields, `table` included)."""
    rng = random.Random(seed)
    ids = list(range(rows))
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "table": [TABLES[i % 2] for i in ids],
        "user_id": pa.array([rng.randrange(10**9) for _ in ids], pa.int64()),
        "name": [f"customer-{i:09d}" for i in ids],
        "amount": [round(rng.random() * 1000, 2) for _ in ids],
        "currency": [("EUR", "USD", "GBP")[i % 3] for i in ids],
        "country": [("DE", "FR", "US", "GB", "NL")[i % 5] for i in ids],
        "status": [("paid", "pending", "refunded")[i % 3] for i in ids],
        "created_at": [f"2026-11-22T10:{(i // 60) % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z" for i in ids],
        "note": [f"note {i} lorem ipsum dolor sit amet" for i in ids],
    })


def null_target(kind: str, url: str) -> Target:
    if kind == "starrocks":
        from streaming_sink.targets.starrocks import StarRocksTarget

        return StarRocksTarget(url, database=DATABASE, user="bench", password="", tables=list(TABLES))
    from streaming_sink.targets.doris import DorisTarget

    return DorisTarget(url, database=DATABASE, user="bench", password="", tables=list(TABLES))


class PreparedRunner:
    """A WriterRunner that prepares `n` transactions (n writer partitions, one tiny table each) on the
    real target, then notes the instant it hands them to the coordinator: what follows is the commit phase."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.returned = 0.0

    def run(self, data: Any, target: Target, router: Router, context: WriteContext, store: StateStore) -> list[PartitionResult]:
        rows = event_table(4).filter(pa.compute.equal(event_table(4).column("table"), TABLES[0]))
        results = []
        for partition in range(self.n):
            writer = PartitionWriter(context, target, router, store, partition)
            results.append(writer.add_all(rows.to_batches()))
        self.returned = time.perf_counter()
        return results


def commit_phase(url: str, kinds: tuple[str, ...] = ("starrocks", "doris"), max_n: int = 256, repeats: int = 3) -> list[dict[str, Any]]:
    """For N = 1, 2, 4, ... max_n: the coordinator's decide + commit phase of N prepared transactions
    (PREPARED record, N commits with the target's parallelism, progress marks, COMMITTED record, final abort
    of unchosen intents), with the file store; the median of `repeats` batches."""
    rows: list[dict[str, Any]] = []
    for kind in kinds:
        with tempfile.TemporaryDirectory(prefix="bench-commit-") as directory:
            runner = PreparedRunner(1)
            sink = ExactlyOnceSink(null_target(kind, url), FileStateStore(directory), job_id=f"bench-commit-{kind}",
                                   table_column="table", runner=runner)
            batch = 0
            n = 1
            while n <= max_n:
                phase, commit = [], []
                for _ in range(repeats):
                    runner.n = n
                    report = sink.process(None, batch, "bench-commit-query")
                    phase.append(time.perf_counter() - runner.returned)
                    commit.append((report.timings or {}).get("commit_s", 0.0))
                    assert report.transactions == n, report
                    batch += 1
                phase_s = statistics.median(phase)
                rows.append({"target": kind, "n": n, "phase_s": phase_s, "commit_s": statistics.median(commit),
                             "goal_s": 0.020 + 0.002 * n, "met": phase_s <= 0.020 + 0.002 * n})
                n *= 2
            sink.target.close()
    return rows


def encode_send(url: str, rows: int, kinds: tuple[str, ...] = ("starrocks", "doris")) -> list[dict[str, Any]]:
    """Rows per CPU-second of one writer thread: route, checksum, encode (CSV) and send one partition's
    rows to the null server and prepare (`PartitionWriter.add_all`, as a task runs it). CPU time is this
    thread's own (`time.thread_time`), so it is per core and excludes the server."""
    from state import MemoryStateStore

    data = event_table(rows)
    batches = data.to_batches(max_chunksize=10_000)  # Spark's Arrow batches are 10,000 rows by default
    out = []
    for kind in kinds:
        for what in ("encode+send", "writer"):
            target = null_target(kind, url)
            store = MemoryStateStore()
            context = WriteContext("bench-encode", f"q-{kind}-{what}", 0, store.take_epoch("bench-encode", "bench"), 0, 64 * 1024 * 1024)
            router = Router(frozenset(TABLES), None, "table")
            wall, cpu = time.perf_counter(), time.thread_time()
            if what == "writer":
                PartitionWriter(context, target, router, store, 0).add_all(batches)
            else:  # the target's transaction alone: encode + send + prepare of rows already routed
                for table, part in router.split(data.combine_chunks().to_batches()[0]):
                    transaction = target.begin(table, lambda chunk, t=table: _ref(kind, t, chunk), lambda ref: None)
                    transaction.write(pa.Table.from_batches([part]))
                    transaction.prepare()
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            out.append({"target": kind, "what": what, "rows": rows, "wall_s": wall, "cpu_s": cpu,
                        "rows_per_cpu_s": rows / cpu, "rows_per_s": rows / wall})
            target.close()
    return out


def _ref(kind: str, table: str, chunk: int) -> Any:
    from streaming_sink.committable import TxnRef

    return TxnRef(kind, DATABASE, table, f"bench_encode_{table}_{chunk}_{time.monotonic_ns()}", 0, "e1w0t0")
