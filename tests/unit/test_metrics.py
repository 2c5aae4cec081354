"""The Prometheus exporter: names, types, escaping, the journal's prepared transactions, Kafka lag."""
from __future__ import annotations

import logging
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streaming_sink.committable import Committable
from streaming_sink.metrics import BatchMetrics, progress_listener
from streaming_sink.records import BatchState
from streaming_sink.sink import BatchReport
from streaming_sink.state import BatchRecord, MemoryStateStore
from streaming_sink.targets.doris import DorisTarget
from streaming_sink.targets.starrocks import StarRocksTarget

JOB = "orders-ingest"
T0 = 1_700_000_000.0


class Clock:
    """A settable time, so ages and timestamps are exact."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def report(batch_id: int = 0, action: str = "written", **overrides) -> BatchReport:
    fields = dict(records_in=7, rows=7, rows_by_table={"orders": 5, "dead_letters": 2}, dead_letters=2, bytes=900,
                  transactions=3, replayed=1, timings={"write_s": 0.4, "record_s": 0.003, "commit_s": 1.5})
    fields.update(overrides)
    return BatchReport(batch_id, action, **fields)


def families(text: str) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(metrics: BatchMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"job_id": JOB, **labels})


def kafka_progress(batch_id: int, query_id: str | None = None, observed: dict | None = None) -> dict:
    """A StreamingQueryProgress as Spark 4's Kafka source reports it (JSON form)."""
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    return StreamingQueryProgress.fromJson({
        "id": query_id or str(uuid.uuid4()), "runId": str(uuid.uuid4()), "name": None,
        "timestamp": "2026-01-02T03:04:05.000Z", "batchId": batch_id, "batchDuration": 1200,
        "durationMs": {"triggerExecution": 1200}, "eventTime": {}, "stateOperators": [],
        "sources": [
            {"description": "KafkaV2[Subscribe[events]]",
             "startOffset": {"events": {"0": 0, "1": 0}}, "endOffset": {"events": {"0": 40, "1": 25}},
             "latestOffset": {"events": {"0": 100, "1": 25}}, "numInputRows": 65,
             "inputRowsPerSecond": 10.0, "processedRowsPerSecond": 50.0,
             "metrics": {"maxOffsetsBehindLatest": "60", "avgOffsetsBehindLatest": "30.0", "minOffsetsBehindLatest": "0"}},
            {"description": "RateStreamV2[rowsPerSecond=1]", "startOffset": 0, "endOffset": 9, "latestOffset": 9,
             "numInputRows": 9, "inputRowsPerSecond": 1.0, "processedRowsPerSecond": 1.0},
        ],
        "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
        "numInputRows": 74, "inputRowsPerSecond": 11.0, "processedRowsPerSecond": 51.0,
        "observedMetrics": {"streaming_sink": observed} if observed else {},
    })


def test_every_metric_has_help_and_type_lines():
    metrics = BatchMetrics(JOB, store=MemoryStateStore(), expiry_limits=StarRocksTarget().expiry_limits, trigger_interval_s=5)
    metrics(report())
    metrics.record_progress(kafka_progress(0))
    text = metrics.render()
    found = families(text)
    assert len(found) >= 20
    for name, family in found.items():
        assert family.documentation, name
        assert f"# TYPE {name}" in text or f"# TYPE {name}_total" in text, name
        assert f"# HELP {name}" in text or f"# HELP {name}_total" in text, name
        assert name.startswith(("streaming_sink_", "process_", "python_")), name


@pytest.mark.parametrize("table", ['t"} 1\nfake_metric{x="1"} 5', "back\\slash\\", "new\nline", "ünïcode 名前"])
def test_a_table_name_cannot_forge_a_series(table):
    """Review S5: label values must be escaped, or a table name can add series or break the scrape."""
    metrics = BatchMetrics(JOB)
    metrics(report(rows_by_table={table: 3}))
    found = families(metrics.render())
    assert not [name for name in found if not name.startswith(("streaming_sink_", "process_", "python_"))]
    rows = [s for s in found["streaming_sink_rows"].samples if s.name == "streaming_sink_rows_total"]
    assert [(s.labels, s.value) for s in rows] == [({"job_id": JOB, "table": table}, 3.0)]


def test_no_created_series_a_build_info_series_and_the_drivers_process_metrics():
    """Review 2026-11-24 §4: `_created` series crowd dashboards; versions and the driver's memory are asked first."""
    from importlib.metadata import version

    metrics = BatchMetrics(JOB, target="clickhouse")
    metrics(report())
    text = metrics.render()
    assert "_created" not in text
    build = [s for s in families(text)["streaming_sink_build_info"].samples]
    assert [(s.name, s.value) for s in build] == [("streaming_sink_build_info", 1.0)]
    assert build[0].labels == {"job_id": JOB, "version": version("streaming-sink"), "pyspark": version("pyspark"),
                               "python": build[0].labels["python"], "target": "clickhouse"}
    assert "process_resident_memory_bytes" in families(text)
    assert "python_info" in families(text)


def test_batch_reports_become_counters_histograms_and_a_commit_time():
    clock = Clock()
    metrics = BatchMetrics(JOB, clock=clock)
    assert value(metrics, "streaming_sink_records_in_total") == 0  # present before the first batch
    assert value(metrics, "streaming_sink_started_timestamp_seconds") == T0
    clock.now = T0 + 30
    metrics(report(4))
    clock.now = T0 + 45
    metrics(report(4, "already-committed", records_in=0, rows=0, rows_by_table=None, dead_letters=0, bytes=0,
                   transactions=0, replayed=0, timings=None))
    metrics(report(3, "recovered-prepared", timings={"commit_s": 20.0}))
    assert value(metrics, "streaming_sink_batches_total", action="written") == 1
    assert value(metrics, "streaming_sink_batches_total", action="already-committed") == 1
    assert value(metrics, "streaming_sink_rows_total", table="orders") == 10
    assert value(metrics, "streaming_sink_rows_total", table="dead_letters") == 4
    assert value(metrics, "streaming_sink_records_in_total") == 14
    assert value(metrics, "streaming_sink_dead_letters_total") == 4
    assert value(metrics, "streaming_sink_transactions_total") == 6
    assert value(metrics, "streaming_sink_replayed_total") == 2
    assert value(metrics, "streaming_sink_bytes_total") == 1800
    assert value(metrics, "streaming_sink_phase_duration_seconds_count", phase="commit") == 2
    assert value(metrics, "streaming_sink_phase_duration_seconds_sum", phase="commit") == pytest.approx(21.5)
    assert value(metrics, "streaming_sink_phase_duration_seconds_bucket", phase="commit", le="2.5") == 1
    assert value(metrics, "streaming_sink_phase_duration_seconds_bucket", phase="commit", le="30.0") == 2
    assert value(metrics, "streaming_sink_phase_duration_seconds_count", phase="write") == 1
    assert value(metrics, "streaming_sink_phase_duration_seconds_count", phase="record") == 1
    assert value(metrics, "streaming_sink_last_phase_seconds", phase="commit") == 20.0
    assert value(metrics, "streaming_sink_last_batch_id") == 4  # a re-run of batch 3 does not move it back
    assert value(metrics, "streaming_sink_last_committed_timestamp_seconds") == T0 + 45


def prepared(store: MemoryStateStore, epoch: int, batch_id: int, labels: list[str], created_at: float,
             state: BatchState = BatchState.PREPARED) -> None:
    committables = [Committable("starrocks", "db", "orders", label, i, "a0") for i, label in enumerate(labels)]
    store.put_batch(JOB, epoch, BatchRecord("q", batch_id, state, epoch, committables, created_at=created_at))


def test_pending_prepared_transactions_and_their_age_come_from_the_journal():
    store, clock = MemoryStateStore(), Clock(T0 + 1000)
    epoch = store.take_epoch(JOB, "test")
    prepared(store, epoch, 6, ["old-0"], T0, state=BatchState.COMMITTED)
    prepared(store, epoch, 7, ["b7-0", "b7-1", "b7-2"], T0 + 400)
    store.mark_done(JOB, epoch, "q", 7, "b7-1")  # committed, its record not yet COMMITTED
    metrics = BatchMetrics(JOB, store=store, expiry_limits=StarRocksTarget(prepared_timeout=900).expiry_limits, clock=clock)
    assert value(metrics, "streaming_sink_pending_prepared_transactions") == 2
    assert value(metrics, "streaming_sink_oldest_prepared_age_seconds") == 600
    assert value(metrics, "streaming_sink_prepared_timeout_seconds") == 900
    assert value(metrics, "streaming_sink_server_expiry_limit_seconds", what="prepared transactions") == 900
    assert value(metrics, "streaming_sink_state_store_up") == 1
    for label in ("b7-0", "b7-2"):
        store.mark_done(JOB, epoch, "q", 7, label)
    assert value(metrics, "streaming_sink_pending_prepared_transactions") == 0
    assert value(metrics, "streaming_sink_oldest_prepared_age_seconds") == 0


def test_the_prepared_timeout_is_the_targets_own():
    assert value(BatchMetrics(JOB, expiry_limits=DorisTarget().expiry_limits), "streaming_sink_prepared_timeout_seconds") == 3600
    assert value(BatchMetrics(JOB, expiry_limits=StarRocksTarget().expiry_limits), "streaming_sink_prepared_timeout_seconds") == 86400
    from streaming_sink.targets.clickhouse import ClickHouseTarget

    never = BatchMetrics(JOB, expiry_limits=ClickHouseTarget("chdb:///nowhere", database="d").expiry_limits)
    assert value(never, "streaming_sink_prepared_timeout_seconds") is None  # staging tables never expire


class UnreachableStore(MemoryStateStore):
    url = "redis://down:6379/0"

    def batch_keys(self, job_id: str) -> list[tuple[str, int]]:
        raise ConnectionError("Connection refused")


def test_an_unreachable_store_does_not_break_the_scrape(caplog):
    metrics = BatchMetrics(JOB, store=UnreachableStore())
    metrics(report())
    with caplog.at_level(logging.WARNING, logger="streaming_sink"):
        found = families(metrics.render())
    assert value(metrics, "streaming_sink_state_store_up") == 0
    assert "streaming_sink_pending_prepared_transactions" not in found
    assert "streaming_sink_rows" in found
    warning = next(r for r in caplog.records if "cannot read the state store" in r.getMessage())
    assert warning.levelno == logging.WARNING and warning.exc_info is not None


def test_kafka_lag_from_sparks_progress():
    clock = Clock(T0 + 7)
    metrics = BatchMetrics(JOB, clock=clock)
    metrics.record_progress(kafka_progress(3))
    assert value(metrics, "streaming_sink_kafka_offsets_behind_latest", topic="events", partition="0") == 60
    assert value(metrics, "streaming_sink_kafka_offsets_behind_latest", topic="events", partition="1") == 0
    assert value(metrics, "streaming_sink_kafka_max_offsets_behind_latest") == 60
    assert value(metrics, "streaming_sink_kafka_avg_offsets_behind_latest") == 30
    assert value(metrics, "streaming_sink_kafka_min_offsets_behind_latest") == 0
    assert value(metrics, "streaming_sink_last_progress_timestamp_seconds") == T0 + 7


def test_the_listener_records_lag_and_idleness_logs_progress_and_never_raises(caplog):
    from pyspark.sql.streaming.listener import QueryIdleEvent, QueryProgressEvent

    clock = Clock()
    metrics = BatchMetrics(JOB, clock=clock)
    listener = progress_listener(metrics)
    ours, other = uuid.uuid4(), uuid.uuid4()
    listener.follow(ours)
    with caplog.at_level(logging.INFO, logger="streaming_sink"):
        listener.onQueryProgress(QueryProgressEvent(kafka_progress(2, str(ours), {"records_in": 65, "dead_letters": 1})))
        listener.onQueryProgress(QueryProgressEvent(kafka_progress(9, str(other))))  # another query of the session
        clock.now = T0 + 60
        listener.onQueryIdle(QueryIdleEvent(ours, uuid.uuid4(), "2026-01-02T03:05:05.000Z"))

        class Broken:
            @property
            def progress(self):
                raise ValueError("a progress Spark could not convert")

        listener.onQueryProgress(Broken())  # logged, not raised: a listener must never fail the query
    assert value(metrics, "streaming_sink_kafka_max_offsets_behind_latest") == 60
    assert value(metrics, "streaming_sink_last_idle_timestamp_seconds") == T0 + 60
    assert "streaming_sink.progress batch 2: offsets behind latest 60, dead_letters 1, records_in 65" in caplog.messages
    assert not [m for m in caplog.messages if "batch 9" in m]
    failure = next(r for r in caplog.records if "could not record Spark's progress" in r.getMessage())
    assert failure.levelno == logging.WARNING and failure.exc_info is not None
    assert listener.wait_for_batch(2, timeout_s=0)
    assert not listener.wait_for_batch(3, timeout_s=0.05)


def test_a_metrics_error_never_fails_the_committed_batch(caplog):
    metrics = BatchMetrics(JOB)
    with caplog.at_level(logging.WARNING, logger="streaming_sink"):
        metrics(report(5, rows_by_table={"orders": -1}))  # a counter refuses to go down
    failure = next(r for r in caplog.records if "could not record batch 5" in r.getMessage())
    assert failure.levelno == logging.WARNING and failure.exc_info is not None


def test_expiry_gauges_show_what_the_target_learns_when_the_driver_starts():
    """ClickHouse finds its ledger's TTL and its tables' deduplication windows only when the driver starts
    (`routable_tables`), after the job built its metrics: the gauges read the target's limits at each scrape."""
    from streaming_sink.targets.base import ExpiryKind, ExpiryLimit

    learned: list[ExpiryLimit] = []
    metrics = BatchMetrics(JOB, expiry_limits=lambda: learned)
    assert value(metrics, "streaming_sink_server_expiry_limit_seconds", what="commit ledger") is None
    learned += [ExpiryLimit("commit ledger", 7200.0, kind=ExpiryKind.LEDGER),
                ExpiryLimit("prepared transactions", 600.0, kind=ExpiryKind.PREPARED)]
    assert value(metrics, "streaming_sink_server_expiry_limit_seconds", what="commit ledger") == 7200
    assert value(metrics, "streaming_sink_prepared_timeout_seconds") == 600
