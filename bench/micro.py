"""In-process measurements without Spark: the commit phase alone, and encode + send per core (every wire format).

Both run against the null server in its own process, so the numbers are the client's.
"""
from __future__ import annotations

import random
import statistics
import tempfile
import time
from typing import Any

import pyarrow as pa

from bench.driver import DATABASE, TABLES
from streaming_sink import ExactlyOnceSink
from streaming_sink.routing import Router
from streaming_sink.state import FileStateStore, StateStore
from streaming_sink.targets.base import Target
from streaming_sink.writer import PartitionResult, PartitionWriter, WriteContext


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


#: (target, wire format) pairs that encode + send measures: StarRocks CSV, and every Doris format.
WIRE_FORMATS = (("starrocks", "csv"), ("doris", "csv"), ("doris", "json"), ("doris", "arrow"))


def null_target(kind: str, url: str, fmt: str = "csv") -> Target:
    if kind == "starrocks":
        from streaming_sink.targets.starrocks import StarRocksTarget

        return StarRocksTarget(url, database=DATABASE, user="bench", password="", tables=list(TABLES), format=fmt)
    from streaming_sink.targets.doris import DorisTarget

    return DorisTarget(url, database=DATABASE, user="bench", password="", tables=list(TABLES), format=fmt)


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


def encode_send(url: str, rows: int, formats: tuple[tuple[str, str], ...] = WIRE_FORMATS, repeats: int = 3) -> list[dict[str, Any]]:
    """Rows per CPU-second of one writer thread, per (target, wire format): `encode+send` is the target's
    transaction alone (encode, send, prepare) on rows already routed; `writer` is `PartitionWriter.add_all`
    as a task runs it (route, checksum, buffer, then the same). CPU time is this thread's own
    (`time.thread_time`), so it is per core and excludes the server; the median of `repeats` runs, each
    with a fresh target (Doris arrow: so each reads `_schema` once per table, as every Spark task does),
    after one untimed run of every pair. Also what reached the server: body bytes per row, and requests."""
    data = event_table(rows)
    arrow_bytes = data.drop_columns(["table"]).nbytes  # the written columns as Arrow in memory, for comparison
    small = event_table(2_000)
    for kind, fmt in formats:  # warm-up: first calls of pyarrow kernels, imports, connections
        for what in ("encode+send", "writer"):
            _encode_send_once(url, small, kind, fmt, what)
    out = []
    for kind, fmt in formats:
        for what in ("encode+send", "writer"):
            runs = sorted((_encode_send_once(url, data, kind, fmt, what) for _ in range(repeats)), key=lambda r: r[1])
            wall, cpu, server = runs[len(runs) // 2]
            out.append({"target": kind, "format": fmt, "what": what, "rows": rows, "wall_s": wall, "cpu_s": cpu,
                        "rows_per_cpu_s": rows / cpu, "rows_per_s": rows / wall, "repeats": repeats,
                        "wire_bytes": server["body_bytes"], "wire_bytes_per_row": server["body_bytes"] / rows,
                        "arrow_bytes_per_row": arrow_bytes / rows, "requests": server["requests"] - 1,
                        "schema_requests": server["by_op"].get("_schema", 0)})
    return out


def _encode_send_once(url: str, data: pa.Table, kind: str, fmt: str, what: str) -> tuple[float, float, dict[str, Any]]:
    """(wall s, CPU s of this thread, the null server's counters) of one `encode+send` or `writer` run of `data`."""
    from streaming_sink.state import MemoryStateStore

    target = null_target(kind, url, fmt)
    store = MemoryStateStore()
    context = WriteContext("bench-encode", f"q-{kind}-{fmt}-{what}-{time.monotonic_ns()}", 0,
                           store.take_epoch("bench-encode", "bench"), 0, 64 * 1024 * 1024)
    router = Router(frozenset(TABLES), None, "table")
    batches = data.to_batches(max_chunksize=10_000)  # Spark's Arrow batches are 10,000 rows by default
    whole = data.combine_chunks().to_batches()[0]
    _stats(url, reset=True)
    wall, cpu = time.perf_counter(), time.thread_time()
    if what == "writer":
        PartitionWriter(context, target, router, store, 0).add_all(batches)
    else:  # the target's transaction alone: encode + send + prepare of rows already routed
        for table, part in router.split(whole):
            transaction = target.begin(table, lambda chunk, t=table: _ref(kind, t, chunk), lambda ref: None)
            transaction.write(pa.Table.from_batches([part]))
            transaction.prepare()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    server = _stats(url)
    target.close()
    if server["rows"] != data.num_rows:
        raise RuntimeError(f"encode+send {kind} {fmt} {what}: the null server counted {server['rows']} rows of {data.num_rows}")
    return wall, cpu, server


def _stats(url: str, reset: bool = False) -> dict[str, Any]:
    """The null server's counters (`reset`: zeroed first); its `requests` include this call."""
    import requests

    response = requests.request("POST" if reset else "GET", f"{url}/bench/{'reset' if reset else 'stats'}", timeout=30)
    response.raise_for_status()
    return response.json()


def _ref(kind: str, table: str, chunk: int) -> Any:
    from streaming_sink.committable import TxnRef

    return TxnRef(kind, DATABASE, table, f"bench_encode_{table}_{chunk}_{time.monotonic_ns()}", 0, "e1w0t0")
