"""R6 on ClickHouse: a staging table no record or intent names is listed by `status` and dropped by `recover`,
embedded (chdb) and over HTTP (the test front), where the operator's commands reach the server."""
from __future__ import annotations

import pyarrow as pa

from streaming_sink.actions import apply_recovery, plan_recovery
from streaming_sink.committable import TxnRef
from streaming_sink.committer import Committer
from streaming_sink.labels import make_label
from streaming_sink.state import FileStateStore
from streaming_sink.status import job_status
from streaming_sink.targets.clickhouse import ClickHouseTarget

DB, JOB, Q = "analytics", "job", "query-1"


def test_a_staging_table_the_journal_forgot_is_listed_and_dropped(tmp_path, clickhouse_url) -> None:
    target = ClickHouseTarget(clickhouse_url, DB)
    target.create_table("orders", pa.schema([("id", pa.int64())]))
    target.routable_tables()
    store = FileStateStore(tmp_path / "state")
    epoch = store.take_epoch(JOB, "driver")

    def begun(label_of_partition: int, record_intent: bool) -> str:
        label = make_label(JOB, Q, 0, "orders", label_of_partition, f"e{epoch}w0t{label_of_partition}")
        ref = TxnRef("clickhouse", DB, "orders", label, label_of_partition, f"e{epoch}w0t{label_of_partition}")
        txn = target.begin("orders", lambda chunk: ref, lambda r: store.add_intent(JOB, epoch, Q, 0, r) if record_intent else None)
        txn.write(pa.table({"id": [1, 2]}))
        return label

    named = begun(0, record_intent=True)  # a crashed writer: the intent names it
    forgotten = begun(1, record_intent=False)  # its intent is gone (a process died between begin and confirm)
    other_job = make_label("job2", Q, 0, "orders", 0, "e1w0t0")
    target.client().command(f"CREATE TABLE {DB}.`{other_job}` AS {DB}.orders")

    assert job_status(store, JOB, target=target)["server_leftovers"] == [forgotten]
    plan = plan_recovery(store, JOB, target)
    assert [(a.action, a.detail) for a in plan if a.action == "abort-leftovers"] == [("abort-leftovers", forgotten)]
    apply_recovery(Committer(target, store, JOB, store.take_epoch(JOB, "operator")), plan, lambda line: None)
    assert set(target.staging_tables()) == {other_job}  # the named one was aborted as an intent; other jobs untouched
    assert named not in target.staging_tables()
    target.close()
