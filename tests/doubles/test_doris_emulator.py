"""Pins the Doris emulator to the wire facts of protocol.md part B (and C, D).

Real HTTP with plain ``requests``, 307s followed by hand (auth, headers and body re-sent). The
doris-flink-connector regexes quoted in B.1 are used as assertions: if the emulator's messages
drift, the connector-style parsing in the product would too.
"""
from __future__ import annotations

import datetime as dt
import math
import re
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
import requests

from tests.support.doubles.emulators.client import Exchange, send
from tests.support.doubles.emulators.doris import DorisEmulator, DorisProfile

DB, TABLE = "db", "t"

# B.1 'Connector parsing regexes' (DF ResponseUtil, asserted in D-RT)
COMMITTED_RE = re.compile(r"transaction \[(\d+)\] is already \b(COMMITTED|committed|VISIBLE|"
                          r"visible)\b, not pre-committed.")
ABORTED_OR_GONE_RE = re.compile(r"transaction \[(\d+)\] is already|transaction \[(\d+)\] "
                                r"not found")
LABEL_EXISTS_RE = re.compile(r"Label \[(.*)\] has already been used, relate to txn \[(\d+)\]")


@pytest.fixture
def dr(tmp_path: Any) -> Iterator[DorisEmulator]:
    with DorisEmulator(tmp_path / "doris") as emu:
        emu.create_table(DB, TABLE, [("id", "INT"), ("name", "VARCHAR(20)")])
        yield emu


def load(emu: DorisEmulator, label: str | None, data: bytes = b"1,a\n", two_pc: bool = True,
         follow: bool = True, **headers: str) -> Exchange:
    hdrs = {"Expect": "100-continue", "column_separator": ",", **headers}
    if label is not None:
        hdrs["label"] = label
    if two_pc:
        hdrs["two_phase_commit"] = "true"
    return send("PUT", f"{emu.fe_url}/api/{DB}/{TABLE}/_stream_load", headers=hdrs, data=data,
                follow=follow)


def two_pc(emu: DorisEmulator, operation: str, txn_id: Any = None, label: str | None = None,
           table: bool = False, url: str | None = None) -> Exchange:
    hdrs = {"txn_operation": operation, "Expect": "100-continue"}
    if txn_id is not None:
        hdrs["txn_id"] = str(txn_id)
    if label is not None:
        hdrs["label"] = label
    path = f"/api/{DB}/{TABLE}/_stream_load_2pc" if table else f"/api/{DB}/_stream_load_2pc"
    return send("PUT", (url or emu.fe_url) + path, headers=hdrs)


def state(emu: DorisEmulator, label: str) -> str:
    return send("GET", f"{emu.fe_url}/api/{DB}/get_load_state?label={label}").json["data"]


def precommitted(emu: DorisEmulator, label: str, data: bytes = b"1,a\n") -> int:
    body = load(emu, label, data).json
    assert body["Status"] == "Success", body
    return body["TxnId"]


def fe_msg(text: str) -> str:
    return f"TStatus: errCode = 2, detailMessage = {text}"


# --------------------------------------------------------------------------------------------
# Redirects, Expect, auth (B.1, C.13, C.14)
# --------------------------------------------------------------------------------------------


def test_fe_redirects_stream_load_and_2pc_to_the_be(dr: DorisEmulator) -> None:
    hop = load(dr, "L", follow=False).response
    assert hop.status_code == 307 and hop.content == b""
    assert hop.headers["Location"] == (f"http://root:@127.0.0.1:{dr.be_port}"  # credentials in userinfo (D9)
                                       f"/api/{DB}/{TABLE}/_stream_load?")
    ex = load(dr, "L")
    assert ex.redirected and ex.json["TwoPhaseCommit"] == "true"  # header survived the 307
    assert state(dr, "L") == "PRECOMMITTED"
    commit = two_pc(dr, "commit", ex.json["TxnId"])
    assert [h.status_code for h in commit.hops] == [307, 200]


def test_fe_stream_load_needs_expect_100_continue(dr: DorisEmulator) -> None:
    resp = send("PUT", f"{dr.fe_url}/api/{DB}/{TABLE}/_stream_load", data=b"1,a\n",
                headers={"label": "L", "two_phase_commit": "true"}).response
    assert resp.json() == {"status": "FAILED", "msg": "There is no 100-continue header"}
    assert dr.transactions() == []


def test_wrong_password_is_401(dr: DorisEmulator) -> None:
    resp = send("PUT", f"{dr.fe_url}/api/{DB}/{TABLE}/_stream_load", auth=("root", "x"),
                headers={"Expect": "100-continue", "label": "L"}, data=b"1,a\n").response
    assert resp.status_code == 401 and "WWW-Authenticate" in resp.headers
    assert dr.transactions() == []


def test_be_load_without_credentials_fails(dr: DorisEmulator) -> None:
    resp = requests.put(f"{dr.fe_url}/api/{DB}/{TABLE}/_stream_load", auth=("root", ""),
                        data=b"1,a\n", timeout=10,
                        headers={"Expect": "100-continue", "label": "L"})  # auth stripped
    assert resp.json()["Status"] == "Fail"
    assert resp.json()["Message"] == "[INTERNAL_ERROR]no valid Basic authorization"


# --------------------------------------------------------------------------------------------
# B.1 phase 1 and phase 2, exact shapes
# --------------------------------------------------------------------------------------------


def test_precommit_commit_happy_path(dr: DorisEmulator) -> None:
    body = load(dr, "L", b"1,a\n2,b\n").json
    assert list(body) == [
        "TxnId", "Label", "Comment", "TwoPhaseCommit", "Status", "Message", "NumberTotalRows",
        "NumberLoadedRows", "NumberFilteredRows", "NumberUnselectedRows", "LoadBytes",
        "LoadTimeMs", "BeginTxnTimeMs", "StreamLoadPutTimeMs", "ReadDataTimeMs",
        "WriteDataTimeMs", "ReceiveDataTimeMs", "CommitAndPublishTimeMs"]
    assert (body["Status"], body["Message"], body["NumberLoadedRows"]) == ("Success", "OK", 2)
    txn_id = body["TxnId"]
    assert dr.visible_rows(DB, TABLE) == []
    envelope = send("GET", f"{dr.fe_url}/api/{DB}/get_load_state?label=L").json
    assert envelope == {"msg": "success", "code": 0, "data": "PRECOMMITTED", "count": 0}

    commit = two_pc(dr, "commit", txn_id)
    assert commit.json == {"status": "Success",
                           "msg": f"transaction [{txn_id}] commit successfully."}
    assert commit.response.text.startswith('{\n    "status"')
    assert dr.visible_rows(DB, TABLE) == [(1, "a"), (2, "b")]
    assert state(dr, "L") == "VISIBLE"


def test_non_2pc_load_is_visible_at_once(dr: DorisEmulator) -> None:
    body = load(dr, "L", two_pc=False).json
    assert (body["Status"], body["TwoPhaseCommit"]) == ("Success", "false")
    assert dr.visible_rows(DB, TABLE) == [(1, "a")]


def test_recommit_is_not_success_but_matches_the_committed_regex(dr: DorisEmulator) -> None:
    txn_id = precommitted(dr, "L")
    two_pc(dr, "commit", txn_id)
    again = two_pc(dr, "commit", txn_id).json  # C.3: non-Success, pattern-matched
    assert again == {"status": "ANALYSIS_ERROR",
                     "msg": fe_msg(f"transaction [{txn_id}] is already visible, "
                                   f"not pre-committed.")}
    assert COMMITTED_RE.search(again["msg"]).group(1) == str(txn_id)
    abort = two_pc(dr, "abort", txn_id).json
    assert abort["msg"] == fe_msg(f"transaction [{txn_id}] is already VISIBLE, could not abort.")
    assert ABORTED_OR_GONE_RE.search(abort["msg"])
    assert [t["commit_count"] for t in dr.transactions()] == [2]


def test_publish_delay_shows_committed_then_visible(dr: DorisEmulator) -> None:
    txn_id = precommitted(dr, "L")
    dr.faults.publish_timeout.arm(visible_after=10)
    assert two_pc(dr, "commit", txn_id).json["status"] == "Success"
    assert state(dr, "L") == "COMMITTED"
    again = two_pc(dr, "commit", txn_id).json
    assert again["msg"].endswith("is already committed, not pre-committed.")
    assert COMMITTED_RE.search(again["msg"])
    dr.clock.advance(10)
    assert state(dr, "L") == "VISIBLE"


def test_abort_then_commit_then_label_reuse(dr: DorisEmulator) -> None:
    txn_id = precommitted(dr, "L")
    assert two_pc(dr, "abort", txn_id, table=True).json == {
        "status": "Success", "msg": f"transaction [{txn_id}] abort successfully."}
    commit = two_pc(dr, "commit", txn_id).json
    assert commit["msg"] == fe_msg(f"transaction [{txn_id}] is already aborted. "
                                   f"abort reason: User Abort")
    again = two_pc(dr, "abort", txn_id).json
    assert again["msg"] == fe_msg(f"transaction [{txn_id}] is already aborted, "
                                  f"abort reason: User Abort")
    assert ABORTED_OR_GONE_RE.search(again["msg"])
    reuse = load(dr, "L").json  # C.11: the label is free again after an abort
    assert reuse["Status"] == "Success" and reuse["TxnId"] != txn_id


def test_commit_of_a_load_still_streaming_is_refused(dr: DorisEmulator) -> None:
    go = threading.Event()

    def body() -> Iterator[bytes]:
        yield b"1,a\n"
        go.wait(10)

    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(load=send(
        "PUT", f"{dr.be_url}/api/{DB}/{TABLE}/_stream_load", data=body(),
        headers={"label": "L", "two_phase_commit": "true", "column_separator": ","}).json))
    thread.start()
    deadline = time.monotonic() + 10
    while not dr.transactions():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    txn_id = dr.transactions()[0]["txn_id"]
    assert two_pc(dr, "commit", txn_id).json["msg"] == fe_msg(
        f"transaction [{txn_id}] is prepare, not pre-committed.")
    busy = load(dr, "L").json  # a concurrent load on the label: RUNNING
    assert (busy["Status"], busy["ExistingJobStatus"]) == ("Label Already Exists", "RUNNING")
    assert two_pc(dr, "abort", label="L").json["status"] == "Success"
    go.set()
    thread.join(10)
    assert result["load"]["Status"] == "Fail"
    assert state(dr, "L") == "ABORTED"


def test_not_found_and_bad_arguments(dr: DorisEmulator) -> None:
    gone = two_pc(dr, "commit", 424242).json
    assert gone == {"status": "ANALYSIS_ERROR",
                    "msg": fe_msg("transaction [424242] not found")}
    assert ABORTED_OR_GONE_RE.search(gone["msg"])
    bad_id = two_pc(dr, "commit", "x12").json
    assert bad_id == {"status": "INTERNAL_ERROR", "msg": "convert txn_id [x12] failed"}
    bad_op = two_pc(dr, "Commit", 1).json
    assert bad_op == {"status": "INTERNAL_ERROR",
                      "msg": "transaction operation should be 'commit' or 'abort'"}
    no_op = send("PUT", f"{dr.fe_url}/api/{DB}/_stream_load_2pc", headers={"txn_id": "1"}).json
    assert no_op == {"status": "FAILED",
                     "msg": "No transaction operation('commit' or 'abort') selected."}
    no_id = send("PUT", f"{dr.fe_url}/api/{DB}/_stream_load_2pc",
                 headers={"txn_operation": "commit"}).json
    assert no_id == {"status": "FAILED", "msg": "No transaction id selected."}


# --------------------------------------------------------------------------------------------
# Labels (B.1 'Label-exists response', B.2 probe, C.10-C.12)
# --------------------------------------------------------------------------------------------


def test_label_already_exists_precommitted_then_finished(dr: DorisEmulator) -> None:
    txn_id = precommitted(dr, "L")
    dup = load(dr, "L", b"9,z\n").json
    assert (dup["TxnId"], dup["Status"], dup["ExistingJobStatus"]) == (
        -1, "Label Already Exists", "PRECOMMITTED")
    assert dup["Message"] == ("[LABEL_ALREADY_EXISTS]TStatus: errCode = 2, detailMessage = "
                              f"Label [L] has already been used, relate to txn [{txn_id}]")
    assert LABEL_EXISTS_RE.search(dup["Message"]).groups() == ("L", str(txn_id))
    two_pc(dr, "commit", txn_id)
    assert load(dr, "L").json["ExistingJobStatus"] == "FINISHED"
    assert dr.visible_rows(DB, TABLE) == [(1, "a")]


def test_empty_body_probe_precommits_zero_rows(dr: DorisEmulator) -> None:
    probe = load(dr, "probe", b"").json  # B.2 lingering-abort probe
    assert (probe["Status"], probe["NumberTotalRows"]) == ("Success", 0)
    assert state(dr, "probe") == "PRECOMMITTED"
    assert two_pc(dr, "abort", probe["TxnId"]).json["status"] == "Success"


def test_label_based_2pc_on_2_1(dr: DorisEmulator) -> None:
    precommitted(dr, "L")
    assert two_pc(dr, "commit", label="L").json == {
        "status": "Success", "msg": "label [L] commit successfully."}
    assert dr.visible_rows(DB, TABLE) == [(1, "a")]
    txn_id = precommitted(dr, "M", b"2,b\n")
    assert two_pc(dr, "abort", txn_id, label="M").json["msg"] == (
        f"label [M] transaction [{txn_id}] abort successfully.")
    missing = two_pc(dr, "abort", label="nope").json
    assert missing["msg"] == fe_msg("running transaction not found, label=nope")


def test_older_profiles_wording(tmp_path: Any) -> None:
    with DorisEmulator(tmp_path, version="1.2.7") as emu:
        emu.create_table(DB, TABLE, [("id", "INT"), ("name", "VARCHAR(20)")])
        txn_id = precommitted(emu, "L")
        body = load(emu, "L").json
        assert "Comment" not in body and "ReceiveDataTimeMs" not in body
        assert body["Message"] == (f"errCode = 2, detailMessage = Label [L] has already been "
                                   f"used, relate to txn [{txn_id}]")
        by_label = two_pc(emu, "commit", label="L").json  # label 2PC needs 2.1
        assert by_label == {"status": "FAILED", "msg": "No transaction id selected."}
        direct = two_pc(emu, "commit", label="L", url=emu.be_url).json
        assert direct == {"status": "Internal error", "msg": "convert txn_id [] failed"}
        two_pc(emu, "commit", txn_id)
        again = two_pc(emu, "commit", txn_id).json
        assert again == {"status": "Fail", "msg": f"errCode = 2, detailMessage = transaction "
                                                  f"[{txn_id}] is already visible, not "
                                                  f"pre-committed."}


# --------------------------------------------------------------------------------------------
# Timeouts and retention on the clock (C.8, C.9)
# --------------------------------------------------------------------------------------------


def test_precommitted_expires_after_3600s(dr: DorisEmulator) -> None:
    txn_id = precommitted(dr, "L")
    dr.clock.advance(3600)
    assert state(dr, "L") == "PRECOMMITTED"
    dr.clock.advance(1)
    assert state(dr, "L") == "ABORTED"
    commit = two_pc(dr, "commit", txn_id).json
    assert commit["msg"] == fe_msg(f"transaction [{txn_id}] is already aborted. "
                                   f"abort reason: timeout by txn manager")


def test_label_retention_12h_then_not_found(dr: DorisEmulator) -> None:
    txn_id = precommitted(dr, "L")
    two_pc(dr, "commit", txn_id)
    dr.clock.advance(43200)
    assert state(dr, "L") == "VISIBLE"
    dr.clock.advance(1)
    assert state(dr, "L") == "UNKNOWN"
    gone = two_pc(dr, "commit", txn_id).json  # doris #13341
    assert gone["msg"] == fe_msg(f"transaction [{txn_id}] not found")
    assert load(dr, "L").json["Status"] == "Success"  # label reusable after eviction


def test_label_num_threshold_forgets_the_oldest_finished_txns(tmp_path: Any) -> None:
    """B.1 / C.9: past label_num_threshold finished (VISIBLE/ABORTED) stream loads in a database,
    the oldest are forgotten whatever their age (apache/doris
    `DatabaseTransactionMgr.removeUselessTxns`); running and pre-committed ones never count."""
    with DorisEmulator(tmp_path, label_num_threshold=3) as emu:
        emu.create_table(DB, TABLE, [("id", "INT"), ("name", "VARCHAR(20)")])
        emu.create_table("other", TABLE, [("id", "INT"), ("name", "VARCHAR(20)")])
        other = send("PUT", f"{emu.fe_url}/api/other/{TABLE}/_stream_load", data=b"9,z\n", headers={
            "Expect": "100-continue", "label": "O", "column_separator": ","}).json
        assert other["Status"] == "Success"
        txn_id = precommitted(emu, "L")
        assert two_pc(emu, "commit", txn_id).json["status"] == "Success"
        pending = precommitted(emu, "P")  # PRECOMMITTED: not finished, not counted
        assert load(emu, "V", two_pc=False).json["Status"] == "Success"  # VISIBLE at once
        assert two_pc(emu, "abort", precommitted(emu, "A")).json["status"] == "Success"
        assert state(emu, "L") == "VISIBLE"  # 3 finished: at the threshold, nothing forgotten
        assert load(emu, "W", two_pc=False).json["Status"] == "Success"  # the 4th: the oldest goes
        assert state(emu, "L") == "UNKNOWN"
        assert [state(emu, label) for label in ("V", "A", "W", "P")] == [
            "VISIBLE", "ABORTED", "VISIBLE", "PRECOMMITTED"]
        gone = two_pc(emu, "commit", txn_id).json
        assert gone["msg"] == fe_msg(f"transaction [{txn_id}] not found")  # doris #13341
        assert two_pc(emu, "commit", pending).json["status"] == "Success"
        other_state = send("GET", f"{emu.fe_url}/api/other/get_load_state?label=O").json["data"]
        assert other_state == "VISIBLE"  # counted per database
        assert len(emu.visible_rows(DB, TABLE)) == 4  # the label is forgotten, not the data


def test_label_num_threshold_defaults_and_can_be_disabled(tmp_path: Any) -> None:
    """2000 by default (B.1); -1 disables it; FEs before 2.0 have none (first release UNCONFIRMED)."""
    assert DorisProfile().label_num_threshold == 2000
    assert DorisProfile(version="1.2.7").label_num_threshold == -1
    with DorisEmulator(tmp_path, label_num_threshold=-1, streaming_label_keep_max_second=10) as emu:
        emu.create_table(DB, TABLE, [("id", "INT"), ("name", "VARCHAR(20)")])
        for i in range(5):
            assert load(emu, f"V{i}", two_pc=False).json["Status"] == "Success"
        assert {state(emu, f"V{i}") for i in range(5)} == {"VISIBLE"}
        emu.clock.advance(11)
        assert {state(emu, f"V{i}") for i in range(5)} == {"UNKNOWN"}  # time still evicts


# --------------------------------------------------------------------------------------------
# Data and limits
# --------------------------------------------------------------------------------------------


def test_too_many_filtered_rows_fail_the_load(dr: DorisEmulator) -> None:
    body = load(dr, "L", b"1,a\n2\n").json
    assert (body["Status"], body["Message"]) == ("Fail",
                                                 "[DATA_QUALITY_ERROR]too many filtered rows")
    assert "Value count does not match" in requests.get(body["ErrorURL"], timeout=5).text
    assert state(dr, "L") == "ABORTED"
    ok = load(dr, "L", b"1,a\n2\n", max_filter_ratio="0.5").json
    assert (ok["Status"], ok["NumberFilteredRows"]) == ("Success", 1)


def test_json_load(dr: DorisEmulator) -> None:
    txn_id = load(dr, "L", b'[{"id": 1, "name": "a"}, {"id": 2}]', format="json",
                  strip_outer_array="true").json["TxnId"]
    two_pc(dr, "commit", txn_id)
    assert dr.visible_rows(DB, TABLE) == [(1, "a"), (2, None)]


def test_running_txn_limit(tmp_path: Any) -> None:
    with DorisEmulator(tmp_path, max_running_txn_num_per_db=1) as emu:
        emu.create_table(DB, TABLE, [("id", "INT"), ("name", "VARCHAR(20)")])
        precommitted(emu, "a")
        body = load(emu, "b").json
        assert body["Status"] == "Fail"
        assert "current running txns on db 10001 is 1, larger than limit 1" in body["Message"]


# --------------------------------------------------------------------------------------------
# Fault knobs
# --------------------------------------------------------------------------------------------


def test_publish_timeout_on_non_2pc_load(dr: DorisEmulator) -> None:
    dr.faults.publish_timeout.arm(op="stream_load", visible_after=5)
    assert load(dr, "L", two_pc=False).json["Status"] == "Publish Timeout"
    assert state(dr, "L") == "COMMITTED"
    dr.clock.advance(5)
    assert dr.visible_rows(DB, TABLE) == [(1, "a")]


def test_write_lock_timeout_keeps_precommitted(dr: DorisEmulator) -> None:
    txn_id = precommitted(dr, "L")
    dr.faults.write_lock_timeout.arm(label="L")
    failed = two_pc(dr, "commit", txn_id).json
    assert failed["status"] != "Success" and "get tableList write lock timeout" in failed["msg"]
    assert state(dr, "L") == "PRECOMMITTED"
    assert two_pc(dr, "commit", txn_id).json["status"] == "Success"


def test_drop_connection_after_commit(dr: DorisEmulator) -> None:
    txn_id = precommitted(dr, "L")
    dr.faults.drop_connection_after_commit.arm(label="L")
    with pytest.raises(requests.ConnectionError):
        two_pc(dr, "commit", txn_id)
    assert state(dr, "L") == "VISIBLE"


def test_drop_before_5xx_expire_and_slow(dr: DorisEmulator) -> None:
    dr.faults.drop_connection_before.arm(op="stream_load")
    with pytest.raises(requests.ConnectionError):
        load(dr, "A")
    dr.faults.http_5xx.arm(op="stream_load", role="be")
    assert [h.status_code for h in load(dr, "A").hops] == [307, 503]
    assert dr.transactions() == []
    txn_id = precommitted(dr, "A")
    dr.faults.expire_prepared.arm(label="A", op="commit")
    assert "timeout by txn manager" in two_pc(dr, "commit", txn_id).json["msg"]
    dr.faults.slow_response.arm(op="stream_load", role="be", seconds=60)
    with pytest.raises(requests.ReadTimeout):
        send("PUT", f"{dr.be_url}/api/{DB}/{TABLE}/_stream_load", timeout=0.3, data=b"2,b\n",
             headers={"label": "B", "two_phase_commit": "true", "column_separator": ","})
    dr.faults.release()
    assert state(dr, "B") == "PRECOMMITTED"


# --------------------------------------------------------------------------------------------
# Persistence and restarts
# --------------------------------------------------------------------------------------------


def test_restart_keeps_precommitted_and_visible(dr: DorisEmulator, tmp_path: Any) -> None:
    pre = precommitted(dr, "P")
    vis = precommitted(dr, "V", b"2,b\n")
    two_pc(dr, "commit", vis)
    dr.restart()
    assert state(dr, "P") == "PRECOMMITTED"
    assert dr.visible_rows(DB, TABLE) == [(2, "b")]
    assert two_pc(dr, "commit", pre).json["status"] == "Success"
    dr.stop()
    with DorisEmulator(tmp_path / "doris") as other:
        assert sorted(other.visible_rows(DB, TABLE)) == [(1, "a"), (2, "b")]
        assert {t["label"]: t["state"] for t in other.transactions()} == {"P": "VISIBLE",
                                                                          "V": "VISIBLE"}


def test_be_restart_aborts_the_load_in_flight(dr: DorisEmulator) -> None:
    go = threading.Event()

    def body() -> Iterator[bytes]:
        yield b"1,a\n"
        go.wait(10)

    def run() -> None:
        try:
            send("PUT", f"{dr.be_url}/api/{DB}/{TABLE}/_stream_load", data=body(),
                 headers={"label": "L", "two_phase_commit": "true", "column_separator": ","})
        except requests.RequestException:
            pass

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 10
    while not dr.transactions():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    dr.restart_be()
    go.set()
    thread.join(10)
    assert dr.transactions()[0]["reason"] == "coordinate BE is down"
    assert load(dr, "L").json["Status"] == "Success"


# --------------------------------------------------------------------------------------------
# Strict mode, value conversion, Arrow (docs/protocol.md, "Common: strict mode", "Common: value conversion",
# "Doris: Arrow and Parquet loads")
# --------------------------------------------------------------------------------------------


def load_table(emu: DorisEmulator, table: str, columns: list[tuple[str, str]], body: bytes, two_pc: bool = False,
               **headers: str) -> dict[str, Any]:
    emu.create_table(DB, table, columns)
    hdrs = {"Expect": "100-continue", "column_separator": "|", "max_filter_ratio": "1", **headers}
    if two_pc:
        hdrs["two_phase_commit"] = "true"
    return send("PUT", f"{emu.fe_url}/api/{DB}/{table}/_stream_load", headers=hdrs, data=body).json


def arrow_body(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_doris_strict_mode_default_off_and_not_null(dr: DorisEmulator) -> None:
    cols = [("id", "INT NOT NULL"), ("v", "TINYINT")]
    off = load_table(dr, "off", cols, b"1|abc\n2|2000\n\\N|1\n")
    assert (off["NumberLoadedRows"], off["NumberFilteredRows"]) == (2, 1)
    assert dr.visible_rows(DB, "off") == [(1, None), (2, None)]
    on = load_table(dr, "on", cols, b"1|abc\n2|1\n", strict_mode="true")
    assert (on["NumberLoadedRows"], on["NumberFilteredRows"]) == (1, 1) and on["ErrorURL"]


def test_doris_too_long_varchar_by_version(dr: DorisEmulator, tmp_path: Any) -> None:
    cols = [("id", "INT"), ("s", "CHAR(10)")]
    before_4 = load_table(dr, "s", cols, b"1|a1234567890\n2|ok\n")
    assert before_4["NumberFilteredRows"] == 1  # a data-quality error whatever strict mode says
    with DorisEmulator(tmp_path / "d4", version="4.0.1") as emu:
        load_table(emu, "s", cols, b"1|a1234567890\n")
        assert emu.visible_rows(DB, "s") == [(1, "a123456789")]  # 4.x docs: truncated when not strict
        strict = load_table(emu, "t", cols, b"1|a1234567890\n", strict_mode="true")
        assert strict["NumberFilteredRows"] == 1


def test_doris_datetime_scale(dr: DorisEmulator) -> None:
    cols = [("id", "INT"), ("t0", "DATETIME"), ("t3", "DATETIME(3)"), ("d", "DATEV2")]
    load_table(dr, "ts", cols, b"1|2024-01-02 03:04:05.6|2024-01-02 03:04:05.1234|2024-01-02 10:00:00\n")
    assert dr.visible_rows(DB, "ts") == [(1, dt.datetime(2024, 1, 2, 3, 4, 6), dt.datetime(2024, 1, 2, 3, 4, 5, 123000),
                                          dt.date(2024, 1, 2))]


def test_arrow_load_by_name_with_two_phase_commit(dr: DorisEmulator) -> None:
    cols = [("id", "BIGINT NOT NULL"), ("name", "VARCHAR(5)"), ("price", "DECIMAL(6,2)"), ("ts", "DATETIME(6)"),
            ("tags", "ARRAY<INT>"), ("attrs", "MAP<VARCHAR(5),DOUBLE>"), ("raw", "STRING")]
    table = pa.table({
        "name": pa.array(["a", "toolong", None]), "ID": pa.array([1, 2, 3], pa.int64()),
        "price": pa.array([Decimal("1.5"), Decimal("2.25"), Decimal("3")], pa.decimal128(5, 2)),
        "ts": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 6)] * 3, pa.timestamp("us")),
        "tags": pa.array([[1, 2], [], None], pa.list_(pa.int32())),
        "attrs": pa.array([[("k", float("nan"))], [], None], pa.map_(pa.string(), pa.float64())),
        "raw": pa.array(["x", "y", "z"]),
    })
    answer = load_table(dr, "arrow", cols, arrow_body(table), two_pc=True, format="arrow")
    # "toolong" does not fit VARCHAR(5): a data-quality error before 4.0, so that row is filtered.
    assert (answer["Status"], answer["TwoPhaseCommit"], answer["NumberLoadedRows"],
            answer["NumberFilteredRows"]) == ("Success", "true", 2, 1)
    assert dr.visible_rows(DB, "arrow") == []
    two_pc(dr, "commit", answer["TxnId"])
    rows = dr.visible_rows(DB, "arrow")
    moment = dt.datetime(2024, 1, 2, 3, 4, 5, 6)
    assert [r[:5] for r in rows] == [(1, "a", Decimal("1.50"), moment, [1, 2]), (3, None, Decimal("3.00"), moment, None)]
    assert math.isnan(rows[0][5]["k"]) and rows[1][5] is None and [r[6] for r in rows] == ["x", "z"]


def test_arrow_load_applies_strict_mode_and_not_null(dr: DorisEmulator) -> None:
    cols = [("id", "INT NOT NULL"), ("v", "TINYINT")]
    table = pa.table({"id": pa.array([1, None, 3], pa.int64()), "v": pa.array(["5", "x", "300"])})
    off = load_table(dr, "a1", cols, arrow_body(table), format="arrow")
    assert (off["NumberLoadedRows"], off["NumberFilteredRows"]) == (2, 1)
    assert dr.visible_rows(DB, "a1") == [(1, 5), (3, None)]
    on = load_table(dr, "a2", cols, arrow_body(table), format="arrow", strict_mode="true")
    assert (on["NumberLoadedRows"], on["NumberFilteredRows"]) == (1, 2)
    empty = load_table(dr, "a3", cols, b"", two_pc=True, format="arrow")  # a probe: zero rows
    assert (empty["Status"], empty["NumberTotalRows"]) == ("Success", 0)
    bad = load_table(dr, "a4", cols, b"not arrow", format="arrow")
    assert bad["Status"] == "Fail" and "arrow" in bad["Message"]


def test_arrow_needs_2_1_and_parquet_is_not_emulated(tmp_path: Any, dr: DorisEmulator) -> None:
    with DorisEmulator(tmp_path / "d20", version="2.0.4") as old:
        answer = load_table(old, "t", [("id", "INT")], b"", format="arrow")
        assert answer["Status"] == "Fail" and "unknown data format" in answer["Message"]
    assert load_table(dr, "p", [("id", "INT")], b"PAR1", format="parquet")["Status"] == "Fail"


def test_doris_schema_endpoint(dr: DorisEmulator, tmp_path: Any) -> None:
    cols = [("id", "BIGINT NOT NULL"), ("p", "DECIMAL(30,4)"), ("d", "DATE"), ("t", "DATETIME(3)"),
            ("m", "MAP<INT,INT>"), ("s", "STRING")]
    dr.create_table(DB, "s", cols)
    body = send("GET", f"{dr.fe_url}/api/{DB}/s/_schema").json
    assert (body["msg"], body["code"], body["data"]["status"], body["data"]["keysType"]) == ("success", 0, 200, "DUP_KEYS")
    assert [(p["name"], p["type"], p.get("precision"), p.get("scale")) for p in body["data"]["properties"]] == [
        ("id", "BIGINT", None, None), ("p", "DECIMAL128", "30", "4"), ("d", "DATEV2", None, None),
        ("t", "DATETIMEV2", None, None), ("m", "MAP", None, None), ("s", "STRING", None, None)]
    assert "is_nullable" not in body["data"]["properties"][0]
    missing = send("GET", f"{dr.fe_url}/api/{DB}/nope/_schema").response
    assert (missing.status_code, missing.json()) == (200, {"msg": "Error", "code": 1,
                                                           "data": "table not found, tableName=nope", "count": 0})
    assert send("GET", f"{dr.fe_url}/api/{DB}/s/_schema", auth=("root", "x")).response.status_code == 401
    with DorisEmulator(tmp_path / "d4", version="4.0.1") as emu:
        emu.create_table(DB, "s", cols)
        props = send("GET", f"{emu.fe_url}/api/{DB}/s/_schema").json["data"]["properties"]
        assert [p["is_nullable"] for p in props] == ["No", "Yes", "Yes", "Yes", "Yes", "Yes"]
