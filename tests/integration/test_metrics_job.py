"""The packaged job's observability on a real streaming query: Kafka lag from Spark's progress into
/metrics through the listener `job.run` registers, and records in / dead letters in Spark's own
progress (`observedMetrics`), without changing a single row the sink writes."""
from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from streaming_sink import job as job_module
from streaming_sink.job import sink_metrics
from streaming_sink.job_spec import JobSpec

GOOD = [{"id": i, "name": f"n{i}"} for i in range(10)]
BAD = ["not json", '{"name": "no id"}']


class Observed:
    """A test's own listener: every progress of the session's queries, waited for with a deadline."""

    def __init__(self) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        seen: list[dict[str, Any]] = []
        changed = threading.Condition()

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:  # noqa: N802
                pass

            def onQueryProgress(self, event: Any) -> None:  # noqa: N802
                with changed:
                    seen.append(json.loads(event.progress.json))
                    changed.notify_all()

            def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
                pass

        self.listener, self.seen, self._changed = Listener(), seen, changed

    def wait(self, done, timeout_s: float = 60) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not done(self.seen):
                left = deadline - time.monotonic()
                assert left > 0, f"progress never complete: {self.seen}"
                self._changed.wait(left)
            return list(self.seen)


def test_a_drain_reports_lag_and_its_records_in_metrics_and_in_sparks_progress(
    spark_session, kafka_broker, new_topic, tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="streaming_sink")
    topic = new_topic(partitions=2)
    values = [json.dumps(m) for m in GOOD] + BAD
    kafka_broker.produce(topic, values[0::2], partition=0)
    kafka_broker.produce(topic, values[1::2], partition=1)
    spec = JobSpec(
        job_id="metrics", bootstrap=kafka_broker.bootstrap, topics=[topic], target_url=f"chdb://{tmp_path / 'ch'}",
        database="default", state_url=f"file://{tmp_path / 'state'}", checkpoint=str(tmp_path / "ckpt"),
        tables={"orders": "id BIGINT NOT NULL, name STRING"}, table="orders", dead_letter_table="dead_letters",
        max_offsets_per_trigger=4, create_tables=True, metrics_port=0,
    )
    spec.validate()
    sinks = []
    build_sink = job_module.build_sink

    def keep(spec: JobSpec):
        sinks.append(build_sink(spec))
        return sinks[-1]

    monkeypatch.setattr(job_module, "build_sink", keep)
    monkeypatch.setattr("streaming_sink.spark_session.build_session", lambda *args, **kwargs: spark_session)
    observed = Observed()
    spark_session.streams.addListener(observed.listener)
    try:
        job_module.run(spec)
        metrics = sink_metrics(sinks[0])
        assert metrics is not None and metrics.server is not None
        port = metrics.server.server_address[1]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        client = sinks[0].target.client()
        written = {t: client.query(f"SELECT count() FROM default.{t}").result_rows[0][0] for t in ("orders", "dead_letters")}
        progress = observed.wait(lambda seen: sum(p["numInputRows"] for p in seen) >= len(values))
    finally:
        spark_session.streams.removeListener(observed.listener)
        for sink in sinks:
            if sink_metrics(sink) is not None:
                sink_metrics(sink).close()
            sink.target.close()

    assert written == {"orders": len(GOOD), "dead_letters": len(BAD)}  # observe() changed no row

    # Spark's own progress: every record counted once, the bad ones as dead letters
    batches = [p["observedMetrics"]["streaming_sink"] for p in progress if p["numInputRows"]]
    assert sum(b["records_in"] for b in batches) == len(values) == 12
    assert sum(b["dead_letters"] for b in batches) == len(BAD)
    assert len(batches) >= 3  # 4 records a trigger: the first batches left records behind

    # /metrics: lag per partition (none left at the end), what the sink wrote, the drain's phases
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}

    def sample(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted({"job_id": "metrics", **labels}.items()))))

    assert sample("streaming_sink_kafka_offsets_behind_latest", topic=topic, partition="0") == 0
    assert sample("streaming_sink_kafka_offsets_behind_latest", topic=topic, partition="1") == 0
    assert sample("streaming_sink_kafka_max_offsets_behind_latest") == 0
    assert sample("streaming_sink_records_in_total") == 12
    assert sample("streaming_sink_dead_letters_total") == 2
    assert sample("streaming_sink_rows_total", table="orders") == 10
    assert sample("streaming_sink_phase_duration_seconds_count", phase="commit") == len(batches)
    assert sample("streaming_sink_pending_prepared_transactions") == 0
    assert sample("streaming_sink_last_progress_timestamp_seconds") is not None
    # the first trigger saw records left behind in Kafka: Spark's metric and ours agree
    first = min((p for p in progress if p["numInputRows"]), key=lambda p: p["batchId"])
    kafka = first["sources"][0]
    behind = sum(int(kafka["latestOffset"][topic][p]) - int(kafka["endOffset"][topic][p]) for p in kafka["endOffset"][topic])
    assert behind == len(values) - first["numInputRows"] > 0
    # and the driver's log has a progress line per trigger
    assert f"streaming_sink.progress batch {first['batchId']}: offsets behind latest {behind}" in "\n".join(caplog.messages)


def test_spark_tells_the_listener_when_the_query_is_idle(spark_session, tmp_path):
    """The stall alert tells "stuck" from "nothing to read" by Spark's idle events: they must arrive."""
    from streaming_sink.metrics import BatchMetrics, progress_listener

    metrics = BatchMetrics("idle")
    listener = progress_listener(metrics)
    (tmp_path / "in").mkdir()
    spark_session.conf.set("spark.sql.streaming.noDataProgressEventInterval", "1s")
    spark_session.streams.addListener(listener)
    query = None
    try:
        query = (spark_session.readStream.format("text").load(str(tmp_path / "in")).writeStream.format("noop")
                 .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="1 second").start())
        listener.follow(query.id)
        deadline = time.monotonic() + 60
        while metrics.registry.get_sample_value("streaming_sink_last_idle_timestamp_seconds", {"job_id": "idle"}) is None:
            assert time.monotonic() < deadline, "Spark reported no idle trigger within 60 s"
            query.awaitTermination(0.2)  # the poll's pause; raises if the query failed
    finally:
        if query is not None:
            query.stop()
        spark_session.streams.removeListener(listener)
        spark_session.conf.unset("spark.sql.streaming.noDataProgressEventInterval")
