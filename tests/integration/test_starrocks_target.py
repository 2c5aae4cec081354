"""StarRocksTarget against the StarRocks emulator (in this process, real HTTP over loopback).

The emulator is pinned to protocol.md by its own tests, so these check the target against the
protocol: every operation, every fault knob, every answer that must be resolved through the
label state, and the messages a user sees.
"""
from __future__ import annotations

import logging
import pickle
import socket
from typing import Any

import pyarrow as pa
import pytest

from streaming_sink.committable import Committable, TxnRef
from streaming_sink.targets import ConfigurationError, target_from_url
from streaming_sink.targets.base import CommitOutcome, TargetError
from streaming_sink.targets.starrocks import StarRocksTarget
from tests.support.doubles.emulators.starrocks import StarRocksEmulator
from tests.support.targets.starrocks import starrocks_target

DB, TABLE, PASSWORD = "db", "t", "pw"


make_target = starrocks_target  # `sr` (db.t, password "pw") comes from tests/support/fixtures.py


class Writer:
    """What PartitionWriter does with a target: labels, intents, one transaction per table."""

    def __init__(self, target: StarRocksTarget, table: str = TABLE, label: str = "L1") -> None:
        self.intents: list[TxnRef] = []
        self.label, self.table = label, table
        self.txn = target.begin(table, self.new_ref, self.intents.append)

    def new_ref(self, chunk: int) -> TxnRef:
        return TxnRef("starrocks", DB, self.table, self.label, 0, "e1w0t0")

    def write(self, *rows: tuple[Any, str | None]) -> Writer:
        self.txn.write(pa.table({"id": [r[0] for r in rows], "name": [r[1] for r in rows]}))
        return self

    def prepare(self) -> Committable:
        (part,) = self.txn.prepare()
        return part.committable("checksum")


def state(sr: StarRocksEmulator, label: str) -> str:
    return [t for t in sr.transactions(DB) if t["label"] == label][-1]["state"]


ROWS = [(1, "a,b"), (2, 'say "hi"\\'), (3, None), (4, "two\nlines")]


# -- the happy path ------------------------------------------------------------------------------


def test_begin_load_prepare_commit_makes_exactly_the_rows_visible(sr) -> None:
    target = make_target(sr)
    writer = Writer(target).write(*ROWS[:2]).write(*ROWS[2:])
    assert [r.label for r in writer.intents] == ["L1"]  # recorded once, before the begin
    committable = writer.prepare()
    assert (committable.rows, committable.txn_id) == (4, str(sr.transactions(DB)[0]["txn_id"]))
    assert state(sr, "L1") == "PREPARED" and sr.visible_rows(DB, TABLE) == []
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert target.commit(committable) is CommitOutcome.COMMITTED  # "already committed" is success
    assert sorted(sr.visible_rows(DB, TABLE)) == ROWS


def test_several_fes_one_down_the_transaction_goes_through_the_other(sr) -> None:
    import socket

    down = socket.socket()
    down.bind(("127.0.0.1", 0))  # bound, never listening: this FE refuses connections
    try:
        target = StarRocksTarget(f"http://127.0.0.1:{down.getsockname()[1]},{sr.fe_url}", DB, "root", PASSWORD,
                                 backoff_s=0.0, backoff_max_s=0.0, http_retries=0)
        committable = Writer(target).write(*ROWS).prepare()
        assert target.commit(committable) is CommitOutcome.COMMITTED
    finally:
        down.close()
    assert sorted(sr.visible_rows(DB, TABLE)) == ROWS


def test_json_format_loads_the_same_rows(sr) -> None:
    target = make_target(sr, format="json")
    committable = Writer(target).write(*ROWS).prepare()
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert sorted(sr.visible_rows(DB, TABLE)) == ROWS


def test_a_big_write_is_split_into_bounded_load_requests(sr, monkeypatch) -> None:
    target = make_target(sr, load_chunk_bytes=2048)
    sizes: list[int] = []
    real = target.http.request

    def counting(method: str, path: str, **kwargs: Any):
        if path.endswith("/load"):
            sizes.append(len(kwargs["body"]))
        return real(method, path, **kwargs)

    monkeypatch.setattr(target.http, "request", counting)
    rows = [(i, f"name-{i}") for i in range(3000)]
    committable = Writer(target).write(*rows).prepare()
    assert len(sizes) > 10 and max(sizes) < 4096
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert sorted(sr.visible_rows(DB, TABLE)) == rows


def test_nothing_begins_for_a_table_with_no_rows(sr) -> None:
    target = make_target(sr)
    writer = Writer(target)
    writer.txn.write(pa.table({"id": pa.array([], pa.int64()), "name": pa.array([], pa.string())}))
    assert writer.txn.prepare() == [] and writer.intents == [] and sr.transactions(DB) == []
    writer.txn.abort()  # nothing to roll back, nothing fails


def test_timeouts_go_on_begin_prepare_and_commit(sr) -> None:
    target = make_target(sr, timeout=120, prepared_timeout=300, publish_timeout=7)
    committable = Writer(target).write(*ROWS).prepare()
    txn = next(iter(sr.store.txns.values()))
    assert (txn.timeout_s, txn.prepared_timeout_s) == (120, 300)
    sr.faults.write_lock_timeout.arm(times=1)
    assert target.commit(committable) is CommitOutcome.COMMITTED
    # the FE reports the commit `timeout` it was given (7 s) in the write-lock message
    assert sr.faults.write_lock_timeout.fired == 1


def test_the_target_pickles_and_works_in_another_process_image(sr) -> None:
    target = pickle.loads(pickle.dumps(make_target(sr)))
    assert target.commit(Writer(target).write(*ROWS).prepare()) is CommitOutcome.COMMITTED
    assert "pw" not in repr(target)


# -- commit answers resolved through the label state -------------------------------------------


def test_publish_timeout_is_a_commit(sr) -> None:
    target = make_target(sr)
    committable = Writer(target).write(*ROWS).prepare()
    sr.faults.publish_timeout.arm(visible_after=60)
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert state(sr, "L1") == "COMMITTED"
    sr.clock.advance(61)
    assert sorted(sr.visible_rows(DB, TABLE)) == ROWS


def test_write_lock_timeouts_are_retried_until_the_commit_lands(sr) -> None:
    target = make_target(sr)
    committable = Writer(target).write(*ROWS).prepare()
    sr.faults.write_lock_timeout.arm(times=3)
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert sr.faults.write_lock_timeout.fired == 3 and len(sr.visible_rows(DB, TABLE)) == 4


def test_a_commit_that_keeps_failing_raises_and_leaves_the_transaction_prepared(sr) -> None:
    target = make_target(sr, busy_retries=2)
    committable = Writer(target).write(*ROWS).prepare()
    sr.faults.write_lock_timeout.arm(times=10)
    with pytest.raises(TargetError, match="still fails after 3 attempts.*write lock timeout.*PREPARED.*next run commits it"):
        target.commit(committable)
    assert state(sr, "L1") == "PREPARED"


def test_a_connection_dropped_after_the_commit_applied_resolves_to_committed(sr) -> None:
    target = make_target(sr)
    committable = Writer(target).write(*ROWS).prepare()
    sr.faults.drop_connection_after_commit.arm()
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert sr.faults.drop_connection_after_commit.fired == 1
    assert [t["commit_count"] for t in sr.transactions(DB)] == [1]  # resolved by state, not by committing again


def test_5xx_and_routing_misses_on_commit_are_retried(sr) -> None:
    target = make_target(sr)
    committable = Writer(target).write(*ROWS).prepare()
    sr.faults.http_5xx.arm(op="commit")
    sr.faults.fe_cache_loss.arm(op="commit")
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert len(sr.visible_rows(DB, TABLE)) == 4


def test_an_expired_prepared_transaction_is_aborted_while_its_label_is_remembered(sr, caplog) -> None:
    """C.8: past prepared_timeout the FE aborts it; the label says ABORTED, so loading it again is safe."""
    target = make_target(sr, prepared_timeout=300)
    committable = Writer(target).write(*ROWS).prepare()
    sr.clock.advance(301)
    with caplog.at_level(logging.WARNING):
        assert target.commit(committable) is CommitOutcome.ABORTED
    assert target.fe.label_state(DB, "L1") == ("ABORTED", "timeout by txn manager")
    assert "rolled it back" in caplog.text and "timeout by txn manager" in caplog.text
    assert sr.visible_rows(DB, TABLE) == []
    other = Writer(target, label="L2").write(*ROWS).prepare()
    sr.faults.expire_prepared.arm(op="commit", label="L2")  # the knob does the same without moving the clock
    assert target.commit(other) is CommitOutcome.ABORTED


def test_an_unknown_label_is_lost_and_the_coordinator_decides(sr, caplog) -> None:
    committable = Committable("starrocks", DB, TABLE, "never_began", 0, "a", rows=1)
    with caplog.at_level(logging.WARNING):
        assert make_target(sr).commit(committable) is CommitOutcome.LOST
    assert "unknown to the server" in caplog.text and "coordinator decides" in caplog.text
    assert "replaying" not in caplog.text


# -- R1: a committed label the server forgot -----------------------------------------------------


def test_a_committed_label_forgotten_after_label_keep_max_second_is_lost_not_committed(sr) -> None:
    """A.4/C.9: after label_keep_max_second (3 days) the label reads UNKNOWN and commit finds no
    transaction: the target cannot tell committed-and-forgotten from never committed, so LOST."""
    target = make_target(sr)
    committable = Writer(target).write(*ROWS).prepare()
    assert target.commit(committable) is CommitOutcome.COMMITTED
    sr.clock.advance(259200)
    assert target.commit(committable) is CommitOutcome.COMMITTED  # still remembered
    sr.clock.advance(1)
    assert target.commit(committable) is CommitOutcome.LOST
    assert sorted(sr.visible_rows(DB, TABLE)) == ROWS  # the rows are there, the label is not


def test_a_committed_label_evicted_by_count_is_lost_not_committed(tmp_path) -> None:
    """A.4: newer FEs also forget finished labels by count (the emulator's label_keep_max_num)."""
    with StarRocksEmulator(tmp_path / "sr", password=PASSWORD, label_keep_max_num=3) as emu:
        emu.create_table(DB, TABLE, [("id", "INT"), ("name", "VARCHAR(32)")])
        target = make_target(emu)
        committable = Writer(target).write(*ROWS).prepare()
        assert target.commit(committable) is CommitOutcome.COMMITTED
        for n in range(3):  # other loads into the same database finish after it
            other = Writer(target, label=f"other{n}").write((10 + n, "x")).prepare()
            assert target.commit(other) is CommitOutcome.COMMITTED
        assert target.fe.label_state(DB, "L1")[0] == "UNKNOWN"
        assert target.commit(committable) is CommitOutcome.LOST


def test_a_commit_whose_answer_was_lost_and_whose_label_was_evicted_since_is_lost_after_send(tmp_path) -> None:
    """label_keep_max_num counts running transactions too: a batch larger than it forgets its own labels
    while it commits. A commit that landed, whose answer was lost, reads UNKNOWN at once: it may be committed,
    so it is LOST_AFTER_SEND (never replayed), not LOST (replayed: a duplicate)."""
    with StarRocksEmulator(tmp_path / "sr", password=PASSWORD, label_keep_max_num=2) as emu:
        emu.create_table(DB, TABLE, [("id", "INT"), ("name", "VARCHAR(32)")])
        target = make_target(emu)
        batch = [Writer(target, label=f"L{n}").write((n, "x")).prepare() for n in range(3)]  # 3 running > 2
        emu.faults.drop_connection_after_commit.arm(op="commit", label="L0", role="fe")
        assert target.commit(batch[0]) is CommitOutcome.LOST_AFTER_SEND
        assert emu.faults.drop_connection_after_commit.fired == 1
        assert emu.visible_rows(DB, TABLE) == [(0, "x")]  # it did land
        assert [target.commit(c) for c in batch[1:]] == [CommitOutcome.COMMITTED] * 2
        assert target.commit(batch[0]) is CommitOutcome.LOST  # a later call that sent nothing unclear


def test_an_evicted_label_the_terminal_state_cache_calls_aborted_is_aborted(tmp_path) -> None:
    """SR-TWCH newest: after eviction the FE still answers commit from its terminal-state cache."""
    with StarRocksEmulator(tmp_path / "sr", password=PASSWORD, terminal_state_cache=True) as emu:
        emu.create_table(DB, TABLE, [("id", "INT"), ("name", "VARCHAR(32)")])
        target = make_target(emu)
        committed = Writer(target).write(*ROWS).prepare()
        assert target.commit(committed) is CommitOutcome.COMMITTED
        aborted = Writer(target, label="L2").write(*ROWS).prepare()
        target.abort(aborted.ref())
        emu.clock.advance(259201)
        assert target.fe.label_state(DB, "L1")[0] == target.fe.label_state(DB, "L2")[0] == "UNKNOWN"
        assert target.commit(committed) is CommitOutcome.COMMITTED  # "Transaction has already committed"
        assert target.commit(aborted) is CommitOutcome.ABORTED  # "Can not commit ABORTED transaction"


# -- the data phase -----------------------------------------------------------------------------


def test_busy_labels_and_fe_routing_misses_are_retried(sr) -> None:
    target = make_target(sr)
    sr.faults.txn_in_processing.arm(times=2, op="load")
    sr.faults.txn_in_processing.arm(times=2, op="prepare")
    sr.faults.fe_cache_loss.arm(op="load")
    sr.faults.fe_cache_loss.arm(op="prepare")
    committable = Writer(target).write(*ROWS).prepare()
    assert sr.faults.txn_in_processing.fired == 4 and sr.faults.fe_cache_loss.fired == 2
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert sorted(sr.visible_rows(DB, TABLE)) == ROWS


def test_a_prepare_whose_answer_is_lost_is_resolved_through_the_label_state(sr) -> None:
    target = make_target(sr, read_timeout=0.3)
    writer = Writer(target).write(*ROWS)
    sr.faults.slow_response.arm(op="prepare", role="be", seconds=10)
    try:
        committable = writer.prepare()  # timed out; the label is PREPARED, so it is prepared
    finally:
        sr.faults.release()
    assert sr.faults.slow_response.fired == 1 and state(sr, "L1") == "PREPARED"
    assert target.commit(committable) is CommitOutcome.COMMITTED


def test_a_begin_cut_off_before_the_server_acted_is_sent_again(sr) -> None:
    target = make_target(sr)
    sr.faults.drop_connection_before.arm(op="begin", role="fe")
    sr.faults.http_5xx.arm(op="begin", role="be")
    committable = Writer(target).write(*ROWS).prepare()
    assert sr.faults.drop_connection_before.fired == 1 and sr.faults.http_5xx.fired == 1
    assert target.commit(committable) is CommitOutcome.COMMITTED


def test_a_begin_that_landed_although_its_answer_was_lost_is_adopted(sr) -> None:
    target = make_target(sr)
    writer = Writer(target)
    sr.faults.slow_response.arm(op="begin", role="be", seconds=10)
    target.http.read_timeout = 0.3
    try:
        writer.write(*ROWS)
    finally:
        sr.faults.release()
        target.http.read_timeout = 5.0
    assert target.commit(writer.prepare()) is CommitOutcome.COMMITTED
    assert len(sr.transactions(DB)) == 1


def test_a_load_with_an_unknown_outcome_fails_the_writer_and_abort_rolls_back(sr) -> None:
    target = make_target(sr)
    writer = Writer(target).write(*ROWS[:1])
    sr.faults.http_5xx.arm(op="load", role="be")
    with pytest.raises(TargetError, match="HTTP 503.*rolled back and the writer fails; Spark retries the task"):
        writer.write(*ROWS[1:])
    writer.txn.abort()
    assert state(sr, "L1") == "ABORTED"


def test_a_be_restart_mid_transaction_fails_the_writer_and_abort_falls_back_to_cancel(sr) -> None:
    target = make_target(sr)
    writer = Writer(target).write(*ROWS[:2])
    sr.restart_be()  # the BE forgets the transaction; the FE still has it in PREPARE
    with pytest.raises(TargetError, match="TXN_NOT_EXISTS.*Spark retries the task"):
        writer.write(*ROWS[2:])
    writer.txn.abort()  # rollback answers TXN_NOT_EXISTS; `_cancel` on the FE aborts it
    assert state(sr, "L1") == "ABORTED"


def test_a_be_restart_between_load_and_prepare_fails_the_prepare_loudly(sr) -> None:
    target = make_target(sr)
    writer = Writer(target).write(*ROWS)
    sr.faults.restart_be.arm(op="prepare", role="be")
    with pytest.raises(TargetError, match="prepare of label L1.*label is PREPARE"):
        writer.prepare()


def test_prepared_data_survives_a_be_restart_and_a_cluster_restart(sr) -> None:
    target = make_target(sr)
    committable = Writer(target).write(*ROWS).prepare()
    sr.restart_be()
    sr.restart()
    assert target.commit(committable) is CommitOutcome.COMMITTED
    assert sorted(sr.visible_rows(DB, TABLE)) == ROWS


def test_rows_the_server_filters_fail_the_prepare_with_the_rejected_rows_url(sr) -> None:
    target = make_target(sr)
    writer = Writer(target).write((1, "x" * 40), (2, "fits"))  # longer than VARCHAR(32): filtered
    with pytest.raises(TargetError, match=r"too many filtered rows \(rejected rows: http://.*_load_error_log.*max_filter_ratio"):
        writer.prepare()


def test_strict_mode_is_on_unless_turned_off_so_a_bad_value_never_loads_as_null(sr) -> None:
    """Review B1: with the server's default (strict mode off) `"12x"` for an INT column becomes NULL and
    counts as loaded. The target sends strict_mode=true unless the user turns it off."""
    def load(target: StarRocksTarget, label: str) -> Writer:
        writer = Writer(target, label=label)
        writer.txn.write(pa.table({"id": ["12x", "7"], "name": ["bad", "good"]}))
        return writer

    with pytest.raises(TargetError, match="too many filtered rows"):
        load(make_target(sr), "strict").prepare()
    lenient = make_target(sr, strict_mode=False)
    committable = load(lenient, "lenient").prepare()
    assert lenient.commit(committable) is CommitOutcome.COMMITTED
    assert sorted(sr.visible_rows(DB, TABLE), key=str) == sorted([(None, "bad"), (7, "good")], key=str)


def test_filtered_rows_allowed_by_max_filter_ratio_are_counted_and_logged(sr, caplog) -> None:
    target = make_target(sr, properties={"max_filter_ratio": "0.5"})
    writer = Writer(target).write((1, "x" * 40), (2, "fits"))
    with caplog.at_level(logging.WARNING):
        committable = writer.prepare()
    assert committable.rows == 1 and "1 rows were filtered" in caplog.text
    assert (committable.filtered_rows, committable.unselected_rows) == (1, 0)  # accounted, not lost


# -- abort -----------------------------------------------------------------------------------------


def test_abort_is_harmless_for_labels_that_never_began_or_are_already_aborted(sr) -> None:
    target = make_target(sr)
    ref = TxnRef("starrocks", DB, TABLE, "ghost", 0, "a")
    target.abort(ref)
    writer = Writer(target).write(*ROWS)
    committable = writer.prepare()
    target.abort(committable.ref())
    target.abort(committable.ref())
    assert state(sr, "L1") == "ABORTED"
    assert target.commit(committable) is CommitOutcome.ABORTED


def test_aborting_a_committed_transaction_is_a_loud_error(sr) -> None:
    target = make_target(sr)
    committable = Writer(target).write(*ROWS).prepare()
    target.commit(committable)
    with pytest.raises(TargetError, match="is VISIBLE, but the sink was aborting it.*duplicated"):
        target.abort(committable.ref())


# -- configuration: fails before any data moves ---------------------------------------------------


def test_routable_tables_checks_the_server_and_returns_the_configured_tables(sr) -> None:
    assert make_target(sr).routable_tables() is None
    assert make_target(sr, tables=["t", "u"]).routable_tables() == {"t", "u"}
    with pytest.raises(ConfigurationError, match="refused the credentials.*check the user \\('root'\\) and password"):
        StarRocksTarget(sr.fe_url, DB, "root", "wrong").routable_tables()
    with pytest.raises(ConfigurationError, match="database 'nope'.*unknown database"):
        StarRocksTarget(sr.fe_url, "nope", "root", PASSWORD).routable_tables()


def test_an_unreachable_fe_is_named_with_its_url() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    target = StarRocksTarget(f"http://127.0.0.1:{port}", DB, http_retries=0)
    with pytest.raises(TargetError, match=f"127.0.0.1:{port}.*could not connect.*Is the FE up"):
        target.routable_tables()


def test_an_unknown_table_fails_at_begin_telling_to_create_it(sr) -> None:
    writer = Writer(make_target(sr), table="missing")
    with pytest.raises(TargetError, match="db.missing failed.*unknown table.*Create the table"):
        writer.txn.write(pa.table({"id": [1], "name": ["a"]}))


def test_option_mistakes_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="unknown option\\(s\\) \\['timout'\\]"):
        StarRocksTarget(timout=5)
    with pytest.raises(ConfigurationError, match="\\['label'\\] are set by the target itself"):
        StarRocksTarget(properties={"label": "x"})
    with pytest.raises(ConfigurationError, match="format='parquet'"):
        StarRocksTarget(format="parquet")
    with pytest.raises(ConfigurationError, match="prepared_timeout must be a positive"):
        StarRocksTarget(prepared_timeout=0)
    with pytest.raises(ConfigurationError, match="enclose must be a single byte"):
        StarRocksTarget(enclose="''")
    with pytest.raises(ConfigurationError, match="not inside the URL"):
        StarRocksTarget("http://root:pw@fe:8030")


def test_target_from_url_builds_it_with_credentials_from_the_environment(sr, monkeypatch) -> None:
    monkeypatch.setenv("STREAMING_SINK_TARGET_USER", "root")
    monkeypatch.setenv("STREAMING_SINK_TARGET_PASSWORD", PASSWORD)
    target = target_from_url(f"starrocks://127.0.0.1:{sr.fe_port}", DB, {"tables": [TABLE], "backoff_s": 0})
    assert isinstance(target, StarRocksTarget) and target.routable_tables() == {TABLE}
    assert target.commit(Writer(target).write(*ROWS).prepare()) is CommitOutcome.COMMITTED


def test_expiry_limits_report_what_recovery_depends_on() -> None:
    limits = {limit.what: limit for limit in StarRocksTarget().expiry_limits()}
    assert (limits["prepared transactions"].seconds, limits["prepared transactions"].count) == (86400.0, None)
    label = limits["label history (FE default)"]
    assert (label.seconds, label.count) == (259200.0, 1000)  # 3 days, and newer FEs' count limit
    assert "label_keep_max_num" in label.note and "1000 by default" in label.note and "unconfirmed" not in label.note
    configured = {limit.what: limit.seconds for limit in StarRocksTarget(prepared_timeout=600).expiry_limits()}
    assert configured["prepared transactions"] == 600.0


def test_open_transactions_cannot_be_listed_over_http(sr) -> None:
    """Only SHOW PROC (admin role) or the MySQL protocol list them: the sweep must rely on intents."""
    target = make_target(sr)
    Writer(target).write(*ROWS)  # one open transaction, in PREPARE
    assert target.leftover_transactions("L") is None
