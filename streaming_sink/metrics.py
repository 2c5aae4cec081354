"""The sink's figures for Prometheus, served from the driver at `http://<metrics_host>:<port>/metrics`.

Three sources feed one registry of the job's own (never the process-wide default, so two jobs or
two tests in one process do not share counters):

* every BatchReport of the sink (`BatchMetrics` is a sink listener): counters and phase histograms;
* Spark's progress of the streaming query (`progress_listener`): Kafka consumer lag. Spark commits
  no offsets back to Kafka, so an external lag exporter sees nothing: this is the only place lag is;
* the state store and the target, read when scraped: prepared transactions not yet committed, the
  oldest one's age, and the server's timeout for them, so an alert can fire before they expire;
* the repeats after transient faults (retry.py), read when scraped: statements sent again, write passes written
  again, the packaged job's query restarted.

Metric names are part of the interface (docs/observability/ uses them; a test checks they exist).
Counters restart with the driver, as Prometheus expects. No `*_created` series (they only confuse dashboards:
prometheus-client's switch is process-wide, so it is turned off when this module is imported); the driver's own
`process_*` and `python_info` series and `streaming_sink_build_info` (versions, target product) come with the
job's registry.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from . import retry
from .records import BatchState
from .targets.base import ExpiryKind

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from .sink import BatchReport
    from .state import StateStore
    from .targets.base import ExpiryLimit

log = logging.getLogger("streaming_sink")

PREFIX = "streaming_sink_"
#: Phase durations span a few milliseconds (an empty record) to many minutes (a big load).
PHASE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
#: How many of the newest batches a scrape reads from the state store (what `status` shows too):
#: a prepared batch is always among the newest, since Spark runs batch N+1 only after N returned.
PENDING_SCAN_BATCHES = 20
disable_created_metrics()

#: The name of the `observe()` metrics the packaged job's frame carries into Spark's progress.
OBSERVED_NAME = "streaming_sink"
#: The counter of messages with top-level fields their table's schema lacks (also read back by `status`).
UNKNOWN_FIELDS_METRIC = "messages_with_unknown_fields"
#: How long `status` waits for a running job's endpoint.
SCRAPE_TIMEOUT_S = 5.0


def build_info(target: str | None) -> dict[str, str]:
    """The labels of `streaming_sink_build_info`: the package's, Spark's and Python's versions, and the target."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "unknown"

    info = {"version": installed("streaming-sink"), "pyspark": installed("pyspark"), "python": platform.python_version()}
    return {**info, "target": target} if target else info


class BatchMetrics:
    """The job's metrics. Call it (or `record`) with each BatchReport; `render()` is the exposition text.

    `store` and `expiry_limits` (the target's, asked at each scrape: some are learned only when the driver
    starts) add the prepared-transaction and expiry gauges;
    `trigger_interval_s` is exported so alerts can count triggers; `clock` is for tests.
    """

    def __init__(
        self,
        job_id: str,
        store: StateStore | None = None,
        expiry_limits: Callable[[], Sequence[ExpiryLimit]] = lambda: (),
        trigger_interval_s: float | None = None,
        clock: Callable[[], float] = time.time,
        target: str | None = None,
    ) -> None:
        self.job_id = job_id
        self.registry = CollectorRegistry()
        self._clock = clock
        self._server: WSGIServer | None = None
        self._lock = threading.Lock()
        self._last_batch = -1
        r, job = self.registry, ["job_id"]

        def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
            return Counter(PREFIX + name, doc, [*job, *labels], registry=r)

        def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
            return Gauge(PREFIX + name, doc, [*job, *labels], registry=r)

        self.batches = counter("batches", "Micro-batches the sink finished, by what it did "
                               "(written, empty, recovered-prepared, already-committed).", ["action"])
        self.rows = counter("rows", "Rows made visible, by target table (dead letters included).", ["table"])
        self.records_in = counter("records_in", "Kafka records the writers received.")
        self.dead_letters = counter("dead_letters", "Records written to the dead-letter table.")
        self.unknown_fields = counter(
            UNKNOWN_FIELDS_METRIC, "Messages routed to a table holding top-level JSON fields its schema lacks, "
            "by table (what became of them: sink.on_unknown_field).", ["table"])
        self.tombstones = counter("tombstones", "Change events' tombstones (a null value after a delete), skipped.")
        self.transactions = counter("transactions", "Target transactions committed.")
        self.replayed = counter("replayed", "Prepared transactions the server lost, loaded again from Kafka.")
        self.bytes = counter("bytes", "Bytes sent to the target in committed transactions.")
        self.phase_seconds = Histogram(
            PREFIX + "phase_duration_seconds",
            "Duration of each phase of a batch: write (load and prepare), record (the PREPARED record), commit.",
            [*job, "phase"], registry=r, buckets=PHASE_BUCKETS,
        )
        self.last_phase_seconds = gauge("last_phase_seconds", "Duration of each phase of the last batch.", ["phase"])
        self.last_batch_id = gauge("last_batch_id", "Id of the newest micro-batch the sink finished.")
        self.last_committed = gauge("last_committed_timestamp_seconds",
                                    "Unix time the sink last finished a batch (its data committed).")
        self.started = gauge("started_timestamp_seconds", "Unix time this driver's exporter started.")
        self.lag = gauge("kafka_offsets_behind_latest",
                         "Records in the Kafka partition after the offsets of the last batch, when it was planned.",
                         ["topic", "partition"])
        self.lag_max = gauge("kafka_max_offsets_behind_latest", "Spark's maxOffsetsBehindLatest of the Kafka source.")
        self.lag_avg = gauge("kafka_avg_offsets_behind_latest", "Spark's avgOffsetsBehindLatest of the Kafka source.")
        self.lag_min = gauge("kafka_min_offsets_behind_latest", "Spark's minOffsetsBehindLatest of the Kafka source.")
        self.last_progress = gauge("last_progress_timestamp_seconds",
                                   "Unix time Spark last reported progress of the query (a finished trigger).")
        self.last_idle = gauge("last_idle_timestamp_seconds",
                               "Unix time Spark last reported the query idle (no new data in Kafka).")
        self.started.labels(job_id).set(clock())
        for unlabelled in (self.records_in, self.dead_letters, self.tombstones, self.transactions, self.replayed, self.bytes):
            unlabelled.labels(job_id)  # present from the first scrape, so rate() sees the first increase
        if trigger_interval_s is not None:
            gauge("trigger_interval_seconds", "The processing-time trigger interval.").labels(job_id).set(trigger_interval_s)
        build = Info(PREFIX + "build", "Versions this driver runs and the target product it loads into.", job, registry=r)
        build.labels(job_id).info(build_info(target))
        ProcessCollector(registry=r)  # the driver's memory, CPU and open files (on Linux)
        PlatformCollector(registry=r)  # python_info
        self.registry.register(ExpiryCollector(expiry_limits, job_id))
        self.registry.register(RepeatCollector(job_id))
        if store is not None:
            self.registry.register(PendingPreparedCollector(store, job_id, clock))

    def __call__(self, report: BatchReport) -> None:
        """A sink listener: `ExactlyOnceSink(listeners=[metrics])`."""
        # The batch is committed when listeners hear of it: a metrics error must not fail it (Spark would
        # re-run a finished batch), so it is logged and swallowed here, unlike anywhere else in the sink.
        try:
            self.record(report)
        except Exception as error:
            log.warning("metrics: could not record batch %s: %s", report.batch_id, error, exc_info=True)

    def record(self, report: BatchReport) -> None:
        job = self.job_id
        self.batches.labels(job, report.action).inc()
        for table, rows in (report.rows_by_table or {}).items():
            self.rows.labels(job, table).inc(rows)
        self.records_in.labels(job).inc(report.records_in)
        self.dead_letters.labels(job).inc(report.dead_letters)
        self.transactions.labels(job).inc(report.transactions)
        self.replayed.labels(job).inc(report.replayed)
        self.bytes.labels(job).inc(report.bytes)
        for key, seconds in (report.timings or {}).items():
            if key.endswith("_s"):
                self.phase_seconds.labels(job, key.removesuffix("_s")).observe(seconds)
                self.last_phase_seconds.labels(job, key.removesuffix("_s")).set(seconds)
        with self._lock:
            self._last_batch = max(self._last_batch, report.batch_id)
            self.last_batch_id.labels(job).set(self._last_batch)
        # every report is of a batch that returned, so its data is committed (or had been already)
        self.last_committed.labels(job).set(self._clock())

    def record_progress(self, progress: Mapping[str, Any]) -> None:
        """Kafka lag from a StreamingQueryProgress (a dict in PySpark 4)."""
        job = self.job_id
        self.last_progress.labels(job).set(self._clock())
        for table, messages in observed_unknown_fields(progress).items():
            self.unknown_fields.labels(job, table).inc(messages)
        self.tombstones.labels(job).inc(int(observed(progress).get(TOMBSTONES_OBSERVED) or 0))
        for lag in kafka_lag(progress):
            for (topic, partition), behind in lag.partitions.items():
                self.lag.labels(job, topic, str(partition)).set(behind)
            for gauge, value in ((self.lag_max, lag.maximum), (self.lag_avg, lag.average), (self.lag_min, lag.minimum)):
                if value is not None:
                    gauge.labels(job).set(value)

    def record_idle(self) -> None:
        self.last_idle.labels(self.job_id).set(self._clock())

    def render(self) -> str:
        return generate_latest(self.registry).decode()

    def serve(self, port: int, host: str = "127.0.0.1") -> WSGIServer:
        """Serve `/metrics` from a daemon thread; `server.server_address` tells the port (0 = any free one)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return server

    @property
    def server(self) -> WSGIServer | None:
        """The endpoint `serve` started, if any."""
        return self._server

    def close(self) -> None:
        """Stop serving (the driver's exit does it too)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def prepared_timeout(limits: Iterable[ExpiryLimit]) -> float | None:
    """The server's timeout for a prepared (pre-committed) transaction; None where it never expires."""
    seconds = [limit.seconds for limit in limits if limit.seconds is not None and limit.kind == ExpiryKind.PREPARED]
    return min(seconds) if seconds else None


class ExpiryCollector(Collector):
    """What the server forgets, from the target at each scrape (its limits can change when the driver starts)."""

    def __init__(self, expiry_limits: Callable[[], Sequence[ExpiryLimit]], job_id: str) -> None:
        self._limits, self._job = expiry_limits, job_id

    def describe(self) -> list[GaugeMetricFamily]:
        return list(self._families())

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (GaugeMetricFamily(PREFIX + "prepared_timeout_seconds",
                                  "How long the server keeps a prepared transaction before it rolls it back.", labels=["job_id"]),
                GaugeMetricFamily(PREFIX + "server_expiry_limit_seconds",
                                  "Everything the server forgets that recovery depends on, by what (as `doctor` lists them).",
                                  labels=["job_id", "what"]))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        timeout, limits = self._families()
        known = self._limits()
        prepared = prepared_timeout(known)
        if prepared is not None:
            timeout.add_metric([self._job], prepared)
            yield timeout
        for limit in known:
            if limit.seconds is not None:
                limits.add_metric([self._job, limit.what], limit.seconds)
        yield limits


class RepeatCollector(Collector):
    """What was sent again after a transient fault since the metrics started, by level (retry.REPEAT_LEVELS): the
    driver's own repeats and those its writers' tasks reported. Counted per process (the counts of two jobs run in
    one process add up)."""

    def __init__(self, job_id: str) -> None:
        self._job, self._since = job_id, retry.repeats()

    def describe(self) -> list[CounterMetricFamily]:
        return [self._family()]

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(PREFIX + "retries", "Repeats after a transient fault, by level: statement (a "
                                   "target's statement or request sent again), write (a batch's write pass written "
                                   "again), query (the packaged job's query restarted from its checkpoint).",
                                   labels=["job_id", "level"])

    def collect(self) -> Iterator[CounterMetricFamily]:
        family, now = self._family(), retry.repeats()
        for level in retry.REPEAT_LEVELS:
            family.add_metric([self._job, level], now[level] - self._since[level])
        yield family


class PendingPreparedCollector(Collector):
    """Prepared transactions whose commit is not confirmed, read from the journal at each scrape.

    From the store, not from the sink: a driver stuck retrying a commit, or a store left PREPARED by
    a killed driver, is exactly when these matter, and the sink reports only batches that returned.
    """

    def __init__(self, store: StateStore, job_id: str, clock: Callable[[], float]) -> None:
        self._store, self._job, self._clock = store, job_id, clock

    def describe(self) -> list[GaugeMetricFamily]:
        return list(self._families())

    def _families(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(PREFIX + "pending_prepared_transactions",
                                "Prepared transactions in the journal not yet confirmed committed.", labels=["job_id"])
        yield GaugeMetricFamily(PREFIX + "oldest_prepared_age_seconds",
                                "Age of the oldest of them (0: none pending).", labels=["job_id"])
        yield GaugeMetricFamily(PREFIX + "state_store_up",
                                "1 if the last scrape could read the state store, else 0.", labels=["job_id"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pending, oldest, up = self._families()
        try:
            count, age = pending_prepared(self._store, self._job, self._clock())
        except Exception as error:  # a scrape must answer even when the store does not
            log.warning("metrics: cannot read the state store %s: %s", self._store.url, error, exc_info=True)
            up.add_metric([self._job], 0)
            yield up
            return
        pending.add_metric([self._job], count)
        oldest.add_metric([self._job], age)
        up.add_metric([self._job], 1)
        yield from (pending, oldest, up)


def pending_prepared(store: StateStore, job_id: str, now: float) -> tuple[int, float]:
    """(transactions in PREPARED records whose commit is not confirmed, the oldest such record's age)."""
    count, oldest = 0, 0.0
    for query_id, batch_id in store.batch_keys(job_id)[-PENDING_SCAN_BATCHES:]:
        record = store.get_batch(job_id, query_id, batch_id)
        if record is None or record.state is not BatchState.PREPARED:
            continue
        done = store.done_labels(job_id, query_id, batch_id)
        open_parts = [c for c in record.live_committables() if c.label not in done]
        if open_parts:
            count += len(open_parts)
            oldest = max(oldest, now - record.created_at)
    return count, oldest


@dataclass
class KafkaLag:
    """How far one Kafka source of a query is behind, as its progress tells."""

    partitions: dict[tuple[str, int], int]  # (topic, partition) -> records after the batch's end offset
    maximum: float | None  # Spark's maxOffsetsBehindLatest, and so on
    average: float | None
    minimum: float | None

    @property
    def total(self) -> int:
        return sum(self.partitions.values())


def kafka_lag(progress: Mapping[str, Any]) -> list[KafkaLag]:
    """Lag of every Kafka source in a progress: per partition from latestOffset - endOffset, plus
    Spark's own `*OffsetsBehindLatest` metrics."""
    lags = []
    for source in progress.get("sources") or []:
        if not str(source.get("description", "")).startswith("Kafka"):
            continue
        end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
        partitions = {
            (topic, int(partition)): max(0, int(offset) - int(end[topic][partition]))
            for topic, by_partition in latest.items() for partition, offset in by_partition.items()
            if partition in end.get(topic, {})
        }
        metrics = source.get("metrics") or {}
        lags.append(KafkaLag(partitions, *(_number(metrics.get(f"{k}OffsetsBehindLatest")) for k in ("max", "avg", "min"))))
    return lags


def _offsets(value: Any) -> dict[str, dict[str, int]]:
    """The Kafka source's offsets JSON ({topic: {partition: offset}}), as a string or parsed; {} if none."""
    if isinstance(value, str):  # from the JVM, a missing offset is Java's null, and str(None) is "None"
        value = json.loads(value) if value.strip() not in ("", "null", "None") else None
    return value if isinstance(value, dict) else {}


def _number(text: Any) -> float | None:
    return None if text is None else float(text)


#: The observed metric of the packaged job's frame counting, per table, messages with fields its schema lacks.
UNKNOWN_FIELDS_OBSERVED = "unknown_fields"
#: Its observed metric counting change events' tombstones, skipped (frame.py).
TOMBSTONES_OBSERVED = "tombstones"


def observed(progress: Mapping[str, Any]) -> dict[str, Any]:
    """What the packaged job's frame observed in the batch of a progress (`OBSERVED_NAME`); {} if nothing."""
    row = (progress.get("observedMetrics") or {}).get(OBSERVED_NAME)
    if row is None:
        return {}
    return dict(row.asDict() if hasattr(row, "asDict") else row)


def observed_unknown_fields(progress: Mapping[str, Any]) -> dict[str, int]:
    """Table -> messages of the batch with top-level JSON fields the table's schema lacks."""
    counts = observed(progress).get(UNKNOWN_FIELDS_OBSERVED) or {}
    return {str(table): int(count) for table, count in dict(counts).items()}


def metrics_url(host: str, port: int) -> str:
    """Where a job serving on (host, port) answers; a wildcard bind is reached on this machine's loopback."""
    reachable = "127.0.0.1" if host in ("0.0.0.0", "") else "[::1]" if host == "::" else host
    return f"http://{reachable}:{port}/metrics"


def scrape_unknown_fields(url: str, job_id: str, timeout_s: float = SCRAPE_TIMEOUT_S) -> tuple[dict[str, int], float | None]:
    """(table -> messages with unknown fields, the Unix time the driver's exporter started) from a running job's
    endpoint: the counts since that driver started, as counters restart with it. Raises OSError if unreachable."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    with urlopen(url, timeout=timeout_s) as answer:  # noqa: S310 - an http(s) URL the operator gave, or the job's own
        text = answer.read().decode()
    counts: dict[str, int] = {}
    started = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("job_id") != job_id:
                continue
            if sample.name == f"{PREFIX}{UNKNOWN_FIELDS_METRIC}_total":
                counts[sample.labels["table"]] = int(sample.value)
            elif sample.name == f"{PREFIX}started_timestamp_seconds":
                started = float(sample.value)
    return counts, started


def progress_line(progress: Mapping[str, Any]) -> str:
    """One line per trigger: how far Kafka is ahead, and what Spark observed in the batch."""
    lags = kafka_lag(progress)
    behind = sum(lag.total for lag in lags)
    line = f"batch {progress.get('batchId')}: offsets behind latest {behind}"
    values = observed(progress)
    if values:
        line += ", " + ", ".join(f"{key} {values[key]}" for key in sorted(values))
    return line


def progress_listener(metrics: BatchMetrics | None, log_progress: bool = True) -> Any:
    """A StreamingQueryListener (for `spark.streams.addListener`) that copies Kafka lag into
    `metrics` and logs a progress line per trigger. Built here, so pyspark loads only when a query runs."""
    from pyspark.sql.streaming import StreamingQueryListener

    class SinkProgressListener(StreamingQueryListener):
        def __init__(self) -> None:
            self.query_id: str | None = None  # set by follow(); until then every query's events count
            self._seen = -1
            self._changed = threading.Condition()

        def follow(self, query_id: Any) -> None:
            self.query_id = str(query_id)

        def _ours(self, query_id: Any) -> bool:
            return self.query_id is None or query_id is None or str(query_id) == self.query_id

        def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's names
            """Nothing to do: lag comes with the first progress."""

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            # Metrics must never fail a batch or the listener bus: errors are logged and swallowed,
            # the one place this project swallows an exception (the sink's own checks still raise).
            batch_id = None
            try:
                progress = event.progress
                if not self._ours(progress.get("id")):
                    return
                batch_id = int(progress["batchId"])
                if metrics is not None:
                    metrics.record_progress(progress)
                if log_progress:
                    log.info("streaming_sink.progress %s", progress_line(progress))
            except Exception as error:
                log.warning("metrics: could not record Spark's progress: %s", error, exc_info=True)
            finally:
                if batch_id is not None:  # seen even if recording failed: wait_for_batch must not hang on it
                    with self._changed:
                        self._seen = max(self._seen, batch_id)
                        self._changed.notify_all()

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            try:  # swallowed for the same reason as in onQueryProgress
                if metrics is not None and self._ours(event.id):
                    metrics.record_idle()
            except Exception as error:
                log.warning("metrics: could not record an idle query: %s", error, exc_info=True)

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            """Nothing to do: the driver logs the query's end."""

        def wait_for_batch(self, batch_id: int, timeout_s: float) -> bool:
            """Spark posts progress asynchronously: wait (with a deadline) until batch `batch_id`'s arrived."""
            deadline = time.monotonic() + timeout_s
            with self._changed:
                while self._seen < batch_id:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._changed.wait(left)
            return True

    return SinkProgressListener()
