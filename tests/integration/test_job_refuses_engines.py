"""A job whose table the sink cannot commit atomically stops at start, before Spark reads anything, and
the error names the table's engine and what to load instead (docs/clickhouse-clusters.md)."""
from __future__ import annotations

import pytest

from streaming_sink.errors import ConfigurationError
from streaming_sink.job import run
from streaming_sink.job_spec import JobSpec
from tests.support.pipeline import open_target

DB = "analytics"


def test_a_table_of_an_engine_the_sink_cannot_commit_stops_the_job_naming_the_engine(tmp_path, kafka_broker, new_topic):
    topic = new_topic()
    with open_target(tmp_path / "ch", DB) as target:
        client = target.client()
        client.command(f"CREATE DATABASE {DB}")
        client.command(f"CREATE TABLE {DB}.orders (id Int64) ENGINE = MergeTree ORDER BY id")
        client.command(f"CREATE TABLE {DB}.audit (id Int64) ENGINE = Log")
    spec = JobSpec(
        job_id="engines", bootstrap=kafka_broker.bootstrap, topics=[topic],
        target_url=f"chdb://{tmp_path / 'ch'}", database=DB, state_url=f"file://{tmp_path / 'state'}",
        checkpoint=str(tmp_path / "ckpt"), tables={"orders": "id BIGINT", "audit": "id BIGINT"}, table_field="table",
    )
    with pytest.raises(ConfigurationError, match=r"analytics\.audit: Log: .*") as refused:
        run(spec)
    assert "orders" not in str(refused.value)  # the loadable table is not blamed
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").rglob("offsets/*"))  # nothing was read
    # the refused job let go of the embedded engine: this process can open another path (one at a time)
    with open_target(tmp_path / "other", DB) as other:
        assert other.client().command("SELECT 1") == 1
