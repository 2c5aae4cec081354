"""`python -m bench.tables`: the tables axis. The same rows per batch spread over 1, 10, 100 and 1000 tables,
written by 16 writers in Spark tasks into the StarRocks and Doris emulators at their servers' default limits
(StarRocks 3.x: 1000 running transactions per database, `label_keep_max_num` 1000; Doris 2.1: 100 running).

Each point is a fresh driver process (`--one`), so its peak memory is its own; the parent samples the RSS of the
driver, its JVM and its Python workers (`RssSampler`, shared with `python -m bench`). Each point checks that every
table holds exactly the source's ids, else it is recorded as not exact. A point the server refuses (a batch that
cannot fit) is recorded with the refusal, not dropped. The goal (issue 26): batch time grows with rows, not with
tables x writers, and 1000 tables x 16 writers runs exact on both servers' default limits.

Writes bench/results/tables-<date>.json and .png unless `--no-record`.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench.__main__ import REPO, RESULTS, RssSampler, machine

TABLES = (1, 10, 100, 1000)
TARGETS = ("starrocks", "doris")
DB, JOB, QUERY = "bench", "bench-tables", "bench-tables-query"


def table_name(index: int) -> str:
    return f"t{index:04d}"


def one(target_kind: str, tables: int, rows: int, writers: int, batches: int, work: Path) -> dict[str, Any]:
    """One point, in this process: a fresh emulator with `tables` tables, `batches` batches of `rows` rows."""
    from pyspark.sql import functions as F

    from streaming_sink.sink import ExactlyOnceSink
    from streaming_sink.state import FileStateStore
    from streaming_sink.targets.base import Target
    from streaming_sink.targets.doris import DorisTarget
    from streaming_sink.targets.starrocks import StarRocksTarget
    from tests.support.doubles.emulators.doris import DorisEmulator
    from tests.support.doubles.emulators.starrocks import StarRocksEmulator
    from tests.support.services.spark import local_spark_session

    emulator = (StarRocksEmulator if target_kind == "starrocks" else DorisEmulator)(work / "server")  # default limits
    point: dict[str, Any] = {"target": target_kind, "tables": tables, "writers": writers, "rows_per_batch": rows,
                             "batches": []}
    with emulator:
        for index in range(tables):
            emulator.create_table(DB, table_name(index), [("id", "BIGINT"), ("name", "VARCHAR(32)")])
        target: Target = (StarRocksTarget(emulator.fe_url, DB, "root", "") if target_kind == "starrocks"
                          else DorisTarget(emulator.fe_url, DB, "root", ""))
        spark = local_spark_session(f"bench-tables-{target_kind}-{tables}", {})
        sink = ExactlyOnceSink(target, FileStateStore(work / "state"), JOB, table_column="__table", heartbeat_seconds=None)
        started = time.perf_counter()
        try:
            for batch in range(batches):
                table = F.concat(F.lit("t"), F.lpad((F.col("id") % tables).cast("string"), 4, "0"))
                df = spark.range(batch * rows, (batch + 1) * rows, numPartitions=writers).select(
                    table.alias("__table"), F.col("id"), F.concat(F.lit("n"), F.col("id").cast("string")).alias("name"))
                began = time.perf_counter()
                report = sink.process(df, batch, QUERY)
                point["batches"].append({"batch": batch, "seconds": round(time.perf_counter() - began, 3),
                                         "transactions": report.transactions,
                                         "waves": getattr(report, "waves", None), "rows": report.rows})
        except Exception as error:  # a refusal is a result of this point, recorded with its first line
            point["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:500]}"
            point["traceback_tail"] = traceback.format_exc().splitlines()[-3:]
        point["seconds"] = round(time.perf_counter() - started, 3)
        done = len(point["batches"])
        point["exact"] = _exact(emulator, tables, rows * done) if done else None
        spark.stop()
        sink.close()
    return point


def _exact(emulator: Any, tables: int, total: int) -> bool:
    """Every table holds exactly the ids the batches sent to it, once each."""
    expected: dict[str, list[int]] = {table_name(i): [] for i in range(tables)}
    for row_id in range(total):
        expected[table_name(row_id % tables)].append(row_id)
    return all(sorted(r[0] for r in emulator.visible_rows(DB, table)) == ids for table, ids in expected.items())


def run_point(target_kind: str, tables: int, rows: int, writers: int, batches: int, work: Path) -> dict[str, Any]:
    """One point in a fresh driver process, its memory sampled."""
    folder = work / f"{target_kind}-{tables}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    out = folder / "point.json"
    command = [sys.executable, "-m", "bench.tables", "--one", target_kind, str(tables), "--rows", str(rows),
               "--writers", str(writers), "--batches", str(batches), "--work", str(folder), "--out", str(out)]
    with open(folder / "driver.log", "w") as log:
        process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        with RssSampler(process.pid) as sampler:
            code = process.wait()
    point = json.loads(out.read_text()) if out.exists() else {"target": target_kind, "tables": tables,
                                                              "error": f"driver exited {code}, see {folder}/driver.log"}
    point["peak_rss_mib"] = sampler.summary()
    return point


def plot(points: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (times, transactions) = plt.subplots(1, 2, figsize=(11, 4))
    for kind in sorted({p["target"] for p in points}):
        mine = [p for p in points if p["target"] == kind and p.get("batches")]
        xs = [p["tables"] for p in mine]
        times.plot(xs, [max(b["seconds"] for b in p["batches"]) for p in mine], marker="o", label=kind)
        transactions.plot(xs, [max(b["transactions"] for b in p["batches"]) for p in mine], marker="o", label=kind)
    for axis, title in ((times, "slowest batch (s)"), (transactions, "transactions per batch")):
        axis.set_xscale("log")
        axis.set_xlabel("tables (same rows per batch)")
        axis.set_title(title)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tables", description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default=",".join(map(str, TABLES)), help="table counts, comma-separated")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--rows", type=int, default=40_000, help="rows per batch (all tables together)")
    parser.add_argument("--writers", type=int, default=16, help="Spark partitions of each batch: the writers")
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--work", default=str(REPO / "data" / "bench-tables"))
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--one", nargs=2, metavar=("TARGET", "TABLES"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    work = Path(args.work)
    if args.one:
        point = one(args.one[0], int(args.one[1]), args.rows, args.writers, args.batches, work)
        Path(args.out).write_text(json.dumps(point))
        return 0
    data: dict[str, Any] = {"machine": machine(), "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                            "config": {"rows_per_batch": args.rows, "writers": args.writers, "batches": args.batches},
                            "points": []}
    for kind in args.targets.split(","):
        for tables in map(int, args.tables.split(",")):
            point = run_point(kind, tables, args.rows, args.writers, args.batches, work)
            data["points"].append(point)
            slowest = max((b["seconds"] for b in point.get("batches", [])), default=None)
            print(f"{kind:9} {tables:5} tables: exact={point.get('exact')} slowest batch={slowest}s "
                  f"transactions={[b['transactions'] for b in point.get('batches', [])]} "
                  f"rss={point['peak_rss_mib']} {point.get('error', '')}", flush=True)
    data["load_average_at_end"] = os.getloadavg()
    if not args.no_record:
        stem = RESULTS / f"tables-{datetime.date.today().isoformat()}"
        stem.with_suffix(".json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        plot(data["points"], stem.with_suffix(".png"))
        print(f"recorded {stem}.json and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
