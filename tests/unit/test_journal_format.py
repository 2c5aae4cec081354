"""The journal is a versioned format: records of before the version still read the same, newer ones are refused.

`fixtures/journal_v0/` holds records exactly as the release before format v1 wrote them (raw Redis values
and the file store's epoch file, made by the real sink, writers and targets: see `generate.py` there).
They are frozen: a change of the code that breaks these tests breaks every job with a PREPARED batch in
its store at an upgrade.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink.committable import BASE_FORMAT, JOURNAL_FORMAT, Committable, JournalFormatError, TxnRef
from streaming_sink.committer import Committer
from streaming_sink.records import BatchState, decode_owner
from streaming_sink.routing import Router
from streaming_sink.sink import ExactlyOnceSink
from streaming_sink.state import BatchRecord, FileStateStore, MemoryStateStore
from streaming_sink.targets.base import CommitOutcome, PreparedPart, TableTransaction, Target
from streaming_sink.writer import PartitionResult, PartitionWriter, WriteContext

FIXTURES = Path(__file__).parent / "fixtures" / "journal_v0"
BATCH_RECORDS = sorted(p.name for p in FIXTURES.glob("*_prepared.json"))
BATCH_RECORDS += sorted(p.name for p in FIXTURES.glob("*_committed*.json"))
INTENTS = sorted(p.name for p in FIXTURES.glob("*_intent.json"))
PROTOCOL_KEYS = ("flush", "flush_rows", "filtered_rows", "unselected_rows")  # in `extra` before format v1
NEWER = f"format version {JOURNAL_FORMAT + 1} was written by a newer streaming-sink.*upgrade"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# -- records of before format v1 ---------------------------------------------------------------------


def test_the_fixtures_are_what_the_release_before_v1_wrote() -> None:
    """No version, protocol fields inside `extra`: if this fails, someone rewrote the frozen fixtures."""
    assert len(BATCH_RECORDS) == 7 and len(INTENTS) == 3
    for name in BATCH_RECORDS:
        data = json.loads(fixture(name))
        assert "v" not in data and all("v" not in c and "flush" not in c for c in data["committables"])
    extras = [c["extra"] for name in BATCH_RECORDS for c in json.loads(fixture(name))["committables"]]
    assert any("filtered_rows" in e for e in extras) and any("flush" in e for e in extras)
    assert any(e == {} for e in extras) and any("staging" in e for e in extras)
    assert any("load_bytes" in e for e in extras)


@pytest.mark.parametrize("name", BATCH_RECORDS)
def test_a_batch_record_of_before_v1_reads_with_the_same_meaning(name: str) -> None:
    raw = json.loads(fixture(name))
    record = BatchRecord.from_json(fixture(name))
    assert (record.query_id, record.batch_id, record.state.value, record.epoch) == (
        raw["query_id"], raw["batch_id"], raw["state"], raw["epoch"])
    assert record.checksums == {int(k): v for k, v in raw["checksums"].items()}
    assert (record.lost, record.sent, record.events, record.records_in, record.open_attempt) == (
        raw["lost"], raw["sent"], raw["events"], raw["records_in"], raw["open_attempt"])
    assert (record.created_at, record.timings) == (raw["created_at"], raw["timings"])
    assert len(record.committables) == len(raw["committables"])
    for committable, old in zip(record.committables, raw["committables"]):
        for key in ("target", "database", "table", "label", "partition", "attempt", "txn_id", "rows", "bytes"):
            assert getattr(committable, key) == old[key], key
        assert committable.checksum == old["checksum"]
        assert committable.flush == old["extra"].get("flush")
        assert committable.flush_rows == old["extra"].get("flush_rows")
        assert committable.filtered_rows == old["extra"].get("filtered_rows", 0)
        assert committable.unselected_rows == old["extra"].get("unselected_rows", 0)
        assert committable.extra == {k: v for k, v in old["extra"].items() if k not in PROTOCOL_KEYS}


def test_the_protocol_fields_of_each_target_kind_are_typed_after_reading() -> None:
    starrocks = BatchRecord.from_json(fixture("starrocks_prepared.json")).committables
    assert (starrocks[0].flush, starrocks[0].flush_rows, starrocks[0].filtered_rows, starrocks[0].rows) == (0, 3, 1, 2)
    assert (starrocks[1].flush, starrocks[1].flush_rows, starrocks[1].extra) == (None, None, {})  # two flushes, one txn
    doris = BatchRecord.from_json(fixture("doris_prepared.json")).committables
    assert [(c.flush, c.flush_rows, c.filtered_rows) for c in doris] == [(0, 4, 1), (1, 1, 0), (0, 2, 0)]
    assert [set(c.extra) for c in doris] == [{"load_bytes"}] * 3
    clickhouse = BatchRecord.from_json(fixture("clickhouse_committed.json")).committables
    assert all(c.extra == {"staging": c.label} and c.flush == 0 and c.txn_id is None for c in clickhouse)
    replayed = BatchRecord.from_json(fixture("starrocks_committed_after_replay.json"))
    assert [c.label for c in replayed.live_committables()] == [replayed.committables[1].label]


@pytest.mark.parametrize("name", INTENTS)
def test_an_intent_of_before_v1_reads_with_the_same_meaning(name: str) -> None:
    raw = json.loads(fixture(name))
    assert TxnRef.from_json(fixture(name)) == TxnRef(**raw)


def test_an_epoch_record_of_before_v1_reads_with_the_same_meaning(tmp_path: Path) -> None:
    assert decode_owner(json.loads(fixture("redis_owner.json"))) == {**json.loads(fixture("redis_owner.json")), "seen": None}
    store = FileStateStore(tmp_path)
    (tmp_path / "file-job").mkdir()
    (tmp_path / "file-job" / "epoch.json").write_text(fixture("file_epoch.json"))
    assert store.current_epoch("file-job") == 1
    assert store.epoch_owner("file-job") == {**json.loads(fixture("file_epoch.json")), "seen": None}
    assert store.take_epoch("file-job", "next") == 2


class RecordingTarget:
    """Commits always succeed; records what was sent where."""

    commit_parallelism = 1
    commits_per_table = False  # commits part by part, as `Target.commit_table`'s default

    def __init__(self, kind: str, database: str) -> None:
        self.kind, self.database = kind, database
        self.calls: list[tuple[str, str]] = []

    def commit(self, committable: Committable) -> CommitOutcome:
        self.calls.append(("commit", committable.label))
        return CommitOutcome.COMMITTED

    def abort(self, ref: TxnRef) -> None:
        self.calls.append(("abort", ref.label))


def test_recover_rolls_forward_a_prepared_record_of_before_v1_from_a_file_store(tmp_path: Path) -> None:
    """The operator's upgrade path: a job crashed with a PREPARED batch, the new release commits it."""
    raw = json.loads(fixture("doris_prepared.json"))
    store = FileStateStore(tmp_path)
    path = tmp_path / "doris-job" / "batches" / raw["query_id"] / "0.record.json"
    path.parent.mkdir(parents=True)
    path.write_text(fixture("doris_prepared.json"))
    target = RecordingTarget("doris", "analytics")
    recovery = Committer(target, store, "doris-job", store.take_epoch("doris-job", "operator"))  # type: ignore[arg-type]
    recovery.finish_prepared(store.get_batch("doris-job", raw["query_id"], 0))
    assert target.calls == [("commit", c["label"]) for c in raw["committables"]]
    committed = store.get_batch("doris-job", raw["query_id"], 0)
    assert committed.state is BatchState.COMMITTED and committed.committables[0].filtered_rows == 1
    assert json.loads(path.read_text())["v"] == BASE_FORMAT  # rewritten in the oldest format that holds it


# -- format v1 -------------------------------------------------------------------------------------


def committable(**fields: Any) -> Committable:
    return Committable("doris", "analytics", "orders", "L0", 3, "e2w0t7", txn_id="41", rows=10, bytes=80,
                       checksum="12:ab", **fields)


def test_v1_writes_the_version_and_the_protocol_fields_as_attributes() -> None:
    c = committable(flush=2, flush_rows=12, filtered_rows=1, unselected_rows=1, extra={"load_bytes": 99})
    data = json.loads(c.to_json())
    assert data["v"] == 1 == BASE_FORMAT
    assert (data["flush"], data["flush_rows"], data["filtered_rows"], data["unselected_rows"]) == (2, 12, 1, 1)
    assert data["extra"] == {"load_bytes": 99}
    assert json.loads(TxnRef("sim", "db", "t", "L", 0, "a").to_json())["v"] == 1


def test_v1_round_trips_every_record_type(tmp_path: Path) -> None:
    typed = committable(flush=0, flush_rows=10, filtered_rows=2, extra={"load_bytes": 7})
    untyped = committable(extra={"staging": "L0"})
    assert Committable.from_json(typed.to_json()) == typed and Committable.from_json(untyped.to_json()) == untyped
    ref = typed.ref()
    assert TxnRef.from_json(ref.to_json()) == ref
    record = BatchRecord("q", 4, BatchState.PREPARED, 2, [typed, untyped], checksums={3: "12:ab"}, lost=["L9"],
                         timings={"write_s": 0.5}, events=["e"], records_in=12, sent=["L0"], open_attempt="e2w1")
    assert json.loads(record.to_json())["v"] == 1
    back = BatchRecord.from_json(record.to_json())
    assert back == record and back.to_json() == record.to_json()
    result = PartitionResult(3, "e2w0t7", "12:ab", 12, [typed, untyped])
    assert PartitionResult.from_json(result.to_json()) == result
    for store in (FileStateStore(tmp_path), MemoryStateStore()):
        epoch = store.take_epoch("job", "me")
        store.put_batch("job", epoch, record)
        store.add_intent("job", epoch, "q", 5, ref)
        assert store.get_batch("job", "q", 4) == record and store.intents("job", "q", 5) == [ref]
    stored = json.loads((tmp_path / "job" / "epoch.json").read_text())
    assert stored["v"] == 1 and decode_owner(stored) == FileStateStore(tmp_path).epoch_owner("job")
    assert set(FileStateStore(tmp_path).epoch_owner("job")) == {"epoch", "owner", "at", "seen"}


def test_v1_ignores_keys_it_does_not_know() -> None:
    """A newer release of the same major version may add a field an older one can drop."""
    data = json.loads(BatchRecord("q", 1, BatchState.COMMITTED, 1, [committable()]).to_json())
    data["compacted"] = True
    data["committables"][0]["server_version"] = "4.0"
    record = BatchRecord.from_json(json.dumps(data))
    assert record.committables == [committable()]
    ref = committable().ref()
    assert TxnRef.from_json(json.dumps({**json.loads(ref.to_json()), "host": "fe1"})) == ref


def test_a_record_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    data = json.loads(BatchRecord("q", 1, BatchState.PREPARED, 1, [committable()]).to_json())
    with pytest.raises(JournalFormatError, match=f"^batch record of {NEWER} before running recover/status"):
        BatchRecord.from_json(json.dumps({**data, "v": JOURNAL_FORMAT + 1}))
    with pytest.raises(JournalFormatError, match=f"^committable of {NEWER}"):
        BatchRecord.from_json(json.dumps({**data, "committables": [{**data["committables"][0], "v": JOURNAL_FORMAT + 1}]}))
    with pytest.raises(JournalFormatError, match=f"^intent record of {NEWER}"):
        TxnRef.from_json(json.dumps({**json.loads(committable().ref().to_json()), "v": JOURNAL_FORMAT + 1}))
    with pytest.raises(JournalFormatError, match=f"^epoch record of {NEWER}"):
        decode_owner({"v": JOURNAL_FORMAT + 1, "epoch": 3, "owner": "x", "at": 0.0})
    with pytest.raises(JournalFormatError, match="format version 0"):
        BatchRecord.from_json(json.dumps({**data, "v": 0}))
    assert not issubclass(RuntimeError, JournalFormatError) and JournalFormatError is not RuntimeError


def test_a_store_refuses_a_newer_record_instead_of_acting_on_it(tmp_path: Path) -> None:
    store = FileStateStore(tmp_path)
    epoch = store.take_epoch("job", "me")
    store.put_batch("job", epoch, BatchRecord("q", 1, BatchState.PREPARED, epoch, [committable()]))
    path = tmp_path / "job" / "batches" / "q" / "1.record.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "v": JOURNAL_FORMAT + 1}))
    with pytest.raises(JournalFormatError, match=NEWER):
        store.get_batch("job", "q", 1)
    epoch_file = tmp_path / "job" / "epoch.json"
    epoch_file.write_text(json.dumps({**json.loads(epoch_file.read_text()), "v": JOURNAL_FORMAT + 1}))
    with pytest.raises(JournalFormatError, match=f"epoch record of {NEWER}"):
        store.current_epoch("job")


# -- the writers fill the typed fields, the coordinator reads them ----------------------------------


class FilteringTarget(Target):
    """Reports what a StarRocks or Doris load does under max_filter_ratio: rows rejected, counted apart."""

    kind, database = "filtering", "db"

    def __init__(self, per_flush: bool) -> None:
        self.per_flush = per_flush
        self.calls: list[tuple[str, str]] = []

    def routable_tables(self) -> set[str] | None:
        return None

    def begin(self, table: str, new_ref: Any, record_intent: Any) -> TableTransaction:
        return _FilteringTransaction(self, new_ref, record_intent)

    def commit(self, committable: Committable) -> CommitOutcome:
        self.calls.append(("commit", committable.label))
        return CommitOutcome.COMMITTED

    def abort(self, ref: TxnRef) -> None:
        self.calls.append(("abort", ref.label))


class _FilteringTransaction(TableTransaction):
    """Rejects every row whose id is negative; one part per flush or one for all flushes."""

    def __init__(self, target: FilteringTarget, new_ref: Any, record_intent: Any) -> None:
        self._target, self._new_ref, self._record_intent = target, new_ref, record_intent
        self._parts: list[PreparedPart] = []

    def write(self, chunk: pa.Table) -> None:
        if self._parts and not self._target.per_flush:
            part = self._parts[0]
        else:
            ref = self._new_ref(len(self._parts))
            self._record_intent(ref)
            part = PreparedPart(ref, str(len(self._parts)), 0, 0, {"load_bytes": 0})
            self._parts.append(part)
        ids = chunk.column("id").to_pylist()
        rejected = sum(1 for i in ids if i < 0)
        part.rows += len(ids) - rejected
        part.extra["load_bytes"] += chunk.nbytes
        part.filtered_rows += rejected

    def prepare(self) -> list[PreparedPart]:
        return self._parts

    def abort(self) -> None:
        pass


def batches(*ids: list[int]) -> list[pa.RecordBatch]:
    return [pa.record_batch({"id": pa.array(i, pa.int64())}) for i in ids]


@pytest.mark.parametrize("per_flush", [True, False])
def test_the_writer_types_the_flush_and_the_rows_the_target_rejected(per_flush: bool) -> None:
    store = MemoryStateStore()
    context = WriteContext("job", "q", 0, store.take_epoch("job", "w"), 0, flush_bytes=1)
    writer = PartitionWriter(context, FilteringTarget(per_flush), Router(None, table="t"), store, 0)
    result = writer.add_all(batches([1, -2, 3], [4, 5]))
    committables = PartitionResult.from_json(result.to_json()).committables  # as a Spark task returns it
    assert all(set(c.extra) == {"load_bytes"} for c in committables)
    if per_flush:
        assert [(c.flush, c.flush_rows, c.rows, c.filtered_rows) for c in committables] == [(0, 3, 2, 1), (1, 2, 2, 0)]
    else:  # one transaction for two flushes: it cannot say which flush it holds
        assert [(c.flush, c.flush_rows, c.rows, c.filtered_rows) for c in committables] == [(None, None, 4, 1)]


class Runner:
    def run(self, data: Any, target: Any, router: Router, context: WriteContext, store: Any) -> list[PartitionResult]:
        return [PartitionWriter(context, target, router, store, p, p + 1).add_all(b) for p, b in enumerate(data)]


def test_the_coordinator_counts_rejected_rows_from_the_typed_fields() -> None:
    store, target = MemoryStateStore(), FilteringTarget(per_flush=True)
    sink = ExactlyOnceSink(target, store, "job", table="t", runner=Runner(), flush_bytes=1)
    report = sink.process([batches([1, -2]), batches([-3, 4, 5])], 0, "q")
    assert (report.action, report.records_in, report.rows) == ("written", 5, 3)
    record = store.get_batch("job", "q", 0)
    assert sum(c.filtered_rows for c in record.committables) == 2 and record.state is BatchState.COMMITTED
