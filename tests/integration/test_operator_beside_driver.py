"""Each operator command beside a live driver process, refused and accepted (issue 22 item 5).

A real driver process (an ExactlyOnceSink that took the job's epoch and beats) runs beside the journal a
killed one left (batch 0 COMMITTED, batch 1 PREPARED) on the StarRocks emulator. Every acting command is
refused while it runs and leaves its epoch alone, so the driver goes on; dry runs are answered. Once the
driver is killed (SIGKILL), the same commands act at once, and the job is exact.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from streaming_sink.cli import ExitCode, main
from streaming_sink.records import BatchState
from streaming_sink.state import FileStateStore
from tests.integration.test_protocol_findings import (
    DB,
    JOB,
    QUERY,
    TABLE,
    Crash,
    CrashingStore,
    expected_ids,
    ids,
    sink_of,
    source,
    target_of,
)

DRIVER = textwrap.dedent("""
    import sys, time
    from streaming_sink.sink import ExactlyOnceSink
    from streaming_sink.state import FileStateStore
    from streaming_sink.targets.starrocks import StarRocksTarget

    state, fe_url, db, table, job = sys.argv[1:]
    sink = ExactlyOnceSink(StarRocksTarget(fe_url, db, "root", "pw"), FileStateStore(state), job, table=table,
                           runner=object(), heartbeat_seconds=0.2)
    sink.start()
    print("epoch", sink.epoch, flush=True)
    while True:
        time.sleep(3600)  # idle: Spark calls the sink only when there is data; the heartbeat goes on
""")


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMING_SINK_TARGET_USER", "root")
    monkeypatch.setenv("STREAMING_SINK_TARGET_PASSWORD", "pw")


def beats(store: FileStateStore, after: float | None, deadline_s: float = 30.0) -> bool:
    """Whether the driver writes a heartbeat newer than `after` (polled until one comes or the deadline passes)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        seen = store.epoch_owner(JOB)["seen"]
        if seen is not None and (after is None or seen > after):
            return True
        time.sleep(0.05)
    return False


def test_each_operator_command_beside_a_live_driver_refuses_then_acts_once_it_is_killed(
    sr, tmp_path: Path, capsys, credentials
) -> None:
    store = FileStateStore(tmp_path / "state")
    sink_of(target_of(sr), store).process(source(0), 0, QUERY)
    with pytest.raises(Crash):  # batch 1 PREPARED, no commit sent: what recover --apply finishes
        sink_of(target_of(sr), CrashingStore(store, "put_batch", on_call=2)).process(source(1), 1, QUERY)
    label = store.get_batch(JOB, QUERY, 1).committables[0].label
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / "state"), sr.fe_url, DB, TABLE, JOB],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        held = int(driver.stdout.readline().split()[1])  # type: ignore[union-attr]
        assert beats(store, after=None)
        base = ["--job", JOB, "--state", f"file://{tmp_path / 'state'}",
                "--target", sr.fe_url.replace("http://", "starrocks://"), "--database", DB]
        (tmp_path / "checkpoint").mkdir()
        (tmp_path / "checkpoint" / "metadata").write_text(json.dumps({"id": QUERY}) + "\n")
        recover = ["recover", "--checkpoint", str(tmp_path / "checkpoint")]  # it commits the batch Spark re-runs
        settle = ["settle", "--query-id", QUERY, "--batch", "1", "--label", label, "--committed"]
        acting = [[*recover, "--apply"], [*settle, "--apply"], ["abort", "--batch", "2", "--apply"]]
        for command in acting[:2]:
            assert main([*command, *base]) == ExitCode.REFUSED, command
            assert "the job seems to be running" in capsys.readouterr().err
        # validation comes first: a wrong batch or label is refused as such, and takes nothing either
        assert main(["abort", "--batch", "1", "--apply", *base]) == ExitCode.REFUSED
        assert main([*settle[:-3], "--label", "nope", "--committed", "--apply", *base]) == ExitCode.REFUSED
        assert main([*recover, *base]) == ExitCode.OK and main([*settle, *base]) == ExitCode.OK  # dry runs
        assert store.current_epoch(JOB) == held and driver.poll() is None  # the driver still holds the job
        assert beats(store, after=store.epoch_owner(JOB)["seen"])  # and beats on, idle

        driver.send_signal(signal.SIGKILL)
        driver.wait()
        capsys.readouterr()
        assert main([*recover, "--apply", *base]) == ExitCode.OK, capsys.readouterr().err  # at once: its pid is gone
        assert store.get_batch(JOB, QUERY, 1).state is BatchState.COMMITTED and ids(sr) == expected_ids(0, 1)
        assert main([*settle, "--apply", *base]) == ExitCode.REFUSED  # nothing left to settle: said so, not taken
        assert "is COMMITTED: only a PREPARED batch" in capsys.readouterr().err
    finally:
        driver.kill()
        driver.wait()
    report = sink_of(target_of(sr), store).process(source(2), 2, QUERY)
    assert report.action == "written" and ids(sr) == expected_ids(0, 1, 2)
