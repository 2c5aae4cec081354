"""The packaged job's resolved description (`JobSpec`): what config.py makes of job.toml, and what
tests hand `python -m streaming_sink.job --spec`. It checks what relates its fields to each other.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, get_args

from .config_schema import SourceFormat, UnknownFieldAction
from .errors import ConfigurationError
from .kafka_source import KafkaSource, check_options, check_starting_offsets
from .targets import descriptor_for

#: Kafka record field -> (the column it becomes in every data table, its Spark type).
METADATA_COLUMNS = {
    "topic": ("kafka_topic", "STRING NOT NULL"),
    "partition": ("kafka_partition", "INT NOT NULL"),
    "offset": ("kafka_offset", "BIGINT NOT NULL"),
    "timestamp": ("kafka_timestamp", "TIMESTAMP NOT NULL"),
    "key": ("kafka_key", "STRING"),  # the key's bytes as UTF-8 text; NULL for a record without a key
}

UNKNOWN_FIELD_ACTIONS: tuple[str, ...] = get_args(UnknownFieldAction)


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
    table_selects: dict[str, str] | None = None  # table -> its Spark SQL projection (projection.py); None: none
    source_format: SourceFormat = "json"  # "debezium": messages are change events (frame.py, changes.py)
    table_keys: dict[str, list[str]] | None = None  # table -> its key columns (debezium); else the target's key
    table: str | None = None  # every message to this table
    table_field: str | None = None  # or: the message field that names its table
    topic_tables: dict[str, str] | None = None  # or: topic -> table
    topic_table: str | None = None  # or: a regex whose first group over the topic is the table (target_tables.py)
    dead_letter_table: str | None = None  # None: a bad message fails the batch loudly instead
    metadata_columns: bool | list[str] = True  # record fields written as kafka_<field>; true: partition, offset
    on_unknown_field: UnknownFieldAction = "dead-letter"  # a JSON field the table's schema lacks (frame.py)
    max_offsets_per_trigger: int | None = None
    starting_offsets: str = "earliest"
    trigger: str = "available-now"  # or a processing-time interval such as "5 seconds"
    flush_bytes: int = 64 * 1024 * 1024
    accept_empty_state: bool = False  # start once on a deliberately emptied state store (see the runbook)
    driver_fetch: str = "stream"  # writers in the driver (chdb): how the batch reaches them (execution.DRIVER_FETCHES)
    transaction_share: float = 0.5  # of the server's transaction limits, per batch (waves.py)
    spread: str = "auto"  # a table's rows over a bounded number of writers (waves.SPREADS)
    spread_above: int = 100  # with "auto": spread past this many transactions
    query_restarts: int = 5  # restarts of the query in a row after a transient fault before the job stops (job.py)
    create_tables: bool = False  # create missing tables from the schemas (embedded ClickHouse only)
    metrics_port: int | None = None  # serve per-batch figures as Prometheus text on this port
    metrics_host: str = "127.0.0.1"  # the address the metrics endpoint binds ("0.0.0.0": every interface)
    target_options: dict[str, Any] = field(default_factory=dict)
    spark_conf: dict[str, str] = field(default_factory=dict)
    kafka_options: dict[str, str] = field(default_factory=dict, repr=False)  # Spark's names; may hold a secret

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        data: dict[str, Any] = json.loads(text)
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigurationError(f"unknown job spec key(s) {unknown}; known: {sorted(cls.__dataclass_fields__)}")
        spec = cls(**data)
        spec.validate()
        return spec

    def validate(self) -> None:
        routes = [k for k in ("table", "table_field", "topic_tables", "topic_table") if getattr(self, k)]
        if len(routes) != 1:
            raise ConfigurationError(
                f"route messages with exactly one of table, table_field, topic_tables, topic_table (got {routes or 'none'})")
        if self.topic_table and self.tables is None:
            self.tables = {}  # the tables not listed take their columns from the target
        if self.tables is None and self.schema is None:
            raise ConfigurationError("give `tables` (a schema per table) or `schema`")
        unselected = sorted(set(self.table_selects or {}) - set(self.tables or {}))
        if unselected:
            raise ConfigurationError(f"table_selects: {unselected} have no schema in `tables`")
        if self.source_format not in get_args(SourceFormat):
            raise ConfigurationError(f"format: {self.source_format!r} is not one of {', '.join(get_args(SourceFormat))}")
        if self.source_format == "debezium" and self.table_selects:
            raise ConfigurationError(f"tables.{sorted(self.table_selects)[0]}.select: change events (kafka.format = "
                                     "\"debezium\") load the row as it is; remove the select")
        if self.table_keys and self.source_format != "debezium":
            raise ConfigurationError(f"tables.{sorted(self.table_keys)[0]}.key is for change events: set kafka.format = "
                                     "\"debezium\", or remove the key")
        empty = sorted(table for table, key in (self.table_keys or {}).items() if not key or not all(key))
        if empty:
            raise ConfigurationError(f"tables.{empty[0]}.key: give the names of the fields that identify a row, e.g. key = [\"id\"]")
        if self.topic_tables and self.topics is not None and set(self.topic_tables) != set(self.topics):
            raise ConfigurationError(f"topic_tables must map every topic in `topics`: {sorted(self.topics)}")
        if isinstance(self.metadata_columns, bool):
            self.metadata_columns = ["partition", "offset"] if self.metadata_columns else []
        unknown = sorted(set(self.metadata_columns) - set(METADATA_COLUMNS))
        if unknown:
            raise ConfigurationError(f"metadata_columns: {unknown} are not Kafka record fields; choose from {list(METADATA_COLUMNS)}")
        if not isinstance(self.query_restarts, int) or isinstance(self.query_restarts, bool) or self.query_restarts < 0:
            raise ConfigurationError(f"query_restarts: {self.query_restarts!r} is not a whole number, 0 or more")
        if self.on_unknown_field not in UNKNOWN_FIELD_ACTIONS:
            raise ConfigurationError(f"on_unknown_field: {self.on_unknown_field!r} is not one of {', '.join(UNKNOWN_FIELD_ACTIONS)}")
        descriptor = descriptor_for(self.target_url)
        if self.on_unknown_field == "add-column" and not (self.changes and self.create_tables and self.tables):
            raise ConfigurationError(
                'on_unknown_field = "add-column" adds columns to tables the job created for change events: it needs '
                'kafka.format = "debezium", tables listed under [tables] and a target that creates them (target.create_tables, '
                "on a target that can)")
        if self.create_tables and not descriptor.creates_tables:
            raise ConfigurationError(f"create_tables: {descriptor.product} tables are never created by the sink")
        self.kafka_options = check_options(self.kafka_options, "kafka_options")
        check_starting_offsets(self.starting_offsets, "starting_offsets")

    @property
    def changes(self) -> bool:
        """Whether the messages are change events: every table then takes upserts and deletes of its key."""
        return self.source_format == "debezium"

    def kafka_source(self) -> KafkaSource:
        return KafkaSource(self.bootstrap, self.topics, self.starting_offsets, self.max_offsets_per_trigger, self.kafka_options)

    def metadata(self) -> list[tuple[str, str, str]]:
        """(record field, column name, Spark type) of each metadata column, in the table's order."""
        fields = ["partition", "offset"] if self.metadata_columns is True else self.metadata_columns or []
        return [(f, *METADATA_COLUMNS[f]) for f in METADATA_COLUMNS if f in fields]

