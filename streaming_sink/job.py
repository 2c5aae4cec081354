"""The packaged Kafka ingestion job: JSON messages from Kafka topics into target tables, exactly once.

`run` checks everything it can before Spark reads a record (the Kafka source, the target, its
tables and their columns, the state store and fencing), then streams the frame of frame.py into
the ExactlyOnceSink. Dead letters travel through the same two-phase commit as every other row.

`python -m streaming_sink.job --spec spec.json` runs a resolved JobSpec (the form tests use);
`streaming-sink run --config job.toml` (cli.py) reads the user-facing TOML (config.py) first.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from .crash import crash_point
from .errors import ConfigurationError, TransientFaultPersistedError, UnknownTableError, transient_cause
from .execution import SparkWriterRunner, sink_error_of
from .frame import (
    CHANGE_KEY_COLUMN,
    ROUTE_COLUMN,
    build_frame,
    check_columns,
    columns_to_add,
    spark_schema,
    table_projections,
    table_schemas,
    table_slots,
)
from .interrupt import BATCHES
from .intervals import parse_interval
from .job_spec import JobSpec
from .kafka_source import KafkaSource, describe_topics, read_topics
from .metrics import BatchMetrics, progress_listener
from .retry import RetryPolicy, repeats, wait
from .sink import ExactlyOnceSink
from .state import open_store
from .target_tables import job_tables
from .targets import descriptor_for, target_from_url
from .targets.base import SupportsAddColumns, SupportsCreateTable, Target

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def build_sink(spec: JobSpec) -> ExactlyOnceSink:
    """The job's sink; with `metrics_port`, a BatchMetrics among its listeners, already serving."""
    target = target_from_url(spec.target_url, spec.database, spec.target_options)
    state = open_store(spec.state_url)
    listeners: list[Any] = []
    if spec.metrics_port is not None:
        metrics = BatchMetrics(spec.job_id, store=state, expiry_limits=target.expiry_limits,
                               trigger_interval_s=trigger_interval_s(spec.trigger),
                               target=descriptor_for(spec.target_url).product)
        server = metrics.serve(spec.metrics_port, spec.metrics_host)
        logging.getLogger("streaming_sink").info("metrics at http://%s:%d/metrics", *server.server_address[:2])
        listeners.append(metrics)
    return ExactlyOnceSink(
        target=target,
        state=state,
        job_id=spec.job_id,
        table_column=ROUTE_COLUMN,
        flush_bytes=spec.flush_bytes,
        dead_letter_table=spec.dead_letter_table,
        listeners=listeners,
        checkpoint_location=spec.checkpoint,
        accept_empty_state=spec.accept_empty_state,
        runner=SparkWriterRunner(spec.driver_fetch),
        transaction_share=spec.transaction_share,
        spread=spec.spread,
        spread_above=spec.spread_above,
        change_key=(CHANGE_KEY_COLUMN,) if spec.changes else (),
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


#: Spark settings the packaged job starts with unless `[spark.conf]` says otherwise: Spark's console progress bar
#: (`[Stage 54:===> (4 + 1) / 5]`) would run into the job's own log lines.
JOB_SPARK_DEFAULTS = {"spark.ui.showConsoleProgress": "false"}


def job_spark_conf(spec: JobSpec) -> dict[str, str]:
    """The job's Spark conf: the defaults above, then the user's `[spark.conf]`."""
    return {**JOB_SPARK_DEFAULTS, **spec.spark_conf}


def run(spec: JobSpec, on_session: Callable[[], None] = lambda: None) -> None:
    """Run the job until its query ends; the target and the state store are closed however it ends.
    `on_session` runs once Spark has started (the CLI installs its Ctrl-C handling there)."""
    from .spark_session import build_session

    spark = build_session(f"streaming-sink:{spec.job_id}", job_spark_conf(spec))
    on_session()
    for table, ddl in (spec.tables or {}).items():  # Spark's parser needs the JVM: checked as soon as it runs
        spark_schema(ddl, f"tables.{table}.schema")
    table_projections(spec, spec.tables or {})
    source = spec.kafka_source()
    topics = read_topics(spark, source)
    logging.getLogger("streaming_sink").info("kafka: %s", describe_topics(source, topics))
    sink = build_sink(spec)
    try:
        run_query(lambda: _stream(spark, spec, source, sink, topics), spec, sink)
    finally:  # an embedded engine holds its path for the whole process until its target is closed
        sink.close()
    ridden = repeats()
    if any(ridden.values()):  # what /metrics counted, for a run whose endpoint is gone with it
        logging.getLogger("streaming_sink").info("repeats after transient faults in this run: %s",
                                                 ", ".join(f"{level} {count}" for level, count in ridden.items()))


def run_query(stream: Callable[[], None], spec: JobSpec, sink: ExactlyOnceSink) -> None:
    """`stream()` (the query, to its end), started again from its checkpoint in this process when it stopped on
    what a restart cures: fields to add as columns, or a transient fault (bounded: `QueryRestarts`)."""
    added: set[tuple[str, str]] = set()
    restarts = QueryRestarts(spec.query_restarts)
    while True:
        try:
            stream()
            return
        except UnknownTableError as error:  # the batch met fields to add as columns: add them, run it again
            wanted = columns_to_add(str(error)) if spec.on_unknown_field == "add-column" else None
            if wanted is None:
                raise
            _add_columns(sink.target, *wanted, added)
        except Exception as error:  # a transient fault: the query starts again from its checkpoint, bounded
            cause = transient_cause(error)
            # a server that refused the job before any batch finished is a wrong address more often than a blip:
            # said at once, in the error's own words, rather than after a series of restarts
            if cause is None or (sink.last_report is None and not cause.reached_server):
                raise
            restarts.pause(error, sink.last_report.batch_id if sink.last_report else None)


#: How the restarts of one series after transient faults are spaced and bounded in time (their number is the job's
#: `query_restarts`): 2 s, doubling up to a minute, none later than 15 minutes after the series' first failure.
QUERY_RESTART_BACKOFF_S, QUERY_RESTART_BACKOFF_MAX_S, QUERY_RESTART_WINDOW_S = 2.0, 60.0, 900.0


class QueryRestarts:
    """The packaged job's restarts of its streaming query after a transient fault (`errors.TRANSIENT_CAUSES`): a
    series of at most `restarts`, spaced and bounded in time as above, counted in the metrics (`retries`, level
    query). A batch that finished since the series' last failure ends the series: the job rode that fault through.
    Restarting is what a restart of the process would do, without leaving it: the query resumes from its checkpoint,
    and the sink recovers the batch it was in (commits it if it was prepared, else aborts and writes it again)."""

    def __init__(self, restarts: int) -> None:
        self.policy = RetryPolicy(restarts, QUERY_RESTART_BACKOFF_S, QUERY_RESTART_BACKOFF_MAX_S, QUERY_RESTART_WINDOW_S)
        self._pauses: Iterator[float] = iter(())
        self._progress: object = object()  # no series yet
        self._failures, self._since = 0, 0.0

    def pause(self, error: BaseException, progress: int | None) -> None:
        """Wait before the query's restart after `error`, a transient fault; `progress`: the newest batch the sink
        finished. Raises TransientFaultPersistedError once the series is spent."""
        cause = transient_cause(error)
        assert cause is not None, "only a transient fault is ridden through"
        if progress != self._progress:  # the first failure, or batches finished since the last one: a new series
            self._pauses, self._progress, self._failures, self._since = self.policy.pauses(), progress, 0, time.monotonic()
        self._failures += 1
        pause = next(self._pauses, None)
        said = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)[:400]
        if pause is None:
            raise TransientFaultPersistedError(
                f"the streaming query failed on a transient fault ({cause.name}) {self._failures} time(s) in a row "
                f"over {time.monotonic() - self._since:.0f}s, restarted from its checkpoint after each but the last "
                f"(sink.query_restarts = {self.policy.retries}, within {QUERY_RESTART_WINDOW_S:.0f}s), and stopped: "
                f"{said}. Nothing is lost: once the cause is fixed, the same command resumes. "
                + TransientFaultPersistedError.RUNBOOK) from error
        wait(pause, f"restarting the streaming query from its checkpoint ({self._failures} of at most "
                    f"{self.policy.retries} in a row) after a transient fault ({cause.name}): {said}", level="query")


def tables_run_creates(spec: JobSpec, target: Target, existing: set[str] | None) -> dict[str, pa.Schema]:
    """The tables `run` creates before it starts (`target.create_tables` on a target that can), with their schemas:
    those of the job's tables (dead letters included) the target does not have. Creates nothing: `doctor` asks too."""
    if not (spec.create_tables and spec.tables is not None and isinstance(target, SupportsCreateTable)):
        return {}
    return {table: schema for table, schema in table_schemas(spec, spec.tables).items()
            if existing is None or table not in existing}


def _add_columns(target: Target, table: str, fields: list[str], added: set[tuple[str, str]]) -> None:
    """Add a table's new fields as Nullable string columns (the JSON text of each value); the query then starts again
    from its checkpoint and re-reads the batch, which nothing committed, with the columns in its table's schema."""
    again = sorted(field for field in fields if (table, field) in added)
    if again:
        raise UnknownTableError(f"table {table!r} gained column(s) {again}, but the batch still carries them as unknown "
                                "fields: check the table's columns")
    logging.getLogger("streaming_sink").warning("table %s: adding column(s) %s, new in its change events "
                                                "(sink.on_unknown_field = \"add-column\")", table, fields)
    cast(SupportsAddColumns, target).add_columns(table, [pa.field(name, pa.string()) for name in fields])
    added.update((table, field) for field in fields)
    crash_point("after-columns-added", -1)


def grown_tables(spec: JobSpec, target: Target, tables: dict[str, str]) -> dict[str, str]:
    """With `add-column`, each listed table's schema and the columns its target table gained since (added for fields
    of its change events, as Nullable strings: `_add_columns`); the sink's own `__` columns are no fields."""
    if spec.on_unknown_field != "add-column":
        return tables
    grown = {}
    for table, ddl in tables.items():
        known = {name.lower() for name in spark_schema(ddl).names} | {name.lower() for _, name, _ in spec.metadata()}
        extra = [name for name in (target.table_columns(table) or {})
                 if name.lower() not in known and not name.startswith("__")]
        grown[table] = ", ".join([ddl, *(f"`{name.replace('`', '``')}` STRING" for name in extra)])
    return grown


def _stream(spark: SparkSession, spec: JobSpec, source: KafkaSource, sink: ExactlyOnceSink, topics: list[str]) -> None:
    """Check the tables, then run the query to its end. `topics`: those the job reads now."""
    for table, schema in tables_run_creates(spec, sink.target, None).items():
        # each unless it exists; a change table keyed by its key (a ReplacingMergeTree on ClickHouse)
        cast(SupportsCreateTable, sink.target).create_table(table, schema, tuple((spec.table_keys or {}).get(table, ())))
    # configuration, connectivity, tables, columns and fencing all fail here, before Spark reads anything
    sink.start()
    resolved = job_tables(spec, sink.target, sink.known_tables, topics)
    resolved = replace(resolved, tables=grown_tables(spec, sink.target, resolved.tables))
    sink.expect_tables({*resolved.tables, *([spec.dead_letter_table] if spec.dead_letter_table else [])})
    for table, why in resolved.unavailable.items():
        logging.getLogger("streaming_sink").warning("table %s: its topics' messages go to the dead letters: %s", table, why)
    columns = check_columns(sink.target, descriptor_for(spec.target_url).columns, table_schemas(spec, resolved.tables))
    sink.route_by_slots(table_slots(spec, resolved.tables))  # where build_frame puts each table's columns
    reader = spark.readStream.format("kafka").options(**source.reader_options())
    frame = build_frame(reader.load(), spec, resolved.tables, columns, resolved.unavailable, resolved.keys)
    # through the edge between batches, where a first Ctrl-C stops the job (interrupt.py)
    writer = frame.writeStream.foreachBatch(lambda data, batch_id: BATCHES.run(sink, data, batch_id)).option(
        "checkpointLocation", spec.checkpoint)
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
        _await(query)
        # progress reaches listeners asynchronously: let the last batch's arrive before the listener goes
        last = query.lastProgress
        if last is not None:
            listener.wait_for_batch(int(last["batchId"]), timeout_s=30)
    finally:
        spark.streams.removeListener(listener)


def _await(query: Any) -> None:
    """Wait for the query's end. The sink's own error that stopped it (raised in foreachBatch, handed back by Spark
    as text) is raised again as its own type, so callers and the CLI tell a stop for an operator from a bug."""
    from pyspark.errors import StreamingQueryException

    try:
        query.awaitTermination()
    except StreamingQueryException as failure:
        own = sink_error_of(failure)
        if own is None:
            raise
        raise own from failure


def execute(load_spec: Callable[[], JobSpec], on_session: Callable[[], None] = lambda: None) -> int:
    """Read the job (a JSON spec, or job.toml through config.py) and run it; a configuration mistake is
    one line on stderr and exit code 2."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        run(load_spec(), on_session)
    except ConfigurationError as error:
        print(f"streaming-sink: configuration error: {error}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m streaming_sink.job --spec spec.json`: a resolved JobSpec (what tests run). Users run
    `streaming-sink run --config job.toml` (cli.py), which reads the TOML first."""
    parser = argparse.ArgumentParser(prog="python -m streaming_sink.job", description=__doc__)
    parser.add_argument("--spec", required=True, help="path of a resolved JSON job spec")
    path = parser.parse_args(argv).spec
    return execute(lambda: JobSpec.from_json(Path(path).read_text()))


if __name__ == "__main__":
    sys.exit(main())
