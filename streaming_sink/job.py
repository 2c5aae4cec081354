"""The packaged Kafka ingestion job: JSON messages from Kafka topics into target tables, exactly once.

`python -m streaming_sink.job --spec spec.json` runs one streaming query described by a JSON spec
(see `JobSpec`). It is what the demo and the end-to-end crash tests run in a child process, so a
test can SIGKILL the driver and start it again on the same checkpoint.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

from state import open_store

from .sink import ExactlyOnceSink
from .targets import ClickHouseTarget, ConfigurationError, Target


@dataclass
class JobSpec:
    job_id: str
    bootstrap: str
    topics: list[str]
    schema: str  # Spark DDL of the JSON value, e.g. "id BIGINT, name STRING"
    target_url: str
    database: str
    state_url: str
    checkpoint: str
    table: str | None = None
    table_field: str | None = None  # a field of the message that names the target table
    metadata_columns: bool = True  # add kafka_partition and kafka_offset columns
    max_offsets_per_trigger: int | None = None
    starting_offsets: str = "earliest"
    trigger: str = "available-now"  # or a processing-time interval such as "5 seconds"
    flush_bytes: int = 64 * 1024 * 1024
    spark_conf: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        data: dict[str, Any] = json.loads(text)
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigurationError(f"unknown job spec key(s) {unknown}; known: {sorted(known)}")
        return cls(**data)


def make_target(spec: JobSpec) -> Target:
    if spec.target_url.startswith(("chdb:", "http:", "https:")):
        return ClickHouseTarget(spec.target_url, database=spec.database)
    raise ConfigurationError(f"target_url {spec.target_url!r}: only ClickHouse (chdb:// or http://) so far")


def build_sink(spec: JobSpec) -> ExactlyOnceSink:
    routing_column = "__table" if spec.table_field else None
    return ExactlyOnceSink(
        target=make_target(spec),
        state=open_store(spec.state_url),
        job_id=spec.job_id,
        table=spec.table,
        table_column=routing_column,
        flush_bytes=spec.flush_bytes,
    )


def run(spec: JobSpec) -> None:
    from pyspark.sql import SparkSession, functions as F

    sink = build_sink(spec)
    sink.start()  # configuration and connectivity errors surface here, before Spark reads anything
    builder = SparkSession.builder.appName(f"streaming-sink:{spec.job_id}")
    for key, value in spec.spark_conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", spec.bootstrap)
        .option("subscribe", ",".join(spec.topics))
        .option("startingOffsets", spec.starting_offsets)
        .option("failOnDataLoss", "true")
    )
    if spec.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", spec.max_offsets_per_trigger)
    raw = reader.load()
    parsed = raw.select(
        F.from_json(F.col("value").cast("string"), spec.schema).alias("v"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
    )
    columns = [F.col(f"v.{name}") for name in spark.createDataFrame([], spec.schema).columns if name != spec.table_field]
    if spec.table_field:
        columns.append(F.col(f"v.{spec.table_field}").alias("__table"))
    if spec.metadata_columns:
        columns += [F.col("kafka_partition"), F.col("kafka_offset")]
    writer = parsed.select(*columns).writeStream.foreachBatch(sink).option("checkpointLocation", spec.checkpoint)
    if spec.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=spec.trigger)
    query = writer.start()
    query.awaitTermination()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streaming_sink.job", description=__doc__)
    parser.add_argument("--spec", required=True, help="path of the JSON job spec")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    with open(args.spec) as handle:
        spec = JobSpec.from_json(handle.read())
    run(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
