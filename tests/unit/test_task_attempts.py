"""R7: a writer's label names its task attempt uniquely, also across stage attempts.

Spark's `attemptNumber()` counts per stage attempt: after a stage is resubmitted, a straggler of the
old stage attempt and attempt 0 of the new one carry the same number, so labels built from it
collide and two writers share one transaction. `taskAttemptId()` is unique in the application.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from streaming_sink.execution import task_writer
from streaming_sink.routing import Router
from streaming_sink.state import FileStateStore
from streaming_sink.writer import PartitionResult, WriteContext
from tests.support.doubles.recording import RecordingTarget


@dataclass
class FakeTask:
    """What `TaskContext.get()` tells a task about itself."""

    partition: int
    attempt_number: int
    attempt_id: int

    def partitionId(self) -> int:
        return self.partition

    def attemptNumber(self) -> int:
        return self.attempt_number

    def taskAttemptId(self) -> int:
        return self.attempt_id


class BeginningTarget(RecordingTarget):
    """Records the label of every transaction a writer begins, and prepares it as empty."""

    def __init__(self) -> None:
        super().__init__()
        self.labels: list[str] = []

    def routable_tables(self):
        return None

    def close(self) -> None:
        pass

    def begin(self, table, new_ref, record_intent):
        target = self

        class Txn:
            def write(self, chunk: pa.Table) -> None:
                ref = new_ref(0)
                record_intent(ref)
                target.labels.append(ref.label)

            def prepare(self):
                return []

            def abort(self) -> None:
                pass

        return Txn()


def test_two_stage_attempts_of_one_partition_write_under_different_labels(tmp_path, monkeypatch) -> None:
    import pyspark

    store = FileStateStore(tmp_path / "state")
    epoch = store.take_epoch("job", "test")
    context = WriteContext("job", "q", 0, epoch, 0, 1 << 20)
    target = BeginningTarget()
    write = task_writer(target, Router(None, "t", None, False), context, store, None)
    rows = pa.record_batch({"id": [1, 2, 3]})
    # attempt 0 of partition 3 in stage attempt 0 (a straggler), and attempt 0 of it in stage attempt 1
    for task in (FakeTask(3, 0, 41), FakeTask(3, 0, 57)):
        monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls, task=task: task))
        results = [PartitionResult.from_json(b.column("result")[0].as_py()) for b in write(iter([rows]))]
        assert results[0].attempt == f"e{epoch}w0t{task.attempt_id}"
    assert len(target.labels) == 2 and target.labels[0] != target.labels[1]
