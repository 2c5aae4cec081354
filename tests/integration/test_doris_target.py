"""DorisTarget against the Doris emulator (protocol.md part B): loads, 2PC outcomes, aborts, faults.

Fast and in-process: the emulator serves real HTTP on loopback, the target speaks to it through its
own client; no Spark. Rows are compared to what was written, value by value.
"""
from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import logging
import pickle
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink.committable import TxnRef
from streaming_sink.committer import Committer
from streaming_sink.errors import ReplayImpossibleError, StreamingSinkError
from streaming_sink.records import BatchState
from streaming_sink.routing import Router
from streaming_sink.state import BatchRecord, FileStateStore
from streaming_sink.targets import PASSWORD_ENV, USER_ENV, ConfigurationError, target_from_url
from streaming_sink.targets.base import CommitOutcome, TargetError
from streaming_sink.targets.doris import DorisTarget
from streaming_sink.targets.streamload import http as http_module
from streaming_sink.writer import PartitionWriter, WriteContext
from tests.support.doubles.emulators.client import send
from tests.support.doubles.emulators.doris import DorisEmulator

DB = "db"
COLUMNS = [("id", "BIGINT NOT NULL"), ("name", "VARCHAR(64)"), ("amount", "DOUBLE")]


@pytest.fixture
def emu(tmp_path: Any) -> Iterator[DorisEmulator]:
    with DorisEmulator(tmp_path / "doris") as emulator:
        emulator.create_table(DB, "orders", COLUMNS)
        emulator.create_table(DB, "payments", COLUMNS)
        yield emulator


def make_target(emu: DorisEmulator, **options: Any) -> DorisTarget:
    options.setdefault("backoff_s", 0.01)
    return DorisTarget(emu.fe_url, DB, "root", "", **options)


def rows(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids], "amount": [i / 4 for i in ids]})


def as_tuples(table: pa.Table) -> list[tuple]:
    return [tuple(r.values()) for r in table.to_pylist()]


class Writer:
    """What a PartitionWriter gives a transaction: deterministic labels, and intents it can inspect."""

    def __init__(self, emu: DorisEmulator, prefix: str = "L", fresh_labels: bool = True) -> None:
        self.emu, self.prefix, self.fresh_labels = emu, prefix, fresh_labels
        self.intents: list[TxnRef] = []

    def new_ref(self, table: str):
        return lambda chunk: TxnRef("doris", DB, table, f"{self.prefix}_{table}_c{chunk}", 0, "e1w0t0")

    def record_intent(self, ref: TxnRef) -> None:
        known = {t["label"] for t in self.emu.transactions()}
        assert not self.fresh_labels or ref.label not in known, "the intent must be durable before the server sees the label"
        self.intents.append(ref)

    def begin(self, target: DorisTarget, table: str = "orders"):
        return target.begin(table, self.new_ref(table), self.record_intent)


def states(emu: DorisEmulator) -> dict[str, str]:
    return {t["label"]: t["state"] for t in emu.transactions()}


def precommit(emu: DorisEmulator, label: str, data: bytes = b"1,a,0.5\n") -> int:
    answer = send("PUT", f"{emu.fe_url}/api/{DB}/orders/_stream_load", data=data, headers={
        "Expect": "100-continue", "label": label, "two_phase_commit": "true", "column_separator": ","}).json
    assert answer["Status"] == "Success", answer
    return answer["TxnId"]


# -- loads and commits -----------------------------------------------------------------------------


def test_every_flush_of_a_table_feeds_one_txn_begun_after_its_intent_and_precommitted_at_prepare(
        emu: DorisEmulator) -> None:
    """Issue 26: one server transaction per (table, writer), whatever the flushes: the first write records the
    intent and returns once the server has begun the load (it runs while later flushes stream into its body);
    prepare ends the body and pre-commits it."""
    target, writer = make_target(emu), Writer(emu)
    txn = writer.begin(target)
    txn.write(rows(0, 3))
    assert states(emu) == {"L_orders_c0": "PREPARE"}, "the first write returns once the server began the load"
    txn.write(rows(3, 2))
    txn.write(rows(5, 4))
    assert states(emu) == {"L_orders_c0": "PREPARE"}
    parts = txn.prepare()
    assert [p.ref.label for p in parts] == ["L_orders_c0"] == [r.label for r in writer.intents]
    assert [p.rows for p in parts] == [9]
    assert states(emu) == {"L_orders_c0": "PRECOMMITTED"}
    assert [int(p.txn_id) for p in parts] == [t["txn_id"] for t in emu.transactions()]
    assert emu.visible_rows(DB, "orders") == []  # invisible until the driver commits
    assert target.commit(parts[0].committable("sum")) is CommitOutcome.COMMITTED
    assert sorted(emu.visible_rows(DB, "orders")) == as_tuples(rows(0, 9))


def test_the_first_write_returns_only_once_the_server_began_the_load_however_slow_its_begin(
        emu: DorisEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer confirms its intent when the first write returns (the intent gate): that must be after the server
    began the transaction, which the BE says by asking for the body, not after the client's `continue_timeout`
    guess. A begin slower than that wait (0.2 s here; the FE's 307 comes well within it) must still hold the write
    back."""
    import threading

    began, entered = threading.Event(), threading.Event()
    real = emu._be_stream_load

    def slow_begin(req: Any, call: Any) -> Any:
        entered.set()
        began.wait(30)
        return real(req, call)

    monkeypatch.setattr(emu, "_be_stream_load", slow_begin)
    target = make_target(emu)
    target.http.continue_timeout = 0.2
    txn = Writer(emu).begin(target)
    written = threading.Event()
    writer = threading.Thread(target=lambda: (txn.write(rows(0, 3)), written.set()))
    writer.start()
    assert entered.wait(30)
    returned_before_the_begin = written.wait(2.0)  # a window for a wrong early return; the right code never returns
    began.set()
    writer.join(30)
    assert not returned_before_the_begin, "the first write returned before the server began its transaction"
    assert written.is_set() and states(emu) == {"L_orders_c0": "PREPARE"}
    assert [p.rows for p in txn.prepare()] == [3]


def test_a_writer_that_gives_up_mid_body_leaves_nothing_behind(emu: DorisEmulator) -> None:
    """The body is cut short (no final chunk), so the server never takes a part of it; the label is aborted."""
    target, writer = make_target(emu), Writer(emu)
    txn = writer.begin(target)
    txn.write(rows(0, 3))
    txn.abort()
    assert states(emu) == {"L_orders_c0": "ABORTED"}
    assert emu.visible_rows(DB, "orders") == []


def test_commit_makes_rows_visible_and_repeating_it_is_success(emu: DorisEmulator) -> None:
    target = make_target(emu)
    txn = Writer(emu).begin(target)
    txn.write(rows(0, 4))
    (part,) = txn.prepare()
    committable = part.committable("sum")
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert target.commit(committable) is CommitOutcome.COMMITTED  # "is already visible, not pre-committed."
    assert sorted(emu.visible_rows(DB, "orders")) == as_tuples(rows(0, 4))
    assert [t["commit_count"] for t in emu.transactions()] == [2]


def test_commit_with_publish_delay_is_committed_and_then_visible(emu: DorisEmulator) -> None:
    target = make_target(emu)
    txn = Writer(emu).begin(target)
    txn.write(rows(0, 2))
    committable = txn.prepare()[0].committable("sum")
    emu.faults.publish_timeout.arm(op="commit", visible_after=30)
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert target.fe.label_state(DB, committable.label)[0] == "COMMITTED"
    assert target.commit(committable) is CommitOutcome.COMMITTED  # "is already committed, not pre-committed."
    emu.clock.advance(30)
    assert sorted(emu.visible_rows(DB, "orders")) == as_tuples(rows(0, 2))


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_hostile_values_round_trip(emu: DorisEmulator, fmt: str) -> None:
    emu.create_table(DB, "wide", [("id", "BIGINT"), ("s", "STRING"), ("f", "DOUBLE"), ("b", "BOOLEAN"),
                                  ("d", "DATE"), ("ts", "DATETIME(6)")])  # DATETIME alone keeps whole seconds
    strings = ['plain', 'comma,inside', 'quote " inside', '"enclosed"', 'back\\slash', 'new\nline', 'tab\tx',
               '\\N', 'N', '', None, 'ünïcødé ✓', 'crlf\r\nend', '\\', '"', ',']
    n = len(strings)
    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "s": pa.array(strings, pa.string()),
        "f": pa.array([None if i == 3 else i * 1.25 - 3 for i in range(n)], pa.float64()),
        "b": pa.array([None if i == 4 else i % 2 == 0 for i in range(n)], pa.bool_()),
        "d": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(n)], pa.date32()),
        "ts": pa.array([dt.datetime(2024, 2, 29, 23, 59, 58, 123456) + dt.timedelta(seconds=i) for i in range(n)],
                       pa.timestamp("us")),
    })
    target = make_target(emu, format=fmt)
    txn = Writer(emu).begin(target, "wide")
    txn.write(table)
    (part,) = txn.prepare()
    assert part.rows == n
    assert target.commit(part.committable("sum")) is CommitOutcome.COMMITTED
    assert sorted(emu.visible_rows(DB, "wide")) == as_tuples(table)


def test_a_load_streams_in_pieces_and_counts_every_row(emu: DorisEmulator) -> None:
    target = make_target(emu, piece_bytes=512)  # many pieces in one chunked body
    txn = Writer(emu).begin(target)
    txn.write(rows(0, 500))
    (part,) = txn.prepare()
    assert part.rows == 500 and part.extra["load_bytes"] > 0
    target.commit(part.committable("sum"))
    assert sorted(emu.visible_rows(DB, "orders")) == as_tuples(rows(0, 500))


# -- commit outcomes ---------------------------------------------------------------------------------


def prepared(emu: DorisEmulator, target: DorisTarget, start: int = 0, prefix: str = "L"):
    txn = Writer(emu, prefix).begin(target)
    txn.write(rows(start, 3))
    return txn.prepare()[0].committable("sum")


def test_precommit_expiry_during_an_outage_is_aborted_while_its_label_is_remembered(emu: DorisEmulator, caplog) -> None:
    """C.8: past stream_load_default_precommit_timeout_second (3600 s) the FE aborts it: safe to load again."""
    target = make_target(emu)
    committable = prepared(emu, target)
    emu.clock.advance(3601)
    with caplog.at_level(logging.WARNING):
        assert target.commit(committable) is CommitOutcome.ABORTED  # "is already aborted"
    assert target.fe.label_state(DB, committable.label)[0] == "ABORTED"
    assert "timeout by txn manager" in caplog.text and "never visible" in caplog.text
    assert emu.visible_rows(DB, "orders") == []


def test_expire_prepared_knob_is_aborted(emu: DorisEmulator) -> None:
    target = make_target(emu)
    committable = prepared(emu, target)
    emu.faults.expire_prepared.arm(label=committable.label, op="commit")
    assert target.commit(committable) is CommitOutcome.ABORTED


def test_not_found_is_resolved_through_the_label_state(emu: DorisEmulator) -> None:
    target = make_target(emu)
    committable = prepared(emu, target)
    assert target.commit(committable) is CommitOutcome.COMMITTED
    from dataclasses import replace

    wrong_id = replace(committable, txn_id="987654")  # "transaction [987654] not found", label VISIBLE
    assert target.commit(wrong_id) is CommitOutcome.COMMITTED


# -- R1: a committed txn the server forgot ---------------------------------------------------------


def other_jobs_finish_loads(emu: DorisEmulator, count: int, first: int = 0) -> None:
    """Other writers of the shared database: plain (non-2PC) stream loads straight to the BE, each one
    finished (VISIBLE) transaction, over one kept-alive connection so that thousands stay quick."""
    connection = http.client.HTTPConnection("127.0.0.1", emu.be_port, timeout=10)
    auth = "Basic " + base64.b64encode(b"root:").decode()
    try:
        for n in range(first, first + count):
            connection.request("PUT", f"/api/{DB}/payments/_stream_load", body=f"{n},other,0.5\n".encode(),
                               headers={"label": f"other_job_{n}", "column_separator": ",", "Authorization": auth})
            answer = json.loads(connection.getresponse().read())
            assert answer["Status"] == "Success", answer
    finally:
        connection.close()


def test_a_committed_txn_forgotten_after_the_label_retention_is_lost(emu: DorisEmulator, caplog) -> None:
    """B.1/C.9: after streaming_label_keep_max_second (12 h) commit says "not found" and the label
    UNKNOWN: committed-and-forgotten cannot be told from never committed, so LOST (not COMMITTED)."""
    target = make_target(emu)
    committable = prepared(emu, target)
    assert target.commit(committable) is CommitOutcome.COMMITTED
    emu.clock.advance(43200)
    assert target.commit(committable) is CommitOutcome.COMMITTED  # still remembered
    emu.clock.advance(1)
    with caplog.at_level(logging.WARNING):
        assert target.commit(committable) is CommitOutcome.LOST
    assert target.fe.label_state(DB, committable.label)[0] == "UNKNOWN"
    assert "unknown to the server" in caplog.text and "coordinator decides" in caplog.text
    assert "treating it as lost" not in caplog.text
    assert len(emu.visible_rows(DB, "orders")) == 3  # the rows stay; only the label is forgotten


def test_a_committed_txn_evicted_by_2000_newer_finished_loads_is_lost(emu: DorisEmulator) -> None:
    """label_num_threshold (2000 by default, apache/doris DatabaseTransactionMgr.removeUselessTxns):
    a busy shared database forgets a committed label within minutes, long before 12 h."""
    target = make_target(emu)
    committable = prepared(emu, target)
    assert target.commit(committable) is CommitOutcome.COMMITTED
    other_jobs_finish_loads(emu, 1999)
    assert target.fe.label_state(DB, committable.label)[0] == "VISIBLE"  # 2000 finished: at the threshold
    other_jobs_finish_loads(emu, 1, first=1999)
    assert target.fe.label_state(DB, committable.label)[0] == "UNKNOWN"
    assert target.commit(committable) is CommitOutcome.LOST
    assert len(emu.visible_rows(DB, "orders")) == 3


def test_a_commit_whose_answer_was_lost_and_whose_txn_was_evicted_before_the_retry_is_lost_after_send(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit landed, its answer was lost, and other loaders finished enough loads while the target
    waited to retry that the FE forgot the txn: "not found" then says nothing about whether it committed,
    so the outcome is LOST_AFTER_SEND (never replayed), not LOST (replayed: a duplicate)."""
    with DorisEmulator(tmp_path / "d", label_num_threshold=2) as emu:
        emu.create_table(DB, "orders", COLUMNS)
        emu.create_table(DB, "payments", COLUMNS)
        target = make_target(emu)
        committable = prepared(emu, target)
        pauses: list[object] = []

        def others_finish_meanwhile(*why: object) -> None:  # whichever pause comes before the repeat
            pauses.append(why)
            other_jobs_finish_loads(emu, 2, first=len(pauses) * 10)

        monkeypatch.setattr("streaming_sink.retry.sleep", others_finish_meanwhile)
        emu.faults.drop_connection_after_commit.arm(op="commit")
        assert target.commit(committable) is CommitOutcome.LOST_AFTER_SEND
        assert emu.faults.drop_connection_after_commit.fired == 1 and len(pauses) == 1
        assert len(emu.visible_rows(DB, "orders")) == 3  # it did land


def test_not_found_with_a_newer_aborted_txn_under_the_label_is_lost_not_aborted(emu: DorisEmulator) -> None:
    """Once a committed txn is forgotten its label can be used again: the empty-load probe that aborts
    labels on servers before 2.1 does exactly that. The label then says ABORTED about another txn,
    so the committed one stays ambiguous."""
    target = make_target(emu, abort_by_label=False)
    committable = prepared(emu, target)
    assert target.commit(committable) is CommitOutcome.COMMITTED
    emu.clock.advance(43201)
    target.abort(committable.ref())  # the probe begins a txn under the label, then aborts it
    assert target.fe.label_state(DB, committable.label)[0] == "ABORTED"
    assert target.commit(committable) is CommitOutcome.LOST


def test_write_lock_timeout_is_retried_then_committed(emu: DorisEmulator) -> None:
    target = make_target(emu)
    committable = prepared(emu, target)
    emu.faults.write_lock_timeout.arm(times=2, label=committable.label)
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert emu.faults.write_lock_timeout.fired == 2


def test_write_lock_timeout_beyond_the_retries_fails_loudly(emu: DorisEmulator) -> None:
    target = make_target(emu, retries=1)
    committable = prepared(emu, target)
    emu.faults.write_lock_timeout.arm(times=5, label=committable.label)
    with pytest.raises(TargetError, match="write lock timeout"):
        target.commit(committable)
    assert states(emu)[committable.label] == "PRECOMMITTED"  # nothing decided: the driver will retry


def test_connection_dropped_after_the_commit_applied(emu: DorisEmulator) -> None:
    target = make_target(emu)
    committable = prepared(emu, target)
    emu.faults.drop_connection_after_commit.arm(label=committable.label)
    assert target.commit(committable) is CommitOutcome.COMMITTED  # retried: "already visible"
    assert [t["commit_count"] for t in emu.transactions()] == [2]
    assert sorted(emu.visible_rows(DB, "orders")) == as_tuples(rows(0, 3))


def test_5xx_and_drops_are_retried_on_load_and_commit(emu: DorisEmulator) -> None:
    target = make_target(emu)
    emu.faults.http_5xx.arm(times=2, op="stream_load", role="be")
    emu.faults.drop_connection_before.arm(op="stream_load", role="fe")
    committable = prepared(emu, target)
    emu.faults.http_5xx.arm(op="commit", role="fe")
    emu.faults.drop_connection_before.arm(op="commit", role="be")
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert states(emu) == {committable.label: "VISIBLE"}
    assert sorted(emu.visible_rows(DB, "orders")) == as_tuples(rows(0, 3))


def test_5xx_beyond_the_retries_fails_loudly(emu: DorisEmulator) -> None:
    target = make_target(emu, retries=1)
    committable = prepared(emu, target)
    emu.faults.http_5xx.arm(times=5, op="commit")
    with pytest.raises(TargetError, match="HTTP 503"):
        target.commit(committable)


def test_a_load_whose_answer_is_lost_after_its_body_fails_the_writer_and_is_released(emu: DorisEmulator) -> None:
    """The body streams as the writer flushes and is not kept, so a load whose answer never came cannot be sent
    again: the writer fails (Spark retries its task under a new label) and its abort releases what the server took."""
    target = make_target(emu, request_timeout_s=0.5)
    emu.faults.slow_response.arm(op="stream_load", role="be", seconds=30)  # applied, answer late
    txn = Writer(emu).begin(target)
    txn.write(rows(0, 3))
    with pytest.raises(TargetError, match="got no usable answer"):
        txn.prepare()
    txn.abort()
    emu.faults.release()
    assert [(t["label"], t["state"]) for t in emu.transactions()] == [("L_orders_c0", "ABORTED")]
    assert emu.visible_rows(DB, "orders") == []


def test_a_committed_label_is_never_loaded_again(emu: DorisEmulator) -> None:
    target = make_target(emu)
    send("PUT", f"{emu.fe_url}/api/{DB}/_stream_load_2pc",
         headers={"txn_operation": "commit", "txn_id": str(precommit(emu, "L_orders_c0"))})
    txn = Writer(emu, fresh_labels=False).begin(target)  # as if the label had been used before
    with pytest.raises(TargetError, match="already committed .*FINISHED"):
        txn.write(rows(0, 3))
    assert emu.visible_rows(DB, "orders") == [(1, "a", 0.5)]


def test_a_label_held_by_a_load_still_running_is_taken_over(emu: DorisEmulator) -> None:
    """A stale request of the same label is still streaming (RUNNING): abort it, then load under the label."""
    import threading
    import time

    go = threading.Event()

    def stale_body() -> Iterator[bytes]:
        yield b"99,stale,0\n"
        go.wait(10)

    stale: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: stale.update(answer=send(
        "PUT", f"{emu.be_url}/api/{DB}/orders/_stream_load", data=stale_body(),
        headers={"label": "L_orders_c0", "two_phase_commit": "true", "column_separator": ","}).json))
    thread.start()
    deadline = time.monotonic() + 10
    while not emu.transactions():  # progress marker: the stale load has begun its txn
        assert time.monotonic() < deadline
        time.sleep(0.005)
    target = make_target(emu)
    txn = Writer(emu, fresh_labels=False).begin(target)
    txn.write(rows(0, 3))
    go.set()
    thread.join(10)
    assert stale["answer"]["Status"] == "Fail"  # its txn was aborted under it
    (part,) = txn.prepare()
    assert [(t["label"], t["state"]) for t in emu.transactions()] == [("L_orders_c0", "ABORTED"),
                                                                      ("L_orders_c0", "PRECOMMITTED")]
    target.commit(part.committable("sum"))
    assert sorted(emu.visible_rows(DB, "orders")) == as_tuples(rows(0, 3))


def test_a_running_txn_limit_is_retried_then_reported(tmp_path: Any) -> None:
    with DorisEmulator(tmp_path / "d", max_running_txn_num_per_db=1) as emu:
        emu.create_table(DB, "orders", COLUMNS)
        target = make_target(emu, retries=2)
        prepared(emu, target, prefix="first")
        with pytest.raises(TargetError, match="larger than limit 1"):
            prepared(emu, target, prefix="second")


def test_restart_keeps_precommitted_txns_committable(emu: DorisEmulator) -> None:
    target = make_target(emu)
    committable = prepared(emu, target)
    emu.restart()
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert sorted(emu.visible_rows(DB, "orders")) == as_tuples(rows(0, 3))


# -- aborts --------------------------------------------------------------------------------------------


def test_transaction_abort_ends_every_chunk(emu: DorisEmulator) -> None:
    target = make_target(emu)
    txn = Writer(emu).begin(target)
    txn.write(rows(0, 2))
    txn.write(rows(2, 2))
    txn.abort()
    txn.abort()  # repeating is harmless
    assert set(states(emu).values()) == {"ABORTED"}


def test_abort_by_label(emu: DorisEmulator) -> None:
    target = make_target(emu)
    committable = prepared(emu, target)
    target.abort(committable.ref())
    assert states(emu) == {committable.label: "ABORTED"}
    assert target.commit(committable) is CommitOutcome.ABORTED  # "is already aborted"
    target.abort(committable.ref())  # already aborted
    target.abort(TxnRef("doris", DB, "orders", "never_used", 0, "a"))  # no such label
    assert states(emu) == {committable.label: "ABORTED"}


def test_aborting_a_committed_label_is_refused_loudly(emu: DorisEmulator) -> None:
    target = make_target(emu)
    committable = prepared(emu, target)
    target.commit(committable)
    with pytest.raises(TargetError, match="already committed"):
        target.abort(committable.ref())


@pytest.mark.parametrize("how", ["old-server", "option"])
def test_abort_without_label_2pc_uses_the_empty_load_probe(tmp_path: Any, how: str) -> None:
    version, options = ("2.0.15", {}) if how == "old-server" else ("2.1.8", {"abort_by_label": False})
    with DorisEmulator(tmp_path / "d", version=version) as emu:
        emu.create_table(DB, "orders", COLUMNS)
        target = make_target(emu, **options)
        committable = prepared(emu, target)
        target.abort(committable.ref())  # the probe finds the holder's txn id and aborts it
        assert states(emu) == {committable.label: "ABORTED"}
        never = TxnRef("doris", DB, "orders", "never_used", 0, "a")
        target.abort(never)  # the probe itself becomes a txn, which is aborted at once
        assert {t["state"] for t in emu.transactions()} == {"ABORTED"}
        committed = prepared(emu, target, start=10, prefix="M")
        target.commit(committed)
        with pytest.raises(TargetError, match="already committed"):
            target.abort(committed.ref())


# -- data quality ----------------------------------------------------------------------------------


def bad_numbers(emu: DorisEmulator) -> pa.Table:
    emu.create_table(DB, "typed", [("id", "BIGINT"), ("n", "INT")])
    return pa.table({"id": pa.array(range(4), pa.int64()), "n": ["1", "x", "3", "4"]})


def test_arrow_loads_land_each_value_in_the_table_columns_own_type(emu: DorisEmulator) -> None:
    """Doris copies Arrow buffers as they come (docs/protocol.md, Doris: Arrow and Parquet loads): an
    int64 sent to an INT column, or a decimal of another scale, would land wrong; the target sends each
    column in its table column's type, read from `_schema`."""
    emu.create_table(DB, "typed", [("id", "BIGINT"), ("small", "INT"), ("price", "DECIMAL(10,2)"), ("name", "VARCHAR(20)"),
                                   ("day", "DATE"), ("at", "DATETIME(6)")])
    table = pa.table({
        "id": pa.array([1, 2], pa.int64()), "small": pa.array([-7, 2_000_000_000], pa.int64()),
        "price": pa.array([Decimal("1.5"), Decimal("-99999999.99")], pa.decimal128(20, 4)),
        "name": pa.array(["é𝄞", None], pa.large_string()),
        "day": pa.array([dt.date(2024, 2, 29), dt.date(9999, 12, 31)]),
        "at": pa.array([dt.datetime(2024, 3, 31, 1, 30, 0, 123456), dt.datetime(2038, 1, 19, 3, 14, 8)], pa.timestamp("us", "UTC")),
    })
    target = make_target(emu, format="arrow")
    txn = Writer(emu).begin(target, "typed")
    txn.write(table)
    (part,) = txn.prepare()
    assert target.commit(part.committable("sum")) is CommitOutcome.COMMITTED
    assert sorted(emu.visible_rows(DB, "typed")) == [
        (1, -7, Decimal("1.50"), "é𝄞", dt.date(2024, 2, 29), dt.datetime(2024, 3, 31, 1, 30, 0, 123456)),
        (2, 2_000_000_000, Decimal("-99999999.99"), None, dt.date(9999, 12, 31), dt.datetime(2038, 1, 19, 3, 14, 8)),
    ]


def test_arrow_column_types_are_read_once_in_the_driver_and_travel_to_the_tasks(emu: DorisEmulator) -> None:
    emu.create_table(DB, "typed", [("id", "BIGINT"), ("small", "INT")])
    target = make_target(emu, format="arrow")
    target.check_schema("typed", pa.schema([("id", pa.int64()), ("small", pa.int64())]))  # the job, at start
    in_task = pickle.loads(pickle.dumps(target))
    asked: list[str] = []
    real = in_task.http.request
    in_task.http.request = lambda method, path, *a, **k: (asked.append(path), real(method, path, *a, **k))[1]
    txn = Writer(emu).begin(in_task, "typed")
    txn.write(pa.table({"id": pa.array([1], pa.int64()), "small": pa.array([5], pa.int64())}))
    txn.abort()
    assert asked and not [path for path in asked if path.endswith("/_schema")]


def test_a_value_that_does_not_fit_the_arrow_column_type_is_refused_not_wrapped(emu: DorisEmulator) -> None:
    emu.create_table(DB, "typed", [("id", "BIGINT"), ("small", "INT")])
    txn = Writer(emu).begin(make_target(emu, format="arrow"), "typed")
    with pytest.raises(Exception, match="small"):
        txn.write(pa.table({"id": pa.array([1], pa.int64()), "small": pa.array([1 << 40], pa.int64())}))
    assert emu.visible_rows(DB, "typed") == []


def test_column_names_beyond_ascii_travel_in_json_bodies_and_are_refused_up_front_for_csv(emu: DorisEmulator) -> None:
    """Review B6: the `columns` header is latin-1; a JSON body carries the names itself."""
    emu.create_table(DB, "named", [("id", "BIGINT"), ("名前", "VARCHAR(20)")])
    schema = pa.schema([("id", pa.int64()), ("名前", pa.string())])
    with pytest.raises(ConfigurationError, match="not printable ASCII.*JSON"):
        make_target(emu).check_schema("named", schema)
    target = make_target(emu, format="json")
    target.check_schema("named", schema)
    txn = Writer(emu).begin(target, "named")
    txn.write(pa.table({"id": [1], "名前": ["山田"]}, schema=schema))
    (part,) = txn.prepare()
    assert target.commit(part.committable("sum")) is CommitOutcome.COMMITTED
    assert emu.visible_rows(DB, "named") == [(1, "山田")]


def test_filtered_rows_beyond_the_ratio_fail_clearly(emu: DorisEmulator) -> None:
    """Strict mode is the default (review B1): "x" for an INT filters its row instead of loading as NULL."""
    table = bad_numbers(emu)
    txn = Writer(emu).begin(make_target(emu), "typed")
    txn.write(table)
    with pytest.raises(TargetError) as failure:
        txn.prepare()  # the server answers when the body ends
    text = str(failure.value)
    assert "too many filtered rows" in text and "1 of 4 rows were filtered" in text
    assert "max_filter_ratio=0" in text and "'x'" in text  # the rejected row, from the ErrorURL
    txn.abort()
    assert set(states(emu).values()) == {"ABORTED"}


def test_max_filter_ratio_and_strict_mode_are_passed_through(emu: DorisEmulator) -> None:
    table = bad_numbers(emu)
    tolerant = make_target(emu, strict_mode=True, max_filter_ratio=0.5)
    txn = Writer(emu, "tolerant").begin(tolerant, "typed")
    txn.write(table)
    (part,) = txn.prepare()
    assert (part.rows, part.filtered_rows) == (3, 1)
    lenient = make_target(emu, strict_mode=False)  # a value that does not convert becomes NULL
    txn = Writer(emu, "lenient").begin(lenient, "typed")
    txn.write(table)
    (part,) = txn.prepare()
    lenient.commit(part.committable("sum"))
    assert sorted(emu.visible_rows(DB, "typed")) == [(0, 1), (1, None), (2, 3), (3, 4)]


def test_a_server_that_ignores_two_phase_commit_is_refused(emu: DorisEmulator, monkeypatch) -> None:
    target = make_target(emu)
    real_load = target.api.stream_load

    def without_2pc(ref, headers, body, what, **options):  # as Doris 1.0/1.1 with 2PC disabled would answer
        return real_load(ref, {k: v for k, v in headers.items() if k != "two_phase_commit"}, body, what, **options)

    monkeypatch.setattr(target.api, "stream_load", without_2pc)
    with pytest.raises(TargetError, match="WITHOUT two-phase commit"):
        txn = Writer(emu).begin(target)
        txn.write(rows(0, 1))
        txn.prepare()


# -- start-up and configuration ---------------------------------------------------------------------


def test_expiry_limits_include_the_label_count_threshold() -> None:
    limits = {limit.what: limit for limit in DorisTarget().expiry_limits()}
    precommitted = limits["pre-committed transactions (FE default)"]
    assert (precommitted.seconds, precommitted.count) == (3600.0, None)
    label = limits["label history (FE default)"]
    assert (label.seconds, label.count) == (43200.0, 2000)  # 12 h or 2000 newer finished txns, whichever first
    assert "label_num_threshold" in label.note and "streaming_label_keep_max_second" in label.note


def test_open_transactions_cannot_be_listed_over_http(emu: DorisEmulator) -> None:
    """Only SHOW PROC (ADMIN privilege) or the MySQL protocol list them: the sweep must rely on intents."""
    target = make_target(emu)
    prepared(emu, target)  # one open, pre-committed transaction
    assert target.leftover_transactions("L") is None


def test_routable_tables_checks_the_server(emu: DorisEmulator) -> None:
    assert make_target(emu).routable_tables() is None
    assert make_target(emu, tables=["orders"]).routable_tables() == {"orders"}
    with pytest.raises(ConfigurationError, match="refused the credentials"):
        DorisTarget(emu.fe_url, DB, "root", "wrong").routable_tables()
    with pytest.raises(ConfigurationError, match="database 'nope'"):
        DorisTarget(emu.fe_url, "nope").routable_tables()


def test_routable_tables_fails_when_nothing_listens(emu: DorisEmulator) -> None:
    url = emu.fe_url
    emu.stop()
    with pytest.raises(TargetError, match="could not connect.*Is the FE up"):
        DorisTarget(url, DB, retries=0).routable_tables()


def test_options_are_checked_and_the_target_travels_to_tasks(emu: DorisEmulator, monkeypatch) -> None:
    with pytest.raises(ConfigurationError, match="unknown option"):
        DorisTarget(emu.fe_url, DB, formt="json")
    with pytest.raises(ConfigurationError, match="set by the target itself"):
        DorisTarget(emu.fe_url, DB, headers={"two_phase_commit": "false"})
    with pytest.raises(ConfigurationError, match="format"):
        DorisTarget(emu.fe_url, DB, format="parquet")
    target = pickle.loads(pickle.dumps(make_target(emu, format="json", tables=["orders"])))
    assert target.runs_writers_in_driver is False and target.options.tables == ("orders",)
    committable = prepared(emu, target)
    assert target.commit(committable) is CommitOutcome.COMMITTED
    monkeypatch.delenv(USER_ENV, raising=False)
    with pytest.raises(ConfigurationError, match="doris needs a user: set STREAMING_SINK_TARGET_USER"):
        target_from_url(f"doris://127.0.0.1:{emu.fe_port}", DB)  # never a silent root
    monkeypatch.setenv(USER_ENV, emu.user)
    monkeypatch.setenv(PASSWORD_ENV, emu.password)
    from_url = target_from_url(f"doris://127.0.0.1:{emu.fe_port}", DB, {"retries": 1})
    assert isinstance(from_url, DorisTarget) and from_url.fe_url == emu.fe_url and from_url.routable_tables() is None


# -- with the coordinator's recovery ----------------------------------------------------------------


JOB, QUERY = "job", "query-1"


def routed(partition: int, start: int, n: int) -> pa.RecordBatch:
    ids = list(range(start, start + n))
    return pa.RecordBatch.from_pydict({
        "id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids], "amount": [i / 2 for i in ids],
        "__table": ["orders" if i % 3 else "payments" for i in ids],
    })


def write_batch(target: DorisTarget, store: FileStateStore, epoch: int, batch_id: int) -> BatchRecord:
    context = WriteContext(JOB, QUERY, batch_id, epoch, 0, flush_bytes=256)  # several chunks per table
    router = Router(None, table_column="__table")
    results = [
        PartitionWriter(context, target, router, store, p).add_all([routed(p, p * 1000 + k * 20, 20) for k in range(3)])
        for p in range(2)
    ]
    committables = [c for r in results for c in r.committables]
    return BatchRecord(QUERY, batch_id, BatchState.PREPARED, epoch, committables, {r.partition: r.checksum for r in results})


def expected(table: str) -> list[tuple]:
    out = [(r["id"], r["name"], r["amount"]) for p in range(2) for k in range(3)
           for r in routed(p, p * 1000 + k * 20, 20).to_pylist() if r["__table"] == table]
    return sorted(out)


def test_recovery_commits_a_prepared_batch_exactly_once(emu: DorisEmulator, tmp_path: Any) -> None:
    target, store = make_target(emu), FileStateStore(tmp_path / "state")
    epoch = store.take_epoch(JOB, "test")
    record = write_batch(target, store, epoch, 1)
    assert len(record.committables) == 4  # one txn per (table, writer), though each flushed several times
    store.put_batch(JOB, epoch, record)
    first = Committer(target, store, JOB, epoch)
    assert first.commit_pending(first.log_of(record)) == []
    for committable in record.committables:  # a driver that died before recording progress repeats them
        assert target.commit(committable) is CommitOutcome.COMMITTED
    first.finish_prepared(record)
    assert sorted(emu.visible_rows(DB, "orders")) == expected("orders")
    assert sorted(emu.visible_rows(DB, "payments")) == expected("payments")
    assert {t["state"] for t in emu.transactions()} == {"VISIBLE"}


def test_intents_without_a_record_are_aborted(emu: DorisEmulator, tmp_path: Any) -> None:
    target, store = make_target(emu), FileStateStore(tmp_path / "state")
    epoch = store.take_epoch(JOB, "test")
    write_batch(target, store, epoch, 1)
    Committer(target, store, JOB, epoch).abort_intents(QUERY, 1)
    assert {t["state"] for t in emu.transactions()} == {"ABORTED"}
    assert store.intents(JOB, QUERY, 1) == []


def test_expired_batch_outside_its_rerun_fails_loudly(emu: DorisEmulator, tmp_path: Any) -> None:
    target, store = make_target(emu), FileStateStore(tmp_path / "state")
    epoch = store.take_epoch(JOB, "test")
    record = write_batch(target, store, epoch, 1)
    store.put_batch(JOB, epoch, record)
    emu.clock.advance(3601)
    with pytest.raises(ReplayImpossibleError, match="runbook"):
        Committer(target, store, JOB, epoch).finish_prepared(record)
    assert emu.visible_rows(DB, "orders") == []


def test_speculative_duplicates_are_aborted_by_the_coordinator(emu: DorisEmulator, tmp_path: Any, monkeypatch) -> None:
    """Two successful attempts of every partition both pre-commit (a speculative copy: Spark does not launch
    those on one host, so the attempts are run here); the coordinator commits one, aborts the other's txns."""
    from types import SimpleNamespace

    from streaming_sink.execution import _one_per_partition
    from streaming_sink.sink import ExactlyOnceSink

    def both_attempts(df, target, router, context, store):
        results = [
            PartitionWriter(context, target, router, store, p, attempt).add_all(
                [routed(p, p * 1000 + k * 20, 20) for k in range(3)])
            for attempt in (1, 0)  # the copy finishes first, so Spark would report it
            for p in range(2)
        ]
        return _one_per_partition(results)

    store = FileStateStore(tmp_path / "state")
    sink = ExactlyOnceSink(make_target(emu), store, JOB, table_column="__table", flush_bytes=256,
                           runner=SimpleNamespace(run=both_attempts))
    assert sink.process(None, 0, QUERY).action == "written"
    assert sorted(emu.visible_rows(DB, "orders")) == expected("orders")
    assert sorted(emu.visible_rows(DB, "payments")) == expected("payments")
    by_attempt = {(t["label"].split("_")[-3], t["state"]) for t in emu.transactions()}
    assert by_attempt == {("e1w0t1", "VISIBLE"), ("e1w0t0", "ABORTED")}, by_attempt
    assert store.intents(JOB, QUERY, 0) == []
    assert sink.process(None, 0, QUERY).action == "already-committed"  # a re-run changes nothing


@pytest.mark.parametrize("table", ["../../api/finance/payments", "orders?label=x#", "a/b"])
def test_a_hostile_routed_table_name_stays_one_path_segment(emu: DorisEmulator, table: str) -> None:
    """Review S2: a name routed from the data must not reach another database or endpoint."""
    target = make_target(emu)
    sent: list[str] = []
    real = target.http.request
    target.http.request = lambda method, path, *a, **k: (sent.append(path), real(method, path, *a, **k))[1]
    txn = Writer(emu).begin(target, table)
    with pytest.raises(StreamingSinkError):  # refused by the server, as the sink's own error
        txn.write(rows(0, 1))
        txn.prepare()
    assert sent and all(p.startswith(f"/api/{DB}/") and p.count("/") == 4 and "?" not in p and "#" not in p for p in sent), sent


def _texts(error: BaseException) -> list[str]:
    """An error's text and that of every error it was raised from or during."""
    texts: list[str] = []
    current: BaseException | None = error
    while current is not None and len(texts) < 20:
        texts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return texts


def test_the_password_in_the_fe_redirect_appears_in_no_error_and_no_log(tmp_path: Any, caplog: Any) -> None:
    """Conformance 2026-11-27 D9: a Doris FE's 307 carries `user:password@` in its Location's userinfo. When the BE
    hop fails (a dropped connection on a load, a 5xx on a commit) the errors and the logged repeats name the BE's URL:
    never with the password in it; the credentials travel in `Authorization` only."""
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    with DorisEmulator(tmp_path / "doris", user="root", password="secret") as emu:
        emu.create_table(DB, "orders", COLUMNS)
        redirect = send("PUT", f"{emu.fe_url}/api/{DB}/orders/_stream_load", auth=("root", "secret"), data=b"",
                        headers={"Expect": "100-continue"}, follow=False).response
        assert redirect.status_code == 307
        assert f"//root:secret@127.0.0.1:{emu.be_port}/" in redirect.headers["Location"]
        target = DorisTarget(emu.fe_url, DB, "root", "secret", backoff_s=0.01, retries=1)

        emu.faults.drop_connection_before.arm(times=10, op="stream_load", role="be")
        load = Writer(emu).begin(target)
        with pytest.raises(TargetError) as dropped:
            load.write(rows(0, 3))
        texts += _texts(dropped.value)
        load.abort()
        emu.faults.drop_connection_before.disarm()

        committable = prepared(emu, target, prefix="C")
        emu.faults.http_5xx.arm(times=10, op="commit", role="be")
        with pytest.raises(TargetError) as refused:
            target.commit(committable)
        texts += _texts(refused.value)
        emu.faults.http_5xx.disarm()
        assert target.commit(committable) is CommitOutcome.COMMITTED  # Authorization alone carries the credentials
        assert sorted(emu.visible_rows(DB, "orders")) == as_tuples(rows(0, 3))
    texts += [record.getMessage() + (logging.Formatter().formatException(record.exc_info) if record.exc_info else "")
              for record in caplog.records]
    assert any(f"127.0.0.1:{emu.be_port}" in text for text in texts), texts  # the BE hop is what the texts name
    assert [text for text in texts if "secret" in text] == []


@pytest.mark.parametrize("memory_bytes", [http_module.SPOOL_MEMORY_BYTES, 100])
def test_a_load_through_a_proxy_that_takes_the_body_before_the_fe_redirects_lands_exactly(
        tmp_path: Any, memory_bytes: int, monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    """Issue 38 item 5: a front (nginx, a cloud load balancer) answers `100 Continue` itself and buffers the whole
    body before the FE's 307 reaches the client. The streamed body went to the front, so the BE hop needs it again:
    the client kept what it sent (in memory, or on disk past `memory_bytes`) and sends that to the BE, once."""
    monkeypatch.setattr(http_module, "SPOOL_MEMORY_BYTES", memory_bytes)
    spools: list[Any] = []
    spooled_file = http_module.tempfile.SpooledTemporaryFile
    monkeypatch.setattr(http_module.tempfile, "SpooledTemporaryFile", lambda **kw: spools.append(kw) or spooled_file(**kw))
    caplog.set_level(logging.WARNING)
    with DorisEmulator(tmp_path / "direct") as direct:  # behind no proxy nothing is kept
        direct.create_table(DB, "orders", COLUMNS)
        target = DorisTarget(direct.fe_url, DB, "root", "", backoff_s=0.01)
        assert target.commit(prepared(direct, target)) is CommitOutcome.COMMITTED
        assert sorted(direct.visible_rows(DB, "orders")) == as_tuples(rows(0, 3)) and spools == []
    with DorisEmulator(tmp_path / "doris").serve_behind_proxy() as emu:
        emu.create_table(DB, "orders", COLUMNS)
        target = DorisTarget(emu.proxy_url, DB, "root", "", backoff_s=0.01)
        txn = Writer(emu).begin(target)
        for start in range(0, 40, 8):
            txn.write(rows(start, 8))  # five flushes into one streamed body
        committable = txn.prepare()[0].committable("sum")
        assert target.commit(committable) is CommitOutcome.COMMITTED
        assert sorted(emu.visible_rows(DB, "orders")) == as_tuples(rows(0, 40))
        assert emu.body_bytes["proxy"] == emu.body_bytes["be"] > 0 and emu.body_bytes["fe"] == 0
        assert [t["state"] for t in emu.transactions()] == ["VISIBLE"]
        second = Writer(emu, "M").begin(target)
        second.write(rows(40, 2))
        assert target.commit(second.prepare()[0].committable("sum")) is CommitOutcome.COMMITTED
        assert sorted(emu.visible_rows(DB, "orders")) == as_tuples(rows(0, 42))
    assert len(spools) == 2  # one copy per load
    assert sum("a proxy in front of the FE" in r.getMessage() for r in caplog.records) == 1  # said once per client
