"""The packaged Kafka ingestion job: JSON messages from Kafka topics into target tables, exactly once.

Each message is routed to a table (by a field of the message, or by its topic), parsed with that
table's schema, and written by the ExactlyOnceSink. A message that cannot be routed or parsed,
lacks a required (NOT NULL) field, or holds a value its table's column cannot hold (value_checks.py)
goes to the dead-letter table with its raw value, topic,
partition, offset, Kafka timestamp and the reason: exactly once, like every other row, because it
travels through the same two-phase commit. Every column is derived from the Kafka record alone, so
a re-run batch produces the same rows (the replay checksum depends on it).

`python -m streaming_sink.job --spec spec.json` runs a resolved JobSpec (the form tests use);
`streaming-sink run --config job.toml` (cli.py) reads the user-facing TOML (config.py) first.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

from state import open_store

from .intervals import parse_interval
from .kafka_source import KafkaSource, check_options, check_starting_offsets, probe
from .metrics import OBSERVED_NAME, BatchMetrics, progress_listener
from .routing import struct_column_for
from .sink import ExactlyOnceSink
from .targets import ConfigurationError, target_from_url, target_kind
from .value_checks import column_limits, value_problems

ROUTE_COLUMN = "__table"
_BAD_COLUMN = "__streaming_sink_bad"  # only between build_frame's select and its observe
DEAD_LETTER_COLUMNS = "raw_value STRING, topic STRING, partition INT, offset BIGINT, kafka_timestamp TIMESTAMP, reason STRING"
#: Kafka record field -> (the column it becomes in every data table, its Spark type).
METADATA_COLUMNS = {
    "topic": ("kafka_topic", "STRING NOT NULL"),
    "partition": ("kafka_partition", "INT NOT NULL"),
    "offset": ("kafka_offset", "BIGINT NOT NULL"),
    "timestamp": ("kafka_timestamp", "TIMESTAMP NOT NULL"),
    "key": ("kafka_key", "STRING"),  # the key's bytes as UTF-8 text; NULL for a record without a key
}


@dataclass
class JobSpec:
    job_id: str
    bootstrap: str
    topics: list[str] | None  # None: kafka_options subscribe by subscribePattern or assign
    target_url: str
    database: str
    state_url: str = field(repr=False)  # a Redis URL may carry its password
    checkpoint: str
    tables: dict[str, str] | None = None  # table -> Spark DDL of its JSON fields; None: `schema` for every target table
    schema: str | None = None  # one schema shared by all tables (only with table_field and no `tables`)
    table: str | None = None  # every message to this table
    table_field: str | None = None  # or: the message field that names its table
    topic_tables: dict[str, str] | None = None  # or: topic -> table
    dead_letter_table: str | None = None  # None: a bad message fails the batch loudly instead
    metadata_columns: bool | list[str] = True  # record fields written as kafka_<field>; true: partition, offset
    max_offsets_per_trigger: int | None = None
    starting_offsets: str = "earliest"
    trigger: str = "available-now"  # or a processing-time interval such as "5 seconds"
    flush_bytes: int = 64 * 1024 * 1024
    accept_empty_state: bool = False  # start once on a deliberately emptied state store (see the runbook)
    create_tables: bool = False  # create missing tables from the schemas (embedded ClickHouse only)
    metrics_port: int | None = None  # serve per-batch figures as Prometheus text on this port
    metrics_host: str = "127.0.0.1"  # the address the metrics endpoint binds ("0.0.0.0": every interface)
    target_options: dict[str, Any] = field(default_factory=dict)
    spark_conf: dict[str, str] = field(default_factory=dict)
    kafka_options: dict[str, str] = field(default_factory=dict, repr=False)  # Spark's names; may hold a secret

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        data: dict[str, Any] = json.loads(text)
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigurationError(f"unknown job spec key(s) {unknown}; known: {sorted(cls.__dataclass_fields__)}")
        spec = cls(**data)
        spec.validate()
        return spec

    def validate(self) -> None:
        routes = [k for k in ("table", "table_field", "topic_tables") if getattr(self, k)]
        if len(routes) != 1:
            raise ConfigurationError(f"route messages with exactly one of table, table_field, topic_tables (got {routes or 'none'})")
        if self.tables is None and self.schema is None:
            raise ConfigurationError("give `tables` (a schema per table) or `schema`")
        if self.topic_tables and self.topics is not None and set(self.topic_tables) != set(self.topics):
            raise ConfigurationError(f"topic_tables must map every topic in `topics`: {sorted(self.topics)}")
        if isinstance(self.metadata_columns, bool):
            self.metadata_columns = ["partition", "offset"] if self.metadata_columns else []
        unknown = sorted(set(self.metadata_columns) - set(METADATA_COLUMNS))
        if unknown:
            raise ConfigurationError(f"metadata_columns: {unknown} are not Kafka record fields; choose from {list(METADATA_COLUMNS)}")
        if self.create_tables and not target_kind(self.target_url).creates_tables:
            raise ConfigurationError(f"create_tables: {target_kind(self.target_url).product} tables are never created by the sink")
        self.kafka_options = check_options(self.kafka_options, "kafka_options")
        check_starting_offsets(self.starting_offsets, "starting_offsets")

    def kafka_source(self) -> KafkaSource:
        return KafkaSource(self.bootstrap, self.topics, self.starting_offsets, self.max_offsets_per_trigger, self.kafka_options)

    def metadata(self) -> list[tuple[str, str, str]]:
        """(record field, column name, Spark type) of each metadata column, in the table's order."""
        fields = ["partition", "offset"] if self.metadata_columns is True else self.metadata_columns or []
        return [(f, *METADATA_COLUMNS[f]) for f in METADATA_COLUMNS if f in fields]


def build_sink(spec: JobSpec) -> ExactlyOnceSink:
    """The job's sink; with `metrics_port`, a BatchMetrics among its listeners, already serving."""
    target = target_from_url(spec.target_url, spec.database, spec.target_options)
    state = open_store(spec.state_url)
    listeners: list[Any] = []
    if spec.metrics_port is not None:
        metrics = BatchMetrics(spec.job_id, store=state, expiry_limits=target.expiry_limits(),
                               trigger_interval_s=trigger_interval_s(spec.trigger))
        server = metrics.serve(spec.metrics_port, spec.metrics_host)
        logging.getLogger("streaming_sink").info("metrics at http://%s:%d/metrics", *server.server_address[:2])
        listeners.append(metrics)
    return ExactlyOnceSink(
        target=target,
        state=state,
        job_id=spec.job_id,
        table_column=ROUTE_COLUMN,
        flush_bytes=spec.flush_bytes,
        struct_columns=True,
        dead_letter_table=spec.dead_letter_table,
        listeners=listeners,
        checkpoint_location=spec.checkpoint,
        accept_empty_state=spec.accept_empty_state,
    )


def sink_metrics(sink: ExactlyOnceSink) -> BatchMetrics | None:
    """The BatchMetrics `build_sink` gave the sink, if it serves metrics."""
    return next((listener for listener in sink.listeners if isinstance(listener, BatchMetrics)), None)


def trigger_interval_s(trigger: str) -> float | None:
    """The processing-time interval in seconds (None for available-now, or a form Spark reads but we do not)."""
    if trigger == "available-now":
        return None
    try:
        return parse_interval(trigger, "trigger")
    except ConfigurationError:
        return None


def resolve_tables(spec: JobSpec, target_tables: set[str] | None) -> dict[str, str]:
    """Table -> schema, checked against what the target has, before anything is read."""
    if spec.tables is not None:
        tables = dict(spec.tables)
    else:
        if target_tables is None:
            raise ConfigurationError("this target cannot list its tables: give `tables` with a schema per table")
        names = {spec.table} if spec.table else set(spec.topic_tables.values()) if spec.topic_tables else target_tables
        tables = {name: spec.schema for name in names}
    if spec.dead_letter_table:
        tables.pop(spec.dead_letter_table, None)
    # Sorted: the frame's column order must not depend on set order (hash seeds differ per process),
    # or a re-run batch would carry the same rows in a different layout and fail its replay checksum.
    tables = dict(sorted(tables.items()))
    if target_tables is not None:
        missing = sorted((set(tables) | ({spec.dead_letter_table} if spec.dead_letter_table else set())) - target_tables)
        if missing:
            raise ConfigurationError(
                f"table(s) {missing} do not exist in the target database {spec.database!r} (or are not loadable there); "
                f"create them first, the sink never creates tables. The target has: {sorted(target_tables)}"
            )
    return tables


def build_frame(raw, spec: JobSpec, tables: dict[str, str], column_types: dict[str, dict[str, str] | None] | None = None):
    """Kafka records -> one route column plus one struct column per table (only the routed one set).

    `column_types` are the target's, per table (`Target.table_columns`): a value its column
    cannot hold makes the message a dead letter naming the column (streaming_sink/value_checks.py).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StringType, StructType

    product = target_kind(spec.target_url).product
    column_types = column_types or {}
    value = F.col("value").cast("string")
    if spec.table:
        route = F.lit(spec.table)
    elif spec.table_field:
        route = F.get_json_object(value, f"$.{spec.table_field}")
    else:
        mapping = F.create_map(*[F.lit(x) for pair in spec.topic_tables.items() for x in pair])
        route = mapping[F.col("topic")]

    columns = []
    utf8 = F.is_valid_utf8(value)
    reason = F.when(value.isNull(), F.lit("message has no value")).when(
        ~utf8, F.lit("message is not valid UTF-8 (raw_value holds its bytes in base64)")
    )
    if any(source == "key" for source, _, _ in spec.metadata()):
        key = F.col("key").cast("string")
        reason = reason.when(key.isNotNull() & ~F.is_valid_utf8(key), F.lit("the record's key is not valid UTF-8 text"))
    reason = reason.when(
        route.isNull(), F.lit(f"message has no {spec.table_field!r} field" if spec.table_field else "no table for the topic")
    ).when(~route.isin(list(tables)), F.concat(F.lit("unknown table "), route))
    for table, ddl in tables.items():
        schema = spark_schema(ddl, f"tables.{table}.schema")
        parse_schema = StructType(
            [StructField(f.name, f.dataType, True) for f in schema.fields if f.name != spec.table_field]
            + [StructField("__corrupt", StringType(), True)]
        )
        parsed = F.from_json(value, parse_schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "__corrupt"})
        mine = route == F.lit(table)
        reason = reason.when(mine & parsed["__corrupt"].isNotNull(), F.lit(f"not valid JSON for the schema of {table}"))
        for f in schema.fields:
            if not f.nullable:
                reason = reason.when(mine & parsed[f.name].isNull(), F.lit(f"required field {f.name!r} of {table} is missing or null"))
        types = column_types.get(table) or {}
        if product != "clickhouse":  # StarRocks and Doris ignore the case of column names
            types = {name.lower(): kind for name, kind in types.items()}
        for f in parse_schema.fields:
            if f.name != "__corrupt":
                spelling = types.get(f.name if product == "clickhouse" else f.name.lower())
                for problem, text in value_problems(table, f, parsed[f.name], column_limits(product, spelling)):
                    reason = reason.when(mine & problem, F.lit(text))
        fields = [parsed[f.name].alias(f.name) for f in parse_schema.fields if f.name != "__corrupt"]
        fields += [F.col(source).cast("string").alias(name) if source == "key" else F.col(source).alias(name)
                   for source, name, _ in spec.metadata()]
        columns.append((table, mine, F.struct(*fields)))

    bad = reason.isNotNull()
    if spec.dead_letter_table:
        raw_value = F.when(utf8, value).otherwise(F.base64(F.col("value")))
        room = column_limits(product, (column_types.get(spec.dead_letter_table) or {}).get("raw_value")).max_bytes
        if room is not None:  # a message longer than raw_value holds: kept in Kafka, named by its coordinates
            too_long = F.octet_length(raw_value) > F.lit(room)
            reason = F.when(too_long, F.concat(reason, F.lit(
                f"; raw_value left empty: the message is longer than the {room} bytes the column holds, "
                "it stays in Kafka at the topic, partition and offset of this row"))).otherwise(reason)
            raw_value = F.when(too_long, F.lit(None)).otherwise(raw_value)
        dead = F.struct(
            raw_value.alias("raw_value"), F.col("topic"), F.col("partition"), F.col("offset"),
            F.col("timestamp").alias("kafka_timestamp"), reason.alias("reason"),
        )
        routed = F.when(bad, F.lit(spec.dead_letter_table)).otherwise(route)
        columns.append((spec.dead_letter_table, bad, dead))
    else:
        # No dead-letter table: the batch fails, and the error names the record and the reason.
        routed = F.when(bad, F.concat(
            F.lit("<bad message "), F.col("topic"), F.lit("/"), F.col("partition").cast("string"), F.lit("@"),
            F.col("offset").cast("string"), F.lit(": "), reason, F.lit("; configure a dead-letter table>"),
        )).otherwise(route)
    # Records in and dead letters also go to Spark's progress (`observedMetrics`, the Spark UI). `observe`
    # passes rows through unchanged; `bad` rides along as a column only so it is not computed twice.
    return raw.select(
        routed.alias(ROUTE_COLUMN),
        *[F.when(condition & (~bad if name != spec.dead_letter_table else F.lit(True)), struct).alias(struct_column_for(name))
          for name, condition, struct in columns],
        bad.alias(_BAD_COLUMN),
    ).observe(
        OBSERVED_NAME, F.count(F.lit(1)).alias("records_in"), F.count_if(F.col(_BAD_COLUMN)).alias("dead_letters"),
    ).drop(_BAD_COLUMN)


def table_schemas(spec: JobSpec, tables: dict[str, str]):
    """The Arrow schema of every table the job writes, as the sink will hand it to the target."""
    import pyarrow as pa

    schemas = {}
    for table, ddl in tables.items():
        metadata = ", ".join(f"{name} {kind}" for _, name, kind in spec.metadata())
        fields = [f for f in arrow_schema(ddl) if f.name != spec.table_field]
        fields += list(arrow_schema(metadata)) if metadata else []
        schemas[table] = pa.schema(fields)
    if spec.dead_letter_table:
        schemas[spec.dead_letter_table] = arrow_schema(DEAD_LETTER_COLUMNS)
    return schemas


def spark_schema(ddl: str, key: str = "schema"):
    """Spark DDL as a StructType; a parse error names the configuration key and Spark's own reason."""
    from pyspark.sql.types import StructType

    try:
        return StructType.fromDDL(ddl)
    except Exception as error:  # Spark's ParseException, raised through py4j or Spark Connect
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigurationError(f"{key}: {ddl!r} is not Spark DDL: {reason}") from None


def arrow_schema(ddl: str):
    """Spark DDL as the Arrow schema Spark hands to Python (timestamps as UTC instants)."""
    import inspect

    from pyspark.sql.pandas.types import to_arrow_schema

    # pyspark 4.0 converts timestamps to UTC by default; 4.2 wants the zone named
    zone = {"timezone": "UTC"} if "timezone" in inspect.signature(to_arrow_schema).parameters else {}
    return to_arrow_schema(spark_schema(ddl), **zone)


def check_columns(target, schemas) -> dict[str, dict[str, str] | None]:
    """Every column the job writes must exist in its table, where the target can tell; returns the
    tables' column types (None where the target cannot tell) for the value checks."""
    found = {}
    for table, schema in schemas.items():
        target.check_schema(table, schema)
        existing = found[table] = target.table_columns(table)
        if existing is None:
            continue
        known = set(existing) if target.kind == "clickhouse" else {name.lower() for name in existing}
        missing = [name for name in schema.names if (name if target.kind == "clickhouse" else name.lower()) not in known]
        if missing:
            raise ConfigurationError(
                f"table {table!r} has no column(s) {missing} that the job writes (it has {list(existing)}); "
                f"add them to the table or remove them from tables.{table}.schema"
            )
    return found


def run(spec: JobSpec) -> None:
    from .spark_session import build_session

    spark = build_session(f"streaming-sink:{spec.job_id}", spec.spark_conf)
    for table, ddl in (spec.tables or {}).items():  # Spark's parser needs the JVM: checked as soon as it runs
        spark_schema(ddl, f"tables.{table}.schema")
    source = spec.kafka_source()
    logging.getLogger("streaming_sink").info("kafka: %s", probe(spark, source))
    sink = build_sink(spec)
    if spec.create_tables and spec.tables is not None:
        for table, schema in table_schemas(spec, spec.tables).items():
            sink.target.create_table(table, schema)
    # configuration, connectivity, tables, columns and fencing all fail here, before Spark reads anything
    sink.start()
    tables = resolve_tables(spec, sink.known_tables)
    columns = check_columns(sink.target, table_schemas(spec, tables))
    reader = spark.readStream.format("kafka").options(**source.reader_options())
    frame = build_frame(reader.load(), spec, tables, columns)
    writer = frame.writeStream.foreachBatch(sink).option("checkpointLocation", spec.checkpoint)
    if spec.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=spec.trigger)
    # Kafka lag into /metrics and a progress line per trigger, from Spark's progress events
    listener = progress_listener(sink_metrics(sink))
    spark.streams.addListener(listener)
    try:
        query = writer.start()
        listener.follow(query.id)
        query.awaitTermination()
        # progress reaches listeners asynchronously: let the last batch's arrive before the listener goes
        last = query.lastProgress
        if last is not None:
            listener.wait_for_batch(int(last["batchId"]), timeout_s=30)
    finally:
        spark.streams.removeListener(listener)


def main(argv: list[str] | None = None) -> int:
    """`python -m streaming_sink.job --spec spec.json`: a resolved JobSpec (what tests run). Users run
    `streaming-sink run --config job.toml` (cli.py), which reads the TOML first."""
    parser = argparse.ArgumentParser(prog="python -m streaming_sink.job", description=__doc__)
    parser.add_argument("--spec", required=True, help="path of a resolved JSON job spec")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        with open(args.spec) as handle:
            run(JobSpec.from_json(handle.read()))
    except ConfigurationError as error:
        print(f"streaming-sink: configuration error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
