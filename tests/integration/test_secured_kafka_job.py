"""The packaged job reads a SASL_SSL (SCRAM over TLS, test CA) Kafka listener configured the way users
configure Spark's Kafka source, the password kept out of the file; a wrong password stops it before
any data moves, with one line that names the cause and not the password."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fixtures import SECURE_PASSWORD, SECURE_USER
from tests.support.jobs import local_spark, secured_kafka, write_job_toml
from tests.support.pipeline import open_target
from tests.support.services.spark import spark_env

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
JAAS_ENV = "ORDERS_KAFKA_JAAS"


def write_config(tmp_path: Path, broker, topic: str) -> Path:
    """Table `orders` from the broker's SASL_SSL listener, the JAAS config read from `JAAS_ENV` (tests/support/jobs.py)."""
    return write_job_toml(tmp_path, job_id="secured", kafka=secured_kafka(broker, topic, JAAS_ENV, SECURE_USER),
                          spark=local_spark())


def run_job(config: Path, broker, password: str, *command: str) -> subprocess.CompletedProcess[str]:
    jaas = broker.spark_kafka_options(SECURE_USER, password)["kafka.sasl.jaas.config"]
    env = dict(os.environ, **spark_env(), PYTHONPATH=str(REPO), **{JAAS_ENV: jaas})
    return subprocess.run([sys.executable, "-m", "streaming_sink.cli", *(command or ("run",)), "--config", str(config)],
                          cwd=config.parent, env=env, capture_output=True, text=True, timeout=600)


def doctor_kafka_verdict(config: Path, broker, password: str) -> dict:
    proc = run_job(config, broker, password, "doctor", "--json", "--outage-tolerance", "1 hour")
    return {c["name"]: c for c in json.loads(proc.stdout)}["kafka"]


@pytest.mark.extended  # CI: the secured broker itself (tests/infra/test_secured_kafka.py) and the options (unit tests)
def test_the_job_reads_a_sasl_ssl_listener_and_a_wrong_password_moves_nothing(tmp_path, secured_kafka_broker):
    broker = secured_kafka_broker
    topic = f"secured-{tmp_path.name}"
    broker.create_topic(topic, partitions=2)
    messages = [{"id": i, "name": f"n{i}"} for i in range(300)]
    broker.produce(topic, [json.dumps(m) for m in messages])
    config = write_config(tmp_path, broker, topic)

    refused = run_job(config, broker, "wrong-password")
    assert refused.returncode == 2, refused.stderr[-3000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert last == (f"streaming-sink: configuration error: Kafka at {broker.secure_bootstrap} (SASL_SSL), topics "
                    f"['{topic}']: SaslAuthenticationException: Authentication failed during authentication due to "
                    "invalid credentials with SASL mechanism SCRAM-SHA-512"), last
    assert "wrong-password" not in refused.stderr + refused.stdout
    data = tmp_path / "data" / "secured"
    assert not (data / "state").exists() and not (data / "checkpoint").exists()  # no driver epoch taken, no offsets

    refused_check = doctor_kafka_verdict(config, broker, "wrong-password")  # the job's own client and settings
    assert refused_check["verdict"] == "FAIL" and "invalid credentials with SASL mechanism SCRAM-SHA-512" in refused_check["detail"]
    passed_check = doctor_kafka_verdict(config, broker, SECURE_PASSWORD)
    assert passed_check == {"name": "kafka", "verdict": "OK", "detail": f"{broker.secure_bootstrap} (SASL_SSL), topics ['{topic}']: "
                                                                          "reachable, topics exist"}

    accepted = run_job(config, broker, SECURE_PASSWORD)
    assert accepted.returncode == 0, accepted.stderr[-3000:]
    with open_target(data / "clickhouse", "default") as target:
        rows = target.client().query("SELECT id, name FROM default.orders").result_rows
    assert sorted(rows) == [(m["id"], m["name"]) for m in messages]
