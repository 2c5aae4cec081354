"""An operator command never stops a running driver by mistake (issue 22 item 5; review ecosystem-2026-11-24 §1.2).

Each acting command validates first and takes the epoch only when it will act; beside a driver that beat
recently it refuses unless --force. The driver here is the owner record a running sink writes (the real
driver process beside real commands is tests/integration/test_operator_beside_driver.py).
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from streaming_sink.cli import ExitCode, main
from streaming_sink.committable import Committable
from streaming_sink.liveness import SILENT_SECONDS, Heartbeat, running_driver
from streaming_sink.records import BatchState
from streaming_sink.state import BatchRecord, FileStateStore, MemoryStateStore
from tests.unit.test_cli_operator import OFFLINE_TARGET, dead_pid, target_credentials  # noqa: F401 - autouse fixture

JOB, Q = "demo-ingest", "q1"
HERE = socket.gethostname()


def owner(name: str, seen_ago: float | None, at_ago: float = 3600.0, epoch: int = 3) -> dict:
    now = time.time()
    return {"epoch": epoch, "owner": name, "at": now - at_ago, "seen": None if seen_ago is None else now - seen_ago}


# -- the judgement -----------------------------------------------------------------------------------------------------


def test_a_driver_that_beat_recently_is_running_and_one_silent_for_three_beats_is_not() -> None:
    assert running_driver(owner("other-host:12", seen_ago=1.0)) is not None
    assert running_driver(owner("other-host:12", seen_ago=SILENT_SECONDS + 1)) is None
    assert running_driver(owner("other-host:12", seen_ago=None, at_ago=2.0)) is not None  # took the epoch just now
    assert running_driver(None) is None


def test_a_killed_driver_on_this_machine_is_gone_at_once() -> None:
    assert running_driver(owner(f"{HERE}:{dead_pid()}", seen_ago=0.5)) is None
    alive = running_driver(owner(f"streaming-sink recover on {HERE}:{os.getpid()}", seen_ago=0.2))
    assert alive is not None and "was active 0 s ago" in alive


@pytest.mark.parametrize("make", [MemoryStateStore, lambda tmp: FileStateStore(tmp / "s")], ids=["memory", "file"])
def test_a_heartbeat_counts_for_its_own_epoch_only_and_stops_when_fenced(make, tmp_path: Path) -> None:
    store = make(tmp_path) if make is not MemoryStateStore else make()
    epoch = store.take_epoch(JOB, "a:1")
    assert store.epoch_owner(JOB)["seen"] is None
    store.beat(JOB, epoch, 123.0)
    assert store.epoch_owner(JOB)["seen"] == 123.0
    newer = store.take_epoch(JOB, "b:2")
    assert store.epoch_owner(JOB) == {"epoch": newer, "owner": "b:2", "at": store.epoch_owner(JOB)["at"], "seen": None}
    with pytest.raises(Exception, match="newer driver"):
        store.beat(JOB, epoch, 124.0)


def test_the_heartbeat_thread_beats_until_stopped() -> None:
    store = MemoryStateStore()
    epoch = store.take_epoch(JOB, "a:1")
    beats: list[float] = []
    original = store.beat

    def beat(job_id: str, held: int, at: float) -> None:
        original(job_id, held, at)
        beats.append(at)
        if len(beats) == 3:
            done.stop()

    store.beat = beat  # type: ignore[method-assign]
    done = Heartbeat(store, JOB, epoch, every=0.01)
    done._thread.join(timeout=10)
    assert not done._thread.is_alive() and len(beats) == 3 and store.epoch_owner(JOB)["seen"] == beats[-1]


# -- the commands ------------------------------------------------------------------------------------------------------


def committables(batch: int, n: int = 2) -> list[Committable]:
    return [Committable("starrocks", "d", "orders", f"L{batch}-{i}", i, "e1w0t0", rows=5) for i in range(n)]


def checkpoint_of(path: Path, query_id: str) -> Path:
    (path / "offsets").mkdir(parents=True)
    (path / "metadata").write_text(json.dumps({"id": query_id}))
    return path


@pytest.fixture
def journal(tmp_path: Path) -> tuple[FileStateStore, str, Path]:
    """Batch 1 of query q1 PREPARED by a driver that is still running (it beat a second ago, from this machine);
    q1's checkpoint lost its offset files (restore-offsets has something to write), and a new checkpoint's
    query q-new (beside which q1's batch may be given up)."""
    store = FileStateStore(tmp_path / "state")
    epoch = store.take_epoch(JOB, f"{HERE}:{os.getpid()}")
    for batch, state in ((0, BatchState.COMMITTED), (1, BatchState.PREPARED)):
        offsets = "v1\n{}\n" + json.dumps({"events": {"0": 40 * (batch + 1)}}) + "\n"
        store.put_batch(JOB, epoch, BatchRecord(Q, batch, state, epoch, committables(batch), source=offsets))
    store.beat(JOB, epoch, time.time())
    checkpoint_of(tmp_path / "new-checkpoint", "q-new")
    return store, f"file://{tmp_path / 'state'}", checkpoint_of(tmp_path / "checkpoint", Q)


ACTING = {
    "recover --apply": ["recover", *OFFLINE_TARGET, "--apply"],
    "settle --apply": ["settle", *OFFLINE_TARGET, "--batch", "1", "--query-id", Q, "--label", "L1-0", "--committed",
                       "--apply"],
    "settle --accept-loss --apply": ["settle", *OFFLINE_TARGET, "--batch", "1", "--query-id", Q, "--accept-loss",
                                     "--apply", "--checkpoint", "NEW"],
    "restore-offsets --apply": ["restore-offsets", "--checkpoint", "CHECKPOINT", "--apply"],
}


@pytest.mark.parametrize("command", list(ACTING))
def test_an_acting_command_beside_a_running_driver_refuses_and_takes_nothing(capsys, journal, command) -> None:
    store, url, checkpoint = journal
    argv = [{"CHECKPOINT": str(checkpoint), "NEW": str(checkpoint.parent / "new-checkpoint")}.get(a, a)
            for a in ACTING[command]]
    before = store.epoch_owner(JOB)
    code = main([*argv, "--job", JOB, "--state", url])
    err = capsys.readouterr().err
    assert code == ExitCode.REFUSED and "the job seems to be running" in err and "--force" in err, err
    assert store.epoch_owner(JOB) == before  # the driver keeps its epoch: it goes on
    assert not (checkpoint / "offsets" / "1").exists()


def test_dry_runs_beside_a_running_driver_are_answered(capsys, journal) -> None:
    store, url, checkpoint = journal
    before = store.epoch_owner(JOB)
    for argv in (["recover", *OFFLINE_TARGET], ["restore-offsets", "--checkpoint", str(checkpoint)],
                 ["settle", *OFFLINE_TARGET, "--batch", "1", "--query-id", Q, "--label", "L1-0", "--committed"]):
        assert main([*argv, "--job", JOB, "--state", url]) == ExitCode.OK, capsys.readouterr().err
    assert "dry run: would record L1-0 as committed" in capsys.readouterr().out
    assert store.epoch_owner(JOB) == before


def test_a_refused_settle_takes_no_epoch(capsys, journal) -> None:
    """The review's reproduction: a settle refused for a wrong label had fenced the running driver."""
    store, url, _ = journal
    before = store.epoch_owner(JOB)
    for wrong in (["--label", "no-such-label", "--committed"], ["--label", "L1-0", "--committed", "--batch", "7"]):
        argv = ["settle", *OFFLINE_TARGET, "--batch", "1", "--query-id", Q, *wrong, "--apply", "--force"]
        assert main([*argv, "--job", JOB, "--state", url]) == ExitCode.REFUSED
    assert "has no PREPARED committable no-such-label; its labels: L1-0, L1-1" in capsys.readouterr().err
    assert store.epoch_owner(JOB) == before


def test_force_acts_beside_a_running_driver(capsys, journal) -> None:
    store, url, checkpoint = journal
    held = store.current_epoch(JOB)
    argv = ["restore-offsets", "--checkpoint", str(checkpoint), "--apply", "--force"]
    assert main([*argv, "--job", JOB, "--state", url]) == ExitCode.OK, capsys.readouterr().err
    assert (checkpoint / "offsets" / "1").exists()
    argv = ["settle", *OFFLINE_TARGET, "--batch", "1", "--query-id", Q, "--label", "L1-0", "--committed", "--apply",
            "--force"]
    assert main([*argv, "--job", JOB, "--state", url]) == ExitCode.OK, capsys.readouterr().err
    assert store.current_epoch(JOB) == held + 1 and store.done_labels(JOB, Q, 1) == {"L1-0"}


def test_accept_loss_refuses_the_checkpoints_own_query_and_needs_the_checkpoint(capsys, journal) -> None:
    store, url, checkpoint = journal
    base = ["settle", *OFFLINE_TARGET, "--batch", "1", "--query-id", Q, "--accept-loss", "--job", JOB, "--state", url]
    assert main(base) == ExitCode.USAGE and "missing --checkpoint" in capsys.readouterr().err
    assert main([*base, "--label", "L1-0"]) == ExitCode.USAGE
    assert main([*base, "--checkpoint", str(checkpoint), "--force", "--apply"]) == ExitCode.REFUSED
    assert "Spark re-runs it when the job restarts" in capsys.readouterr().err
    assert store.get_batch(JOB, Q, 1).state is BatchState.PREPARED
