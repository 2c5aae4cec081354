"""No secret the job is given ever reaches an output: the target's password, the Redis password and the Kafka
SASL password are each searched for in stdout and stderr (which holds the driver's log) of `run`, `status`
(text and --json), `doctor` (text and --json) and `recover`, when things work and when each one is refused."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.doubles.emulators.starrocks import StarRocksEmulator
from tests.support.fixtures import SECURE_PASSWORD, SECURE_USER
from tests.support.jobs import local_spark, secured_kafka, write_job_toml
from tests.support.services.redis import RedisServer
from tests.support.services.spark import spark_env

# Extended suite: CI keeps test_operator_redis_password.py (the Redis password through every operator command) and the
# targets' own checks that a password never shows in a repr or an error.
pytestmark = [pytest.mark.slow, pytest.mark.extended]

REPO = Path(__file__).resolve().parents[2]
TARGET_PASSWORD = "tgt-Pw-0c4f2e"
REDIS_PASSWORD = "rds-Pw-91be7a"
SECRETS = {"target": TARGET_PASSWORD, "redis": REDIS_PASSWORD, "kafka": SECURE_PASSWORD}


def write_config(tmp_path: Path, broker, topic: str, fe_port: int) -> Path:
    return write_job_toml(
        tmp_path, job_id="secrets", kafka=secured_kafka(broker, topic, "KAFKA_JAAS", SECURE_USER), spark=local_spark(),
        target={"url": f"starrocks://127.0.0.1:{fe_port}", "database": "analytics",
                "options": {"tables": ["orders"], "backoff_s": 0.05}},
        sink={"metadata_columns": False},
    )


def errors(log: str) -> str:
    """The lines of a driver's log that say what went wrong (Spark's plans make the tail useless)."""
    return "\n".join(line[:400] for line in log.splitlines() if "Error" in line or "Exception" in line)[-3000:]


def test_no_secret_reaches_any_output(tmp_path, secured_kafka_broker):
    broker = secured_kafka_broker
    topic = f"secrets-{tmp_path.name}"
    broker.create_topic(topic)
    broker.produce(topic, [json.dumps({"id": i, "name": f"n{i}"}) for i in range(50)])
    with StarRocksEmulator(tmp_path / "sr", password=TARGET_PASSWORD) as emulator, \
            RedisServer(tmp_path / "redis", password=REDIS_PASSWORD) as redis:
        emulator.create_database("analytics")
        emulator.create_table("analytics", "orders", [("id", "BIGINT"), ("name", "VARCHAR(64)")])
        config = write_config(tmp_path, broker, topic, emulator.fe_port)
        redis_url = redis.url  # carries the password

        def cli(*args: str, target_pw: str = TARGET_PASSWORD, redis_url_: str = redis_url,
                kafka_pw: str = SECURE_PASSWORD) -> subprocess.CompletedProcess[str]:
            env = dict(os.environ, **spark_env(), PYTHONPATH=str(REPO), STREAMING_SINK_TARGET_USER="root",
                       STREAMING_SINK_TARGET_PASSWORD=target_pw, STREAMING_SINK_STATE_URL=redis_url_,
                       KAFKA_JAAS=broker.spark_kafka_options(SECURE_USER, kafka_pw)["kafka.sasl.jaas.config"])
            return subprocess.run([sys.executable, "-m", "streaming_sink.cli", *args, "--config", str(config)],
                                  cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)

        runs = {"run": cli("run")}
        assert runs["run"].returncode == 0, errors(runs["run"].stderr)
        assert len(emulator.visible_rows("analytics", "orders")) == 50
        runs |= {
            "status": cli("status"), "status --json": cli("status", "--json"),
            "doctor": cli("doctor", "--outage-tolerance", "1 hour"),
            "doctor --json": cli("doctor", "--json", "--outage-tolerance", "1 hour"),
            "recover": cli("recover"),
            # each secret wrong in turn: the refusals name what failed, never what was sent
            "run, wrong target password": cli("run", target_pw="wrong-" + TARGET_PASSWORD),
            "run, wrong redis password": cli("run", redis_url_=redis_url.replace(REDIS_PASSWORD, "wrong-" + REDIS_PASSWORD)),
            "run, wrong kafka password": cli("run", kafka_pw="wrong-" + SECURE_PASSWORD),
            "status, wrong redis password": cli("status", "--json",
                                               redis_url_=redis_url.replace(REDIS_PASSWORD, "wrong-" + REDIS_PASSWORD)),
        }
    for name, result in runs.items():
        if "wrong" in name:
            assert result.returncode != 0, f"{name} was not refused: {result.stderr[-2000:]}"
        for what, secret in SECRETS.items():
            assert secret not in result.stdout + result.stderr, f"the {what} password appears in the output of {name}"
