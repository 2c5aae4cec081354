"""The main job's demo: local Kafka -> streaming-sink -> embedded ClickHouse, with a kill -9 in the middle.

1. starts a real Kafka broker (KRaft) under ./data/demo and produces 3 x 2000 JSON orders/payments;
2. runs the packaged ingestion job (`python -m streaming_sink.job`) with the file state store and
   chdb, and has it SIGKILL itself right after the first commit of batch 3 (half committed);
3. runs it again on the same checkpoint, which rolls the batch forward and finishes the topic;
4. compares both tables to the source row by row (count and checksum) and prints the verdict.
"""
from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path

from devstack.kafka import KafkaBroker
from devstack.pipeline import LocalPipeline

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    data = ROOT / "data" / "demo"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    print(f"[demo] data directory: {data}")
    with KafkaBroker(data / "kafka") as broker:
        print(f"[demo] Kafka broker (KRaft) at {broker.bootstrap}")
        pipeline = LocalPipeline(
            data / "job", broker, f"file://{data / 'job' / 'state'}",
            messages_per_partition=2000, max_offsets_per_trigger=1000,
        )
        pipeline.produce()
        total = sum(len(rows) for rows in pipeline.source.values())
        print(f"[demo] produced {total} messages to topic {pipeline.topic} ({pipeline.partitions} partitions)")
        print("[demo] run 1: job starts; it will kill -9 itself after the first commit of batch 3")
        code = pipeline.run_driver(crash_at="after-first-commit@3", run=0)
        if code != -signal.SIGKILL:
            print(f"[demo] FAILED: expected the driver to be killed, it exited {code}\n{pipeline.log_tail(0)}")
            return 1
        record, intents, done = pipeline.batch_state(3)
        print(
            f"[demo] driver killed: batch 3 is {record.state.value} with {len(done)} of "
            f"{len(record.committables)} transactions committed, {len(intents)} intents recorded"
        )
        print("[demo] run 2: restart on the same checkpoint")
        pipeline.run_to_completion()
        report = pipeline.verify()
    for table, (rows, checksum) in report.items():
        print(f"[demo] {table}: {rows} rows, checksum {checksum:016x} == source")
    print(f"[demo] OK: exactly once ({sum(r for r, _ in report.values())} rows of {total}), "
          "no staging tables, no intents, every batch COMMITTED")
    print(f"[demo] driver logs: {pipeline.logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
