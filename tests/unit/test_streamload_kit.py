"""The Stream Load kit reads both products' answers one way: both dialects, both `get_load_state` envelopes, one
row-accounting rule (the targets' own tests prove the same against the emulators)."""
from __future__ import annotations

from typing import Any

import pytest

from streaming_sink.errors import ConfigurationError, TargetError
from streaming_sink.targets.streamload.accounting import RowCounts
from streaming_sink.targets.streamload.fe import PROBE_LABEL, Answer, Dialect, FeClient, LabelState


def test_an_answer_is_read_in_either_dialect_and_only_in_the_one_asked_for() -> None:
    load = Answer.parse({"Status": "Success", "Message": "OK", "TxnId": 7}, Dialect.LOAD)
    rest = Answer.parse({"status": "FAILED", "msg": "no such label"}, Dialect.REST)
    assert load is not None and load.ok and load.body["TxnId"] == 7
    assert rest is not None and not rest.ok and rest.brief == "FAILED: no such label"
    assert Answer.parse({"status": "OK"}, Dialect.LOAD) is None and Answer.parse("<html>", Dialect.REST) is None
    with pytest.raises(TargetError, match="begin answered without a 'Status' \\('<html>"):
        Answer.expect("<html>" + "x" * 1000, Dialect.LOAD, "begin")


def test_an_answer_that_never_came_is_unclear_only_if_it_may_have_been_acted_on() -> None:
    assert Answer.failed("CONNECTION", "reset", applied=True).unclear
    assert not Answer.failed("CONNECTION", "refused", applied=False).unclear
    rejected = Answer.parse({"Status": "Fail", "Message": "too many filtered rows", "ErrorURL": "http://be/e"}, Dialect.LOAD)
    assert rejected is not None and not rejected.unclear and rejected.brief.endswith("(rejected rows: http://be/e)")


def test_label_states_say_committed_and_gone() -> None:
    assert [s for s in LabelState if s.committed] == [LabelState.COMMITTED, LabelState.VISIBLE]
    assert [s for s in LabelState if s.gone] == [LabelState.UNKNOWN, LabelState.ABORTED]
    assert LabelState("PRECOMMITTED") == "PRECOMMITTED" and f"{LabelState.PREPARED}" == "PREPARED"


def test_rows_add_up_when_loaded_filtered_and_unselected_are_every_row_sent() -> None:
    answer = Answer("OK", "", {"NumberLoadedRows": 8, "NumberFilteredRows": 1, "NumberUnselectedRows": 1})
    counts = RowCounts.of(answer)
    assert counts == RowCounts(8, 1, 1) and counts.adds_up_to(10) and not counts.adds_up_to(8)
    assert "8 loaded + 1 filtered + 1 unselected rows under label L, but 9 rows were sent" in counts.mismatch("X", "L", 9)
    assert RowCounts.of(Answer("OK", "", {})) is None  # a prepare that reports no counts is not checked


class _Fe:
    """An FE that answers every request with one body (or raises one error)."""

    base_url, user = "http://fe:8030", "root"

    def __init__(self, body: Any) -> None:
        self.body = body
        self.asked: list[dict[str, Any]] = []

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.asked.append({"method": method, "path": path, **kwargs})
        if isinstance(self.body, Exception):
            raise self.body
        body = self.body
        return type("Response", (), {"json": lambda _: body})()


@pytest.mark.parametrize("body, state, reason", [
    ({"status": "OK", "code": "0", "msg": "Success", "state": "aborted", "reason": "timeout"}, LabelState.ABORTED, "timeout"),
    ({"status": "OK", "msg": "Success"}, LabelState.UNKNOWN, ""),  # StarRocks: no state is UNKNOWN
    ({"code": 0, "msg": "success", "data": "PRECOMMITTED", "count": 0}, LabelState.PRECOMMITTED, ""),  # Doris httpv2
])
def test_both_products_label_state_answers_read_as_one(body: Any, state: LabelState, reason: str) -> None:
    fe = _Fe(body)
    assert FeClient(fe, "X").label_state("db", "L1") == (state, reason)  # type: ignore[arg-type]
    assert fe.asked == [{"method": "GET", "path": "/api/db/get_load_state", "params": {"label": "L1"}, "idempotent": True}]


@pytest.mark.parametrize("body, error, text", [
    ({"status": "FAILED", "msg": "unknown database, database=nope"}, ConfigurationError, "database 'nope'.*create it"),
    ({"code": 1, "msg": "unknown database, database=nope", "data": None}, ConfigurationError, "database 'nope'.*create it"),
    ({"code": 1, "msg": "No label selected.", "data": None}, TargetError, "No label selected"),
    ({"status": "OK", "state": "LOADING"}, TargetError, "unknown state 'LOADING'"),
    (["not", "an", "envelope"], TargetError, "unexpected answer"),
])
def test_a_refusal_names_what_to_fix(body: Any, error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        FeClient(_Fe(body), "X").probe("nope")  # type: ignore[arg-type]


def test_the_probe_asks_for_its_own_label() -> None:
    fe = _Fe({"status": "OK", "state": "UNKNOWN"})
    FeClient(fe, "X").probe("db")  # type: ignore[arg-type]
    assert fe.asked[0]["params"] == {"label": PROBE_LABEL}
