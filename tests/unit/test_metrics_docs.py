"""The shipped Grafana dashboard and Prometheus alerts use only metrics the exporter has: renaming a
metric without them fails here, instead of leaving a blank panel or an alert that can never fire."""
from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from ruamel.yaml import YAML

from streaming_sink.metrics import BatchMetrics
from streaming_sink.sink import BatchReport
from streaming_sink.state import MemoryStateStore
from streaming_sink.targets.starrocks import StarRocksTarget

DOCS = Path(__file__).resolve().parents[2] / "docs"
METRIC = re.compile(r"\bstreaming_sink_[a-z0-9_]+")
REQUIRED_ALERTS = {
    "StreamingSinkConsumerLagGrowing", "StreamingSinkPreparedTransactionExpiring",
    "StreamingSinkNoBatchCommitted", "StreamingSinkDeadLetters",
}


def exposition() -> str:
    """What the exporter serves once a batch, a progress and an idle trigger were recorded."""
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    metrics = BatchMetrics("job", store=MemoryStateStore(), expiry_limits=StarRocksTarget().expiry_limits,
                           trigger_interval_s=10)
    metrics(BatchReport(0, "written", records_in=3, rows=3, rows_by_table={"orders": 2, "dead_letters": 1},
                        dead_letters=1, bytes=100, transactions=2, replayed=0,
                        timings={"write_s": 0.5, "record_s": 0.01, "commit_s": 0.2}))
    metrics.record_progress(StreamingQueryProgress.fromJson({
        "id": str(uuid.uuid4()), "runId": str(uuid.uuid4()), "name": None, "timestamp": "2026-01-01T00:00:00.000Z",
        "batchId": 0, "batchDuration": 1, "stateOperators": [], "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
        "sources": [{"description": "KafkaV2[Subscribe[events]]", "startOffset": None, "endOffset": {"events": {"0": 3}},
                     "latestOffset": {"events": {"0": 5}}, "numInputRows": 3, "inputRowsPerSecond": 0.0,
                     "processedRowsPerSecond": 0.0, "metrics": {"maxOffsetsBehindLatest": "2",
                                                                "avgOffsetsBehindLatest": "2.0", "minOffsetsBehindLatest": "2"}}],
        "observedMetrics": {"streaming_sink": {"records_in": 3, "dead_letters": 1, "unknown_fields": {"orders": 1}}},
    }))
    metrics.record_idle()
    return metrics.render()


def exported_names() -> set[str]:
    """Every family and series name in the exposition (counters both as `x` and `x_total`)."""
    names = set()
    for family in text_string_to_metric_families(exposition()):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)


def test_the_dashboard_uses_only_exported_metrics():
    dashboard = json.loads((DOCS / "observability" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for text in strings(dashboard) for name in METRIC.findall(text)}
    assert len(exprs) >= 10 and len(used) >= 12
    assert not used - exported_names(), f"the dashboard uses metrics the exporter lacks: {sorted(used - exported_names())}"
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])


def test_the_alert_rules_use_only_exported_metrics():
    rules = YAML(typ="safe").load((DOCS / "observability" / "alerts.yml").read_text())
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert {rule["alert"] for rule in alerts} >= REQUIRED_ALERTS
    for rule in alerts:
        assert rule["expr"].strip() and rule["labels"]["severity"] and rule["annotations"]["summary"], rule["alert"]
    used = {name for text in strings(rules) for name in METRIC.findall(text)}
    assert not used - exported_names(), f"the alerts use metrics the exporter lacks: {sorted(used - exported_names())}"


def test_the_guide_explains_every_metric_and_alert():
    guide = (DOCS / "observability.md").read_text()
    documented = set(METRIC.findall(guide))
    families = {family.name for family in text_string_to_metric_families(exposition())}
    missing = {name for name in families if name.startswith("streaming_sink_") and name not in documented
               and f"{name}_total" not in documented}
    assert not missing, f"docs/observability.md does not explain {sorted(missing)}"
    assert not documented - exported_names(), sorted(documented - exported_names())
    for alert in REQUIRED_ALERTS:
        assert alert in guide

