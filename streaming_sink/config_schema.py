"""The shape of `job.toml`: every section and key with its type and default, in one place.

The types are strict (`"false"` is not a boolean, `true` is not a port) and drive three things:
decoding (msgspec), unknown-key detection with did-you-mean (config.py), and the JSON Schema that
editors use to complete and check the file (`docs/job.schema.json`, `python -m
streaming_sink.config_schema` writes it). Checks that relate keys to each other live in config.py.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from .job_id import JOB_ID_PATTERN

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "docs" / "job.schema.json"

Port = Annotated[int, msgspec.Meta(ge=0, le=65535, description="a TCP port; 0 picks a free one")]
Positive = Annotated[int, msgspec.Meta(gt=0)]
#: What the job does with a message holding a top-level JSON field its table's schema lacks (frame.py).
UnknownFieldAction = Literal["dead-letter", "ignore", "fail", "add-column"]
#: How a Kafka message's value reads: a JSON object of the table's fields, or a Debezium change event (frame.py).
SourceFormat = Literal["json", "debezium"]


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """A TOML table: unknown keys are refused."""


class Kafka(_Section):
    bootstrap_servers: Annotated[str | list[str], msgspec.Meta(description='"host:port[,host:port]" or a list')]
    topics: list[str] | None = None
    topic_pattern: Annotated[str | None, msgspec.Meta(
        description='subscribe to every topic whose whole name matches this regex (Spark\'s subscribePattern), '
                    'e.g. "^pg\\.public\\..+$"; instead of topics')] = None
    starting_offsets: Annotated[str, msgspec.Meta(description='earliest, latest or JSON {"topic": {"0": offset}}')] = "earliest"
    max_offsets_per_trigger: Positive | None = None
    format: Annotated[SourceFormat, msgspec.Meta(description=(
        '"json": each message is a JSON object of its table\'s fields; "debezium": each message is a Debezium change '
        'event (with or without its schema part), loaded as an upsert or a delete of its key (docs/change-streams.md)'))] = "json"
    options: Annotated[dict[str, Any], msgspec.Meta(
        description="options of Spark's Kafka source by their Spark names, e.g. \"kafka.security.protocol\"; "
                    "a value may be { env = \"NAME\" } to read it from the environment")] = {}


class Routing(_Section):
    field: str | None = None
    topics: dict[str, str] | None = None
    table: str | None = None
    topic_table: Annotated[str | None, msgspec.Meta(
        description='a regex over the topic whose first group is the table, e.g. "^pg\\.public\\.(.+)$"; a table '
                    'not under [tables] takes its columns from the target\'s table')] = None


class Table(_Section):
    schema: Annotated[str, msgspec.Meta(description="the message's JSON fields as Spark DDL")]
    select: Annotated[str | None, msgspec.Meta(
        description='the columns the table gets, as a Spark SQL select list over the message\'s fields and the '
                    'metadata columns, e.g. "id, upper(name) AS name, amount * 100 AS cents"; none: the fields as they are')] = None
    key: Annotated[list[str] | None, msgspec.Meta(description=(
        'with kafka.format = "debezium": the columns that identify a row (the source table\'s primary key); none: '
        'the target table\'s own key'))] = None


class DeadLetters(_Section):
    table: str


class Target(_Section):
    url: str | None = None
    database: str = "default"
    options: dict[str, Any] = {}
    create_tables: bool | None = None


class State(_Section):
    url: str | None = None
    wait_replicas: Annotated[Annotated[int, msgspec.Meta(ge=0)] | Literal["auto"] | None, msgspec.Meta(
        description='Redis: replicas each journal write must reach before the job acts on it; "auto" (the '
                    'default): those connected when the job starts')] = None
    wait_timeout: Annotated[str | None, msgspec.Meta(
        description='Redis: how long a journal write waits for its replicas, e.g. "5 seconds" (the default)')] = None


class Trigger(_Section):
    interval: Annotated[str, msgspec.Meta(description='"available-now" or an interval such as "10 seconds"')] = "available-now"


class Sink(_Section):
    flush_bytes: Annotated[int | str, msgspec.Meta(description='bytes, or a size such as "64MiB"')] = 64 * 1024 * 1024
    checkpoint: str | None = None
    metadata_columns: bool | list[Literal["topic", "partition", "offset", "timestamp", "key"]] = True
    on_unknown_field: Annotated[UnknownFieldAction, msgspec.Meta(
        description='a message with a top-level JSON field its table\'s schema lacks: "dead-letter" (the default: '
                    'the message goes to the dead letters, the reason names the fields), "ignore" (the field is '
                    'dropped, and counted), "fail" (the batch fails naming the message) or, for change events into tables the '
                    'job created, "add-column" (the table gains the column, then the batch loads with it)')] = "dead-letter"
    metrics_port: Port | None = None
    metrics_host: str = "127.0.0.1"
    accept_empty_state: bool = False
    transaction_share: Annotated[float, msgspec.Meta(gt=0, le=1, description=(
        "the share of the server's transaction limits (running transactions, remembered labels) one batch may "
        "hold at once; a batch past it commits in waves"))] = 0.5
    spread: Annotated[Literal["auto", "always", "never"], msgspec.Meta(description=(
        'whether a table\'s rows go to a bounded number of writers: "auto" when a batch could hold more than '
        'spread_above transactions or the budget, "always", "never"'))] = "auto"
    spread_above: Annotated[int, msgspec.Meta(ge=1, description=(
        "with spread = \"auto\": spread a batch whose tables x writers could pass this many transactions"))] = 100
    query_restarts: Annotated[int, msgspec.Meta(ge=0, description=(
        "how often in a row the job restarts its streaming query from the checkpoint, in the same process, after a "
        "transient fault (a connection cut, an executor lost; docs/runbook.md, \"Transient faults\") before it stops; "
        "a finished batch starts the count again; 0: it stops at the first"))] = 5
    driver_fetch: Annotated[Literal["stream", "partitions"], msgspec.Meta(
        description='an engine embedded in the driver: "stream" computes every partition at once (faster, the driver JVM may hold '
                    'the whole batch); "partitions" one at a time (two held)')] = "stream"


class Spark(_Section):
    conf: dict[str, str | int | float | bool] = {}


class JobConfig(_Section):
    """One packaged job: Kafka topics to target tables, exactly once."""

    job_id: Annotated[str, msgspec.Meta(pattern=JOB_ID_PATTERN)]
    kafka: Kafka
    routing: Routing
    tables: dict[str, Table] = {}
    data_dir: str | None = None
    dead_letters: DeadLetters | None = None
    target: Target = msgspec.field(default_factory=Target)
    state: State = msgspec.field(default_factory=State)
    trigger: Trigger = msgspec.field(default_factory=Trigger)
    sink: Sink = msgspec.field(default_factory=Sink)
    spark: Spark = msgspec.field(default_factory=Spark)


def json_schema() -> dict[str, Any]:
    schema = msgspec.json.schema(JobConfig)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "streaming-sink job.toml"
    return schema


def main() -> int:
    """Write the JSON Schema of job.toml (a test keeps the published file equal to this)."""
    SCHEMA_PATH.write_text(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")
    print(f"wrote {SCHEMA_PATH}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
