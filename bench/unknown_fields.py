"""What finding unknown fields costs the packaged job's parse (issue 25): the job's own frame (`frame.build_frame`) over
the bench's events, side by side in one Spark session, in four variants:

  dead-letter             the default `sink.on_unknown_field`: detected, counted, such a message becomes a dead letter
  ignore                  detected and counted, loaded without the field
  undetected-dead-letter  the frame with `json_object_keys` answering NULL, so no message has unknown fields: the
  undetected-ignore       parse without detection, under each policy (bench-only: the job has no switch that turns
                          detection off; "ignore" still detects, to count)

Each run is a Spark `noop` write of the whole frame (route, parse per table, value checks, the observe() counts) over
the same cached events; the variants take turns in a rotating order, after one warm-up round. Each run's wall time and
the CPU time of Spark's JVM (where all of this work runs: the frame has no Python UDF) are kept: on a machine others
share, the CPU time is the steadier measure. bench/driver.py goes
through the sink but not through this frame, hence this script.

`python -m bench.unknown_fields [--events N] [--rounds R] [--no-record]` writes
bench/results/unknown-fields-<date>.json (the machine and its load, every time, the medians and their ratios).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.__main__ import events, machine

VARIANTS = ("dead-letter", "ignore", "undetected-dead-letter", "undetected-ignore")
KAFKA = "value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP"
#: The bench's tables: its events' fields, `table` aside (it routes the message).
TABLE_SCHEMA = ("id BIGINT, user_id BIGINT, name STRING, amount DOUBLE, currency STRING, country STRING, status STRING, "
                "created_at STRING, note STRING")
RESULTS = Path(__file__).resolve().parent / "results"


@contextlib.contextmanager
def undetected() -> Iterator[None]:
    """Build frames whose messages' keys read as NULL: what the frame costs without finding unknown fields."""
    from pyspark.sql import functions as F

    original = F.json_object_keys
    F.json_object_keys = lambda column: F.lit(None).cast("array<string>")
    try:
        yield
    finally:
        F.json_object_keys = original


def jvm_cpu_s(spark: Any) -> float:
    """CPU seconds (user + system, every thread) Spark's JVM has used so far, from /proc."""
    pid = spark.sparkContext._gateway.proc.pid
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def frame_for(raw: Any, variant: str, scratch: Path) -> Any:
    from streaming_sink.frame import build_frame
    from streaming_sink.job_spec import JobSpec

    spec = JobSpec(job_id="bench-unknown", bootstrap="unused", topics=["events"], target_url=f"chdb://{scratch}/ch",
                   database="bench", state_url=f"file://{scratch}/state", checkpoint=str(scratch / "ckpt"),
                   tables={"orders": TABLE_SCHEMA, "payments": TABLE_SCHEMA}, table_field="table",
                   dead_letter_table="dead_letters",
                   on_unknown_field=variant.removeprefix("undetected-"))
    spec.validate()
    with undetected() if variant.startswith("undetected-") else contextlib.nullcontext():
        return build_frame(raw, spec, dict(spec.tables or {}))


def run(event_count: int, rounds: int, scratch: Path) -> dict[str, Any]:
    from tests.support.services.spark import local_spark_session

    spark = local_spark_session("bench-unknown-fields")
    spark.sparkContext.setLogLevel("ERROR")
    stamp = datetime.datetime(2026, 11, 22)
    rows = [(bytearray(value), "events", i % 4, i // 4, stamp) for i, value in enumerate(events(event_count))]
    raw = spark.createDataFrame(rows, KAFKA).repartition(4).cache()
    assert raw.count() == event_count
    frames = {variant: frame_for(raw, variant, scratch) for variant in VARIANTS}
    times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    cpu: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for round_number in range(rounds + 1):  # round 0 warms the JVM and the Python side up; it is not kept
        order = VARIANTS[round_number % len(VARIANTS):] + VARIANTS[:round_number % len(VARIANTS)]
        for variant in order:
            started, cpu_before = time.perf_counter(), jvm_cpu_s(spark)
            frames[variant].write.format("noop").mode("overwrite").save()
            if round_number:
                times[variant].append(round(time.perf_counter() - started, 3))
                cpu[variant].append(round(jvm_cpu_s(spark) - cpu_before, 2))
    spark.stop()
    return {"wall": summary(times, event_count), "jvm_cpu": summary(cpu, event_count)}


def summary(seconds: dict[str, list[float]], event_count: int) -> dict[str, Any]:
    """Every run's seconds, their medians, and the ratios asked for: what detection costs under each policy (detected
    against undetected), and what "ignore" saves against the default."""
    median = {variant: statistics.median(values) for variant, values in seconds.items()}
    return {
        "seconds": seconds,
        "median_s": median,
        "events_per_s": {variant: round(event_count / value) for variant, value in median.items()},
        "detected_to_undetected": {policy: round(median[policy] / median[f"undetected-{policy}"], 3)
                                   for policy in ("dead-letter", "ignore")},
        "ignore_to_default": round(median["ignore"] / median["dead-letter"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.unknown_fields", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-record", action="store_true", help="print the result, write nothing")
    args = parser.parse_args()
    scratch = Path("data/bench/unknown-fields").resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    started = time.time()
    data = {"date": datetime.date.today().isoformat(), "machine": machine(),
            "config": {"events": args.events, "rounds": args.rounds, "spark": "local[2]", "partitions": 4},
            **run(args.events, args.rounds, scratch)}
    data["load_average_at_end"] = os.getloadavg()
    data["elapsed_s"] = round(time.time() - started, 1)
    text = json.dumps(data, indent=2)
    print(text)
    if not args.no_record:
        (RESULTS / f"unknown-fields-{data['date']}.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
