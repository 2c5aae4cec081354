"""Where an embedded ClickHouse batch's time goes, without Spark: the sink's driver-side work per statement.

`python -m bench.chdb_phases [--rows 50000] [--batches 6] [--partitions 4]` writes the same batches (the bench's
events, cut into Spark-like partitions) twice into chdb: by hand (`insert_arrow` per table, as `alo-chdb-hand`)
and through `ExactlyOnceSink.process` with the driver's writer and a file store (as `eo-chdb-file`), then prints
per batch the wall and CPU time of each, the sink's phases, every class of statement sent to chdb (count and
time) and the state store's `fsync`s. Spark is left out so that the sink's own cost is seen apart from Spark's,
which dominates the end-to-end modes.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bench.driver import CH_DDL, DATABASE, TABLES
from bench.micro import event_table
from streaming_sink import ExactlyOnceSink
from streaming_sink.execution import _write_in_driver
from streaming_sink.routing import Router
from streaming_sink.state import FileStateStore, StateStore
from streaming_sink.targets.base import Target
from streaming_sink.targets.clickhouse import ClickHouseTarget
from streaming_sink.writer import PartitionResult, WriteContext

Batch = list[tuple[int | None, pa.RecordBatch]]  # (Spark partition, Arrow batch) as the driver's stream hands them over


class StreamRunner:
    """The driver's writer over in-memory (partition, batch) pairs: `data` is the batch itself."""

    def run(self, data: Batch, target: Target, router: Router, context: WriteContext, store: StateStore) -> list[PartitionResult]:
        return _write_in_driver(iter(data), target, router, context, store)


class StatementClock:
    """Wraps a chdb client's calls: time and count per statement class (labels and values stripped)."""

    def __init__(self, client: Any) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        for name in ("command", "query", "insert_arrow"):
            setattr(client, name, self._timed(name, getattr(client, name)))

    def _timed(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            text = re.sub(r"ss_\w+", "<staging>", str(args[0]) if args else "")
            key = f"{name}: {re.split(r' VALUES| TO TABLE| WHERE', text)[0][:80]}"
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds[key] += time.perf_counter() - started
                self.calls[key] += 1
        return timed


def batches(rows: int, count: int, partitions: int) -> Iterator[Batch]:
    """`count` batches of `rows` events, each cut into `partitions` Spark partitions of Arrow batches of 10,000 rows."""
    for number in range(count):
        table = event_table(rows, seed=number)
        table = table.set_column(0, "id", pc.add(table.column("id"), number * rows))
        per = -(-rows // partitions)
        yield [(None, b) for p in range(partitions) for b in table.slice(p * per, per).to_batches(max_chunksize=10_000)]


def chdb_target(path: str) -> ClickHouseTarget:
    target = ClickHouseTarget(f"chdb://{path}", database=DATABASE)
    client = target.client()
    client.command(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    for table in TABLES:
        client.command(CH_DDL.format(db=DATABASE, table=table))
    return target


def by_hand(target: ClickHouseTarget, batch: Batch) -> None:
    """What `alo-chdb-hand` does with a batch (bench/driver.py)."""
    data = pa.Table.from_batches([b for _, b in batch])
    routes, rest = data.column("table"), data.drop_columns(["table"])
    for table in pc.unique(routes).to_pylist():
        target.client().insert_arrow(table, rest.filter(pc.equal(routes, table)), database=DATABASE)


def timed(work: Callable[[], None]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000, help="events per batch (the full bench's batch)")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args(argv)
    data = list(batches(args.rows, args.batches + 1, args.partitions))  # the first of each run warms up, untimed
    work = tempfile.mkdtemp(prefix="chdb-phases-")
    hand = chdb_target(f"{work}/hand")
    by_hand(hand, data[0])
    hand_wall, hand_cpu = map(sum, zip(*(timed(lambda b=b: by_hand(hand, b)) for b in data[1:]), strict=True))
    hand.close()
    target = chdb_target(f"{work}/sink")
    sink = ExactlyOnceSink(target, FileStateStore(f"{work}/state"), "phases", table_column="table", runner=StreamRunner())
    sink.process(data[0], 0, "q")
    clock = StatementClock(target.client())
    fsyncs = _count_fsyncs()
    phases: dict[str, float] = defaultdict(float)

    def write_all() -> None:
        for number, batch in enumerate(data[1:], start=1):
            for phase, seconds in (sink.process(batch, number, "q").timings or {}).items():
                if phase.endswith("_s"):
                    phases[phase] += seconds

    sink_wall, sink_cpu = timed(write_all)
    target.close()
    shutil.rmtree(work)
    n = args.batches
    print(f"{args.rows:,} rows a batch in {args.partitions} partitions, {n} batches; ms per batch")
    print(f"by hand:  {hand_wall / n * 1000:7.1f} wall {hand_cpu / n * 1000:7.1f} CPU")
    print(f"the sink: {sink_wall / n * 1000:7.1f} wall {sink_cpu / n * 1000:7.1f} CPU   "
          + "  ".join(f"{k} {v / n * 1000:.1f}" for k, v in phases.items()) + f"   fsync x{fsyncs[0] / n:.1f}")
    for key in sorted(clock.seconds, key=clock.seconds.__getitem__, reverse=True):
        print(f"  {clock.seconds[key] / n * 1000:7.1f} ms  x{clock.calls[key] / n:4.1f}  {key}")
    return 0


def _count_fsyncs() -> list[int]:
    """Counts `os.fsync` calls from here on (the file store's durability)."""
    count = [0]
    fsync = os.fsync

    def counted(fd: int) -> None:
        count[0] += 1
        fsync(fd)

    os.fsync = counted  # type: ignore[assignment]
    return count


if __name__ == "__main__":
    raise SystemExit(main())
