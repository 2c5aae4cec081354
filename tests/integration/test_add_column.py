"""A column added upstream, with `sink.on_unknown_field = "add-column"` (issue 27, item 4): the packaged job reads
Debezium change events into a table it created on the embedded ClickHouse; a later event carries a field the table
lacks. The job adds the column (Nullable string), runs the batch again with it, and the table ends equal to the
source's rows, the new column's values included; also when the driver is killed right after the column was added.
"""
from __future__ import annotations

import json
import signal

import pytest

from tests.support.jobs import DEAD_LETTERS, ConfigJob, job_toml, local_spark
from tests.support.pipeline import open_target

pytestmark = pytest.mark.slow


def _event(op: str, row: dict, lsn: int) -> str:
    before, after = (row, None) if op == "d" else (None, row)
    return json.dumps({"before": before, "after": after, "op": op, "source": {"lsn": lsn}})


def _job(tmp_path, kafka_broker, topic: str) -> ConfigJob:
    job = ConfigJob(tmp_path / "job", kafka_broker.bootstrap, topic)
    job.config_path.write_text(job_toml(
        job_id="demo-ingest", data_dir="data",
        kafka={"bootstrap_servers": kafka_broker.bootstrap, "topics": [topic], "format": "debezium",
               "max_offsets_per_trigger": 4},
        routing={"table": "customers"},
        tables={"customers": {"schema": "id INT NOT NULL, name STRING", "key": ["id"]}},
        dead_letters={"table": DEAD_LETTERS},
        sink={"metadata_columns": False, "on_unknown_field": "add-column"}, spark=local_spark(),
    ))
    return job


def _produce(kafka_broker, topic: str) -> list[tuple]:
    """Changes of customers; from the fifth on, the source table has a `coupon` column. Returns the source's rows."""
    kafka_broker.create_topic(topic, 1)
    events = [("c", {"id": 1, "name": "a"}), ("c", {"id": 2, "name": "b"}), ("u", {"id": 1, "name": "a2"}),
              ("c", {"id": 3, "name": "c"}),
              ("c", {"id": 4, "name": "d", "coupon": "X1"}), ("u", {"id": 2, "name": "b2", "coupon": None}),
              ("d", {"id": 3, "name": None, "coupon": None}), ("u", {"id": 1, "name": "a3", "coupon": 7})]
    kafka_broker.produce(topic, [_event(op, row, 100 + at) for at, (op, row) in enumerate(events)], partition=0)
    return [(1, "a3", "7"), (2, "b2", None), (4, "d", "X1")]


# CI runs the killed run, whose first driver takes the straight path up to its kill; the straight run is extended
@pytest.mark.parametrize("kill", [pytest.param(False, marks=pytest.mark.extended), True],
                         ids=["straight", "killed-after-the-column"])
def test_a_new_field_becomes_a_column_and_its_values_load(tmp_path, kafka_broker, kill):
    topic = f"cdc-add-{tmp_path.name[-10:]}"
    job = _job(tmp_path, kafka_broker, topic)
    expected = _produce(kafka_broker, topic)
    if kill:
        assert job.run(0, crash_at="after-columns-added") == -signal.SIGKILL, job.log_tail(0)
        assert job.run(1) == 0, job.log_tail(1)
    else:
        assert job.run(0) == 0, job.log_tail(0)
    assert sorted(job.read_embedded("customers FINAL", "id, name, coupon")) == expected
    assert job.read_embedded(DEAD_LETTERS, "reason") == []
    with open_target(job.data_dir / "clickhouse", "default") as target:
        columns = dict(target.client().query(
            "SELECT name, type FROM system.columns WHERE database = 'default' AND table = 'customers'").result_rows)
    assert columns["coupon"] == "Nullable(String)"
    job.verify_journal()
    assert "adding column(s) ['coupon']" in (job.logs / "driver-0.log").read_text()
