"""A local end-to-end pipeline: real Kafka -> the packaged job in a child process -> a target.

Used by the demo (scripts/demo.sh) and the end-to-end crash tests. A pipeline produces a known set
of messages to a fresh topic, runs `python -m streaming_sink.job` as a child process (so tests can
SIGKILL it and restart it on the same checkpoint), and verifies the target row by row against the
source: sorted row lists, counts and an order-independent checksum per table, nothing left behind
in the target (staging tables, open transactions), no intents left, every batch record COMMITTED.

The target is reached through its adapter (tests/support/targets/<product>.py, one class per target, which the crash
matrix drives too): ClickHouse on chdb under the pipeline's root by default.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from streaming_sink.records import BatchState
from streaming_sink.state import open_store
from streaming_sink.targets.clickhouse import ClickHouseTarget
from tests.support.services.spark import local_spark_conf, spark_env

if TYPE_CHECKING:
    from tests.support.targets.base import TargetAdapter

DB = "analytics"
TABLES = ["orders", "payments"]
SCHEMA = "id BIGINT, table STRING, name STRING, amount DOUBLE"
REPO = Path(__file__).resolve().parents[2]
TABLE_DDL = (
    "CREATE TABLE IF NOT EXISTS {db}.{table} (id Int64, name String, amount Float64, "
    "kafka_partition Int32, kafka_offset Int64) ENGINE = MergeTree PARTITION BY id % 4 ORDER BY (kafka_partition, kafka_offset)"
)


def create_tables(path: Path, database: str, tables: list[str]) -> None:
    with open_target(path, database) as target:
        client = target.client()
        client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
        for table in tables:
            client.command(TABLE_DDL.format(db=database, table=table))


@contextmanager
def open_target(path: Path, database: str) -> Iterator[ClickHouseTarget]:
    """A target on the path, closed afterwards so another process (a driver) can open the path."""
    target = ClickHouseTarget(f"chdb://{path}", database=database)
    try:
        yield target
    finally:
        target.close()


def table_rows(target: ClickHouseTarget, table: str) -> list[tuple]:
    result = target.client().query(
        f"SELECT id, name, amount, kafka_partition, kafka_offset FROM {target.database}.{table}"
    )
    return sorted(tuple(r) for r in result.result_rows)



def row_checksum(rows: list[tuple]) -> int:
    """Order-independent: sum of per-row digests modulo 2**64 (duplicates and losses both change it)."""
    total = 0
    for row in rows:
        total += int.from_bytes(hashlib.sha256(repr(row).encode()).digest()[:8], "big")
    return total % (1 << 64)


def kill_driver(proc: subprocess.Popen) -> None:
    """kill -9 a driver started in a process group of its own: its Python process and the Spark JVM, at the same
    instant; then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@dataclass
class LocalPipeline:
    root: Path
    broker: object  # tests.support.services.kafka.KafkaBroker
    state_url: str
    job_id: str = "orders-ingest"
    partitions: int = 3
    messages_per_partition: int = 300
    max_offsets_per_trigger: int = 150
    topic: str = ""
    source: dict[str, list[tuple]] = field(default_factory=dict)
    adapter: TargetAdapter | None = None  # default: ClickHouse on chdb under root/ch
    spark_conf: dict[str, str] = field(default_factory=dict)  # overrides of the local Spark conf
    driver_module: str = "streaming_sink.job"  # tests may wrap the job to inject faults in tasks
    driver_env: dict[str, str] = field(default_factory=dict)
    checkpoint_name: str = "checkpoint"

    def __post_init__(self) -> None:
        self.topic = self.topic or f"events-{self.root.name}"
        self.chdb_path = self.root / "ch"
        if self.adapter is None:
            from tests.support.targets.clickhouse import ClickHouseAdapter

            self.adapter = ClickHouseAdapter(self.chdb_path)
        self.spec_path = self.root / "spec.json"
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.adapter.create_tables(DB, TABLES)
        self.write_spec()

    def write_spec(self) -> None:
        """(Re)write the job spec, e.g. after changing `checkpoint_name` (a new checkpoint = a new query id)."""
        assert self.adapter is not None
        self.spec_path.write_text(
            json.dumps(
                {
                    "job_id": self.job_id,
                    "bootstrap": self.broker.bootstrap,
                    "topics": [self.topic],
                    "schema": SCHEMA,
                    "table_field": "table",
                    "target_url": self.adapter.target_url(),
                    "target_options": self.adapter.target_options(),
                    "database": DB,
                    "state_url": self.state_url,
                    "checkpoint": str(self.root / self.checkpoint_name),
                    "max_offsets_per_trigger": self.max_offsets_per_trigger,
                    "spark_conf": local_spark_conf({"spark.sql.shuffle.partitions": "2", **self.spark_conf}),
                }
            )
        )

    def produce(self, more: int = 0) -> None:
        """Messages with a known (partition, offset) each, spread over both tables; `more`: that many further
        messages per partition, appended to the topic and the source (data that arrived since)."""
        first = 0
        if more:
            first = self.messages_per_partition
            self.messages_per_partition += more
        else:
            self.broker.create_topic(self.topic, self.partitions)
            self.source = {t: [] for t in TABLES}
        for partition in range(self.partitions):
            values = []
            for offset in range(first, self.messages_per_partition):
                ident = partition * 1_000_000 + offset
                table = TABLES[(offset // 2 + partition) % 2]  # both tables in every batch and partition
                message = {"id": ident, "table": table, "name": f"name-{ident}", "amount": ident / 4}
                values.append(json.dumps(message))
                self.source[table].append((ident, message["name"], message["amount"], partition, offset))
            self.broker.produce(self.topic, values, partition=partition)

    # -- drivers -------------------------------------------------------------------------------

    def _env(self, crash_at: str | None) -> dict[str, str]:
        assert self.adapter is not None
        env = dict(os.environ, **spark_env(), **self.adapter.env(), **self.driver_env)
        env.pop("STREAMING_SINK_CRASH_AT", None)
        if crash_at:
            env["STREAMING_SINK_CRASH_AT"] = crash_at
        env["PYTHONPATH"] = str(REPO)
        return env

    def start_driver(self, crash_at: str | None = None, run: int = 0) -> subprocess.Popen:
        with open(self.logs / f"driver-{run}.log", "w") as log:  # the child keeps its own descriptor
            return subprocess.Popen(
                [sys.executable, "-m", self.driver_module, "--spec", str(self.spec_path)],
                cwd=REPO, env=self._env(crash_at), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: kill() takes the Spark JVM down with it
            )

    def run_driver(self, crash_at: str | None = None, run: int = 0, timeout: float = 300) -> int:
        proc = self.start_driver(crash_at, run)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"driver run {run} did not finish in {timeout}s; log: {self.log_tail(run)}") from None
        finally:
            self.kill(proc)  # whatever is left of its process group (a hung JVM, Python workers)

    def log_tail(self, run: int, lines: int = 40) -> str:
        text = (self.logs / f"driver-{run}.log").read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def run_to_completion(self, first_run: int = 1) -> None:
        code = self.run_driver(run=first_run)
        assert code == 0, f"driver exited {code}:\n{self.log_tail(first_run)}"

    # -- state and verification --------------------------------------------------------------

    def store(self):
        return open_store(self.state_url)

    def query_ids(self) -> set[str]:
        return {q for q, _ in self.store().batch_keys(self.job_id)}

    def batch_state(self, batch_id: int, query_id: str | None = None):
        store = self.store()
        if query_id is None:
            (query_id,) = self.query_ids()
        return (
            store.get_batch(self.job_id, query_id, batch_id),
            store.intents(self.job_id, query_id, batch_id),
            store.done_labels(self.job_id, query_id, batch_id),
        )

    def wait_for_batches(self, proc: subprocess.Popen, count: int, deadline_s: float = 240) -> None:
        """Poll the state store until `count` batches are COMMITTED (a progress marker, not a sleep)."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return
            store = self.store()
            committed = [
                k for k in store.batch_keys(self.job_id)
                if (r := store.get_batch(self.job_id, *k)) is not None and r.state is BatchState.COMMITTED
            ]
            if len(committed) >= count:
                return
            time.sleep(0.2)
        raise AssertionError(f"no {count} committed batches within {deadline_s}s")

    def kill(self, proc: subprocess.Popen) -> None:
        kill_driver(proc)

    def kill_at_random_instants(self, rng: random.Random, runs: int, max_wait_s: float) -> int:
        """Start the driver up to `runs` times; each time, once it has committed one more batch, kill it
        at an instant drawn from `rng` (unless it finished first). Returns how many kills landed."""
        killed = 0
        for run in range(runs):
            proc = self.start_driver(run=run)
            self.wait_for_batches(proc, count=run + 1)
            try:
                proc.wait(timeout=rng.uniform(0.0, max_wait_s))  # the kill instant, drawn from the seed
            except subprocess.TimeoutExpired:
                self.kill(proc)
                killed += 1
            if proc.returncode == 0:
                break
        return killed

    def verify(self) -> dict[str, tuple[int, int]]:
        """Target equals source exactly, and nothing is left behind anywhere."""
        assert self.adapter is not None
        report = {}
        for table in TABLES:
            actual, expected = self.adapter.rows(DB, table), sorted(self.source[table])
            assert len(actual) == len(expected), f"{table}: {len(actual)} rows, source has {len(expected)}"
            assert row_checksum(actual) == row_checksum(expected), f"{table}: checksum differs"
            assert actual == expected, f"{table}: rows differ"
            report[table] = (len(actual), row_checksum(actual))
        problems = self.adapter.problems(DB)
        assert problems == [], f"left behind in the target: {problems}"
        store = self.store()
        for key in store.batch_keys(self.job_id):
            assert store.intents(self.job_id, *key) == [], f"intents left for {key}"
            record = store.get_batch(self.job_id, *key)
            assert record is not None and record.state is BatchState.COMMITTED, f"batch {key} is {record}"
        return report
