"""The operator's commands on what a killed job left behind, then the job restarted: still exact.

Embedded ClickHouse (chdb), and ClickHouse over HTTPS through the test front with a certificate of a test
CA: the job (driver and tasks) and the operator's commands trust it through `ca_bundle`, which the commands
read from the job's TOML (`--config`), as an operator's would."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from streaming_sink.records import BatchState
from tests.support.jobs import write_job_toml
from tests.support.pipeline import DB, LocalPipeline
from tests.support.targets.clickhouse import clickhouse_adapter

pytestmark = pytest.mark.slow


def cli(pipeline: LocalPipeline, *args: str, target: bool = True) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "streaming_sink.cli", *args, "--job", pipeline.job_id, "--state", pipeline.state_url]
    if target:
        command += ["--target", pipeline.adapter.target_url(), "--database", DB, "--config", str(operator_config(pipeline))]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def operator_config(pipeline: LocalPipeline) -> Path:
    """The job's TOML, whose `target.options` (TLS ones included) the commands take: flags give the rest."""
    assert pipeline.adapter is not None
    return write_job_toml(
        pipeline.root, job_id=pipeline.job_id, kafka={"bootstrap_servers": pipeline.broker.bootstrap, "topics": [pipeline.topic]},
        routing={"field": "table"}, tables={"orders": {"schema": "id BIGINT NOT NULL, name STRING, amount DOUBLE"}},
        target={"url": pipeline.adapter.target_url(), "database": DB, "options": pipeline.adapter.target_options()},
        state={"url": pipeline.state_url},
    )


# The operator commands' logic is the same on every target: CI runs them on chdb; the HTTPS variant (whose commit
# and abort on the wire CI proves in test_exactly_once_clickhouse_http.py) runs in the extended suite.
@pytest.fixture(params=["chdb", pytest.param("https", marks=pytest.mark.extended)])
def pipeline(request, tmp_path, kafka_broker):
    with clickhouse_adapter(request.param, tmp_path / "ch") as adapter:
        p = LocalPipeline(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}", adapter=adapter)
        p.produce()
        yield p


def test_status_and_recover_finish_a_prepared_batch_before_the_job_returns(pipeline):
    assert pipeline.run_driver(crash_at="after-prepared-record@2", run=0) == -signal.SIGKILL
    record, _, _ = pipeline.batch_state(2)

    status = json.loads(cli(pipeline, "status", "--json", "--prepared-timeout", "86400", target=False).stdout)
    batch2 = next(b for b in status["batches"] if b["batch_id"] == 2)
    assert batch2["state"] == "PREPARED" and batch2["committed"] == 0
    assert {p["label"] for p in status["pending_transactions"]} == {c.label for c in record.committables}
    assert all(0 < p["expires_in_s"] <= 86400 for p in status["pending_transactions"])
    human = cli(pipeline, "status", target=False).stdout
    assert "PREPARED" in human and "prepared, not yet committed" in human

    dry = json.loads(cli(pipeline, "recover", "--json").stdout)
    assert dry["applied"] is False and [(a["batch_id"], a["action"]) for a in dry["actions"]] == [(2, "commit-prepared")]
    assert pipeline.batch_state(2)[0].state is BatchState.PREPARED  # a dry run changes nothing

    applied = cli(pipeline, "recover", "--apply", "--json")
    assert applied.returncode == 0, applied.stderr
    assert pipeline.batch_state(2)[0].state is BatchState.COMMITTED

    pipeline.run_to_completion()
    assert '"action": "already-committed", "batch_id": 2' in (pipeline.logs / "driver-1.log").read_text()
    pipeline.verify()


@pytest.mark.extended  # CI: abort refused beside a live driver and acting once it is killed (test_operator_beside_driver.py)
def test_abort_refuses_a_prepared_batch_and_cleans_a_begun_one(pipeline):
    assert pipeline.run_driver(crash_at="after-writers-prepared@2", run=0) == -signal.SIGKILL
    _, intents, _ = pipeline.batch_state(2)
    assert intents
    dry = cli(pipeline, "abort", "--batch", "2")
    assert dry.returncode == 0 and "would abort" in dry.stdout
    applied = cli(pipeline, "abort", "--batch", "2", "--apply")
    assert applied.returncode == 0, applied.stderr
    assert pipeline.batch_state(2)[1] == []

    assert pipeline.run_driver(crash_at="after-prepared-record@3", run=1) == -signal.SIGKILL
    refused = cli(pipeline, "abort", "--batch", "3", "--apply")
    assert refused.returncode == 4 and "refusing: batch 3 is PREPARED" in refused.stderr  # ExitCode.REFUSED
    pipeline.run_to_completion(first_run=2)
    pipeline.verify()
