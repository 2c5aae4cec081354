"""`streaming-sink status` shows the running job's messages with unknown fields per table (issue 25 item 5), through
the installed command: the count goes from the job's frame through Spark's observed metrics to the driver's
/metrics, which `status --metrics` (or sink.metrics_port in --config) reads. The journal holds no such count."""
from __future__ import annotations

import json

import pytest

from tests.integration.test_first_hour import streaming_sink
from tests.integration.test_unknown_fields import job, stream_with_metrics
from tests.support.services.ports import free_port


@pytest.mark.slow
def test_status_shows_the_running_jobs_messages_with_unknown_fields_per_table(spark_session, clickhouse_target, tmp_path):
    spec = job(tmp_path, clickhouse_target, "ignore")
    metrics = stream_with_metrics(spark_session, spec, clickhouse_target, tmp_path)
    port = free_port()
    metrics.serve(port)
    config = tmp_path / "job.toml"
    config.write_text(f'job_id = "{spec.job_id}"\n[kafka]\nbootstrap_servers = "127.0.0.1:9"\ntopics = ["events"]\n'
                      '[routing]\ntable = "orders"\n[tables.orders]\nschema = "id BIGINT NOT NULL, name STRING"\n'
                      f'[state]\nurl = "{spec.state_url}"\n[sink]\nmetrics_port = {port}\nmetrics_host = "0.0.0.0"\n')
    try:
        shown = streaming_sink("status", "--state", spec.state_url, "--job", spec.job_id,
                               "--metrics", f"http://127.0.0.1:{port}/metrics", "--json", cwd=tmp_path)
        text = streaming_sink("status", "--config", str(config), cwd=tmp_path)  # the endpoint from sink.metrics_port
    finally:
        metrics.close()
    assert shown.returncode == 0, shown.stderr[-2000:]
    unknown = json.loads(shown.stdout)["unknown_fields"]
    assert unknown["by_table"] == {"orders": 1} and unknown["since"].endswith("Z"), unknown
    assert text.returncode == 0, text.stderr[-2000:]
    assert "messages with unknown fields (sink.on_unknown_field), since the driver started at " in text.stdout
    assert text.stdout.rstrip().splitlines()[-2].endswith(": orders 1"), text.stdout

    gone = streaming_sink("status", "--state", spec.state_url, "--job", spec.job_id,
                          "--metrics", f"http://127.0.0.1:{port}/metrics", cwd=tmp_path)
    assert gone.returncode == 0, gone.stderr[-2000:]  # a stopped job's endpoint is no problem of the journal's
    assert f"messages with unknown fields: cannot read http://127.0.0.1:{port}/metrics (is the job running?)" in gone.stdout
