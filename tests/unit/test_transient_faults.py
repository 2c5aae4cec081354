"""What the sink calls a transient fault (errors.TRANSIENT_CAUSES), which ClickHouse statements it sends again after
one, and the packaged job's restarts of its query after one: bounded, counted, and one line when it persists
(issue 38, item 9)."""
from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest

from streaming_sink import job as job_module
from streaming_sink import retry
from streaming_sink.errors import (
    ReplayMismatchError,
    TransientFaultPersistedError,
    UnknownTableError,
    transient_cause,
)
from streaming_sink.job import run_query
from streaming_sink.job_spec import JobSpec
from streaming_sink.metrics import BatchMetrics
from streaming_sink.targets.clickhouse import ClickHouseError
from streaming_sink.targets.clickhouse.connection import StatementRetries, repeatable_statement
from streaming_sink.targets.clickhouse.target import CommitInterruptedError

# What the issue's run met, as the sink and Spark said it
LOST_ANSWER = ("Error ('Connection aborted.', RemoteDisconnected('Remote end closed connection without response')) "
               "executing HTTP request attempt 1 (http://ch:8123)")
REFUSED = ("Error HTTPConnectionPool(host='ch', port=8123): Max retries exceeded with url: /? (Caused by "
           "NewConnectionError('<urllib3.connection.HTTPConnection object at 0x7f>: Failed to establish a new "
           "connection: [Errno 111] Connection refused')) executing HTTP request attempt 1 (http://ch:8123)")
EXECUTOR_LOST = ("An error occurred while calling o412.collectToPython.\n: org.apache.spark.SparkException: Job aborted "
                 "due to stage failure: Task 1 in stage 31.0 failed 4 times, most recent failure: Lost task 1.3 in stage "
                 "31.0 (TID 97) (10.0.0.7 executor 3): ExecutorLostFailure (executor 3 exited caused by one of the running "
                 "tasks) Reason: Remote RPC client disassociated. Likely due to containers exceeding thresholds")


def test_the_issues_faults_are_transient_and_say_whether_the_server_may_have_acted() -> None:
    lost = transient_cause(ClickHouseError(LOST_ANSWER))
    assert lost is not None and lost.name == "connection lost" and lost.reached_server
    refused = transient_cause(ClickHouseError(REFUSED))
    assert refused is not None and refused.name == "connection refused" and not refused.reached_server
    spark = transient_cause(RuntimeError(EXECUTOR_LOST))
    assert spark is not None and spark.name == "executor lost"
    busy = transient_cause(ClickHouseError("Received ClickHouse exception, code: 999, server response: Code: 999. "
                                           "DB::Exception: Session expired. (KEEPER_EXCEPTION)"))
    assert busy is not None and busy.name == "server busy"
    proxy = transient_cause(ClickHouseError("HTTP driver received HTTP status 502, server response: Bad Gateway"))
    assert proxy is not None and proxy.name == "server unavailable"


def test_a_fault_is_found_in_the_causes_of_the_error_raised() -> None:
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError as reset:
            raise RuntimeError("the writer failed") from reset
    except RuntimeError as error:
        cause = transient_cause(error)
    assert cause is not None and cause.name == "connection lost"


@pytest.mark.parametrize("error", [
    ClickHouseError("Received ClickHouse exception, code: 60, server response: Code: 60. DB::Exception: Table x "
                    "does not exist. (UNKNOWN_TABLE)"),
    ClickHouseError("Received ClickHouse exception, code: 62, server response: Code: 62. Syntax error (SYNTAX_ERROR)"),
    RuntimeError("java.lang.OutOfMemoryError: Java heap space"),
    RuntimeError("Job 12 cancelled because SparkContext was shut down"),
    # the sink's own verdicts, whatever fault their text quotes
    CommitInterruptedError(f"commit of x was interrupted: {LOST_ANSWER}"),
    ReplayMismatchError(f"partition 0 differs ({LOST_ANSWER})"),
    UnknownTableError("table 't' met unknown fields; Connection reset"),
])
def test_what_going_again_will_not_cure_is_not_transient(error: BaseException) -> None:
    assert transient_cause(error) is None


@pytest.mark.parametrize("sql, repeatable", [
    ("SELECT count() FROM `db`.`ss_x`", True),
    ("EXISTS TABLE `db`.`ss_x`", True),
    ("SYSTEM SYNC REPLICA `db`.`_streaming_sink_ledger` LIGHTWEIGHT", True),
    ("CREATE TABLE IF NOT EXISTS `db`.`_streaming_sink_ledger` (label String) ENGINE = MergeTree ORDER BY label", True),
    ("DROP TABLE IF EXISTS `db`.`ss_x` SYNC", True),
    ("ALTER TABLE `db`.`t` ADD COLUMN IF NOT EXISTS `c` Nullable(String), ADD COLUMN IF NOT EXISTS `d` Int64", True),
    ("SYSTEM STOP MERGES `db`.`ss_x`", True),
    # a second run would differ, or may not be safe, if the first one was applied
    ("CREATE TABLE `db`.`ss_x` AS `db`.`t`", False),
    ("INSERT INTO `db`.`_streaming_sink_ledger` (label) VALUES ('x')", False),
    ("ALTER TABLE `db`.`ss_x` MOVE PARTITION ID 'all' TO TABLE `db`.`t`", False),
    ("ALTER TABLE `db`.`l` DELETE WHERE batch < 3", False),
    ("ALTER TABLE `db`.`t` ADD COLUMN IF NOT EXISTS `c` Int64, DROP COLUMN `d`", False),
    ("DROP TABLE `db`.`ss_x`", False),
    ("INSERT INTO `db`.`t` SELECT * FROM `db`.`ss_x`", False),
])
def test_which_statements_are_sent_again_after_their_answer_was_lost(sql: str, repeatable: bool) -> None:
    assert repeatable_statement(sql) is repeatable


# -- the packaged job's restarts of its query -----------------------------------------------------------------------


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pauses before each restart, taken instead of slept."""
    taken: list[float] = []
    monkeypatch.setattr(retry, "sleep", taken.append)
    return taken


def _spec(**overrides: Any) -> JobSpec:
    return JobSpec(job_id="j", bootstrap="k:9092", topics=["t"], schema="id INT", target_url="chdb:///tmp/x", database="default",
                   state_url="file:///tmp/s", checkpoint="/tmp/c", table="t", **overrides)


class Query:
    """A streaming query that fails with `failures` (one per start, in turn), then runs to its end; a batch finishes
    at each start listed in `finishes`."""

    def __init__(self, failures: list[BaseException], finishes: tuple[int, ...] = ()) -> None:
        self.failures, self.finishes, self.starts = list(failures), finishes, 0
        self.sink = SimpleNamespace(last_report=None, target=None)

    def __call__(self) -> None:
        self.starts += 1
        if self.starts in self.finishes:
            self.sink.last_report = SimpleNamespace(batch_id=self.starts)
        if self.failures:
            raise self.failures.pop(0)


def test_a_query_that_fails_on_a_transient_fault_is_restarted_in_the_process_and_counted(pauses: list[float]) -> None:
    metrics = BatchMetrics("j")
    query = Query([RuntimeError(EXECUTOR_LOST), ClickHouseError(LOST_ANSWER)])
    run_query(query, _spec(), query.sink)  # type: ignore[arg-type]
    assert query.starts == 3
    assert pauses == [job_module.QUERY_RESTART_BACKOFF_S, 2 * job_module.QUERY_RESTART_BACKOFF_S]
    assert re.search(r'streaming_sink_retries_total\{job_id="j",level="query"\} 2\.0', metrics.render())


def test_a_fault_that_persists_stops_the_job_in_one_line_after_the_bound(pauses: list[float]) -> None:
    query = Query([ClickHouseError(LOST_ANSWER)] * 10)
    with pytest.raises(TransientFaultPersistedError) as stopped:
        run_query(query, _spec(query_restarts=2), query.sink)  # type: ignore[arg-type]
    assert query.starts == 3 and len(pauses) == 2
    line = stopped.value.one_line()
    assert "\n" not in line and "(connection lost) 3 time(s) in a row" in line and "sink.query_restarts = 2" in line
    assert "RemoteDisconnected" in line and "A transient fault persisted" in line
    assert stopped.value.exit_code == 3


def test_the_bound_is_per_series_a_finished_batch_starts_the_count_again(pauses: list[float]) -> None:
    """Two faults, a batch finished, two more: four restarts in all under a bound of two in a row."""
    query = Query([ClickHouseError(LOST_ANSWER)] * 4, finishes=(3,))
    run_query(query, _spec(query_restarts=2), query.sink)  # type: ignore[arg-type]
    assert query.starts == 5 and len(pauses) == 4


def test_the_bound_is_also_in_time(pauses: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    """However many restarts the count allows, none starts past the series' window."""
    now = [0.0]
    monkeypatch.setattr(retry, "monotonic", lambda: now[0])
    monkeypatch.setattr(retry, "sleep", lambda seconds: now.__setitem__(0, now[0] + seconds) or pauses.append(seconds))
    query = Query([ClickHouseError(LOST_ANSWER)] * 100)
    with pytest.raises(TransientFaultPersistedError):
        run_query(query, _spec(query_restarts=50), query.sink)  # type: ignore[arg-type]
    assert sum(pauses) <= job_module.QUERY_RESTART_WINDOW_S and len(pauses) < 50


def test_what_is_not_transient_stops_at_once_as_itself(pauses: list[float]) -> None:
    query = Query([ClickHouseError("Received ClickHouse exception, code: 60 (UNKNOWN_TABLE)")])
    with pytest.raises(ClickHouseError, match="UNKNOWN_TABLE"):
        run_query(query, _spec(), query.sink)  # type: ignore[arg-type]
    assert query.starts == 1 and pauses == []


class FakeClient:
    """A clickhouse-connect client that records each statement and fails the ones `failing` names, once each."""

    def __init__(self, *failing: tuple[str, BaseException]) -> None:
        self.sent: list[str] = []
        self.failing = list(failing)

    def _send(self, sql: str) -> str:
        self.sent.append(sql)
        for at, (start, error) in enumerate(self.failing):
            if sql.startswith(start):
                del self.failing[at]
                raise error
        return "ok"

    def command(self, sql: str, **kwargs: Any) -> str:
        return self._send(sql)

    def query(self, sql: str, **kwargs: Any) -> str:
        return self._send(sql)

    def insert_arrow(self, table: str, data: Any, **kwargs: Any) -> str:
        return self._send(f"INSERT INTO {table}")


def _retrying(client: FakeClient) -> StatementRetries:
    return StatementRetries(client, retry.RetryPolicy(retries=3, backoff_s=0.0, backoff_max_s=0.0))


def test_a_read_after_a_replica_sync_is_sent_again_with_its_sync(pauses: list[float]) -> None:
    """A new connection may reach another replica: the sync that made the read consistent goes first again."""
    client = FakeClient(("SELECT", ClickHouseError(LOST_ANSWER)))
    retrying = _retrying(client)
    retrying.command("SYSTEM SYNC REPLICA `db`.`_streaming_sink_ledger` LIGHTWEIGHT")
    assert retrying.query("SELECT DISTINCT state FROM `db`.`_streaming_sink_ledger`") == "ok"
    assert [s.split()[0] for s in client.sent] == ["SYSTEM", "SELECT", "SYSTEM", "SELECT"]


def test_a_statement_is_sent_again_only_where_safe(pauses: list[float]) -> None:
    # an INSERT whose answer was lost: raised for its caller to judge; one never sent: sent again
    lost = FakeClient(("INSERT", ClickHouseError(LOST_ANSWER)))
    with pytest.raises(ClickHouseError):
        _retrying(lost).insert_arrow("ss_x", None)
    refused = FakeClient(("INSERT", ClickHouseError(REFUSED)))
    assert _retrying(refused).insert_arrow("ss_x", None) == "ok" and len(refused.sent) == 2
    # a staging table's CREATE whose answer was lost: raised; a DROP IF EXISTS: sent again
    create = FakeClient(("CREATE", ClickHouseError(LOST_ANSWER)))
    with pytest.raises(ClickHouseError):
        _retrying(create).command("CREATE TABLE `db`.`ss_x` AS `db`.`t`")
    drop = FakeClient(("DROP", ClickHouseError(LOST_ANSWER)))
    assert _retrying(drop).command("DROP TABLE IF EXISTS `db`.`ss_x` SYNC") == "ok" and len(drop.sent) == 2
    # what is not transient is never sent again, safe or not
    unknown = FakeClient(("SELECT", ClickHouseError("Received ClickHouse exception, code: 60 (UNKNOWN_TABLE)")))
    with pytest.raises(ClickHouseError, match="UNKNOWN_TABLE"):
        _retrying(unknown).query("SELECT 1")
    assert len(unknown.sent) == 1
