"""streaming-sink: exactly-once loads from Spark Structured Streaming into OLAP databases.

Names are resolved lazily so that light modules (the committable records, the state store, the
operator CLI) import without loading PySpark.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "ExactlyOnceSink": "streaming_sink.sink",
    "ClickHouseTarget": "streaming_sink.targets.clickhouse",
    "ConfigurationError": "streaming_sink.errors",
    "StreamingSinkError": "streaming_sink.errors",
    "BatchState": "streaming_sink.records",
    "Committable": "streaming_sink.committable",
    "TxnRef": "streaming_sink.committable",
    "make_label": "streaming_sink.labels",
}

__all__ = [
    "BatchState", "ClickHouseTarget", "Committable", "ConfigurationError", "ExactlyOnceSink", "StreamingSinkError",
    "TxnRef", "make_label",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'streaming_sink' has no attribute {name!r}")
