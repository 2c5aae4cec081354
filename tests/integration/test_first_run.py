"""A user's first run: the README's `streaming-sink run --config job.toml` on examples/job.toml with only
the bootstrap address changed, in a fresh process that has nothing of the devstack (no Kafka jars,
no worker Python, no Spark settings in the environment). The rows must arrive exactly as sent."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.pipeline import open_target
from tests.support.services.kafka import KafkaBroker

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "streaming-sink"


def user_environment(venv_activated: bool) -> dict[str, str]:
    """The test runner's environment less everything that would hand the job a working Spark setup.

    Not activated, `python3` on PATH is not the venv's, as for a user who runs `.venv/bin/streaming-sink`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "SPARK_", "STREAMING_SINK_")) and k not in ("PYTHONPATH", "JAVA_TOOL_OPTIONS")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != CLI.parent.resolve()]
    env["PATH"] = os.pathsep.join([str(CLI.parent), *path] if venv_activated else path)
    return env


def spark_submit(spark_version: str) -> list[str]:
    """spark-submit as a cluster user runs it: the Kafka source by --packages, the job as a file."""
    import pyspark

    launcher = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    package = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version}"
    return [str(launcher), "--master", "local[2]", "--packages", package,
            str(REPO / "streaming_sink" / "launch.py"), "--config", "job.toml"]


@pytest.mark.parametrize("how", ["streaming-sink run", "spark-submit"])
def test_the_example_job_runs_on_a_plain_install(tmp_path, how):
    with KafkaBroker(tmp_path / "kafka") as broker:  # the user's broker, topic "events" as in the example
        run_example(tmp_path, broker, how)


def run_example(tmp_path: Path, kafka_broker: KafkaBroker, how: str) -> None:
    example = (REPO / "examples" / "job.toml").read_text()
    config = re.sub(r'(?m)^bootstrap_servers = ".*"$', f'bootstrap_servers = "{kafka_broker.bootstrap}"', example)
    assert config != example
    (tmp_path / "job.toml").write_text(config)
    assert "[spark" not in config  # no Spark settings: the job must find its Kafka source itself

    kafka_broker.create_topic("events", partitions=2)
    orders = [{"table": "orders", "id": i, "name": f"o{i}", "amount": i / 4} for i in range(40)]
    payments = [{"table": "payments", "id": i, "method": "card", "amount": i * 1.5} for i in range(25)]
    bad = ['{"table": "orders", "name": "no id"}', "not json", '{"table": "refunds", "id": 1}']
    kafka_broker.produce("events", [json.dumps(m) for m in orders + payments] + bad)

    import pyspark

    argv = [str(CLI), "run", "--config", "job.toml"] if how == "streaming-sink run" else spark_submit(pyspark.__version__)
    # spark-submit starts the driver with `python3`: its users activate the venv (or set PYSPARK_DRIVER_PYTHON)
    env = user_environment(venv_activated=how == "spark-submit")
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]

    with open_target(tmp_path / "data" / "orders-ingest" / "clickhouse", "default") as target:
        def rows(sql: str) -> list[tuple]:
            return sorted(tuple(r) for r in target.client().query(sql).result_rows)

        assert rows("SELECT id, name, amount FROM default.orders") == [(m["id"], m["name"], m["amount"]) for m in orders]
        assert rows("SELECT id, method, amount FROM default.payments") == [(m["id"], m["method"], m["amount"]) for m in payments]
        assert rows("SELECT raw_value, topic FROM default.dead_letters") == sorted((b, "events") for b in bad)
