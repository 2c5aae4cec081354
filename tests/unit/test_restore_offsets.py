"""`streaming-sink restore-offsets`: the checkpoint's offset log made to agree with the journal again."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from streaming_sink.cli import main
from streaming_sink.records import BatchState
from streaming_sink.state import BatchRecord, FileStateStore
from tests.unit.test_cli_operator import dead_pid

JOB, QUERY = "job", "0f7c1d2e-0000-4000-8000-000000000001"


def offsets_text(end: int, stamp: int = 0) -> str:
    return f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{stamp}}}\n{{"events":{{"0":{end}}}}}'


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, FileStateStore]:
    ckpt, state = tmp_path / "ckpt", tmp_path / "state"
    (ckpt / "offsets").mkdir(parents=True)
    (ckpt / "commits").mkdir()
    (ckpt / "metadata").write_text(json.dumps({"id": QUERY}))
    store = FileStateStore(state)
    epoch = store.take_epoch(JOB, f"{socket.gethostname()}:{dead_pid()}")  # the driver that stopped on it is gone
    for batch in range(3):  # the journal: batches 0-2 committed, with the ranges Spark first planned
        store.put_batch(JOB, epoch, BatchRecord(QUERY, batch, BatchState.COMMITTED, epoch, [],
                                                source=offsets_text(100 * (batch + 1))))
    return ckpt, state, store


def run(state: Path, ckpt: Path, *extra: str) -> int:
    return main(["restore-offsets", "--job", JOB, "--state", f"file://{state}", "--checkpoint", str(ckpt), *extra])


def test_a_snapshot_restore_is_undone_from_the_journal(setup, capsys) -> None:
    ckpt, state, _ = setup
    # a snapshot from after batch 0; Spark then planned batch 1 anew (and got as far as planning batch 2)
    (ckpt / "offsets" / "0").write_text(offsets_text(100))
    (ckpt / "commits" / "0").write_text("v1\n{}")
    for batch, end in ((1, 250), (2, 400)):
        (ckpt / "offsets" / str(batch)).write_text(offsets_text(end, stamp=9))
    (ckpt / "offsets" / ".1.crc").write_bytes(b"crc of the re-planned file")
    (ckpt / "offsets" / "3").write_text(offsets_text(500, stamp=9))  # beyond the journal: never reached the sink
    assert run(state, ckpt) == 0
    dry = capsys.readouterr().out
    assert "offsets/1" in dry and "offsets/2" in dry and "offsets/3 and commits/3" in dry and "offsets/0" not in dry
    assert (ckpt / "offsets" / "1").read_text() == offsets_text(250, stamp=9)  # a dry run writes nothing
    assert run(state, ckpt, "--apply") == 0
    assert (ckpt / "offsets" / "1").read_text() == offsets_text(200)
    assert (ckpt / "offsets" / "2").read_text() == offsets_text(300)
    assert not (ckpt / "offsets" / ".1.crc").exists() and not (ckpt / "offsets" / "3").exists()
    assert run(state, ckpt) == 0 and "nothing to do" in capsys.readouterr().out


def test_it_refuses_when_the_journal_lost_the_range_spark_would_start_from(setup, capsys) -> None:
    ckpt, state, store = setup
    store.delete_batch(JOB, store.current_epoch(JOB), QUERY, 1)  # past retention
    (ckpt / "offsets" / "2").write_text(offsets_text(999))
    assert run(state, ckpt, "--apply") == 4
    assert "no recorded range for batch(es) [1]" in capsys.readouterr().err
    assert (ckpt / "offsets" / "2").read_text() == offsets_text(999)  # untouched


def test_a_folder_that_is_not_a_checkpoint_is_refused(setup, tmp_path, capsys) -> None:
    _, state, _ = setup
    assert run(state, tmp_path / "elsewhere", "--apply") == 2
    assert "configuration error: " in (err := capsys.readouterr().err) and "not a streaming checkpoint" in err



def test_kafka_layout_changes_name_partitions_added_or_removed_and_offsets_that_went_back() -> None:
    """Only Kafka sources' lines count (topic -> partition -> end offset): a topic that gained or lost partitions, or
    a partition whose end offset is below the earlier batch's (the topic re-created); a rate or file source, an
    unknown text or a topic first seen now is no change."""
    from streaming_sink.checkpoint import kafka_layout_changes

    def log(*sources: str) -> str:
        return "v1\n{\"batchWatermarkMs\":0,\"batchTimestampMs\":1}\n" + "\n".join(sources) + "\n"

    before = log('{"a":{"0":5,"1":7},"b":{"0":3}}', '{"logOffset":4}')
    after = log('{"a":{"0":9,"1":9,"2":0},"b":{"0":3},"c":{"0":1,"1":1}}', '{"logOffset":5}')
    assert kafka_layout_changes(before, after) == ["topic a: 2 partitions, now 3"]
    assert kafka_layout_changes(after, before) == ["topic a: 3 partitions, now 2", "topic a partition 0: offset 9, now 5",
                                                   "topic a partition 1: offset 9, now 7"]
    assert kafka_layout_changes(before, log('{"a":{"0":5,"1":2},"b":{"0":3}}')) == ["topic a partition 1: offset 7, now 2"]
    assert kafka_layout_changes(None, after) == kafka_layout_changes(before, None) == []
    assert kafka_layout_changes(log("-"), log('{"a":{"0":1}}')) == []
