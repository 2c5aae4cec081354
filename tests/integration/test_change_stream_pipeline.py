"""A real change-data pipeline, exactly once (issue 27, item 5): PostgreSQL -> Debezium's PostgreSQL connector on
Kafka Connect -> Kafka -> the packaged job (`kafka.format = "debezium"`) -> the target. A workload of inserts, updates,
deletes and re-inserts runs on two tables, in rounds; after each round the driver is started and SIGKILLed at an
instant drawn from the seed once it has committed a batch more. At the end, once the last transaction's events are in
Kafka, a last run drains them, and each target table equals its PostgreSQL table row by row (ClickHouse read with
FINAL, the emulator's as SELECT * shows it); no dead letter, every batch committed and reconciled.
"""
from __future__ import annotations

import random
import subprocess
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from streaming_sink.targets import PASSWORD_ENV, USER_ENV
from tests.support.change_data import ChangeWorkload, add_connector, await_last_transaction, change_topics, current_rows
from tests.support.jobs import DEAD_LETTERS, ConfigJob, job_toml, local_spark

pytestmark = pytest.mark.slow

#: The job's schema of each table, as Debezium's JSON carries the workload's columns (numeric as a decimal string).
SCHEMAS = {"customers": "id INT NOT NULL, name STRING, balance DECIMAL(12,2), active BOOLEAN NOT NULL",
           "orders": "id BIGINT NOT NULL, customer_id INT, note STRING"}
COLUMNS = {"customers": ("id", "name", "balance", "active"), "orders": ("id", "customer_id", "note")}
#: The emulator's tables: primary-key tables for the changes, a duplicate table for the dead letters.
STARROCKS_COLUMNS = {
    "customers": [("id", "INT NOT NULL"), ("name", "VARCHAR(200)"), ("balance", "DECIMAL(12,2)"), ("active", "BOOLEAN NOT NULL")],
    "orders": [("id", "BIGINT NOT NULL"), ("customer_id", "INT"), ("note", "VARCHAR(200)")],
    DEAD_LETTERS: [("raw_value", "STRING"), ("topic", "VARCHAR(256)"), ("partition", "INT"), ("offset", "BIGINT"),
                   ("kafka_timestamp", "DATETIME"), ("reason", "VARCHAR(1024)")],
}
#: a kill instant within KILL_WINDOW_S of a committed batch, and batches small enough that a round's run is still going
ROUNDS, KILL_WINDOW_S = 3, 2.0


def _config(job: ConfigJob, prefix: str, target: dict[str, Any] | None) -> str:
    return job_toml(
        job_id="demo-ingest", data_dir="data",
        kafka={"bootstrap_servers": job.bootstrap, "topic_pattern": rf"^{prefix}\.public\..+$", "format": "debezium",
               "max_offsets_per_trigger": 25},
        routing={"topic_table": rf"^{prefix}\.public\.(.+)$"},
        tables={table: {"schema": schema, "key": ["id"]} for table, schema in SCHEMAS.items()},
        # writers in tasks spread every batch (StarRocks): a key's changes of one batch meet in several writers unless
        # the sink keeps one per key
        dead_letters={"table": DEAD_LETTERS}, target=target, spark=local_spark(),
        sink={"metadata_columns": False, **({"spread": "always"} if target else {})},
    )


def _row(table: str, values: Any) -> tuple:
    """A row as both sides compare it: the decimal as text with its scale, the rest as Python values."""
    row = dict(zip(COLUMNS[table], values, strict=True)) if not isinstance(values, dict) else values
    return tuple(f"{Decimal(str(row[c])):.2f}" if c == "balance" and row[c] is not None else row[c] for c in COLUMNS[table])


def _run_with_kills(job: ConfigJob, rng: random.Random, run: int) -> bool:
    """Start the driver; once it has committed a batch more, kill it at an instant drawn from `rng` (unless it ends
    first). True when the kill landed."""
    before = job.committed_batches()
    proc = job.start(run)
    deadline = time.monotonic() + 240
    while job.committed_batches() <= before and proc.poll() is None:  # a progress marker, not a pause
        assert time.monotonic() < deadline, f"no batch committed within 240 s:\n{job.log_tail(run)}"
        time.sleep(0.2)
    try:
        proc.wait(timeout=rng.uniform(0.0, KILL_WINDOW_S))  # the kill instant, drawn from the seed
    except subprocess.TimeoutExpired:
        job.kill(proc)
        return True
    assert proc.returncode == 0, job.log_tail(run)
    return False


def _starrocks(tmp_path: Path) -> Any:
    from tests.support.doubles.emulators.starrocks import StarRocksEmulator

    emulator = StarRocksEmulator(tmp_path / "starrocks")
    emulator.start()
    emulator.create_database("shop")
    for table, columns in STARROCKS_COLUMNS.items():
        keyed = table != DEAD_LETTERS
        emulator.create_table("shop", table, columns, **({"keys_type": "PRIMARY_KEYS", "key": ("id",)} if keyed else {}))
    return emulator


# CI runs the ClickHouse chain; the StarRocks one (its emulator's keyed tables) in the extended suite, with CI's siblings
# for StarRocks' change loads in test_change_tables_olap.py and test_whole_database_olap.py
@pytest.mark.parametrize("target", ["clickhouse", pytest.param("starrocks", marks=pytest.mark.extended)])
def test_postgres_changes_reach_the_target_exactly_through_driver_kills(
        tmp_path, kafka_broker, kafka_connect, postgres, target):
    rng = random.Random(f"pipeline-{target}")
    workload = ChangeWorkload(seed=rng.randrange(10**6))
    emulator = _starrocks(tmp_path) if target == "starrocks" else None
    try:
        with postgres.connect() as conn:
            workload.run(conn, 10)  # rows before the connector: its snapshot
            prefix, _ = add_connector(kafka_connect, postgres)
            job = ConfigJob(tmp_path / "job", kafka_broker.bootstrap, "unused",
                            env={USER_ENV: "root", PASSWORD_ENV: ""} if emulator is not None else {})
            target_section = None if emulator is None else {
                "url": f"starrocks://127.0.0.1:{emulator.fe_port}", "database": "shop",
                "options": {"tables": list(STARROCKS_COLUMNS), "backoff_s": 0.05}}
            job.config_path.write_text(_config(job, prefix, target_section))
            kills, applied = 0, None
            for run in range(ROUNDS):
                applied = workload.run(conn, 30)
                kills += _run_with_kills(job, rng, run)
            assert applied is not None
            truth = current_rows(conn)
        await_last_transaction(kafka_broker, change_topics(prefix), applied, kafka_connect)
        assert job.run(ROUNDS) == 0, job.log_tail(ROUNDS)
        assert kills >= 1, f"none of {ROUNDS} kills landed on a running job: the test proved nothing"

        for table, rows in truth.items():
            want = sorted(_row(table, row) for row in rows.values())
            if emulator is None:
                got = sorted(_row(table, row) for row in job.read_embedded(f"{table} FINAL", ", ".join(COLUMNS[table])))
            else:
                got = sorted(_row(table, row[:len(COLUMNS[table])]) for row in emulator.visible_rows("shop", table))
            assert len(got) == len(want), f"{table}: {len(got)} rows, PostgreSQL has {len(want)}"
            assert got == want, f"{table}: rows differ from PostgreSQL's"
        dead = job.read_embedded(DEAD_LETTERS, "reason") if emulator is None else emulator.visible_rows("shop", DEAD_LETTERS)
        assert dead == [], f"dead letters: {dead[:3]}"
        job.verify_journal()
    finally:
        if emulator is not None:
            emulator.stop()
