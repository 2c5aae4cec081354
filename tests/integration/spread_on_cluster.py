"""The driver of `test_spread.py`'s cluster test, in its own process (a Python process holds one SparkContext).

`python -m tests.integration.spread_on_cluster SPEC.json`: connects to the standalone master, writes the spread batch
of `test_spread.source_rows` through `ExactlyOnceSink` (writers in tasks, Redis store) into the StarRocks emulator,
and prints one line `SPREAD_RESULT {...}`: the batch's report and, per committable, the host its task ran on (from
Spark's monitoring API).
"""
from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

from streaming_sink import ExactlyOnceSink
from streaming_sink.labels import Attempt
from streaming_sink.state import RedisStateStore
from streaming_sink.targets.starrocks import StarRocksTarget
from tests.integration.test_spread import DB, JOB, QUERY, PlannedRunner, frame, plan_of, source_rows
from tests.support.pipeline import REPO
from tests.support.services.spark import local_spark_session
from tests.support.targets.starrocks import FAST


def task_hosts(ui: str, app: str) -> dict[int, str]:
    """Every task of the application: task attempt id -> the host of the executor it ran on."""

    def get(path: str) -> Any:
        with urllib.request.urlopen(f"{ui}/api/v1/applications/{app}{path}", timeout=30) as answer:
            return json.load(answer)

    hosts: dict[int, str] = {}
    for stage in get("/stages"):
        detail = get(f"/stages/{stage['stageId']}/{stage['attemptId']}?details=true")
        for task in detail.get("tasks", {}).values():
            hosts[int(task["taskId"])] = str(task["host"])
    return hosts


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    spark = local_spark_session("spread-on-cluster", {
        "spark.master": spec["master"],
        "spark.executor.cores": "1",
        "spark.executor.memory": "768m",
        "spark.executorEnv.PYTHONPATH": str(REPO),
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.ui.enabled": "true",
        "spark.ui.port": str(spec["ui_port"]),
        "spark.sql.execution.arrow.maxRecordsPerBatch": "50",
    })
    rows = source_rows()
    plan = plan_of(rows)
    target = StarRocksTarget(spec["fe_url"], DB, "root", spec["password"], **FAST)
    sink = ExactlyOnceSink(target, RedisStateStore(spec["redis_url"]), JOB, table_column="__table", flush_bytes=4096,
                           runner=PlannedRunner(plan), heartbeat_seconds=None)
    report = sink.process(frame(spark, rows), 0, QUERY)
    hosts = task_hosts(f"http://127.0.0.1:{spec['ui_port']}", spark.sparkContext.applicationId)
    record = RedisStateStore(spec["redis_url"]).get_batch(JOB, QUERY, 0)
    assert record is not None
    committables = []
    for committable in record.committables:
        attempt = Attempt.parse(committable.attempt)
        host = hosts.get(attempt.task) if attempt is not None else None
        committables.append({"table": committable.table, "partition": committable.partition, "host": host})
    spark.stop()
    print("SPREAD_RESULT " + json.dumps({"records_in": report.records_in, "action": report.action,
                                         "committables": committables, "writers": dict(plan.writers)}), flush=True)


if __name__ == "__main__":
    main()
