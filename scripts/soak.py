"""Soak: the packaged job on a Spark standalone cluster, killed again and again, must end exact.

Real parts: a Kafka broker (KRaft), Redis (AOF), a Spark master with two workers on 127.0.0.2 and
127.0.0.3; the StarRocks emulator (a test double, in this process) with faults armed at random.
The driver is SIGKILLed (its process group: Python and its JVM) and executors are SIGKILLed at
instants drawn from the seed; the driver is restarted whenever it dies. At the end the job runs
until the topic is drained and the target is compared with the source row by row.

Not part of CI (it runs for tens of minutes). Usage: scripts/soak.sh [--events N] [--kills K] [--seed S]
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.doubles.emulators.starrocks import StarRocksEmulator  # noqa: E402
from tests.support.pipeline import LocalPipeline  # noqa: E402
from tests.support.services.kafka import KafkaBroker  # noqa: E402
from tests.support.services.redis import RedisServer  # noqa: E402
from tests.support.services.spark_cluster import executor_pids, standalone_cluster  # noqa: E402
from tests.support.targets.starrocks import StarRocksAdapter  # noqa: E402

FAULTS = ("publish_timeout", "write_lock_timeout", "drop_connection_after_commit", "http_5xx")


def newest_committed(pipeline: LocalPipeline) -> int:
    """The highest batch id with a COMMITTED record (-1: none yet)."""
    store = pipeline.store()
    try:
        committed = [b for q, b in store.batch_keys(pipeline.job_id)
                     if (record := store.get_batch(pipeline.job_id, q, b)) is not None and record.state.value == "COMMITTED"]
        return max(committed, default=-1)
    finally:
        store.close()


def wait_for_progress(pipeline: LocalPipeline, proc: subprocess.Popen, newest: int, timeout: float) -> None:
    """Until a batch newer than `newest` is committed, the driver exits, or `timeout` passes (polling the store)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None and newest_committed(pipeline) <= newest:
        time.sleep(0.2)


def soak(events: int, kills: int, seed: int, minutes: float, work: Path) -> dict:
    rng = random.Random(seed)
    started = time.monotonic()
    partitions = 4
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(KafkaBroker(work / "kafka"))
        redis = stack.enter_context(RedisServer(work / "redis"))
        emulator = stack.enter_context(StarRocksEmulator(work / "starrocks", password="soak"))
        master = stack.enter_context(standalone_cluster(work))
        pipeline = LocalPipeline(
            work / "job", broker, redis.url,
            partitions=partitions,
            messages_per_partition=events // partitions,
            max_offsets_per_trigger=max(1000, events // 100),
            adapter=StarRocksAdapter(emulator, {"commit_parallelism": 4}),
            spark_conf={
                "spark.master": master,
                "spark.executor.cores": "1",
                "spark.executor.memory": "768m",
                "spark.task.maxFailures": "8",
                "spark.executorEnv.PYTHONPATH": str(REPO),
                "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
                "spark.sql.shuffle.partitions": "2",
            },
        )
        print(f"soak: producing {events} events into {partitions} partitions", flush=True)
        pipeline.produce()
        landed = {"driver": 0, "executor": 0}
        run = 0
        proc = pipeline.start_driver(run=run)
        deadline = started + minutes * 60
        while sum(landed.values()) < kills and time.monotonic() < deadline:
            # Once the (re)started driver commits one more batch (a progress marker read from the state
            # store), the next kill comes at an instant drawn from the seed: mid-write, mid-commit, anywhere.
            wait_for_progress(pipeline, proc, newest_committed(pipeline), timeout=300)
            try:
                code = proc.wait(timeout=rng.uniform(0.0, 8.0))
            except subprocess.TimeoutExpired:
                code = None
            if code == 0:
                print("soak: the job drained the topic before every kill landed", flush=True)
                break
            if code is not None:  # it died by itself (e.g. too many task failures): restart, as an operator would
                print(f"soak: driver run {run} exited {code}; restarting", flush=True)
                run += 1
                proc = pipeline.start_driver(run=run)
                continue
            if rng.random() < 0.2:
                getattr(emulator.faults, rng.choice(FAULTS)).arm(times=rng.randint(1, 3), op="commit", role="fe")
            executors = executor_pids()
            if rng.random() < 0.35 or not executors:
                pipeline.kill(proc)
                landed["driver"] += 1
                run += 1
                proc = pipeline.start_driver(run=run)
            else:
                os.kill(rng.choice(executors), signal.SIGKILL)
                landed["executor"] += 1
            print(f"soak: kills so far {landed} at {time.monotonic() - started:.0f}s", flush=True)
        pipeline.kill(proc)
        for fault in FAULTS:
            getattr(emulator.faults, fault).disarm()
        pipeline.run_driver(run=run + 1, timeout=max(600.0, events / 500))
        problems: list[str] = []
        try:
            report = pipeline.verify()
        except AssertionError as error:
            problems.append(str(error)[:2000])
            report = {}
        return {
            "seed": seed, "events": events, "partitions": partitions, "kills": landed,
            "driver_runs": run + 2, "duration_s": round(time.monotonic() - started),
            "exact": not problems, "problems": problems,
            "tables": {t: {"rows": n, "checksum": c} for t, (n, c) in report.items()},
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--minutes", type=float, default=90.0, help="stop killing after this long")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        result = soak(args.events, args.kills, args.seed, args.minutes, Path(tmp))
    result.update(
        command=" ".join(["scripts/soak.sh", *sys.argv[1:]]),
        machine=f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    out = REPO / "bench" / "results" / f"soak-{result['date'][:10]}-seed{args.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"soak: result in {out.relative_to(REPO)}")
    return 0 if result["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
