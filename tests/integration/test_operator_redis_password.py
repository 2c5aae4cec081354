"""Review S1: the Redis password never reaches an operator's screen, a script's JSON or a log line.

A real redis-server with --requirepass; every output channel (stdout and stderr, text and --json) of the
operator commands is searched for the password, on success and on each kind of failure.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streaming_sink.committable import Committable
from streaming_sink.records import BatchState
from streaming_sink.state import BatchRecord, RedisStateStore
from streaming_sink.state.redis import RedisKeys
from tests.support.jobs import write_job_toml
from tests.support.services.redis import RedisServer

SECRET = "s3cr3t-pw-Hx7"
JOB = "orders-ingest"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "redis", password=SECRET) as server:
        yield server


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "streaming_sink.cli", *args], capture_output=True, text=True,
                          timeout=120, env=environment)


def shown(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


def test_the_redis_password_is_never_shown(server: RedisServer, tmp_path: Path) -> None:
    store = RedisStateStore(server.url)
    epoch = store.take_epoch(JOB, f"{socket.gethostname()}:{os.getpid()}")  # a driver running, committing batch 6
    committables = [Committable("clickhouse", "db", "orders", f"L6-{i}", i, "e1w0t0", rows=5) for i in range(2)]
    store.put_batch(JOB, epoch, BatchRecord("q", 6, BatchState.PREPARED, epoch, committables, created_at=time.time() - 5006))
    redacted = f"redis://***@127.0.0.1:{server.port}/0"

    text = cli("status", "--job", JOB, "--state", server.url, "--prepared-timeout", "3600")
    assert text.returncode == 1 and f"state store {redacted}" in text.stdout and "EXPIRED" in text.stdout
    as_json = cli("status", "--job", JOB, "--state", server.url, "--json")
    assert json.loads(as_json.stdout)["state_store"] == redacted

    # the way the runbook asks for it: the URL with the password in the environment, the rest from the TOML
    config = write_job_toml(tmp_path, job_id=JOB, tables={"orders": {"schema": "id BIGINT NOT NULL"}},
                            target={"url": f"chdb://{tmp_path / 'ch'}"}, state={"url": f"redis://127.0.0.1:{server.port}/0"})
    from_config = cli("status", "--config", str(config), "--json", env={"STREAMING_SINK_STATE_URL": server.url})
    assert from_config.returncode == 0 and json.loads(from_config.stdout)["state_store"] == redacted, from_config.stderr

    unknown = cli("status", "--job", "orders-ingestt", "--state", server.url, "--json")
    assert unknown.returncode == 1 and "did you mean 'orders-ingest'" in unknown.stderr

    wrong = server.url.replace(SECRET, "not-the-password")
    refused = cli("status", "--job", JOB, "--state", wrong, "--json")
    assert refused.returncode == 2 and "refused the credentials" in refused.stderr
    assert "not-the-password" not in shown(refused)

    # a read that fails on the server (WRONGTYPE), with the traceback asked for
    legacy = RedisKeys("streaming-sink", f"{JOB}-2", legacy=True)  # the layout before the Cluster hash tag
    server.client().set(legacy.index, "not a set")
    server.client().set(legacy.epoch, "1")
    broken = cli("status", "--job", f"{JOB}-2", "--state", server.url, "--debug")
    assert broken.returncode == 3 and "WRONGTYPE" in broken.stderr

    store.close()
    server.stop()
    down = cli("status", "--job", JOB, "--state", server.url, "--json")
    assert down.returncode == 3 and "cannot reach the state store" in down.stderr

    for result in (text, as_json, from_config, unknown, refused, broken, down):
        assert SECRET not in shown(result), result.args
