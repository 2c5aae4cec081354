"""Issue 22 end to end, as a new user meets it: the packaged job on a real Kafka broker, Spark local, chdb.

* A deleted last offset file (the usual remedy for a corrupt one) made Spark re-plan the batch with another
  range, and the sink took it for the committed batch and dropped its new rows, exit 0 (review F2). Now the
  job stops with exit 4, `status` says why, `restore-offsets --apply` gives Spark the recorded range back,
  and the restart is exact.
* A state store wiped inside batch 0, in a pipeline that does not give `checkpoint_location`: the epoch and
  the labels repeated and the batch was committed twice. Now the sink keeps its marker in the checkpoint it
  reads from Spark, and the restart stops (StateStoreLostError) with nothing loaded twice.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from streaming_sink.checkpoint import CheckpointFolder, delete_log_entry, latest_batch
from tests.support.pipeline import DB, REPO, TABLES, LocalPipeline

pytestmark = pytest.mark.slow


def cli(pipeline: LocalPipeline, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streaming_sink.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=pipeline._env(None), timeout=timeout)


@pytest.mark.extended  # CI: replanned batches in process (test_checkpoint_findings.py) and restore-offsets in the simulation
def test_a_deleted_last_offset_file_stops_the_job_until_restore_offsets_gives_the_range_back(tmp_path, kafka_broker):
    pipeline = LocalPipeline(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}", messages_per_partition=110)
    pipeline.produce()
    pipeline.run_to_completion(first_run=0)  # batches of 150: 150, 150, 30
    checkpoint = CheckpointFolder(str(tmp_path / "checkpoint"))
    last = latest_batch(checkpoint, "offsets")
    assert last == 2 and latest_batch(checkpoint, "commits") == 2
    pipeline.produce(more=40)  # data arrived since: a re-plan of batch 2 covers more than its 30 messages
    for log in ("commits", "offsets"):  # the operator removes the "corrupt" last offset file, as forums advise
        delete_log_entry(checkpoint, log, last)

    stopped = cli(pipeline, "run", "--spec", str(pipeline.spec_path))
    assert stopped.returncode == 4, stopped.stderr[-3000:]
    assert "stopped for an operator (SourceReplannedError)" in stopped.stderr
    assert "section 'Batch re-planned with another range'" in stopped.stderr
    ids = [row[0] for table in TABLES for row in pipeline.adapter.rows(DB, table)]
    assert len(ids) == 330 and len(set(ids)) == 330  # nothing written by the re-planned batch

    status = cli(pipeline, "status", "--job", pipeline.job_id, "--state", pipeline.state_url)
    assert status.returncode == 1 and "stopped for an operator on batch 2" in status.stdout, status.stdout
    base = ["--job", pipeline.job_id, "--state", pipeline.state_url, "--checkpoint", str(tmp_path / "checkpoint")]
    dry = cli(pipeline, "restore-offsets", *base)
    assert dry.returncode == 0 and "would write 1 offset file(s)" in dry.stdout, dry.stdout + dry.stderr
    applied = cli(pipeline, "restore-offsets", *base, "--apply")
    assert applied.returncode == 0, applied.stderr

    pipeline.run_to_completion(first_run=2)  # batch 2 with its recorded range, then the new data
    pipeline.verify()
    assert cli(pipeline, "status", "--job", pipeline.job_id, "--state", pipeline.state_url).returncode == 0


def test_a_store_wiped_inside_batch_0_stops_the_restart_in_a_pipeline_without_checkpoint_location(
    tmp_path: Path, kafka_broker
) -> None:
    pipeline = LocalPipeline(tmp_path, kafka_broker, f"file://{tmp_path / 'state'}",
                             driver_module="tests.integration.job_without_checkpoint_location")
    pipeline.produce()
    assert pipeline.run_driver(crash_at="after-first-commit@0", run=0) == -signal.SIGKILL
    committed = [row[0] for table in TABLES for row in pipeline.adapter.rows(DB, table)]
    assert committed  # part of batch 0 is visible
    marker = json.loads(next((tmp_path / "checkpoint" / "streaming-sink").glob("*.json")).read_text())
    assert marker  # the sink found the checkpoint from Spark and kept its marker there
    shutil.rmtree(tmp_path / "state")  # the state store is wiped (FLUSHALL, a Redis without persistence)

    code = pipeline.run_driver(run=1)
    log = (pipeline.logs / "driver-1.log").read_text()
    assert code != 0 and "StateStoreLostError" in log, pipeline.log_tail(1)
    after = [row[0] for table in TABLES for row in pipeline.adapter.rows(DB, table)]
    assert sorted(after) == sorted(committed)  # nothing committed again, nothing new before the operator decides
