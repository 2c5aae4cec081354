"""A field the producer adds is never dropped in silence (issue 25, item 5): the key, its default, its one-line
refusal, and the counter Spark's observed metrics feed."""
from __future__ import annotations

import uuid

import pytest

from streaming_sink.cli import main
from streaming_sink.config import resolve_config
from streaming_sink.errors import ConfigurationError
from streaming_sink.metrics import BatchMetrics, progress_line

CONFIG = {
    "job_id": "shop",
    "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["orders"]},
    "routing": {"table": "orders"},
    "tables": {"orders": {"schema": "id BIGINT NOT NULL"}},
}


def test_unknown_fields_go_to_the_dead_letters_unless_the_file_says_otherwise(tmp_path):
    assert resolve_config(CONFIG, tmp_path).on_unknown_field == "dead-letter"
    for action in ("ignore", "fail"):
        assert resolve_config({**CONFIG, "sink": {"on_unknown_field": action}}, tmp_path).on_unknown_field == action


def test_a_wrong_value_is_one_line_naming_the_key(tmp_path, capsys):
    with pytest.raises(ConfigurationError, match=r"^sink.on_unknown_field = 'drop': not one of dead-letter, ignore, fail, add-column$"):
        resolve_config({**CONFIG, "sink": {"on_unknown_field": "drop"}}, tmp_path)
    job = tmp_path / "job.toml"
    job.write_text('job_id = "shop"\n[kafka]\nbootstrap_servers = "127.0.0.1:9092"\ntopics = ["orders"]\n'
                   '[routing]\ntable = "orders"\n[tables.orders]\nschema = "id BIGINT"\n[sink]\non_unknown_field = "Ignore"\n')
    assert main(["run", "--config", str(job)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sink.on_unknown_field = 'Ignore'" in err and "Traceback" not in err


def progress(observed: dict) -> dict:
    return {"id": str(uuid.uuid4()), "batchId": 4, "sources": [], "observedMetrics": {"streaming_sink": observed}}


def test_messages_with_unknown_fields_are_counted_per_table_from_the_frames_observed_metrics():
    metrics = BatchMetrics("shop")
    metrics.record_progress(progress({"records_in": 5, "dead_letters": 2, "unknown_fields": {"orders": 2, "payments": 0}}))
    metrics.record_progress(progress({"records_in": 1, "dead_letters": 0, "unknown_fields": {"orders": 1}}))
    metrics.record_progress({"batchId": 6, "sources": []})  # a query of the library API observes nothing
    text = metrics.render()
    assert 'streaming_sink_messages_with_unknown_fields_total{job_id="shop",table="orders"} 3.0' in text
    assert 'streaming_sink_messages_with_unknown_fields_total{job_id="shop",table="payments"} 0.0' in text
    line = progress_line(progress({"records_in": 5, "unknown_fields": {"orders": 2}}))
    assert line.endswith("records_in 5, unknown_fields {'orders': 2}")
