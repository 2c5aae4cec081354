"""The operator commands an on-call engineer runs at 3 a.m.: one line and a documented code for every failure,
nothing created by a read, an unknown job named as such, and `status` usable as a monitoring check."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streaming_sink.cli import EXIT_CODES_HELP, ExitCode, build_parser, main
from streaming_sink.committable import Committable, TxnRef
from streaming_sink.records import BatchState
from streaming_sink.state import BatchRecord, FileStateStore
from streaming_sink.status import human_duration
from tests.support.jobs import write_job_toml
from tests.support.services.ports import free_port

JOB = "demo-ingest"
Q = "q1"
ROOT = Path(__file__).resolve().parents[2]
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
# a target the dry runs can name without any server: StarRocks lists nothing over HTTP
OFFLINE_TARGET = ["--target", "starrocks://127.0.0.1:9", "--database", "d"]


@pytest.fixture(autouse=True)
def target_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """OFFLINE_TARGET is never contacted, but a StarRocks target needs a user to be built."""
    monkeypatch.setenv("STREAMING_SINK_TARGET_USER", "ingest")
    monkeypatch.setenv("STREAMING_SINK_TARGET_PASSWORD", "ingest-pw")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def committables(batch: int, n: int = 3) -> list[Committable]:
    return [Committable("clickhouse", "db", "orders", f"L{batch}-{i}", i, "e1w0t0", rows=5) for i in range(n)]


def intent(label: str) -> TxnRef:
    return TxnRef("clickhouse", "db", "orders", label, 0, "e1w0t0")


@pytest.fixture
def state(tmp_path: Path) -> tuple[FileStateStore, str]:
    """A job that committed batch 4; the test adds what it needs."""
    store = FileStateStore(tmp_path / "state")
    epoch = store.take_epoch(JOB, f"{socket.gethostname()}:{dead_pid()}")  # its driver was killed
    store.put_batch(JOB, epoch, BatchRecord(Q, 4, BatchState.COMMITTED, epoch, committables(4), created_at=time.time() - 600))
    return store, f"file://{tmp_path / 'state'}"


def dead_pid() -> int:
    """The pid of a process that has ended (a driver killed on this machine)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def tree(path: Path) -> list[Path]:
    return sorted(path.rglob("*")) if path.exists() else []


# -- 1. no tracebacks: one line, a documented code -------------------------------------------------------------------


@pytest.mark.parametrize("command", ["status", "recover", "abort", "settle"])
def test_every_failure_is_one_line_with_a_documented_code(capsys, tmp_path, state, command):
    _, url = state
    extra = {"status": [], "recover": OFFLINE_TARGET, "abort": [*OFFLINE_TARGET, "--batch", "4"],
             "settle": [*OFFLINE_TARGET, "--batch", "4", "--query-id", Q, "--label", "L4-0", "--committed"]}[command]
    (tmp_path / "a-file").write_text("")
    cases = [
        (["--job", JOB, "--state", "data/demo/state"], ExitCode.USAGE, "has no scheme: use redis://host:port/db or file:///"),
        (["--job", JOB, "--state", f"redis://127.0.0.1:{free_port()}/0"], ExitCode.SERVICE, "cannot reach the state store"),
        (["--job", "bad id", "--state", url], ExitCode.USAGE, "job id 'bad id' is not valid"),
        (["--job", JOB, "--state", f"file://{tmp_path / 'a-file'}"], ExitCode.SERVICE,
         "a-file/demo-ingest/epoch.json: Not a directory; check the path in --state"),
        (["--state", url], ExitCode.USAGE, "missing --job: give it, or --config job.toml"),
    ]
    if command != "status":
        cases.append((["--job", JOB, "--state", url, "--target", "bogus://x", "--database", "d"], ExitCode.USAGE,
                      "target url 'bogus://x': scheme must be"))
    for args, code, says in cases:
        argv = [command, *extra, *args]
        got, out, err = run(capsys, *argv)
        assert got == code, (argv, err)
        assert err.count("\n") == 1 and err.startswith(f"streaming-sink {command}: ") and says in err, (argv, err)
        assert "Traceback" not in err and out == ""
        got, out, err = run(capsys, *argv, "--json")
        assert got == code and json.loads(out) == {"error": err.strip().split(": ", 1)[1], "exit_code": int(code)}


def test_usage_errors_and_a_broken_config_follow_the_same_rule(capsys, tmp_path):
    for argv, says in [
        (["status", "--job", JOB, "--state", "file:///x", "--last", "-1"], "argument --last: '-1' must be greater than 0"),
        (["status", "--job", JOB, "--config", str(tmp_path / "missing.toml")], "configuration error: config file"),
        (["doctor", "--config", str(tmp_path / "missing.toml")], "configuration error: config file"),
    ]:
        code, out, err = run(capsys, *argv)
        assert code == ExitCode.USAGE and err.count("\n") == 1 and says in err and "Traceback" not in err, err


def test_exit_codes_are_documented_in_help_and_runbook():
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    section = runbook.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    for code in ExitCode:
        assert re.search(rf"^\s*{code.value}\s", EXIT_CODES_HELP, re.M), code
        assert re.search(rf"^\| `?{code.value}`? \|", section, re.M), code
    assert "exit codes:" in build_parser().format_help()
    assert "exit codes:" in build_parser()._subparsers._group_actions[0].choices["status"].format_help()


def test_version(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and re.fullmatch(r"streaming-sink \S+\n", capsys.readouterr().out)


# -- 2. reads create nothing; 3. an unknown job is named -------------------------------------------------------------


def test_read_only_commands_create_nothing(capsys, tmp_path, state):
    store, url = state
    store.add_intent(JOB, store.current_epoch(JOB), Q, 5, intent("I5"))
    before = tree(tmp_path)
    for argv in (["status", "--job", JOB, "--state", url], ["recover", "--job", JOB, "--state", url, *OFFLINE_TARGET],
                 ["abort", "--job", JOB, "--state", url, *OFFLINE_TARGET, "--batch", "5"],
                 ["status", "--job", "demo-ingestt", "--state", url],
                 ["status", "--job", JOB, "--state", f"file://{tmp_path / 'a missing directory'}"]):
        run(capsys, *argv)
    assert tree(tmp_path) == before


def test_an_unknown_job_names_the_jobs_the_store_holds(capsys, tmp_path, state):
    _, url = state
    code, out, err = run(capsys, "status", "--job", "demo-ingestt", "--state", url)
    assert code == ExitCode.PROBLEM and out == ""
    assert err == ("streaming-sink status: unknown job 'demo-ingestt'; this store holds: demo-ingest "
                   "(did you mean 'demo-ingest'?)\n")
    code, _, err = run(capsys, "recover", "--job", "orders", "--state", url, *OFFLINE_TARGET, "--apply")
    assert code == ExitCode.USAGE and "unknown job 'orders'; this store holds: demo-ingest\n" in err
    assert FileStateStore(tmp_path / "state").job_ids() == [JOB]  # --apply took no epoch for the typo
    code, _, err = run(capsys, "status", "--job", JOB, "--state", f"file://{tmp_path / 'elsewhere'}")
    assert code == ExitCode.PROBLEM and "holds no job: check --state" in err


# -- 4. status as a monitoring check ---------------------------------------------------------------------------------


def driver_runs(store: FileStateStore) -> int:
    """A driver of the job runs in this very process (it took the epoch now): its batches in flight are normal."""
    return store.take_epoch(JOB, f"{socket.gethostname()}:{os.getpid()}")


def test_status_is_healthy_with_a_batch_in_flight(capsys, state):
    store, url = state
    store.add_intent(JOB, driver_runs(store), Q, 5, intent("I5"))  # the newest batch being written: normal
    code, out, _ = run(capsys, "status", "--job", JOB, "--state", url, "--prepared-timeout", "3600")
    assert code == ExitCode.OK and out.rstrip().endswith("verdict: OK") and "; running" in out
    assert re.search(r"^\s+4 COMMITTED .* 10 min ", out, re.M)


def test_status_fails_on_a_batch_left_unfinished_by_a_driver_that_is_gone(capsys, state):
    """Review F6: a ClickHouse job stopped mid-commit (staging tables never expire) was reported healthy."""
    store, url = state
    epoch = store.current_epoch(JOB)  # the fixture's driver was killed
    store.put_batch(JOB, epoch, BatchRecord(Q, 5, BatchState.PREPARED, epoch, committables(5)))
    code, out, _ = run(capsys, "status", "--job", JOB, "--state", url)
    assert code == ExitCode.PROBLEM and "; not running" in out
    assert "no driver is running and 1 batch(es) are unfinished: 5 (PREPARED); restart the job" in out


def test_status_names_the_stop_for_an_operator_and_its_runbook_section(capsys, state):
    """Review F6: `status` said healthy, exit 0, while the job was stopped with ReplayAmbiguousError."""
    store, url = state
    epoch = driver_runs(store)  # even while a restarted driver keeps stopping on it
    stop = {"error": "ReplayAmbiguousError", "section": "Replay ambiguous: a committed label was forgotten",
            "message": "job demo-ingest batch 5 ...", "at": time.time()}
    store.put_batch(JOB, epoch, BatchRecord(Q, 5, BatchState.PREPARED, epoch, committables(5), stop=stop))
    code, out, _ = run(capsys, "status", "--job", JOB, "--state", url, "--json")
    status = json.loads(out)
    assert code == ExitCode.PROBLEM and not status["healthy"] and status["stops"][0]["error"] == "ReplayAmbiguousError"
    assert status["problems"] == [
        f"the job stopped for an operator on batch 5 of query {Q} at {status['stops'][0]['at_iso']}: "
        "ReplayAmbiguousError; see docs/runbook.md, section 'Replay ambiguous: a committed label was forgotten'"]


def test_status_fails_on_an_expired_prepared_transaction(capsys, state):
    store, url = state
    epoch = driver_runs(store)
    store.put_batch(JOB, epoch, BatchRecord(Q, 6, BatchState.PREPARED, epoch, committables(6), created_at=time.time() - 5006))
    store.mark_done(JOB, epoch, Q, 6, "L6-0")
    code, out, _ = run(capsys, "status", "--job", JOB, "--state", url, "--prepared-timeout", "3600")
    assert code == ExitCode.PROBLEM
    assert re.search(r"batch 6 orders L6-1 age 1 h 23 min, EXPIRED 23 min ago \(\d{4}-\d\d-\d\dT[\d:]+Z\)", out), out
    assert "-1406" not in out and "verdict: PROBLEM" in out
    code, out, _ = run(capsys, "status", "--job", JOB, "--state", url, "--prepared-timeout", "3600", "--json")
    status = json.loads(out)
    assert code == ExitCode.PROBLEM and status["healthy"] is False and ISO.match(status["checked_at"])
    pending = status["pending_transactions"]
    assert [p["label"] for p in pending] == ["L6-1", "L6-2"] and all(p["expired"] for p in pending)
    assert all(-1410 < p["expires_in_s"] < -1400 and ISO.match(p["expires_at"]) for p in pending)
    assert ISO.match(status["epoch"]["at_iso"]) and all(ISO.match(b["created_at"]) for b in status["batches"])
    # the same batch long before its expiry is healthy; close to it, a problem
    assert run(capsys, "status", "--job", JOB, "--state", url, "--prepared-timeout", "86400")[0] == ExitCode.OK
    code, out, _ = run(capsys, "status", "--job", JOB, "--state", url, "--prepared-timeout", "6000")
    assert code == ExitCode.PROBLEM and "server drops it in 16 min" in out and "expire within 16 min" in out
    assert run(capsys, "status", "--job", JOB, "--state", url, "--prepared-timeout", "6000",
               "--expiry-margin", "600")[0] == ExitCode.OK


def test_status_fails_on_leftover_intents_of_an_old_batch(capsys, state):
    store, url = state
    epoch = store.current_epoch(JOB)
    store.add_intent(JOB, epoch, Q, 3, intent("I3"))  # begun for batch 3, which never reached its record
    code, out, _ = run(capsys, "status", "--job", JOB, "--state", url)
    assert code == ExitCode.PROBLEM and "1 leftover intent(s) in old batch(es) 3: run `recover`" in out


def test_human_durations():
    assert [human_duration(s) for s in (0, 45, 1380, 11520, 3600, 187200, -1406)] == [
        "0 s", "45 s", "23 min", "3 h 12 min", "1 h", "2 d 4 h", "23 min"]


# -- 5. --config supplies the job's settings; flags win --------------------------------------------------------------


def test_config_supplies_job_state_and_target(capsys, tmp_path, state):
    _, url = state
    config = write_job_toml(tmp_path, job_id=JOB, tables={"orders": {"schema": "id BIGINT NOT NULL"}},
                            target={"url": "starrocks://127.0.0.1:9", "database": "analytics"}, state={"url": url})
    code, out, _ = run(capsys, "status", "--config", str(config), "--json")
    assert code == ExitCode.OK and json.loads(out)["job_id"] == JOB
    code, out, _ = run(capsys, "recover", "--config", str(config), "--json")
    assert code == ExitCode.OK and json.loads(out) == {"applied": False, "actions": []}
    code, _, err = run(capsys, "status", "--config", str(config), "--job", "other")  # the flag wins
    assert code == ExitCode.PROBLEM and "unknown job 'other'" in err
    code, _, err = run(capsys, "recover", "--config", str(config), "--target", "bogus://x")
    assert code == ExitCode.USAGE and "bogus://x" in err


# -- operator actions: refused for safety ----------------------------------------------------------------------------


def test_abort_refuses_a_batch_with_a_record(capsys, state):
    _, url = state
    code, out, err = run(capsys, "abort", "--job", JOB, "--state", url, *OFFLINE_TARGET, "--batch", "4", "--json")
    assert code == ExitCode.REFUSED and "refusing: batch 4 is COMMITTED: its transactions are committed" in err
    assert json.loads(out)["exit_code"] == ExitCode.REFUSED
    code, _, err = run(capsys, "abort", "--job", JOB, "--state", url, *OFFLINE_TARGET, "--batch", "99")
    assert code == ExitCode.USAGE and "has no batch 99; it holds batches 4-4" in err
    code, _, err = run(capsys, "settle", "--job", JOB, "--state", url, *OFFLINE_TARGET, "--batch", "4", "--query-id", Q,
                       "--label", "L4-0", "--committed")
    assert code == ExitCode.REFUSED and "refusing: batch 4 of query q1 is COMMITTED: only a PREPARED batch's" in err
