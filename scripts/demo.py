"""The README's main job: the packaged Kafka ingestion job on embedded defaults, killed and restarted.

1. starts a real Kafka broker (KRaft) under ./data/demo and produces 3 x 2000 JSON messages for two
   tables, with malformed and misfit ones mixed in;
2. runs `streaming-sink run --config job.toml` with no [target] and no [state]: ClickHouse embedded
   through chdb and a file state store, tables created from the schemas; the driver SIGKILLs itself
   right after the first commit of batch 3 (half of that batch visible);
3. runs it again on the same checkpoint, which rolls the batch forward and drains the topic;
4. compares both tables and the dead letters with the source, row by row, and prints the verdict.
"""
from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path

from tests.support.jobs import DEAD_LETTERS, ConfigJob
from tests.support.services.kafka import KafkaBroker

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    data = ROOT / "data" / "demo"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    print(f"[demo] working directory: {data}")
    with KafkaBroker(data / "kafka") as broker:
        print(f"[demo] Kafka broker (KRaft) at {broker.bootstrap}")
        job = ConfigJob(data / "job", broker.bootstrap, "events", messages_per_partition=2000, max_offsets_per_trigger=1000)
        total = job.produce(broker)
        bad = len(job.expected[DEAD_LETTERS])
        print(f"[demo] produced {total} messages to topic 'events' (3 partitions), {bad} of them malformed or misfit")
        print(f"[demo] config: {job.config_path}")
        print("[demo] run 1: `streaming-sink run --config job.toml`; it kills -9 itself after the first commit of batch 3")
        code = job.run(0, crash_at="after-first-commit@3")
        if code != -signal.SIGKILL:
            print(f"[demo] FAILED: the driver should have been killed, it exited {code}\n{job.log_tail(0)}")
            return 1
        record, done = job.batch(3)
        print(f"[demo] driver killed: batch 3 is {record.state.value}, {len(done)} of {len(record.committables)} "
              "transactions committed")
        print("[demo] run 2: the same command again, on the same checkpoint")
        code = job.run(1)
        if code != 0:
            print(f"[demo] FAILED: the restarted driver exited {code}\n{job.log_tail(1)}")
            return 1
        report = job.verify()
    for table, (rows, checksum) in report.items():
        print(f"[demo] {table:<13} {rows:>5} rows, checksum {checksum:016x} == source")
    loaded = sum(rows for table, (rows, _) in report.items() if table != DEAD_LETTERS)
    print(f"[demo] OK: {total} messages in = {loaded} rows loaded + {report[DEAD_LETTERS][0]} dead letters, "
          "each exactly once; every batch COMMITTED, nothing left prepared")
    print(f"[demo] tables: chdb at {job.data_dir / 'clickhouse'}; driver logs: {job.logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
