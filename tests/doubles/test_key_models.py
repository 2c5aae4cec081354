"""Pins the emulators' table key models to the servers' (docs/protocol.md, "StarRocks: primary key tables and `__op`",
"Doris: unique key tables, delete sign and sequence column"): what `SELECT *` shows after loads of upserts and deletes,
what each FE refuses, and what its schema endpoints say about keys.

Loads are plain stream loads (committed at once) over real HTTP, 307s followed by hand; the StarRocks PRIMARY KEY
cases also go through the transaction interface the target uses.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.doubles.emulators.client import send
from tests.support.doubles.emulators.doris import DorisEmulator
from tests.support.doubles.emulators.key_models import ModelError
from tests.support.doubles.emulators.starrocks import StarRocksEmulator

DB = "db"
COLUMNS = [("id", "INT NOT NULL"), ("name", "VARCHAR(20)")]


@pytest.fixture
def sr(tmp_path: Any) -> Iterator[StarRocksEmulator]:
    with StarRocksEmulator(tmp_path / "sr") as emu:
        emu.create_table(DB, "pk", COLUMNS, keys_type="PRIMARY_KEYS", key=("id",))
        emu.create_table(DB, "dup", COLUMNS)
        yield emu


@pytest.fixture
def dr(tmp_path: Any) -> Iterator[DorisEmulator]:
    with DorisEmulator(tmp_path / "dr") as emu:
        emu.create_table(DB, "uniq", COLUMNS, keys_type="UNIQUE_KEYS", key=("id",))
        emu.create_table(DB, "seq", COLUMNS, keys_type="UNIQUE_KEYS", key=("id",), sequence_type="BIGINT")
        emu.create_table(DB, "dup", COLUMNS)
        emu.create_table(DB, "signless", COLUMNS, keys_type="UNIQUE_KEYS", key=("id",), delete_sign=False)
        yield emu


def stream_load(emu: Any, table: str, body: bytes, columns: str | None, **headers: str) -> dict[str, Any]:
    hdrs = {"Expect": "100-continue", "column_separator": ",", **headers}
    if columns is not None:
        hdrs["columns"] = columns
    return send("PUT", f"{emu.fe_url}/api/{DB}/{table}/_stream_load", headers=hdrs, data=body).json


def loaded(emu: Any, table: str, body: bytes, columns: str | None = "id,name,__op", **headers: str) -> None:
    answer = stream_load(emu, table, body, columns, **headers)
    assert answer["Status"] == "Success", answer


def rows(emu: Any, table: str) -> list[tuple[Any, ...]]:
    return sorted(emu.visible_rows(DB, table), key=repr)


# -- StarRocks ---------------------------------------------------------------------------------------------------


def test_starrocks_primary_key_upserts_by_key_and_the_last_row_of_a_key_in_a_load_wins(sr: StarRocksEmulator) -> None:
    loaded(sr, "pk", b"1,a,0\n2,b,0\n1,a2,0\n3,c,0\n")
    assert rows(sr, "pk") == [(1, "a2"), (2, "b"), (3, "c")]
    loaded(sr, "pk", b"2,b2,0\n3,\\N,1\n4,d,0\n4,\\N,1\n")  # an update, a delete, an insert deleted in the same load
    assert rows(sr, "pk") == [(1, "a2"), (2, "b2")]
    loaded(sr, "pk", b"3,c again,0\n1,\\N,1\n")  # a re-insert, a delete
    assert rows(sr, "pk") == [(2, "b2"), (3, "c again")]


def test_starrocks_applies_a_loads_deletes_after_its_upserts_across_memtable_flushes(tmp_path: Any) -> None:
    """Within one memtable the last row of a key wins, op included (be/src/storage/memtable.cpp); across the memtables
    one load flushes, the apply step upserts every segment and then erases every delete (be/src/storage/
    tablet_updates.cpp): a delete, then a re-insert of the key in a later memtable, leaves the key deleted."""
    with StarRocksEmulator(tmp_path / "sr", memtable_rows=2) as sr:
        sr.create_table(DB, "pk", COLUMNS, keys_type="PRIMARY_KEYS", key=("id",))
        loaded(sr, "pk", b"1,a,0\n2,b,0\n")
        loaded(sr, "pk", b"1,\\N,1\n3,c,0\n1,a again,0\n2,\\N,1\n")  # memtables [delete 1, 3] [upsert 1, delete 2]
        assert rows(sr, "pk") == [(3, "c")]
        loaded(sr, "pk", b"4,\\N,1\n4,d,0\n5,e,0\n5,\\N,1\n")  # in one memtable each: the last row wins
        assert rows(sr, "pk") == [(3, "c"), (4, "d")]
        tx = "L1"
        for op, body in (("begin", b""), ("load", b"3,\\N,1\n"), ("load", b"6,f,0\n3,c back,0\n"), ("prepare", b""),
                         ("commit", b"")):  # a transaction's loads share its memtables: [delete 3, 6] [upsert 3]
            extra = {"columns": "id,name,__op", "column_separator": ","} if op == "load" else {}
            answer = send("POST" if op != "load" else "PUT", f"{sr.fe_url}/api/transaction/{op}",
                          headers={"label": tx, "db": DB, "table": "pk", **extra}, data=body).json
            assert answer["Status"] == "OK", (op, answer)
        assert rows(sr, "pk") == [(4, "d"), (6, "f")]


def test_starrocks_without_op_column_every_row_is_an_upsert(sr: StarRocksEmulator) -> None:
    loaded(sr, "pk", b"1,a\n1,b\n", columns="id,name")
    loaded(sr, "pk", b"1,c\n", columns=None)
    assert rows(sr, "pk") == [(1, "c")]


def test_starrocks_op_deletes_only_at_1_and_filters_what_is_no_tinyint(sr: StarRocksEmulator) -> None:
    """The BE counts a row as a delete only where its op is 1 (SR-PK-OP); other numbers upsert. A value that is no
    TINYINT filters its row under strict mode."""
    loaded(sr, "pk", b"1,a,0\n2,b,0\n")
    loaded(sr, "pk", b"1,a2,2\n2,b2,-1\n")
    assert rows(sr, "pk") == [(1, "a2"), (2, "b2")]
    answer = stream_load(sr, "pk", b"1,x,delete\n", "id,name,__op", strict_mode="true")
    assert (answer["Status"], answer["NumberFilteredRows"]) == ("Fail", 1)
    assert rows(sr, "pk") == [(1, "a2"), (2, "b2")]


def test_starrocks_op_on_a_duplicate_table_is_dropped_and_every_row_appended(sr: StarRocksEmulator) -> None:
    """StarRocks plans `__op` of a table that is not PRIMARY KEY as a source column no column reads: no error, and
    a delete lands as a row (Load.initColumns, SR-PK-OP). The target must refuse such a table itself."""
    loaded(sr, "dup", b"1,a,0\n1,\\N,1\n")
    assert rows(sr, "dup") == [(1, "a"), (1, None)]


def test_starrocks_primary_key_through_the_transaction_interface_and_a_restart(sr: StarRocksEmulator) -> None:
    headers = {"label": "L1", "db": DB, "table": "pk"}
    for op, body in (("begin", b""), ("load", b"1,a,0\n2,b,0\n"), ("load", b"2,\\N,1\n"), ("prepare", b"")):
        extra = {"columns": "id,name,__op", "column_separator": ","} if op == "load" else {}
        answer = send("POST" if op != "load" else "PUT", f"{sr.fe_url}/api/transaction/{op}",
                      headers={**headers, **extra}, data=body).json
        assert answer["Status"] == "OK", (op, answer)
    sr.restart()  # the prepared rows and their ops are on disk
    assert send("POST", f"{sr.fe_url}/api/transaction/commit", headers=headers).json["Status"] == "OK"
    assert rows(sr, "pk") == [(1, "a")]
    sr.restart()
    assert rows(sr, "pk") == [(1, "a")]


def test_starrocks_schema_endpoints_tell_keys_only_in_the_v2_api(sr: StarRocksEmulator, tmp_path: Any) -> None:
    v1 = send("GET", f"{sr.fe_url}/api/{DB}/pk/_schema").json
    assert "keysType" not in v1 and all(set(p) == {"name", "type", "comment"} for p in v1["properties"])  # SR-TSA
    v2 = send("GET", f"{sr.fe_url}/api/v2/catalogs/default_catalog/databases/{DB}/tables/pk/schema").json
    assert (v2["code"], v2["result"]["keysType"]) == ("0", "PRIMARY_KEYS")
    assert [(c["name"], c["isKey"]) for c in v2["result"]["columns"]] == [("id", True), ("name", False)]
    dup = send("GET", f"{sr.fe_url}/api/v2/catalogs/default_catalog/databases/{DB}/tables/dup/schema").json
    assert dup["result"]["keysType"] == "DUP_KEYS"
    missing = send("GET", f"{sr.fe_url}/api/v2/catalogs/default_catalog/databases/{DB}/tables/nope/schema").response
    assert (missing.status_code, missing.json()["message"]) == (404, "Unknown table 'nope'")
    with StarRocksEmulator(tmp_path / "old", version="3.2.10") as old:
        old.create_table(DB, "pk", COLUMNS, keys_type="PRIMARY_KEYS", key=("id",))
        answer = send("GET", f"{old.fe_url}/api/v2/catalogs/default_catalog/databases/{DB}/tables/pk/schema").response
        assert answer.status_code == 404 and answer.text == "Not Found"


def test_create_table_refuses_what_the_servers_refuse(sr: StarRocksEmulator) -> None:
    with pytest.raises(ModelError, match="prefix"):
        sr.create_table(DB, "bad", COLUMNS, keys_type="PRIMARY_KEYS", key=("name",))
    with pytest.raises(ModelError, match="needs key columns"):
        sr.create_table(DB, "bad", COLUMNS, keys_type="PRIMARY_KEYS")
    with pytest.raises(ModelError, match="not emulated"):
        sr.create_table(DB, "bad", COLUMNS, keys_type="UNIQUE_KEYS", key=("id",))


# -- Doris -------------------------------------------------------------------------------------------------------


def test_doris_unique_key_upserts_and_the_delete_sign_deletes(dr: DorisEmulator) -> None:
    columns = "id,name,__DORIS_DELETE_SIGN__"
    loaded(dr, "uniq", b"1,a,0\n2,b,0\n1,a2,0\n", columns)
    loaded(dr, "uniq", b"2,\\N,1\n3,c,0\n", columns)
    assert rows(dr, "uniq") == [(1, "a2"), (3, "c")]
    loaded(dr, "uniq", b"2,b again\n", columns="id,name")  # no sign: an upsert
    assert rows(dr, "uniq") == [(1, "a2"), (2, "b again"), (3, "c")]
    loaded(dr, "uniq", b"1,\\N\n", columns="id,name", merge_type="DELETE")  # every row of the load deletes
    assert rows(dr, "uniq") == [(2, "b again"), (3, "c")]


def test_doris_sequence_column_ignores_lower_versions_within_and_across_loads(dr: DorisEmulator) -> None:
    columns = "id,name,__DORIS_DELETE_SIGN__,v"
    seq = {"function_column.sequence_col": "v"}
    loaded(dr, "seq", b"1,a10,0,10\n1,a5,0,5\n2,b3,0,3\n", columns, **seq)  # within a load: the highest wins
    assert rows(dr, "seq") == [(1, "a10"), (2, "b3")]
    loaded(dr, "seq", b"1,a7,0,7\n2,b3 again,0,3\n", columns, **seq)  # lower: ignored; equal: the later wins
    assert rows(dr, "seq") == [(1, "a10"), (2, "b3 again")]
    loaded(dr, "seq", b"1,\\N,1,9\n2,\\N,1,4\n", columns, **seq)  # a delete with a lower sequence deletes nothing
    assert rows(dr, "seq") == [(1, "a10")]
    loaded(dr, "seq", b"2,b2,0,2\n2,b5,0,5\n", columns, **seq)  # the delete at 4 stays: 2 is ignored, 5 re-inserts
    assert rows(dr, "seq") == [(1, "a10"), (2, "b5")]
    dr.restart()
    assert rows(dr, "seq") == [(1, "a10"), (2, "b5")]


def test_doris_refuses_loads_that_do_not_fit_the_table(dr: DorisEmulator) -> None:
    def failure(table: str, columns: str, **headers: str) -> str:
        answer = stream_load(dr, table, b"1,a,0\n", columns, **headers)
        assert answer["Status"] == "Fail", answer
        return str(answer["Message"])

    assert "need to specify the sequence column" in failure("seq", "id,name,__DORIS_DELETE_SIGN__")
    assert "There is no sequence column in the table" in failure("uniq", "id,name,v", **{
        "function_column.sequence_col": "v"})
    assert "only supported in unique tables" in failure("dup", "id,name,x", merge_type="DELETE")
    merge = {"merge_type": "MERGE", "delete": "`op` = 1"}
    assert "only supported in unique tables" in failure("dup", "id,name,op", **merge)
    assert "need to upgrade table to support batch delete" in failure("signless", "id,name,op", **merge)
    assert "need to upgrade table to support batch delete" in failure("signless", "id,name", merge_type="DELETE")
    assert "Excepted DELETE ON clause" in failure("uniq", "id,name,op", merge_type="MERGE")
    assert rows(dr, "dup") == rows(dr, "uniq") == rows(dr, "seq") == rows(dr, "signless") == []


def test_doris_merge_deletes_the_rows_its_condition_holds_for_in_every_format(dr: DorisEmulator) -> None:
    """`merge_type: MERGE` sets each row's delete sign to the `delete` condition, which may read a source column no
    table column takes (D-DEL); with a sequence column a delete still needs a sequence at least the stored one."""
    merge = {"merge_type": "MERGE", "delete": "`op` = 1"}
    loaded(dr, "uniq", b"1,a,0\n2,b,0\n3,c,0\n", "id,name,op", **merge)
    loaded(dr, "uniq", b"2,\\N,1\n3,c2,0\n", "id,name,op", **merge)
    loaded(dr, "uniq", b'{"id": 3, "op": 1}\n{"id": 4, "name": "d", "op": 0}\n', "id,name,op", format="json",
           read_json_by_line="true", **merge)
    assert rows(dr, "uniq") == [(1, "a"), (4, "d")]
    loaded(dr, "seq", b"1,a,0,5\n", "id,name,op,v", **merge, **{"function_column.sequence_col": "v"})
    loaded(dr, "seq", b"1,\\N,1,4\n", "id,name,op,v", **merge, **{"function_column.sequence_col": "v"})
    assert rows(dr, "seq") == [(1, "a")]
    loaded(dr, "seq", b"1,\\N,1,5\n", "id,name,op,v", **merge, **{"function_column.sequence_col": "v"})
    assert rows(dr, "seq") == []


def test_doris_plans_a_column_the_table_lacks_as_a_dropped_source_column(dr: DorisEmulator) -> None:
    """A `columns` name that is no table column reads nothing into the table (conformance 2026-11-27 D1,
    *inference*): the delete sign named for a table without one loads the deletes as rows, the silent path that
    `merge_type` MERGE closes."""
    loaded(dr, "signless", b"1,a,0\n2,\\N,1\n", "id,name,__DORIS_DELETE_SIGN__")
    assert rows(dr, "signless") == [(1, "a"), (2, None)]
    loaded(dr, "dup", b"1,a,1\n", "id,name,__DORIS_DELETE_SIGN__")
    assert rows(dr, "dup") == [(1, "a")]


def test_doris_schema_tells_the_keys_type_and_keys_by_their_missing_aggregation(dr: DorisEmulator, tmp_path: Any) -> None:
    def props(emu: DorisEmulator, table: str) -> tuple[str, list[tuple[str, str]]]:
        data = send("GET", f"{emu.fe_url}/api/{DB}/{table}/_schema").json["data"]
        return data["keysType"], [(p["name"], p["aggregation_type"]) for p in data["properties"]]

    assert props(dr, "uniq") == ("UNIQUE_KEYS", [("id", ""), ("name", "NONE")])  # merge-on-write: 2.1's default
    assert [p["name"] for p in send("GET", f"{dr.fe_url}/api/{DB}/seq/_schema").json["data"]["properties"]] == [
        "id", "name"]  # hidden columns are not shown
    with DorisEmulator(tmp_path / "old", version="2.0.15") as old:
        old.create_table(DB, "mor", COLUMNS, keys_type="UNIQUE_KEYS", key=("id",))
        old.create_table(DB, "mow", COLUMNS, keys_type="UNIQUE_KEYS", key=("id",), merge_on_write=True)
        assert props(old, "mor") == ("UNIQUE_KEYS", [("id", ""), ("name", "REPLACE")])  # merge-on-read before 2.1
        assert props(old, "mow") == ("UNIQUE_KEYS", [("id", ""), ("name", "NONE")])
    with DorisEmulator(tmp_path / "new", version="4.0.1") as new:
        new.create_table(DB, "uniq", COLUMNS, keys_type="UNIQUE_KEYS", key=("id",))
        data = send("GET", f"{new.fe_url}/api/{DB}/uniq/_schema").json["data"]
        assert [(p["name"], p["is_key"]) for p in data["properties"]] == [("id", "Yes"), ("name", "No")]


def test_doris_sequence_mapped_to_a_table_column_needs_no_header(dr: DorisEmulator) -> None:
    """Property `function_column.sequence_col`: the table's own column is the sequence (D-SEQ)."""
    dr.create_table(DB, "mapped", [("id", "INT NOT NULL"), ("name", "VARCHAR(20)"), ("v", "BIGINT")],
                    keys_type="UNIQUE_KEYS", key=("id",), sequence_col="v")
    loaded(dr, "mapped", b"1,new,10\n", columns="id,name,v")
    loaded(dr, "mapped", b"1,old,5\n2,two,1\n", columns="id,name,v")
    assert rows(dr, "mapped") == [(1, "new", 10), (2, "two", 1)]
    with pytest.raises(ModelError, match="not exists"):
        dr.create_table(DB, "bad", COLUMNS, keys_type="UNIQUE_KEYS", key=("id",), sequence_col="v")


def test_a_duplicate_table_without_a_key_reports_its_leading_columns_as_its_sort_key(dr: DorisEmulator) -> None:
    dr.create_table(DB, "wide", [("a", "BIGINT"), ("b", "VARCHAR(10)"), ("c", "INT"), ("d", "DOUBLE")])
    data = send("GET", f"{dr.fe_url}/api/{DB}/wide/_schema").json["data"]
    assert (data["keysType"], [p["aggregation_type"] for p in data["properties"]]) == ("DUP_KEYS", ["", "", "NONE", "NONE"])
