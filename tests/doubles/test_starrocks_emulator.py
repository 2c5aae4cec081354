"""Pins the StarRocks emulator to the wire facts of protocol.md part A (and C, D).

Every test talks real HTTP with plain ``requests`` and follows 307s by hand (re-sending auth and
body), like the product must. Expected strings are the recorded/quoted ones from protocol.md
(source keys in the comments) so that a drifting emulator fails here first.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
import requests

from tests.support.doubles.emulators.client import Exchange, send
from tests.support.doubles.emulators.column_types import ColumnType
from tests.support.doubles.emulators.conversion import ConversionError, convert_value
from tests.support.doubles.emulators.load_formats import LoadFormat, split_csv
from tests.support.doubles.emulators.starrocks import StarRocksEmulator

DB, TABLE = "db", "t"
AUTH = ("root", "")


@pytest.fixture
def sr(starrocks_emulator: Callable[..., StarRocksEmulator]) -> StarRocksEmulator:
    return starrocks_emulator(password="", columns=[("id", "INT"), ("name", "VARCHAR(20)")])


def txn(emu: StarRocksEmulator, op: str, label: str, data: bytes = b"", *, db: str = DB,
        table: str | None = TABLE, follow: bool = True, auth: Any = AUTH,
        **headers: str) -> Exchange:
    """One transaction-API call on the FE; loads use PUT, the rest POST (A.1)."""
    hdrs = {"label": label, "db": db, **{k.replace("__", "-"): v for k, v in headers.items()}}
    if table is not None:
        hdrs["table"] = table
    if op == "load":
        hdrs.setdefault("column_separator", ",")
    method = "PUT" if op == "load" else "POST"
    return send(method, f"{emu.fe_url}/api/transaction/{op}", headers=hdrs, data=data,
                follow=follow, auth=auth)


def load_state(emu: StarRocksEmulator, label: str, db: str = DB) -> dict[str, Any]:
    return send("GET", f"{emu.fe_url}/api/{db}/get_load_state?label={label}").json


def prepared(emu: StarRocksEmulator, label: str, rows: bytes = b"1,a\n", **headers: str) -> int:
    begin = txn(emu, "begin", label)
    assert begin.json["Status"] == "OK", begin.json
    assert txn(emu, "load", label, rows).json["Status"] == "OK"
    prep = txn(emu, "prepare", label, **headers)
    assert prep.json["Status"] == "OK", prep.json
    return begin.json["TxnId"]


def state_of(emu: StarRocksEmulator, label: str) -> dict[str, Any]:
    matches = [t for t in emu.transactions(DB) if t["label"] == label]
    return matches[-1]


# --------------------------------------------------------------------------------------------
# A.2 redirects, auth
# --------------------------------------------------------------------------------------------


def test_begin_is_a_307_to_the_be_with_path_and_query_kept(sr: StarRocksEmulator) -> None:
    hop = send("POST", f"{sr.fe_url}/api/transaction/begin?a=1&b=%2Fx", follow=False,
               headers={"label": "L", "db": DB, "table": TABLE}).response
    assert hop.status_code == 307  # SR-RBA redirectTo
    assert hop.headers["Location"] == f"{sr.be_url}/api/transaction/begin?a=1&b=%2Fx"
    assert hop.content == b""
    bare = txn(sr, "begin", "L2", follow=False).response
    assert bare.headers["Location"] == f"http://127.0.0.1:{sr.be_port}/api/transaction/begin?"


@pytest.mark.parametrize("op", ["load", "prepare"])
def test_load_and_prepare_are_redirected_to_the_coordinator(sr: StarRocksEmulator,
                                                            op: str) -> None:
    txn(sr, "begin", "L")
    if op == "prepare":
        txn(sr, "load", "L", b"1,a\n")
    ex = txn(sr, op, "L", b"1,a\n")
    assert [h.status_code for h in ex.hops] == [307, 200]
    assert ex.hops[0].headers["Location"].startswith(sr.be_url)


def test_wrong_password_is_401_with_www_authenticate(sr: StarRocksEmulator) -> None:
    for url in (f"{sr.fe_url}/api/transaction/begin", f"{sr.fe_url}/api/{DB}/get_load_state"):
        resp = send("POST" if "begin" in url else "GET", url, auth=("root", "bad"),
                    headers={"label": "L", "db": DB, "table": TABLE}).response
        assert resp.status_code == 401  # A.1, SR-RBA
        assert resp.headers["WWW-Authenticate"] == 'Basic realm=""'
        assert resp.json()["status"] == "FAILED"
    assert sr.transactions() == []


def test_be_begin_without_credentials_fails_like_requests_auto_redirect(
        sr: StarRocksEmulator) -> None:
    # A.2 'Python caution': requests strips Authorization on the FE->BE hop (port changes).
    resp = requests.post(f"{sr.fe_url}/api/transaction/begin", auth=AUTH, timeout=10,
                         headers={"label": "L", "db": DB, "table": TABLE})
    assert resp.json() == {"Status": "INTERNAL_ERROR", "Message": "no valid Basic authorization"}
    assert sr.transactions() == []


def test_expect_100_continue_on_a_be_load_is_honoured(sr: StarRocksEmulator) -> None:
    txn(sr, "begin", "L")
    ex = txn(sr, "load", "L", b"1,a\n", Expect="100-continue")
    assert ex.json["Status"] == "OK" and ex.json["LoadBytes"] == 4


# --------------------------------------------------------------------------------------------
# A.3 response shapes (SR-T-prepared_timeout / SR-T-coordinator examples)
# --------------------------------------------------------------------------------------------


def test_two_phase_happy_path_shapes(sr: StarRocksEmulator) -> None:
    begin = txn(sr, "begin", "test_normal")
    assert list(begin.json) == ["Status", "Message", "Label", "TxnId", "BeginTxnTimeMs"]
    assert begin.json["Status"] == "OK" and begin.json["Message"] == ""
    assert begin.json["Label"] == "test_normal"
    assert begin.response.text.startswith('{\n    "Status": "OK"')  # BE: 4-space PrettyWriter
    txn_id = begin.json["TxnId"]

    load = txn(sr, "load", "test_normal", b"1,alice\n")
    assert load.json == {"Status": "OK", "Message": "", "Label": "test_normal", "TxnId": txn_id,
                         "LoadBytes": 8, "StreamLoadPlanTimeMs": 0, "ReceivedDataTimeMs": 0}

    prep = txn(sr, "prepare", "test_normal", table=None)  # table optional after begin
    assert list(prep.json) == [
        "Status", "Message", "Label", "TxnId", "NumberTotalRows", "NumberLoadedRows",
        "NumberFilteredRows", "NumberUnselectedRows", "LoadBytes", "LoadTimeMs",
        "StreamLoadPlanTimeMs", "ReceivedDataTimeMs", "WriteDataTimeMs", "CommitAndPublishTimeMs"]
    assert (prep.json["NumberTotalRows"], prep.json["NumberLoadedRows"]) == (1, 1)
    assert load_state(sr, "test_normal")["state"] == "PREPARED"
    assert sr.visible_rows(DB, TABLE) == []

    commit = txn(sr, "commit", "test_normal", table=None)
    assert not commit.redirected  # the FE commits PREPARED txns itself (A.2 step 5)
    assert commit.json == {"Label": "test_normal", "Status": "OK", "TxnId": txn_id, "Message": ""}
    assert commit.response.text.startswith('{\n  "Label"')  # FE: Gson 2-space
    assert sr.visible_rows(DB, TABLE) == [(1, "alice")]
    assert load_state(sr, "test_normal")["state"] == "VISIBLE"
    assert state_of(sr, "test_normal")["commit_count"] == 1


def test_get_load_state_shape_and_errors(sr: StarRocksEmulator) -> None:
    body = load_state(sr, "nope")
    assert body == {"state": "UNKNOWN", "reason": "", "status": "OK", "code": "0",
                    "msg": "Success", "message": "OK"}  # A.7, SR-GLS, SR-TR RestBaseResult
    no_label = send("GET", f"{sr.fe_url}/api/{DB}/get_load_state").json
    assert no_label["status"] == "FAILED" and no_label["msg"] == "No label selected."
    no_db = load_state(sr, "x", db="missing")
    assert no_db["msg"] == "unknown database, database=missing"


@pytest.mark.parametrize("headers, message", [
    ({"label": "L"}, "No database selected."),
    ({"db": DB}, "Empty label."),
    ({"db": "nodb", "label": "L"}, "Database[nodb] does not exist."),
])
def test_fe_validation_failures(sr: StarRocksEmulator, headers: dict[str, str],
                                message: str) -> None:
    body = send("POST", f"{sr.fe_url}/api/transaction/begin", headers=headers).json
    assert body == {"Status": "FAILED",
                    "Message": f"class com.starrocks.common.StarRocksException: {message}"}


def test_unknown_operation_and_old_exception_class(tmp_path: Any) -> None:
    with StarRocksEmulator(tmp_path, version="3.3.0") as emu:
        emu.create_table(DB, TABLE, [("id", "INT")])
        body = send("POST", f"{emu.fe_url}/api/transaction/frobnicate",
                    headers={"label": "L", "db": DB}).json
        assert body["Message"] == ("class com.starrocks.common.UserException: "
                                   "Unknown transaction operation: frobnicate")


# --------------------------------------------------------------------------------------------
# A.4 op x state matrix (SR-T-basic_txn, recorded)
# --------------------------------------------------------------------------------------------


def test_basic_txn_commit_operations(sr: StarRocksEmulator) -> None:
    label = "commit_test"
    assert txn(sr, "begin", label).json["Status"] == "OK"
    txn(sr, "load", label, b"1,alice")
    one_phase = txn(sr, "commit", label)  # PREPARE -> commit on the BE
    assert one_phase.redirected and one_phase.json["Status"] == "OK"
    assert one_phase.json["NumberLoadedRows"] == 1
    again = txn(sr, "commit", label)
    assert again.json["Status"] == "OK"  # C.3 idempotent
    assert again.json["Message"] == (f"Transaction {one_phase.json['TxnId']} has already "
                                     f"committed, label is {label}")
    load = txn(sr, "load", label, b"2,bob")
    assert load.json == {"Status": "TXN_NOT_EXISTS",
                         "Message": f"Transaction with label {label} not exists"}
    rollback = txn(sr, "rollback", label)
    assert rollback.json["Status"] == "FAILED"
    assert rollback.json["Message"].endswith(
        f"Can not abort VISIBLE transaction {one_phase.json['TxnId']}, label is {label}")
    assert sr.visible_rows(DB, TABLE) == [(1, "alice")]
    begin = txn(sr, "begin", label).json
    assert begin == {"Status": "LABEL_ALREADY_EXISTS", "ExistingJobStatus": "FINISHED",
                     "Message": f"Label [{label}] has already been used."}


def test_basic_txn_rollback_operations(sr: StarRocksEmulator) -> None:
    label = "rollback_test"
    first = txn(sr, "begin", label).json["TxnId"]
    txn(sr, "load", label, b"1,alice")
    assert txn(sr, "rollback", label).json == {"Status": "OK", "Message": "", "Label": label}
    again = txn(sr, "rollback", label).json
    assert again["Status"] == "OK"
    assert again["Message"] == f"Transaction {first} has already aborted, label is {label}"
    assert txn(sr, "load", label, b"2,bob").json["Status"] == "TXN_NOT_EXISTS"
    commit = txn(sr, "commit", label).json
    assert commit["Status"] == "FAILED"
    assert commit["Message"].endswith(f"Can not commit ABORTED transaction {first}, "
                                      f"label is {label}")
    assert sr.visible_rows(DB, TABLE) == []
    reuse = txn(sr, "begin", label).json  # C.11 label reuse after abort
    assert reuse["Status"] == "OK" and reuse["TxnId"] != first
    assert load_state(sr, label)["state"] == "PREPARE"


def test_basic_txn_edge_cases(sr: StarRocksEmulator) -> None:
    load = txn(sr, "load", "no_begin", b"1,alice").json
    assert load["Status"] == "FAILED"
    assert "Can't find the transaction with db [db] and label[no_begin]" in load["Message"]
    commit = txn(sr, "commit", "no_begin").json
    assert commit["Message"].endswith("No transaction found with db[db] and label[no_begin]")
    assert txn(sr, "rollback", "no_begin").json["Status"] == "FAILED"
    assert txn(sr, "prepare", "no_begin").json["Status"] == "FAILED"

    txn(sr, "begin", "empty_commit")
    empty = txn(sr, "commit", "empty_commit").json
    assert empty["Status"] == "INTERNAL_ERROR"  # C.5
    assert empty["Message"].endswith("hasn't send any data yet")
    assert state_of(sr, "empty_commit")["state"] == "ABORTED"

    txn(sr, "begin", "empty_prepare")
    assert txn(sr, "prepare", "empty_prepare").json["Status"] == "INTERNAL_ERROR"

    txn(sr, "begin", "empty_rollback")
    assert txn(sr, "rollback", "empty_rollback").json["Status"] == "OK"

    txn(sr, "begin", "double_begin")
    assert txn(sr, "begin", "double_begin").json == {
        "Status": "LABEL_ALREADY_EXISTS", "ExistingJobStatus": "", "Message": ""}
    assert txn(sr, "rollback", "double_begin").json["Status"] == "OK"
    assert sr.visible_rows(DB, TABLE) == []


def test_prepared_txn_matrix(sr: StarRocksEmulator) -> None:
    txn_id = prepared(sr, "P")
    second = txn(sr, "prepare", "P").json  # C.4: context removed at first prepare
    assert second == {"Status": "TXN_NOT_EXISTS",
                      "Message": "transaction with label P not exists"}
    assert txn(sr, "load", "P", b"2,b\n").json["Status"] == "TXN_NOT_EXISTS"
    begin = txn(sr, "begin", "P").json
    assert (begin["Status"], begin["ExistingJobStatus"]) == ("LABEL_ALREADY_EXISTS", "RUNNING")
    rollback = txn(sr, "rollback", "P")
    assert not rollback.redirected
    assert rollback.json == {"Label": "P", "Status": "OK", "TxnId": txn_id, "Message": ""}
    state = load_state(sr, "P")
    assert (state["state"], state["reason"]) == ("ABORTED", "User Aborted")


def test_begin_label_exists_after_be_restart_reports_running(sr: StarRocksEmulator) -> None:
    txn(sr, "begin", "L")
    sr.restart_be()  # C.15: the BE forgets the context, the FE keeps the PREPARE txn
    begin = txn(sr, "begin", "L").json
    assert begin == {"Status": "LABEL_ALREADY_EXISTS", "ExistingJobStatus": "RUNNING",
                     "Message": "Label [L] has already been used."}
    assert txn(sr, "load", "L", b"1,a\n").json["Status"] == "TXN_NOT_EXISTS"
    rollback = txn(sr, "rollback", "L").json
    assert rollback == {"Status": "TXN_NOT_EXISTS",
                        "Message": "transaction with label L not exists"}
    cancel = send("POST", f"{sr.fe_url}/api/{DB}/{TABLE}/_cancel?label=L").json
    assert (cancel["status"], "Status" in cancel) == ("OK", False)  # a RestBaseResult (SR-CSLA-T)
    assert load_state(sr, "L")["state"] == "ABORTED"


def test_restart_be_knob_loses_every_context_at_that_request(sr: StarRocksEmulator) -> None:
    txn(sr, "begin", "A")
    txn(sr, "begin", "B")
    sr.faults.restart_be.arm(op="load", role="be", label="A")
    with pytest.raises(requests.ConnectionError):  # the BE died under the request: no answer
        txn(sr, "load", "A", b"1,a\n")
    assert sr.faults.restart_be.fired == 1
    for label in ("A", "B"):  # C.15: contexts lost on the BE, the FE still has the PREPARE txns
        assert txn(sr, "load", label, b"1,a\n").json["Status"] == "TXN_NOT_EXISTS"
        assert load_state(sr, label)["state"] == "PREPARE"


def test_be_rejects_mismatched_db_and_table(sr: StarRocksEmulator) -> None:
    sr.create_table(DB, "other", [("id", "INT")])
    txn(sr, "begin", "L")
    bad_table = txn(sr, "load", "L", b"1,a\n", table="other").json
    assert bad_table == {"Status": "INVALID_ARGUMENT",
                         "Message": "Request table other not equal transaction table t"}
    sr.create_database("db2")
    bad_db = send("POST", f"{sr.be_url}/api/transaction/commit",
                  headers={"label": "L", "db": "db2"}).json
    assert bad_db == {"Status": "INVALID_ARGUMENT",
                      "Message": "request db db2 transaction db db not match"}


def test_multi_statement_header_is_refused_by_the_be(sr: StarRocksEmulator) -> None:
    body = send("POST", f"{sr.be_url}/api/transaction/begin",
                headers={"label": "L", "db": DB, "transaction_type": "multi"}).json
    assert body["Status"] == "INVALID_ARGUMENT"
    assert body["Message"] == ("Multi-statement transaction requests can only be sent to FE "
                               "nodes, not BE nodes")


# --------------------------------------------------------------------------------------------
# A.5 timeouts on the clock, A.4 label retention
# --------------------------------------------------------------------------------------------


def test_begin_timeout_aborts_the_prepare_txn(sr: StarRocksEmulator) -> None:
    txn(sr, "begin", "L", timeout="5")
    txn(sr, "load", "L", b"1,a\n")
    sr.clock.advance(5)
    assert load_state(sr, "L")["state"] == "PREPARE"  # expiry is strictly after the timeout
    sr.clock.advance(1)
    state = load_state(sr, "L")
    assert (state["state"], state["reason"]) == ("ABORTED", "timeout by txn manager")
    assert txn(sr, "load", "L", b"2,b\n").json["Status"] == "TXN_NOT_EXISTS"
    assert txn(sr, "commit", "L").json["Status"] == "FAILED"


def test_default_begin_timeout_is_600s(sr: StarRocksEmulator) -> None:
    txn(sr, "begin", "L")
    sr.clock.advance(600)
    sr.tick()
    assert state_of(sr, "L")["state"] == "PREPARE"
    sr.clock.advance(1)
    sr.tick()
    assert state_of(sr, "L")["state"] == "ABORTED"


def test_prepared_timeout_header_and_default(sr: StarRocksEmulator) -> None:
    prepared(sr, "short", prepared_timeout="300")
    prepared(sr, "default")
    sr.clock.advance(301)
    assert state_of(sr, "short")["reason"] == "timeout by txn manager"  # SR-T-prepared_timeout
    assert state_of(sr, "default")["state"] == "PREPARED"
    sr.clock.advance(86400 - 301)
    assert state_of(sr, "default")["state"] == "PREPARED"
    sr.clock.advance(1)
    assert state_of(sr, "default")["state"] == "ABORTED"
    commit = txn(sr, "commit", "default").json  # C.8: data loss for a checkpointed txn
    assert commit["Status"] == "FAILED" and "Can not commit ABORTED" in commit["Message"]


def test_prepared_timeout_needs_3_5_4(tmp_path: Any) -> None:
    with StarRocksEmulator(tmp_path, version="3.5.3") as emu:
        emu.create_table(DB, TABLE, [("id", "INT"), ("name", "VARCHAR(20)")])
        prepared(emu, "L", prepared_timeout="1")  # header unknown to older servers
        emu.clock.advance(2)
        assert state_of(emu, "L")["state"] == "PREPARED"


@pytest.mark.parametrize("value, status, message", [
    ("0", "INVALID_ARGUMENT", "Invalid prepared_timeout: 0"),
    ("-5", "INVALID_ARGUMENT", "Invalid prepared_timeout: -5"),
    ("abc", "FAILED", 'class java.lang.NumberFormatException: For input string: "abc"'),
])
def test_invalid_prepared_timeout(sr: StarRocksEmulator, value: str, status: str,
                                  message: str) -> None:
    txn(sr, "begin", "L")
    txn(sr, "load", "L", b"1,a\n")
    assert txn(sr, "prepare", "L", prepared_timeout=value).json == {"Status": status,
                                                                    "Message": message}
    assert txn(sr, "prepare", "L").json["Status"] == "OK"  # validation did not roll back


def test_idle_transaction_timeout(sr: StarRocksEmulator) -> None:
    txn(sr, "begin", "L", idle_transaction_timeout="10")
    sr.clock.advance(8)
    txn(sr, "load", "L", b"1,a\n")  # activity resets the idle clock
    sr.clock.advance(8)
    assert state_of(sr, "L")["state"] == "PREPARE"
    sr.clock.advance(3)
    assert state_of(sr, "L")["reason"] == "transaction is aborted by idle timeout 10 seconds."


def test_label_retention_then_unknown_and_reusable(sr: StarRocksEmulator) -> None:
    prepared(sr, "L")
    txn(sr, "commit", "L")
    sr.clock.advance(259200)
    assert load_state(sr, "L")["state"] == "VISIBLE"
    sr.clock.advance(1)
    assert load_state(sr, "L")["state"] == "UNKNOWN"  # C.9
    commit = txn(sr, "commit", "L").json
    assert commit["Status"] == "FAILED" and "No transaction found" in commit["Message"]
    assert txn(sr, "begin", "L").json["Status"] == "OK"
    assert sr.visible_rows(DB, TABLE) == [(1, "a")]  # eviction forgets the label, not the data


def test_label_keep_max_num_forgets_the_oldest_finished_labels(tmp_path: Any) -> None:
    """A.4: newer FEs also evict finished txns by count (setting name UNCONFIRMED; the source read
    uses label_keep_max_num over running + finished txns of the database, see the profile)."""
    with StarRocksEmulator(tmp_path, label_keep_max_num=3) as emu:
        emu.create_table(DB, TABLE, [("id", "INT"), ("name", "VARCHAR(20)")])
        emu.create_table("other", TABLE, [("id", "INT"), ("name", "VARCHAR(20)")])
        for op, body in (("begin", b""), ("load", b"9,z\n"), ("commit", b"")):
            assert txn(emu, op, "O", body, db="other").json["Status"] == "OK"
        prepared(emu, "L")
        assert txn(emu, "commit", "L").json["Status"] == "OK"
        prepared(emu, "A")
        assert txn(emu, "rollback", "A").json["Status"] == "OK"  # ABORTED is finished too
        prepared(emu, "P")  # PREPARED: never evicted, but it counts (running + finished)
        assert load_state(emu, "L")["state"] == "VISIBLE"  # 3 txns: at the limit, nothing forgotten
        assert txn(emu, "begin", "R").json["Status"] == "OK"  # a 4th, running: the oldest finished goes
        assert load_state(emu, "L")["state"] == "UNKNOWN"
        assert load_state(emu, "A")["state"] == "ABORTED"
        commit = txn(emu, "commit", "L").json
        assert commit["Status"] == "FAILED" and "No transaction found" in commit["Message"]
        assert load_state(emu, "P")["state"] == "PREPARED"
        assert load_state(emu, "O", db="other")["state"] == "VISIBLE"  # counted per database
        assert emu.visible_rows(DB, TABLE) == [(1, "a")]  # the label is forgotten, not the data


def test_terminal_state_cache_profile(tmp_path: Any) -> None:
    with StarRocksEmulator(tmp_path, terminal_state_cache=True, label_keep_max_second=10) as emu:
        emu.create_table(DB, TABLE, [("id", "INT"), ("name", "VARCHAR(20)")])
        prepared(emu, "L")
        txn(emu, "commit", "L")
        emu.clock.advance(11)
        again = txn(emu, "commit", "L").json
        assert again == {"Label": "L", "Status": "OK",
                         "Message": "Transaction has already committed, label is L"}


# --------------------------------------------------------------------------------------------
# A.6 concurrency and limits
# --------------------------------------------------------------------------------------------


def test_concurrent_request_on_a_label_gets_txn_in_processing(sr: StarRocksEmulator) -> None:
    txn(sr, "begin", "L")
    go = threading.Event()
    result: dict[str, Any] = {}

    def slow_body() -> Iterator[bytes]:
        yield b"1,a\n"
        go.wait(10)
        yield b"2,b\n"

    def loader() -> None:
        result["load"] = send("PUT", f"{sr.be_url}/api/transaction/load", data=slow_body(),
                              headers={"label": "L", "db": DB, "table": TABLE,
                                       "column_separator": ","}).json

    thread = threading.Thread(target=loader)
    thread.start()
    deadline = time.monotonic() + 10
    while not sr.stream_context_busy("L"):
        assert time.monotonic() < deadline, "the load never took the context lock"
        time.sleep(0.005)
    busy = txn(sr, "prepare", "L").json
    assert busy == {"Status": "TXN_IN_PROCESSING", "Label": "L",
                    "Message": "Transaction is in processing"}
    go.set()
    thread.join(10)
    assert result["load"]["Status"] == "OK" and result["load"]["LoadBytes"] == 8
    assert txn(sr, "prepare", "L").json["NumberLoadedRows"] == 2


def test_running_txn_limit_per_db(tmp_path: Any) -> None:
    with StarRocksEmulator(tmp_path, max_running_txn_num_per_db=2) as emu:
        emu.create_table(DB, TABLE, [("id", "INT"), ("name", "VARCHAR(20)")])
        assert txn(emu, "begin", "a").json["Status"] == "OK"
        assert txn(emu, "begin", "b").json["Status"] == "OK"
        third = txn(emu, "begin", "c").json
        assert third["Status"] == "ANALYSIS_ERROR"
        assert third["Message"] == "current running txns on db 10001 is 2, larger than limit 2"
        txn(emu, "rollback", "a")
        assert txn(emu, "begin", "c").json["Status"] == "OK"


# --------------------------------------------------------------------------------------------
# Fault knobs (protocol.md C.1, C.2, C.7, C.16, D)
# --------------------------------------------------------------------------------------------


def test_publish_timeout_commit_fails_but_data_lands(sr: StarRocksEmulator) -> None:
    prepared(sr, "L")
    sr.faults.publish_timeout.arm(label="L", visible_after=30)
    commit = txn(sr, "commit", "L").json
    assert commit == {"Status": "FAILED", "Message":
                      "class com.starrocks.common.StarRocksException: publish timeout: 20000"}
    assert load_state(sr, "L")["state"] == "COMMITTED"  # C.1: resolve via get_load_state
    assert sr.visible_rows(DB, TABLE) == []
    sr.clock.advance(30)
    assert load_state(sr, "L")["state"] == "VISIBLE"
    assert sr.visible_rows(DB, TABLE) == [(1, "a")]
    assert txn(sr, "commit", "L").json["Status"] == "OK"


def test_publish_timeout_uses_commit_timeout_header_and_be_path(sr: StarRocksEmulator) -> None:
    prepared(sr, "L")
    sr.faults.publish_timeout.arm()
    assert txn(sr, "commit", "L", timeout="7").json["Message"].endswith("publish timeout: 7000")
    txn(sr, "begin", "one_phase")
    txn(sr, "load", "one_phase", b"2,b\n")
    sr.faults.publish_timeout.arm()
    be = txn(sr, "commit", "one_phase").json
    assert be["Status"] == "PUBLISH_TIMEOUT"
    assert {r[0] for r in sr.visible_rows(DB, TABLE)} == {1, 2}  # visible_after=0: next request


def test_write_lock_timeout_keeps_the_txn_prepared(sr: StarRocksEmulator) -> None:
    prepared(sr, "L")
    sr.faults.write_lock_timeout.arm()
    commit = txn(sr, "commit", "L").json
    assert commit["Status"] == "FAILED"
    assert commit["Message"].endswith("get database write lock timeout, database=db, "
                                      "timeoutMillis=20000")
    assert load_state(sr, "L")["state"] == "PREPARED"  # C.2: retrying is correct
    assert txn(sr, "commit", "L").json["Status"] == "OK"
    assert state_of(sr, "L")["commit_count"] == 2


def test_txn_in_processing_knob(sr: StarRocksEmulator) -> None:
    txn(sr, "begin", "L")
    sr.faults.txn_in_processing.arm(op="load")
    assert txn(sr, "load", "L", b"1,a\n").json["Status"] == "TXN_IN_PROCESSING"
    assert txn(sr, "load", "L", b"1,a\n").json["Status"] == "OK"


def test_fe_cache_loss_knob(sr: StarRocksEmulator) -> None:
    txn(sr, "begin", "L")
    sr.faults.fe_cache_loss.arm(label="L")
    load = txn(sr, "load", "L", b"1,a\n").json
    assert load["Status"] == "FAILED"
    assert "The possible reasons: 1. FE leader is started or switched" in load["Message"]
    assert load_state(sr, "L")["state"] == "PREPARE"  # C.16: the txn itself is fine


def test_expire_prepared_knob(sr: StarRocksEmulator) -> None:
    prepared(sr, "L")
    sr.faults.expire_prepared.arm(label="L", op="commit")
    commit = txn(sr, "commit", "L").json
    assert commit["Status"] == "FAILED" and "Can not commit ABORTED" in commit["Message"]
    assert load_state(sr, "L")["reason"] == "timeout by txn manager"


def test_drop_connection_after_commit_applies_it(sr: StarRocksEmulator) -> None:
    prepared(sr, "L")
    sr.faults.drop_connection_after_commit.arm()
    with pytest.raises(requests.ConnectionError):
        txn(sr, "commit", "L")
    assert load_state(sr, "L")["state"] == "VISIBLE"


def test_drop_connection_before_does_nothing(sr: StarRocksEmulator) -> None:
    sr.faults.drop_connection_before.arm(op="begin")
    with pytest.raises(requests.ConnectionError):
        txn(sr, "begin", "L")
    assert sr.transactions() == []
    assert txn(sr, "begin", "L").json["Status"] == "OK"


def test_http_5xx_answers_without_acting(sr: StarRocksEmulator) -> None:
    sr.faults.http_5xx.arm(times=2, op="begin", status=500)
    assert txn(sr, "begin", "L").response.status_code == 500
    assert txn(sr, "begin", "L").response.status_code == 500
    assert sr.transactions() == []
    sr.faults.http_5xx.arm(op="begin", role="be")  # the BE leg this time; default 503
    ex = txn(sr, "begin", "L")
    assert [h.status_code for h in ex.hops] == [307, 503]
    assert sr.transactions() == []


def test_slow_response_acts_then_delays(sr: StarRocksEmulator) -> None:
    sr.faults.slow_response.arm(op="begin", role="be", seconds=60)
    with pytest.raises(requests.ReadTimeout):
        send("POST", f"{sr.be_url}/api/transaction/begin", timeout=0.3,
             headers={"label": "L", "db": DB, "table": TABLE})
    assert load_state(sr, "L")["state"] == "PREPARE"  # acted: the client cannot know
    sr.faults.release()
    sr.faults.slow_response.arm(op="get_load_state", seconds=60)  # a new arm waits again
    with pytest.raises(requests.ReadTimeout):
        send("GET", f"{sr.fe_url}/api/{DB}/get_load_state?label=L", timeout=0.3)
    sr.faults.release()


def test_knobs_match_label_and_count(sr: StarRocksEmulator) -> None:
    sr.faults.http_5xx.arm(times=2, label="A")
    assert txn(sr, "begin", "B").json["Status"] == "OK"
    assert txn(sr, "begin", "A").response.status_code == 503
    assert txn(sr, "begin", "A").response.status_code == 503
    assert txn(sr, "begin", "A").json["Status"] == "OK"
    assert sr.faults.http_5xx.fired == 2 and not sr.faults.http_5xx.armed
    with pytest.raises(AttributeError):
        sr.faults.no_such_knob.arm()


# --------------------------------------------------------------------------------------------
# Persistence across restarts (D checklist, C.15)
# --------------------------------------------------------------------------------------------


def test_restart_keeps_prepared_visible_and_history(sr: StarRocksEmulator,
                                                    tmp_path: Any) -> None:
    prepared(sr, "P", b"1,a\n")
    prepared(sr, "V", b"2,b\n")
    txn(sr, "commit", "V")
    txn(sr, "begin", "R")
    txn(sr, "load", "R", b"3,c\n")
    txn(sr, "rollback", "R")
    txn(sr, "begin", "open")
    txn(sr, "load", "open", b"4,d\n")
    sr.clock.advance(100)
    fe_port, be_port, now = sr.fe_port, sr.be_port, sr.clock.now()

    sr.restart()
    assert (sr.fe_port, sr.be_port) == (fe_port, be_port)
    assert sr.visible_rows(DB, TABLE) == [(2, "b")]
    assert load_state(sr, "P")["state"] == "PREPARED"
    assert load_state(sr, "R")["state"] == "ABORTED"
    assert load_state(sr, "open")["state"] == "PREPARE"
    assert txn(sr, "load", "open", b"5,e\n").json["Status"] == "TXN_NOT_EXISTS"  # ctx lost
    assert txn(sr, "commit", "P").json["Status"] == "OK"
    assert sorted(sr.visible_rows(DB, TABLE)) == [(1, "a"), (2, "b")]

    sr.stop()
    with StarRocksEmulator(tmp_path / "sr") as other:  # a new process on the same data dir
        assert other.clock.now() == now
        assert sorted(other.visible_rows(DB, TABLE)) == [(1, "a"), (2, "b")]
        assert {t["label"]: t["state"] for t in other.transactions()} == {
            "P": "VISIBLE", "V": "VISIBLE", "R": "ABORTED", "open": "PREPARE"}
        new = txn(other, "begin", "new").json
        assert new["TxnId"] > max(t["txn_id"] for t in other.transactions() if t["label"] != "new")


# --------------------------------------------------------------------------------------------
# Non-transactional stream load (A.3, C.14)
# --------------------------------------------------------------------------------------------


def stream_load(emu: StarRocksEmulator, data: bytes, label: str | None = None,
                **headers: str) -> Exchange:
    hdrs = {"Expect": "100-continue", "column_separator": ",", **headers}
    if label:
        hdrs["label"] = label
    return send("PUT", f"{emu.fe_url}/api/{DB}/{TABLE}/_stream_load", headers=hdrs, data=data)


def test_fe_stream_load_requires_expect_100_continue(sr: StarRocksEmulator) -> None:
    resp = send("PUT", f"{sr.fe_url}/api/{DB}/{TABLE}/_stream_load", data=b"1,a\n",
                headers={"label": "L"}).response
    assert resp.json() == {"Status": "FAILED", "Message": "class com.starrocks.common."
                           "DdlException: There is no 100-continue header"}  # C.14, SR-LA
    assert resp.headers["Connection"] == "close"
    hop = stream_load(sr, b"1,a\n", "L2").hops[0]
    assert hop.status_code == 307 and hop.headers["Connection"] == "close"


def test_stream_load_success_and_label_exists(sr: StarRocksEmulator) -> None:
    ok = stream_load(sr, b"1,a\n2,b\n", "L").json
    assert list(ok)[:5] == ["TxnId", "Label", "Status", "Message", "NumberTotalRows"]
    assert (ok["Status"], ok["Message"], ok["NumberLoadedRows"]) == ("Success", "OK", 2)
    assert "ReadDataTimeMs" in ok and "CommitAndPublishTimeMs" in ok
    dup = stream_load(sr, b"3,c\n", "L").json
    assert {k: dup[k] for k in ("TxnId", "Label", "Status", "ExistingJobStatus", "Message")} == {
        "TxnId": -1, "Label": "L", "Status": "Label Already Exists",
        "ExistingJobStatus": "FINISHED", "Message": "Label [L] has already been used."}
    assert sr.visible_rows(DB, TABLE) == [(1, "a"), (2, "b")]
    assert load_state(sr, "L")["state"] == "VISIBLE"


def test_stream_load_publish_timeout_and_filtered(sr: StarRocksEmulator) -> None:
    sr.faults.publish_timeout.arm(op="stream_load", visible_after=5)
    slow = stream_load(sr, b"1,a\n", "P").json
    assert (slow["Status"], slow["Message"]) == (
        "Publish Timeout", "transaction commit successfully, BUT data will be visible later")
    assert load_state(sr, "P")["state"] == "COMMITTED"
    bad = stream_load(sr, b"x,a\n", "F", strict_mode="true").json
    assert (bad["Status"], bad["Message"], bad["NumberFilteredRows"]) == (
        "Fail", "too many filtered rows", 1)
    assert requests.get(bad["ErrorURL"], timeout=5).text.startswith("column id")
    assert load_state(sr, "F")["state"] == "ABORTED"


# --------------------------------------------------------------------------------------------
# Data: formats, typed conversion, filtered rows failing late (C.6)
# --------------------------------------------------------------------------------------------


def test_too_many_filtered_rows_fail_at_prepare(sr: StarRocksEmulator) -> None:
    txn(sr, "begin", "L")
    assert txn(sr, "load", "L", b"1,a\n2\n").json["Status"] == "OK"  # loads say OK
    prep = txn(sr, "prepare", "L").json
    assert (prep["Status"], prep["Message"]) == ("INTERNAL_ERROR", "too many filtered rows")
    errors = requests.get(prep["ErrorURL"], timeout=5).text
    assert "Value count does not match column count" in errors
    assert load_state(sr, "L")["state"] == "ABORTED"


def test_max_filter_ratio_allows_some_filtered_rows(sr: StarRocksEmulator) -> None:
    txn(sr, "begin", "L")
    txn(sr, "load", "L", b"1,a\n2\n", max_filter_ratio="0.5")
    prep = txn(sr, "prepare", "L").json
    assert (prep["Status"], prep["NumberTotalRows"], prep["NumberFilteredRows"]) == ("OK", 2, 1)


def test_strict_mode_off_turns_bad_values_into_null(sr: StarRocksEmulator) -> None:
    txn(sr, "begin", "L")
    txn(sr, "load", "L", b"x,a\n")
    txn(sr, "commit", "L")
    assert sr.visible_rows(DB, TABLE) == [(None, "a")]


def test_csv_options_and_typed_columns(sr: StarRocksEmulator) -> None:
    sr.create_table(DB, "typed", [("id", "BIGINT NOT NULL"), ("ts", "DATETIME"),
                                  ("ok", "BOOLEAN"), ("score", "DOUBLE"), ("note", "STRING")])
    body = (b"id|note|ts|ok|score\r\n"
            b"1|'a|b'|2024-01-02 03:04:05|true|1.5\r\n"
            b"2|\\N|2024-01-02|0|2\r\n"
            b"3|it\\'s|2024-01-02T00:00:01|false|-3\r\n")
    hdrs = {"column_separator": "|", "row_delimiter": "\\x0d\\x0a", "enclose": "'", "escape": "\\",
            "skip_header": "1", "columns": "`id`, note, ts, ok, score"}
    txn(sr, "begin", "L", table="typed")
    assert txn(sr, "load", "L", body, table="typed", **hdrs).json["Status"] == "OK"
    assert txn(sr, "commit", "L", table="typed").json["Status"] == "OK"
    assert sr.visible_rows(DB, "typed") == [
        (1, dt.datetime(2024, 1, 2, 3, 4, 5), True, 1.5, "a|b"),
        (2, dt.datetime(2024, 1, 2), False, 2.0, None),
        (3, dt.datetime(2024, 1, 2, 0, 0, 1), False, -3.0, "it's"),
    ]


def test_csv_loads_of_one_txn_form_one_stream(sr: StarRocksEmulator) -> None:
    # SR-DOC 'Limits': every CSV record must end with the row delimiter, because the loads of
    # a txn are appended to one pipe: "1,a" + "2,b\n" is the single record "1,a2,b".
    txn(sr, "begin", "L")
    txn(sr, "load", "L", b"1,a")
    txn(sr, "load", "L", b"2,b\n")
    commit = txn(sr, "commit", "L").json
    assert (commit["Status"], commit["Message"]) == ("INTERNAL_ERROR", "too many filtered rows")
    assert "Expect 2, but got 3" in requests.get(commit["ErrorURL"], timeout=5).text
    txn(sr, "begin", "M")
    txn(sr, "load", "M", b"1,a\n")
    txn(sr, "load", "M", b"2,b")  # the last record of the stream may lack the delimiter
    assert txn(sr, "commit", "M").json["NumberLoadedRows"] == 2


def test_json_strip_outer_array_and_name_mapping(sr: StarRocksEmulator) -> None:
    txn(sr, "begin", "L")
    txn(sr, "load", "L", b'[{"id": 5}]', format="json")  # an array needs strip_outer_array
    prep = txn(sr, "prepare", "L").json
    assert (prep["Status"], prep["Message"]) == ("INTERNAL_ERROR", "too many filtered rows")
    assert "strip_outer_array" in requests.get(prep["ErrorURL"], timeout=5).text
    txn(sr, "begin", "J")
    txn(sr, "load", "J", b'[{"id": 1, "name": "a"}, {"NAME": "b", "id": "2", "x": 0}]',
        format="json", strip_outer_array="true")
    txn(sr, "load", "J", b'{"id": 3}\n{"id": 4, "name": "d"}', format="json",
        strip_outer_array="true")
    txn(sr, "commit", "J")
    assert sr.visible_rows(DB, TABLE) == [(1, "a"), (2, "b"), (3, None), (4, "d")]


# --------------------------------------------------------------------------------------------
# Admin API (other processes)
# --------------------------------------------------------------------------------------------


def test_admin_api(sr: StarRocksEmulator) -> None:
    admin = f"{sr.fe_url}/__emulator"
    assert requests.post(f"{admin}/tables", json={"db": DB, "table": "x",
                                                  "columns": [["id", "INT"]]}, timeout=5).ok
    requests.post(f"{admin}/faults/http_5xx", json={"label": "A", "params": {"status": 500}},
                  timeout=5).raise_for_status()
    assert txn(sr, "begin", "A", table="x").response.status_code == 500
    prepared(sr, "B")
    txn(sr, "commit", "B")
    rows = requests.get(f"{admin}/rows", params={"db": DB, "table": TABLE}, timeout=5).json()
    assert rows == {"rows": [[1, "a"]]}
    now = requests.post(f"{admin}/clock/advance", json={"seconds": 10}, timeout=5).json()["now"]
    assert now == sr.clock.now()
    txns = requests.get(f"{admin}/transactions", timeout=5).json()["transactions"]
    assert [(t["label"], t["state"]) for t in txns] == [("B", "VISIBLE")]
    knobs = requests.get(f"{admin}/faults", timeout=5).json()["knobs"]
    assert {"publish_timeout", "write_lock_timeout", "slow_response"} <= set(knobs)


def test_runs_as_a_separate_process(tmp_path: Any) -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.doubles.emulators.starrocks", "--data-dir",
                             str(tmp_path), "--profile", '{"version": "3.3.0"}'],
                            cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        admin = f"{info['fe_url']}/__emulator"
        requests.post(f"{admin}/tables", json={"db": DB, "table": TABLE,
                                               "columns": [["id", "INT"]]},
                      timeout=5).raise_for_status()
        begin = send("POST", f"{info['fe_url']}/api/transaction/begin",
                     headers={"label": "L", "db": DB, "table": TABLE}).json
        assert begin["Status"] == "OK"
        txns = requests.get(f"{admin}/transactions", timeout=5).json()["transactions"]
        assert [t["state"] for t in txns] == ["PREPARE"]
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------------
# Parsing units (column_types.py, conversion.py, load_formats.py)
# --------------------------------------------------------------------------------------------


def test_split_csv_edge_cases() -> None:
    fmt = LoadFormat(column_separator=",", enclose='"', escape="\\")
    assert split_csv('"a,b",c\n"x""y",\\N\n\n"",z', fmt) == [
        ["a,b", "c"], ['x"y', None], ["", "z"]]
    multi = LoadFormat(column_separator="\\x01", row_delimiter="||")
    assert split_csv("1\\x012||3\\x014||", multi) == [["1", "2"], ["3", "4"]]
    hexed = LoadFormat.from_headers({"column_separator": "\\x01", "row_delimiter": "\\x0a"})
    assert split_csv("1\x012\n3\x014\n", hexed) == [["1", "2"], ["3", "4"]]


@pytest.mark.parametrize("value, ctype, expected", [
    ("12", "INT", 12), ("2147483648", "BIGINT", 2147483648), (True, "BOOLEAN", True),
    ("1.25", "DECIMAL(5,2)", __import__("decimal").Decimal("1.25")),
    ({"a": 1}, "VARCHAR(20)", '{"a":1}'), ("2024-02-03", "DATE", dt.date(2024, 2, 3)),
])
def test_convert_value(value: Any, ctype: str, expected: Any) -> None:
    assert convert_value(value, ColumnType.parse(ctype)) == expected


@pytest.mark.parametrize("value, ctype", [
    ("2147483648", "INT"), ("1.5", "INT"), ("abc", "DOUBLE"), ("yes", "BOOLEAN"),
    ("123456", "DECIMAL(5,2)"), ("toolong", "VARCHAR(3)"), ("2024-13-01", "DATETIME"),
])
def test_convert_value_rejects(value: Any, ctype: str) -> None:
    with pytest.raises(ConversionError):
        convert_value(value, ColumnType.parse(ctype))


# --------------------------------------------------------------------------------------------
# Common: strict mode and value conversion (docs/protocol.md, "Common: strict mode", "Common: value conversion")
# --------------------------------------------------------------------------------------------

TYPED = [("id", "INT NOT NULL"), ("v", "TINYINT")]


def load_into(emu: StarRocksEmulator, table: str, columns: list[tuple[str, str]], body: bytes,
              **headers: str) -> dict[str, Any]:
    """Plain stream load into a fresh table; the answer (rows are read back with visible_rows)."""
    emu.create_table(DB, table, columns)
    hdrs = {"Expect": "100-continue", "column_separator": "|", "max_filter_ratio": "1", **headers}
    return send("PUT", f"{emu.fe_url}/api/{DB}/{table}/_stream_load", headers=hdrs, data=body).json


def test_strict_mode_is_off_by_default_and_nulls_failed_conversions(sr: StarRocksEmulator) -> None:
    # The documented TINYINT example: \N, abc, 2000, 1.
    body = b"1|\\N\n2|abc\n3|2000\n4|1\n"
    off = load_into(sr, "off", TYPED, body)
    assert (off["NumberLoadedRows"], off["NumberFilteredRows"]) == (4, 0)
    assert sr.visible_rows(DB, "off") == [(1, None), (2, None), (3, None), (4, 1)]
    on = load_into(sr, "on", TYPED, body, strict_mode="true")
    assert (on["Status"], on["NumberLoadedRows"], on["NumberFilteredRows"]) == ("Success", 2, 2)
    assert sr.visible_rows(DB, "on") == [(1, None), (4, 1)]
    assert "abc" in requests.get(on["ErrorURL"], timeout=5).text


def test_filtered_rows_count_against_max_filter_ratio(sr: StarRocksEmulator) -> None:
    body = b"1|abc\n2|1\n"
    failed = load_into(sr, "strict", TYPED, body, strict_mode="true", max_filter_ratio="0.4")
    assert (failed["Status"], failed["NumberFilteredRows"]) == ("Fail", 1)
    assert failed["ErrorURL"]
    ok = load_into(sr, "strict2", TYPED, body, strict_mode="true", max_filter_ratio="0.5")
    assert (ok["Status"], ok["NumberLoadedRows"]) == ("Success", 1)


@pytest.mark.parametrize("strict", ["false", "true"])
def test_not_null_columns_filter_nulls_whatever_strict_mode(sr: StarRocksEmulator, strict: str) -> None:
    answer = load_into(sr, "nn", TYPED, b"\\N|1\nx|2\n3|3\n", strict_mode=strict)
    assert answer["NumberFilteredRows"] == 2  # a given NULL, and a NULL made by a failed conversion
    assert sr.visible_rows(DB, "nn") == [(3, 3)]


def test_too_long_varchar_counts_bytes_and_is_a_failed_conversion(sr: StarRocksEmulator) -> None:
    cols = [("id", "INT"), ("s", "VARCHAR(4)")]
    load_into(sr, "s1", cols, "1|abcd\n2|abcde\n3|ééé\n4|éé\n".encode())
    assert sr.visible_rows(DB, "s1") == [(1, "abcd"), (2, None), (3, None), (4, "éé")]
    strict = load_into(sr, "s2", cols, b"1|abcde\n", strict_mode="true")
    assert strict["NumberFilteredRows"] == 1
    load_into(sr, "s3", [("id", "INT"), ("s", "STRING")], b"1|" + b"x" * 65534 + b"\n")
    assert sr.visible_rows(DB, "s3") == [(1, None)]  # STRING is VARCHAR(65533)


def test_integers_and_largeint(sr: StarRocksEmulator) -> None:
    cols = [("id", "INT"), ("b", "BIGINT"), ("l", "LARGEINT")]
    load_into(sr, "ints", cols, b"1|-9223372036854775808|170141183460469231731687303715884105727\n"
                                b"2|9223372036854775808|170141183460469231731687303715884105728\n3|1.5| 7 \n")
    assert sr.visible_rows(DB, "ints") == [
        (1, -2**63, 2**127 - 1), (2, None, None), (3, None, 7)]


def test_float_and_double_text(sr: StarRocksEmulator) -> None:
    cols = [("id", "INT"), ("f", "FLOAT"), ("d", "DOUBLE")]
    load_into(sr, "fl", cols, b"1|nan|NaN\n2|inf|-Infinity\n3|0.1|0.1\n4|1e39|1e999\n5|1_0|0x10\n")
    rows = sr.visible_rows(DB, "fl")
    assert math.isnan(rows[0][1]) and math.isnan(rows[0][2])
    assert rows[1][1:] == (math.inf, -math.inf)
    assert rows[2][1:] == (struct.unpack("<f", struct.pack("<f", 0.1))[0], 0.1)  # FLOAT keeps float32
    assert rows[3][1:] == (None, None) and rows[4][1:] == (None, None)  # overflow, not numbers


def test_decimal_rounds_extra_scale_and_nulls_overflow(sr: StarRocksEmulator) -> None:
    cols = [("id", "INT"), ("d", "DECIMAL(5,2)")]
    load_into(sr, "dec", cols, b"1|1.005\n2|-1.005\n3|999.994\n4|999.995\n5|1e2\n6|abc\n")
    assert sr.visible_rows(DB, "dec") == [
        (1, Decimal("1.01")), (2, Decimal("-1.01")), (3, Decimal("999.99")), (4, None), (5, Decimal("100.00")),
        (6, None)]


def test_dates_and_datetimes(sr: StarRocksEmulator) -> None:
    cols = [("id", "INT"), ("d", "DATE"), ("t", "DATETIME")]
    load_into(sr, "dt", cols, b"1|2024-02-29|2024-02-29 23:59:59.123456\n2|20240301|2024-03-01T01:02:03\n"
                              b"3|2023-02-29|2024-13-01 00:00:00\n4|9999-12-31|0001-01-01\n")
    assert sr.visible_rows(DB, "dt") == [
        (1, dt.date(2024, 2, 29), dt.datetime(2024, 2, 29, 23, 59, 59, 123456)),
        (2, dt.date(2024, 3, 1), dt.datetime(2024, 3, 1, 1, 2, 3)),
        (3, None, None), (4, dt.date(9999, 12, 31), dt.datetime(1, 1, 1))]


def test_boolean_json_and_varbinary(sr: StarRocksEmulator) -> None:
    cols = [("id", "INT"), ("b", "BOOLEAN"), ("j", "JSON"), ("bin", "VARBINARY(3)")]
    load_into(sr, "misc", cols, b'1|TRUE|{"a": [1, 2.5]}|abc\n2|0|"s"|abcd\n3|yes|{bad|\\N\n')
    assert sr.visible_rows(DB, "misc") == [
        (1, True, {"a": [1, 2.5]}, b"abc"), (2, False, "s", None), (3, None, None, None)]


def test_array_map_struct_in_csv_and_json(sr: StarRocksEmulator) -> None:
    cols = [("id", "INT"), ("a", "ARRAY<INT>"), ("m", "MAP<VARCHAR(10),INT>"), ("s", "STRUCT<x INT, y VARCHAR(5)>")]
    load_into(sr, "nested", cols, b'1|[1, 2, null]|{"k": 1, \'j\': null}|{"x": 1, "y": "ab"}\n'
                                  b"2|[1, x]|{k: 1}|{x: 2}\n3|[]|{}|[1]\n")
    assert sr.visible_rows(DB, "nested") == [
        (1, [1, 2, None], {"k": 1, "j": None}, {"x": 1, "y": "ab"}),
        (2, None, {"k": 1}, {"x": 2, "y": None}),  # one bad element fails the whole array
        (3, [], {}, None)]
    sr.create_table(DB, "nested_json", cols)
    body = json.dumps([{"id": 1, "a": [1, "2"], "m": {"k": 3}, "s": {"x": 4, "y": "z"}},
                       {"id": 2, "a": "[5]", "m": [1], "s": {"q": 1}}]).encode()
    answer = send("PUT", f"{sr.fe_url}/api/{DB}/nested_json/_stream_load", data=body, headers={
        "Expect": "100-continue", "format": "json", "strip_outer_array": "true"}).json
    assert answer["Status"] == "Success", answer
    assert sr.visible_rows(DB, "nested_json") == [
        (1, [1, 2], {"k": 3}, {"x": 4, "y": "z"}), (2, [5], None, None)]


def test_json_nan_tokens_are_not_json(sr: StarRocksEmulator) -> None:
    sr.create_table(DB, "jn", [("id", "INT"), ("d", "DOUBLE")])
    answer = send("PUT", f"{sr.fe_url}/api/{DB}/jn/_stream_load", data=b'{"id": 1, "d": NaN}', headers={
        "Expect": "100-continue", "format": "json", "max_filter_ratio": "1"}).json
    assert answer["NumberFilteredRows"] == 1
    send("PUT", f"{sr.fe_url}/api/{DB}/jn/_stream_load", data=b'{"id": 2, "d": "nan"}', headers={
        "Expect": "100-continue", "format": "json"})
    assert math.isnan(sr.visible_rows(DB, "jn")[0][1])


def test_typed_rows_survive_a_restart(sr: StarRocksEmulator) -> None:
    cols = [("id", "INT"), ("d", "DECIMAL(5,2)"), ("f", "DOUBLE"), ("j", "JSON"), ("b", "VARBINARY"),
            ("m", "MAP<INT,ARRAY<DATE>>"), ("t", "DATETIME")]
    load_into(sr, "keep", cols, b'1|1.5|-inf|{"k":[1]}|xy|{1: ["2024-01-02"]}|2024-01-02 03:04:05.5\n')
    before = sr.visible_rows(DB, "keep")
    assert before == [(1, Decimal("1.50"), -math.inf, {"k": [1]}, b"xy", {1: [dt.date(2024, 1, 2)]},
                       dt.datetime(2024, 1, 2, 3, 4, 5, 500000))]
    sr.restart()
    assert sr.visible_rows(DB, "keep") == before
    assert sr.visible_dicts(DB, "keep")[0]["j"] == {"k": [1]}


@pytest.mark.parametrize("text, spelled", [
    ("varchar(10) not null", "VARCHAR(10)"), ("MAP<VARCHAR(10), INT>", "MAP<VARCHAR(10),INT>"),
    ("STRUCT<a:INT, b VARCHAR(3)>", "STRUCT<a INT,b VARCHAR(3)>"), ("DATETIMEV2(3)", "DATETIME(3)"),
    ("ARRAY<ARRAY<DECIMAL(10,2)>>", "ARRAY<ARRAY<DECIMAL(10,2)>>"),
])
def test_column_type_parsing(text: str, spelled: str) -> None:
    ctype = ColumnType.parse(text)
    assert ctype.spelled() == spelled and ctype.nullable == ("not null" not in text)


# --------------------------------------------------------------------------------------------
# Common: table schema endpoint (docs/protocol.md, "Common: table schema endpoint")
# --------------------------------------------------------------------------------------------


def test_schema_endpoint_shape_auth_and_unknown_table(sr: StarRocksEmulator) -> None:
    sr.create_table(DB, "s", [("id", "BIGINT NOT NULL"), ("p", "DECIMAL(10,2)"), ("v", "VARCHAR(9)"),
                              ("a", "ARRAY<INT>"), ("x", "STRING")])
    resp = send("GET", f"{sr.fe_url}/api/{DB}/s/_schema").response
    assert resp.status_code == 200
    assert resp.json() == {"status": 200, "properties": [
        {"type": "BIGINT", "comment": "", "name": "id"},
        {"precision": "10", "scale": "2", "type": "DECIMAL64", "comment": "", "name": "p"},
        {"type": "VARCHAR", "comment": "", "name": "v"}, {"type": "INVALID_TYPE", "comment": "", "name": "a"},
        {"type": "VARCHAR", "comment": "", "name": "x"}]}
    missing = send("GET", f"{sr.fe_url}/api/{DB}/nope/_schema").response
    assert (missing.status_code, missing.json()) == (404, {"status": 404, "exception": "Table [nope] does not exists"})
    assert send("GET", f"{sr.fe_url}/api/{DB}/s/_schema", auth=("root", "x")).response.status_code == 401
