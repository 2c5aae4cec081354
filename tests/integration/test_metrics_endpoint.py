"""The Prometheus exporter's endpoint, served for real: it binds the configured host and answers a scrape.

The exporter's names, types and values are checked without a server in tests/unit/test_metrics.py.
"""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path


def test_the_endpoint_binds_the_configured_host(tmp_path: Path):
    from streaming_sink.job import build_sink, sink_metrics
    from streaming_sink.job_spec import JobSpec

    spec = JobSpec.from_json(json.dumps({
        "job_id": "m", "bootstrap": "unused:9092", "topics": ["events"], "target_url": f"chdb://{tmp_path / 'ch'}",
        "database": "default", "state_url": f"file://{tmp_path / 'state'}", "checkpoint": str(tmp_path / "ckpt"),
        "schema": "id BIGINT", "table": "t", "trigger": "5 seconds", "metrics_port": 0}))
    assert spec.metrics_host == "127.0.0.1"
    for host in ("127.0.0.1", "127.0.0.2"):  # any loopback address a test may bind proves the host is used
        spec.metrics_host = host
        metrics = sink_metrics(build_sink(spec))
        assert metrics is not None
        try:
            server_host, port = metrics.server.server_address[:2]
            assert server_host == host
            text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
        finally:
            metrics.close()
        assert "# HELP streaming_sink_pending_prepared_transactions" in text
        assert 'streaming_sink_trigger_interval_seconds{job_id="m"} 5.0' in text
