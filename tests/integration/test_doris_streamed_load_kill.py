"""Issue 26: a Doris writer streams every flush of a table into one load it keeps open for the batch. A process
SIGKILLed while those bodies are open leaves no part of them loaded, and the restarted driver writes the batch exactly,
row by row. No Spark: the real `ExactlyOnceSink` and `PartitionWriter`s in a child process (killed at a fixed point
of its own writing, so no timing), the Doris emulator over HTTP in the test's.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

from streaming_sink.labels import parse_label
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import FileStateStore
from streaming_sink.targets.doris import DorisTarget
from streaming_sink.writer import PartitionResult, PartitionWriter, WriteContext
from tests.support.batches import InMemoryRunner
from tests.support.doubles.emulators.doris import DorisEmulator

DB, JOB, QUERY = "db", "job", "query-1"
TABLES = ["t0", "t1", "t2"]
WRITERS, ROWS = 2, 40  # rows per table per writer, one a batch
FLUSH_BYTES = 3 * 3 * 15  # about 3 routed rows of each table: every table flushes ~13 times into its one load
REPO = Path(__file__).resolve().parents[2]


def source() -> list[list[pa.RecordBatch]]:
    return [[pa.record_batch({"__table": [table], "id": [w * 1000 + TABLES.index(table) * 100 + n], "name": [f"w{w}"]})
             for n in range(ROWS) for table in TABLES] for w in range(WRITERS)]


def expected(table: str) -> list[tuple[Any, ...]]:
    return sorted((w * 1000 + TABLES.index(table) * 100 + n, f"w{w}") for w in range(WRITERS) for n in range(ROWS))


class KilledMidBody(InMemoryRunner):
    """Writer 0 prepares; writer 1 SIGKILLs its process halfway through its rows, its loads open mid-body."""

    def run(self, data: Any, target: Any, router: Any, context: WriteContext, store: Any) -> list[PartitionResult]:
        results = []
        for partition, batches in enumerate(data):
            self.next_attempt += 1
            writer = PartitionWriter(context, target, router, store, partition, self.next_attempt)
            if partition == 1:
                for batch in batches[: len(batches) // 2]:
                    writer.add(batch)
                os.kill(os.getpid(), signal.SIGKILL)
            results.append(writer.add_all(batches))
        return results


def sink(fe_url: str, state: Path, runner: InMemoryRunner) -> ExactlyOnceSink:
    return ExactlyOnceSink(DorisTarget(fe_url, DB, "root", "", backoff_s=0.0), FileStateStore(state), JOB,
                           table_column="__table", runner=runner, spread="never", flush_bytes=FLUSH_BYTES)


def child(fe_url: str, state: str) -> None:
    """The driver that dies: run in its own process by the test."""
    sink(fe_url, Path(state), KilledMidBody()).process(source(), 0, QUERY)


def test_a_writer_killed_with_its_loads_open_mid_body_loads_nothing_and_the_restart_is_exact(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with DorisEmulator(tmp_path / "doris") as emu:
        for table in TABLES:
            emu.create_table(DB, table, [("id", "INT"), ("name", "VARCHAR(32)")])
        code = f"from tests.integration.test_doris_streamed_load_kill import child; child({emu.fe_url!r}, {str(state)!r})"
        died = subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=120, capture_output=True, text=True)
        assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
        by_writer: dict[int, set[str]] = {0: set(), 1: set()}
        for txn in emu.transactions(DB):
            parts = parse_label(txn["label"], JOB)
            assert parts is not None
            by_writer[parts.partition].add(txn["state"])
        assert by_writer[0] == {"PRECOMMITTED"}, by_writer  # writer 0 prepared: one load per table
        assert by_writer[1] and by_writer[1] <= {"PREPARE", "ABORTED"}, by_writer  # open bodies: never taken
        assert len(emu.transactions(DB)) == WRITERS * len(TABLES)
        assert all(emu.visible_rows(DB, table) == [] for table in TABLES)

        report = sink(emu.fe_url, state, InMemoryRunner()).process(source(), 0, QUERY)
        assert report.action == "written"
        for table in TABLES:
            assert sorted(emu.visible_rows(DB, table)) == expected(table), table
        assert {t["state"] for t in emu.transactions(DB)} == {"VISIBLE", "ABORTED"}
        assert FileStateStore(state).intents(JOB, QUERY, 0) == []
