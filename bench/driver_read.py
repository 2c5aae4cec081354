"""What getting one micro-batch into the driver costs, side by side in one Spark session, without Kafka or a target.

`python -m bench.driver_read [--rows 50000] [--rounds 12] [--no-record]` parses the bench's JSON events (4 partitions,
the strings cached, the parse done again on every read, as a Kafka batch's is) and reads them, the ways alternated
round after round: Spark's `noop` sink, `df.toArrow()`, and the stream the driver's writer reads
(`streaming_sink.execution._arrow_stream`), with each row tagged with its Spark partition and without. It prints
the median ms per read of each and writes bench/results/driver-read-<date>.json. The tag is what the driver's
writer read until its checksum took each Arrow batch as a source (`writer.ContentChecksum`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.__main__ import PARTITIONS, RESULTS, events, machine
from bench.driver import SCHEMA
from streaming_sink.execution import _arrow_stream


def _reads(df: Any) -> dict[str, Callable[[], int]]:
    def stream(tagged: bool) -> Callable[[], int]:
        return lambda: sum(batch.num_rows for _, batch in _arrow_stream(df, tagged))

    return {
        "noop": lambda: df.write.format("noop").mode("overwrite").save() or 0,
        "toArrow": lambda: df.toArrow().num_rows,
        "stream, tagged": stream(True),
        "stream, untagged": stream(False),
    }


def run(rows: int, rounds: int) -> dict[str, Any]:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (SparkSession.builder.master("local[2]").appName("bench-driver-read")
             .config("spark.sql.session.timeZone", "UTC").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        raw = spark.createDataFrame([(e.decode(),) for e in events(rows)], "value STRING").repartition(PARTITIONS).cache()
        raw.count()
        df = raw.select(F.from_json("value", SCHEMA).alias("e")).select("e.*")
        reads = _reads(df)
        times: dict[str, list[float]] = {name: [] for name in reads}
        for round_number in range(rounds + 1):  # round 0 warms the JVM and the Python side up; it is not kept
            for name, read in reads.items():
                began = time.perf_counter()
                got = read()
                elapsed = time.perf_counter() - began
                if name != "noop" and got != rows:
                    raise RuntimeError(f"{name} read {got} rows of {rows}")
                if round_number:
                    times[name].append(elapsed * 1000)
        return {"median_ms": {name: round(statistics.median(t), 1) for name, t in times.items()},
                "ms": {name: [round(v, 1) for v in t] for name, t in times.items()}}
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.driver_read", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
              "config": {"rows": args.rows, "rounds": args.rounds, "partitions": PARTITIONS, "spark": "local[2]"},
              **run(args.rows, args.rounds)}
    for name, ms in result["median_ms"].items():
        print(f"{name:>18}: {ms:7.1f} ms a read (median of {args.rounds})")
    if not args.no_record:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"driver-read-{datetime.date.today().isoformat()}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
