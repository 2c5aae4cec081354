"""job.toml for tests, the demo and the soak, written in one place; and the packaged job end to end.

* `job_toml(**overrides)`: the text of a job.toml. Each keyword replaces one top-level key or section of
  `DEFAULTS` (a job `job` reading topic `events` on 127.0.0.1:9092 into table `orders`); `None` drops it.
  A dict is a section, a dict inside it a sub-table (`tables={"orders": {...}}` is `[tables.orders]`).
  `write_job_toml(directory, **overrides)` writes it to `directory/job.toml`; `local_spark()` is the
  `spark` section with the local services' Spark conf, `secured_kafka(...)` the `kafka` section of the
  secured broker.
* `ConfigJob`: the packaged job end to end, from a TOML file: good and bad messages in, tables and dead
  letters out. Used by the README's main-job command (scripts/demo.sh) and by the job's end-to-end tests.
  It produces messages whose fate is known in advance (a row of `orders` or `payments`, or a dead
  letter with a known reason), runs `streaming-sink run --config job.toml` in a child process
  (its own process group, so a kill takes the Spark JVM too), and compares every table and the
  dead letters with the source, row by row.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streaming_sink.records import BatchState
from streaming_sink.state import open_store
from tests.support.pipeline import REPO, kill_driver, open_target, row_checksum
from tests.support.services.spark import local_spark_conf, spark_env

#: the job every `job_toml` starts from
DEFAULTS: dict[str, Any] = {
    "job_id": "job",
    "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["events"]},
    "routing": {"table": "orders"},
    "tables": {"orders": {"schema": "id BIGINT NOT NULL, name STRING"}},
}
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def job_toml(**overrides: Any) -> str:
    """The text of a job.toml: `DEFAULTS` with each keyword replacing its top-level key or section (`None`: left out)."""
    document = {key: value for key, value in {**DEFAULTS, **overrides}.items() if value is not None}
    return "\n".join(_table([], document)).strip() + "\n"


def write_job_toml(directory: Path, **overrides: Any) -> Path:
    """`job_toml(**overrides)` written to `directory/job.toml`; returns the path."""
    path = Path(directory) / "job.toml"
    path.write_text(job_toml(**overrides))
    return path


def local_spark(**conf: str) -> dict[str, Any]:
    """The `spark` section: the local services' Spark conf (its Kafka source jars), `conf` added."""
    return {"conf": {**local_spark_conf(), **conf}}


def secured_kafka(broker: Any, topic: str, jaas_env: str, user: str) -> dict[str, Any]:
    """The `kafka` section for the broker's SASL_SSL listener as `user`, the JAAS config read from `jaas_env`."""
    options = {k: v for k, v in broker.spark_kafka_options(user, "unused").items()
               if k not in ("kafka.bootstrap.servers", "kafka.sasl.jaas.config")}
    return {"bootstrap_servers": broker.secure_bootstrap, "topics": [topic],
            "options": {**options, "kafka.sasl.jaas.config": {"env": jaas_env}}}


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")


def _table(path: list[str], values: Mapping[str, Any]) -> list[str]:
    """A table's keys, then its sub-tables (a header only where the table has keys of its own)."""
    scalars = {k: v for k, v in values.items() if not isinstance(v, Mapping)}
    lines = [f"[{'.'.join(_key(p) for p in path)}]"] if path and (scalars or not values) else []
    lines += [f"{_key(k)} = {_value(v)}" for k, v in scalars.items()]
    for key, value in values.items():
        if isinstance(value, Mapping):
            lines += ["", *_table([*path, key], value)]
    return lines


# -- the packaged job end to end ---------------------------------------------------------------------------------------

DB = "default"
SCHEMAS = {
    "orders": "id BIGINT NOT NULL, name STRING, amount DOUBLE",
    "payments": "id BIGINT NOT NULL, method STRING, amount DOUBLE",
}
DEAD_LETTERS = "dead_letters"
_BAD_KINDS = [
    ("{not json", "message has no 'table' field"),
    ({"table": "refunds", "id": 1}, "unknown table refunds"),
    ({"table": "orders", "id": "seven", "name": "x"},
     "not valid JSON for the schema of orders: field 'id' holds seven, which does not parse as BIGINT (column type {id})"),
    ({"table": "payments", "method": "cash"}, "required field 'id' of payments is missing or null"),
]

RowsReader = Callable[[str, str], list[tuple]]  # (table, SQL column list) -> rows


@dataclass
class ConfigJob:
    root: Path
    bootstrap: str
    topic: str
    partitions: int = 3
    messages_per_partition: int = 1000
    bad_every: int = 37
    max_offsets_per_trigger: int = 600
    target: dict[str, Any] | None = None  # the [target] section; None: the embedded default (chdb)
    state: str | None = None  # a state store URL; None: the embedded default (file store)
    env: dict[str, str] = field(default_factory=dict)
    expected: dict[str, list[tuple]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.config_path = self.root / "job.toml"
        self.logs = self.root / "logs"
        self.logs.mkdir(exist_ok=True)
        self.config_path.write_text(job_toml(
            job_id="demo-ingest", data_dir="data",
            kafka={"bootstrap_servers": self.bootstrap, "topics": [self.topic],
                   "max_offsets_per_trigger": self.max_offsets_per_trigger},
            routing={"field": "table"}, tables={name: {"schema": ddl} for name, ddl in SCHEMAS.items()},
            dead_letters={"table": DEAD_LETTERS}, target=self.target, state={"url": self.state} if self.state else None,
            spark=local_spark(),
        ))

    @property
    def id_type(self) -> str:
        """How the target spells the type of orders.id (a dead letter's reason names it)."""
        return "Int64" if self.target is None or "clickhouse" in str(self.target.get("url")) else "BIGINT"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def state_url(self) -> str:
        return self.state or f"file://{self.data_dir / 'state'}"

    def produce(self, broker) -> int:
        """Messages with known fates; returns how many."""
        broker.create_topic(self.topic, self.partitions)
        self.expected = {"orders": [], "payments": [], DEAD_LETTERS: []}
        for partition in range(self.partitions):
            values = []
            for offset in range(self.messages_per_partition):
                ident = partition * 1_000_000 + offset
                if offset % self.bad_every == self.bad_every - 1:
                    message, reason = _BAD_KINDS[(offset // self.bad_every) % len(_BAD_KINDS)]
                    reason = reason.replace("{id}", self.id_type)
                    raw = message if isinstance(message, str) else json.dumps(message)
                    self.expected[DEAD_LETTERS].append((raw, self.topic, partition, offset, reason))
                elif ident % 3:
                    raw = json.dumps({"table": "orders", "id": ident, "name": f"n{ident}", "amount": ident / 8})
                    self.expected["orders"].append((ident, f"n{ident}", ident / 8, partition, offset))
                else:
                    raw = json.dumps({"table": "payments", "id": ident, "method": "card", "amount": ident / 4})
                    self.expected["payments"].append((ident, "card", ident / 4, partition, offset))
                values.append(raw)
            broker.produce(self.topic, values, partition=partition)
        return self.partitions * self.messages_per_partition

    def run(self, run: int, crash_at: str | None = None, timeout: float = 600) -> int:
        proc = self.start(run, crash_at)
        try:
            return proc.wait(timeout=timeout)
        finally:
            self.kill(proc)  # whatever is left of its process group

    def start(self, run: int, crash_at: str | None = None) -> subprocess.Popen:
        """`streaming-sink run` in a process group of its own, logging to logs/driver-<run>.log."""
        env = dict(os.environ, **spark_env(), **self.env, PYTHONPATH=str(REPO))
        env.pop("STREAMING_SINK_CRASH_AT", None)
        if crash_at:
            env["STREAMING_SINK_CRASH_AT"] = crash_at
        with open(self.logs / f"driver-{run}.log", "w") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "streaming_sink.cli", "run", "--config", str(self.config_path)],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )

    kill = staticmethod(kill_driver)

    def committed_batches(self) -> int:
        store = open_store(self.state_url)
        return sum(1 for key in store.batch_keys("demo-ingest")
                   if (record := store.get_batch("demo-ingest", *key)) is not None and record.state is BatchState.COMMITTED)

    def log_tail(self, run: int, lines: int = 30) -> str:
        return "\n".join((self.logs / f"driver-{run}.log").read_text(errors="replace").splitlines()[-lines:])

    def batch(self, batch_id: int):
        store = open_store(self.state_url)
        (query_id,) = {q for q, _ in store.batch_keys("demo-ingest")}
        return store.get_batch("demo-ingest", query_id, batch_id), store.done_labels("demo-ingest", query_id, batch_id)

    def read_embedded(self, table: str, columns: str) -> list[tuple]:
        with open_target(self.data_dir / "clickhouse", DB) as target:
            return [tuple(r) for r in target.client().query(f"SELECT {columns} FROM {DB}.{table}").result_rows]

    def verify(self, read: RowsReader | None = None) -> dict[str, tuple[int, int]]:
        """Every table and the dead letters equal the source; every batch COMMITTED and reconciled."""
        read = read or self.read_embedded
        actual = {
            "orders": read("orders", "id, name, amount, kafka_partition, kafka_offset"),
            "payments": read("payments", "id, method, amount, kafka_partition, kafka_offset"),
            DEAD_LETTERS: read(DEAD_LETTERS, "raw_value, topic, partition, offset, reason"),
        }
        report = {}
        for table, rows in actual.items():
            got, want = sorted(rows), sorted(self.expected[table])
            assert len(got) == len(want), f"{table}: {len(got)} rows, source says {len(want)}"
            assert row_checksum(got) == row_checksum(want), f"{table}: checksum differs from the source"
            assert got == want, f"{table}: rows differ from the source"
            report[table] = (len(got), row_checksum(got))
        self.verify_journal()
        return report

    def verify_journal(self) -> None:
        """Every batch COMMITTED, its rows reconciled with what it read, no intent left."""
        store = open_store(self.state_url)
        for key in store.batch_keys("demo-ingest"):
            record = store.get_batch("demo-ingest", *key)
            assert record is not None and record.state is BatchState.COMMITTED, f"batch {key}: {record}"
            assert record.records_in == sum(c.rows for c in record.live_committables()), f"batch {key} does not reconcile"
            assert store.intents("demo-ingest", *key) == [], f"batch {key}: intents left"
