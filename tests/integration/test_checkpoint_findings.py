"""What operators, checkpoints and stores do between crashes (issue 22; review reliability-2026-11-24 F2-F4).

The real coordinator, writers and StarRocks emulator over HTTP, as in test_protocol_findings; the
checkpoint is a real folder in which each test writes Spark's offset log the way Spark does (`offsets/N`
before the batch is called). Each test failed on the code before its fix.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streaming_sink.actions import apply_recovery, plan_recovery
from streaming_sink.checkpoint import CheckpointFolder, restore_offsets
from streaming_sink.committer import Committer
from streaming_sink.errors import ReplayAmbiguousError, SourceReplannedError
from streaming_sink.records import BatchState
from streaming_sink.state import MemoryStateStore, StateStoreLostError
from tests.integration.test_protocol_findings import (
    DB,
    JOB,
    QUERY,
    Crash,
    CrashingStore,
    expected_ids,
    ids,
    sink_of,
    source,
    target_of,
)


def plan(checkpoint: Path, batch_id: int, ends: dict[str, int], stamp: int = 0) -> str:
    """Write offsets/<batch_id> as Spark does before it calls the batch; returns its text."""
    text = "v1\n" + json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000 + stamp}) + "\n"
    text += json.dumps({"events": ends}) + "\n"
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch_id)).write_text(text)
    return text


# -- F2: a batch Spark planned again with another range is never taken as committed -----------------------------------


def test_a_committed_batch_replanned_with_another_range_stops_instead_of_dropping_its_rows(sr, tmp_path) -> None:
    store, ckpt = MemoryStateStore(), tmp_path / "ckpt"
    plan(ckpt, 0, {"0": 100, "1": 100})
    sink_of(target_of(sr), store, checkpoint_location=str(ckpt)).process(source(0), 0, QUERY)
    plan(ckpt, 1, {"0": 200, "1": 200})
    sink_of(target_of(sr), store, checkpoint_location=str(ckpt)).process(source(1), 1, QUERY)
    recorded = (ckpt / "offsets" / "1").read_text()
    # the operator deletes offsets/1 and commits/1 (a corrupt last offset file); Spark plans batch 1 again, further
    plan(ckpt, 1, {"0": 260, "1": 260}, stamp=5)
    with pytest.raises(SourceReplannedError, match="section 'Batch re-planned with another range'"):
        sink_of(target_of(sr), store, checkpoint_location=str(ckpt)).process(source(2), 1, QUERY)
    assert ids(sr) == expected_ids(0, 1)  # nothing written for the new range, nothing dropped as "committed"
    stopped = store.get_batch(JOB, QUERY, 1)
    assert stopped.stop["error"] == "SourceReplannedError" and stopped.stop["section"] == "Batch re-planned with another range"
    # the runbook's remedy: the recorded range back in offsets/1; Spark re-runs batch 1 as it was, and goes on
    restore_offsets(CheckpointFolder(str(ckpt)), 1, stopped.source)
    assert (ckpt / "offsets" / "1").read_text() == recorded
    report = sink_of(target_of(sr), store, checkpoint_location=str(ckpt)).process(source(1), 1, QUERY)
    assert report.action == "already-committed" and store.get_batch(JOB, QUERY, 1).stop is None
    plan(ckpt, 2, {"0": 260, "1": 260})
    sink_of(target_of(sr), store, checkpoint_location=str(ckpt)).process(source(2), 2, QUERY)
    assert ids(sr) == expected_ids(0, 1, 2)


def test_a_prepared_batch_replanned_with_another_range_commits_nothing_until_the_range_is_back(sr, tmp_path) -> None:
    store, ckpt = MemoryStateStore(), tmp_path / "ckpt"
    recorded = plan(ckpt, 0, {"0": 100})
    with pytest.raises(Crash):  # killed at the commit point: PREPARED, no commit sent
        sink_of(target_of(sr), CrashingStore(store, "put_batch", on_call=2), checkpoint_location=str(ckpt)).process(
            source(0), 0, QUERY)
    plan(ckpt, 0, {"0": 150}, stamp=9)
    with pytest.raises(SourceReplannedError):
        sink_of(target_of(sr), store, checkpoint_location=str(ckpt)).process(source(1), 0, QUERY)
    assert ids(sr) == [] and store.get_batch(JOB, QUERY, 0).state is BatchState.PREPARED
    restore_offsets(CheckpointFolder(str(ckpt)), 0, recorded)
    assert sink_of(target_of(sr), store, checkpoint_location=str(ckpt)).process(source(0), 0, QUERY).action == "recovered-prepared"
    assert ids(sr) == expected_ids(0)


def test_the_same_range_planned_again_is_the_normal_replay(sr, tmp_path) -> None:
    """Spark's metadata line (its batch timestamp) differs on a re-plan; only the sources' offsets count."""
    store, ckpt = MemoryStateStore(), tmp_path / "ckpt"
    plan(ckpt, 0, {"0": 100})
    sink_of(target_of(sr), store, checkpoint_location=str(ckpt)).process(source(0), 0, QUERY)
    plan(ckpt, 0, {"0": 100}, stamp=7)
    assert sink_of(target_of(sr), store, checkpoint_location=str(ckpt)).process(source(0), 0, QUERY).action == "already-committed"


# -- F3: a store rolled back inside a replay is detected ---------------------------------------------------------------


def test_a_store_rolled_back_to_a_record_older_than_a_replay_is_detected(sr, tmp_path) -> None:
    store, ckpt = MemoryStateStore(), str(tmp_path / "ckpt")
    sink_of(target_of(sr), store, checkpoint_location=ckpt).process(source(0), 0, QUERY)
    with pytest.raises(Crash):  # batch 1: killed right after its PREPARED record
        sink_of(target_of(sr), CrashingStore(store, "put_batch", on_call=2), checkpoint_location=ckpt).process(
            source(1), 1, QUERY)
    replica = store.snapshot()  # a replica or backup of the store as it is now
    sr.clock.advance(3 * 86400 + 60)  # the prepared transactions expired and were forgotten
    # driver B replays batch 1 under fresh labels and commits them, then dies before Spark's commits/1
    with pytest.raises(Crash):
        sink_of(target_of(sr), CrashingStore(store, "mark_done_many", on_call=2), checkpoint_location=ckpt).process(
            source(1), 1, QUERY)
    assert ids(sr) == expected_ids(0, 1)
    store.restore(replica)  # the store fails over to the copy
    with pytest.raises(StateStoreLostError, match="commits were sent for 4 label"):
        sink_of(target_of(sr), store, checkpoint_location=ckpt).process(source(1), 1, QUERY)
    assert ids(sr) == expected_ids(0, 1)  # not replayed a second time


# -- F4: a label that answered LOST on its first commit never reads as ambiguous later ---------------------------------


def _prepared_then_forgotten(sr: Any, store: MemoryStateStore) -> None:
    sink_of(target_of(sr), store).process(source(0), 0, QUERY)
    with pytest.raises(Crash):  # batch 1 killed right after its PREPARED record: no commit sent
        sink_of(target_of(sr), CrashingStore(store, "put_batch", on_call=2)).process(source(1), 1, QUERY)
    sr.clock.advance(86400 + 60)  # the prepared timeout (a day): the server aborts them when it next looks
    for committable in store.get_batch(JOB, QUERY, 1).committables:
        target = target_of(sr)
        assert target.fe.label_state(target.database, committable.label)[0] == "ABORTED"
    sr.clock.advance(3 * 86400 + 60)  # and forgets the aborted labels: a commit answers LOST


def test_recover_apply_first_then_the_restart_replays_instead_of_stopping(sr) -> None:
    store = MemoryStateStore()
    _prepared_then_forgotten(sr, store)
    recovery = Committer(target_of(sr), store, JOB, store.take_epoch(JOB, "operator"))
    # the query of the checkpoint is given (this job keeps no marker: it runs without a checkpoint folder)
    done = apply_recovery(recovery, plan_recovery(store, JOB, recovery.target, checkpoint_query=QUERY), lambda _: None)
    assert [a.action for a in done] == ["keep-for-replay"]  # the runbook: leave it, restart the job
    report = sink_of(target_of(sr), store).process(source(1), 1, QUERY)  # was ReplayAmbiguousError
    assert report.action == "recovered-prepared" and ids(sr) == expected_ids(0, 1)


def test_a_replay_cut_short_by_a_crash_replays_again_on_restart(sr) -> None:
    store = MemoryStateStore()
    _prepared_then_forgotten(sr, store)

    class DiesInReplay:
        def run(self, *args: Any) -> Any:
            raise Crash("killed while the replay reads the batch")

    sink = sink_of(target_of(sr), store)
    sink.runner = DiesInReplay()
    with pytest.raises(Crash):
        sink.process(source(1), 1, QUERY)
    assert store.get_batch(JOB, QUERY, 1).never_committed  # recorded before the replay began
    report = sink_of(target_of(sr), store).process(source(1), 1, QUERY)  # was ReplayAmbiguousError
    assert report.action == "recovered-prepared" and ids(sr) == expected_ids(0, 1)


def test_a_label_sent_by_an_earlier_phase_and_forgotten_still_stops(sr) -> None:
    """The rule F4 relaxes stays for what it protects (I8): a label whose commit went out in an earlier phase."""
    store = MemoryStateStore()
    with pytest.raises(Crash):  # the first commit lands, the driver dies before its progress mark
        sink_of(target_of(sr), CrashingStore(store, "mark_done_many")).process(source(0), 0, QUERY)
    sr.clock.advance(3 * 86400 + 60)
    with pytest.raises(ReplayAmbiguousError):
        sink_of(target_of(sr), store).process(source(0), 0, QUERY)
    assert len(ids(sr)) == len(set(ids(sr)))


# -- F5: an older checkpoint's batch that can no longer be committed does not block the new query forever ---------------


def test_an_older_querys_unreplayable_batch_is_given_up_by_the_operator_and_the_new_query_goes_on(
    sr, tmp_path, capsys, monkeypatch
) -> None:
    from streaming_sink.cli import main
    from streaming_sink.errors import ReplayImpossibleError
    from streaming_sink.state import FileStateStore

    store = FileStateStore(tmp_path / "state")
    with pytest.raises(Crash):  # the old query's batch 0 is PREPARED, no commit sent; the server then drops it
        sink_of(target_of(sr), CrashingStore(store, "put_batch", on_call=2)).process(source(0), 0, "q-old")
    sr.clock.advance(3 * 86400 + 60)
    checkpoint = tmp_path / "new-checkpoint"  # the runbook's new checkpoint: a new query, which never re-runs q-old's
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": "q-new"}))
    for _ in range(2):  # every start stops on it: the old query will never re-run the batch to replay it
        sink = sink_of(target_of(sr), store)
        with pytest.raises(ReplayImpossibleError, match="--query-id q-old --batch 0 --accept-loss"):
            sink.process(source(5), 0, "q-new")
        sink.close()  # as the job does when it stops
    assert store.get_batch(JOB, "q-old", 0).stop["error"] == "ReplayImpossibleError"  # status shows it on that batch

    monkeypatch.setenv("STREAMING_SINK_TARGET_USER", "root")
    monkeypatch.setenv("STREAMING_SINK_TARGET_PASSWORD", "pw")
    command = ["settle", "--job", JOB, "--state", f"file://{tmp_path / 'state'}", "--target",
               sr.fe_url.replace("http://", "starrocks://"), "--database", DB, "--query-id", "q-old", "--batch", "0",
               "--accept-loss", "--checkpoint", str(checkpoint)]
    assert main(command) == 0 and "dry run: would commit what the target still holds" in capsys.readouterr().out
    assert store.get_batch(JOB, "q-old", 0).state is BatchState.PREPARED  # a dry run changes nothing
    assert main([*command, "--apply"]) == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    assert "2 transaction(s) given up (200 rows); its source range" in said
    old = store.get_batch(JOB, "q-old", 0)
    assert old.state is BatchState.COMMITTED and len(old.discarded) == 2 and old.stop is None
    assert old.live_committables() == []

    report = sink_of(target_of(sr), store).process(source(5), 0, "q-new")
    assert report.action == "written" and ids(sr) == expected_ids(5)  # q-old's rows are the operator's to re-ingest


# -- a stop raised in foreachBatch reaches the job's caller with its own type ------------------------------------------


def test_a_stop_in_foreach_batch_ends_the_query_with_its_own_type(spark_session, tmp_path) -> None:
    """Spark hands the error of a foreachBatch function back from awaitTermination as text; the packaged job
    raises the sink's own error again, so `run` answers with its exit code, not a traceback of a bug."""
    from streaming_sink.job import _await

    def stop(df: Any, batch_id: int) -> None:
        raise SourceReplannedError("batch re-planned; see docs/runbook.md, section 'Batch re-planned with another range'")

    query = (spark_session.readStream.format("rate").option("rowsPerSecond", 1).load().writeStream.foreachBatch(stop)
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    with pytest.raises(SourceReplannedError) as raised:
        _await(query)
    assert raised.value.runbook_section == "Batch re-planned with another range"
