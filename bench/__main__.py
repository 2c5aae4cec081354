"""`python -m bench [--quick | --events N --batches B]`: every mode side by side on one Kafka topic, in one run.

Starts a real Kafka broker (4 partitions), Redis and the null Stream Load server (its own process),
produces the events once, then runs each mode in a fresh driver process (bench/driver.py) and
measures: throughput relative to Spark's noop sink, peak RSS of the driver and the Python workers
(sampled from /proc), memory as the batch grows 1x/10x/100x, restart time, the commit phase alone,
encode + send per core, and cProfiles of the exactly-once modes. Writes
bench/results/bench-<date>.json and .png and the table in bench/README.md.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import pstats
import random
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
STDLIB = sysconfig.get_paths()["stdlib"]
PARTITIONS = 4
SIZES = {"quick": (40_000, 4), "full": (400_000, 8)}  # events, micro-batches of the throughput runs
THROUGHPUT_MODES = ("noop", "toarrow", "tasks-arrow", "alo-chdb-hand", "alo-chdb-sink", "eo-chdb-file", "eo-chdb-redis",
                    "alo-null-starrocks", "eo-null-starrocks", "alo-null-doris", "eo-null-doris", "eo-null-doris-arrow",
                    "eo-null-spread-starrocks")
MEMORY_MODES = ("eo-chdb-file", "eo-null-starrocks")
RESTART_MODES = ("noop", "eo-chdb-file", "eo-null-starrocks")
PROFILE_MODES = ("eo-chdb-file", "eo-null-starrocks")


def log(message: str) -> None:
    print(f"bench [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the data ----------------------------------------------------------------------------------------


def events(count: int, start: int = 0, seed: int = 11) -> list[bytes]:
    """JSON events of about 200 bytes and 10 fields, half for each table."""
    rng = random.Random(seed + start)
    out = []
    for i in range(start, start + count):
        out.append(json.dumps({
            "id": i, "table": ("orders", "payments")[i % 2], "user_id": rng.randrange(10**9),
            "name": f"customer-{i:09d}", "amount": round(rng.random() * 1000, 2),
            "currency": ("EUR", "USD", "GBP")[i % 3], "country": ("DE", "FR", "US", "GB", "NL")[i % 5],
            "status": ("paid", "pending", "refunded")[i % 3],
            "created_at": f"2026-11-22T10:{(i // 60) % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z",
            "note": f"note {i} lorem ipsum dolor sit amet",
        }, separators=(",", ":")).encode())
    return out


def produce(broker: Any, topic: str, count: int, start: int = 0) -> None:
    """`count` events spread evenly over the topic's partitions (created on first use)."""
    if start == 0:
        broker.create_topic(topic, PARTITIONS)
    values = events(count, start)
    for partition in range(PARTITIONS):
        broker.produce(topic, values[partition::PARTITIONS], partition=partition)


# -- one driver ------------------------------------------------------------------------------------


class RssSampler:
    """Peak RSS (VmHWM) of a driver's process group, sampled from /proc: the Python driver, its JVM, and
    the Python workers (pyspark daemon and workers). Sampling, not synchronisation: it only reads."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pid, self.interval = pid, interval
        self.peak: dict[str, int] = {}  # role -> KiB
        self.workers: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def _descendants(self) -> list[int]:
        """The driver and every process below it, from /proc/<pid>/task/<tid>/children (cheap: no /proc scan)."""
        found, pending = [], [self.pid]
        while pending:
            pid = pending.pop()
            found.append(pid)
            with contextlib.suppress(OSError):
                for task in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(OSError):
                        pending.extend(int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
        return found

    def sample(self) -> None:
        for pid in self._descendants():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            hwm = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
            if pid == self.pid:
                role = "driver_python"
            elif "java" in cmdline.split(" ")[0]:
                role = "driver_jvm"
            elif "pyspark" in cmdline or "python" in cmdline:
                role = "python_worker"
                self.workers[pid] = max(self.workers.get(pid, 0), hwm)
            else:
                continue
            self.peak[role] = max(self.peak.get(role, 0), hwm)

    def summary(self) -> dict[str, float]:
        mib = {k: round(v / 1024, 1) for k, v in self.peak.items()}
        mib["python_workers_sum"] = round(sum(self.workers.values()) / 1024, 1)
        mib["python_workers"] = len(self.workers)
        return mib


def run_driver(spec: dict[str, Any], work: Path, name: str) -> dict[str, Any]:
    """Run one mode in a fresh process (its own session, so the sampler finds its JVM and workers)."""
    spec_path = work / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=str(REPO), PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    log_path = work / f"{name}.log"
    with open(log_path, "w") as out:
        launched = time.time()
        proc = subprocess.Popen([sys.executable, "-m", "bench.driver", str(spec_path)], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=out, start_new_session=True, text=True)
        try:
            with RssSampler(proc.pid) as sampler:
                stdout, _ = proc.communicate(timeout=1200)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)  # whatever of its group outlived it
    lines = [line for line in stdout.splitlines() if line.startswith("BENCH_RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"driver {name} exited {proc.returncode}:\n{tail}")
    result = json.loads(lines[-1][len("BENCH_RESULT "):])
    result["launched"] = launched
    result["rss_mib"] = sampler.summary()
    result["rss_mib"]["driver_python_self"] = round(result.pop("driver_maxrss_kb") / 1024, 1)
    if result.get("first_batch_done"):
        result["first_batch_after_launch_s"] = result["first_batch_done"] - launched
    return result


# -- targets' counts --------------------------------------------------------------------------------


def null_stats(url: str, reset: bool = False) -> dict[str, Any]:
    import requests

    response = requests.request("POST" if reset else "GET", f"{url}/bench/{'reset' if reset else 'stats'}", timeout=30)
    response.raise_for_status()
    return response.json()


def chdb_rows(path: Path) -> int:
    from bench.driver import DATABASE, TABLES
    from streaming_sink.targets.clickhouse import ClickHouseTarget

    target = ClickHouseTarget(f"chdb://{path}", database=DATABASE)
    try:
        return sum(int(target.client().command(f"SELECT count() FROM {DATABASE}.{t}")) for t in TABLES)
    finally:
        target.close()


@contextlib.contextmanager
def null_server_process(work: Path) -> Iterator[str]:
    """The null server in its own process: its CPU is not the client's. Ready when it prints its URL."""
    with open(work / "null-server.log", "w") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, "-m", "bench.null_server", "--exit-with-stdin"], cwd=REPO,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"null server did not start: {line!r}")
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait()


# -- the run ---------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path, broker: Any, redis_url: str, null_url: str) -> None:
        self.args, self.work, self.broker, self.redis_url, self.null_url = args, work, broker, redis_url, null_url
        self.runs = 0
        self.errors: list[dict[str, Any]] = []
        self.on_progress: Callable[[list[dict[str, Any]]], None] = lambda results: None

    def guarded(self, part: str, measure: Callable[[], Any]) -> Any:
        """A part that fails is recorded as an error; the parts after it still run."""
        try:
            return measure()
        except (RuntimeError, StopIteration, KeyError) as error:
            log(f"{part} FAILED: {error}")
            self.errors.append({"part": part, "error": str(error)[-2000:]})
            return None

    def spec(self, mode: str, topic: str, max_offsets: int, checkpoint: str, starting: str = "earliest",
             chdb: str | None = None, profile_dir: str | None = None) -> dict[str, Any]:
        self.runs += 1
        store = self.redis_url if mode == "eo-chdb-redis" else f"file://{self.work / 'state' / checkpoint}"
        return {"mode": mode, "bootstrap": self.broker.bootstrap, "topic": topic, "starting_offsets": starting,
                "max_offsets": max_offsets, "checkpoint": str(self.work / "checkpoints" / checkpoint),
                "chdb_path": str(self.work / "chdb" / (chdb or checkpoint)), "state_url": store,
                "null_url": self.null_url, "profile_dir": profile_dir}

    def verify(self, mode: str, result: dict[str, Any], chdb: str, expected: int) -> None:
        """Every mode must have delivered every event (exactly, for the sink's modes): else its time means nothing."""
        if "chdb" in mode and mode != "alo-chdb-hand":
            got = chdb_rows(self.work / "chdb" / chdb)
        elif "null" in mode:
            stats = null_stats(self.null_url)
            got = stats["committed_rows"]
            result["null_server"] = {  # what reached the server; `requests` leaves out this read
                "body_bytes": stats["body_bytes"], "wire_bytes_per_row": stats["body_bytes"] / max(1, stats["rows"]),
                "transactions": stats["begun"], "committed": stats["committed"], "requests": stats["requests"] - 1,
                "schema_requests": stats["by_op"].get("_schema", 0)}
        else:
            got = result["rows"]
        if mode == "alo-chdb-hand":
            got = chdb_rows(self.work / "chdb" / chdb)
        result["delivered"] = got
        if got != expected:
            raise RuntimeError(f"{mode}: delivered {got} rows, expected {expected}")

    def throughput(self, topic: str, events_total: int, batches: int) -> list[dict[str, Any]]:
        """Every mode once per round, rounds one after another, so that the modes a goal compares ran minutes apart
        at most and each ratio is taken within a round (a machine's drift between rounds cancels out). A mode's
        result is its median round; `rounds` keeps every round's rows/s and x noop."""
        per_batch = events_total // batches
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in self.args.modes}
        # the first driver of a bench runs cold (the JVM's and the OS's caches): measured, noop came out 0.8 of its
        # later rounds, and every ratio to it flattered the modes; one noop run warms up and is not kept
        log("throughput: warm-up (noop, not kept)")
        try:
            run_driver(self.spec("noop", topic, per_batch, "tp-warm-up"), self.work, "tp-warm-up")
        except RuntimeError as error:  # the rounds still run (and noop's own runs fail the same way, recorded)
            log(f"  FAILED: {error}")
        for round_number in range(self.args.rounds):
            for mode in self.args.modes:
                null_stats(self.null_url, reset=True)
                name = f"tp-{mode}-r{round_number}"
                log(f"throughput: {mode}, round {round_number + 1} of {self.args.rounds} ({events_total} events, {batches} batches)")
                try:
                    result = run_driver(self.spec(mode, topic, per_batch, name), self.work, name)
                    self.verify(mode, result, name, events_total)
                except RuntimeError as error:  # recorded, and the other modes still run
                    log(f"  FAILED: {error}")
                    self.errors.append({"part": "throughput", "mode": mode, "round": round_number, "error": str(error)[-2000:]})
                    continue
                # the rows delivered (checked above), not Spark's input rows: a batch read twice (a spread's count of
                # its tables, then its write) reports its input rows twice
                result["rows_per_s"] = result["delivered"] / result["seconds"]
                result["round"] = round_number
                runs[mode].append(result)
                log(f"  {result['seconds']:.1f}s, {result['rows_per_s']:,.0f} rows/s")
                self.on_progress(_medians(runs))
        return _medians(runs)

    def starting_offsets(self, topic: str, rows: int) -> str:
        """Start each partition so that `rows` events are left in all (evenly spread)."""
        ends = self.broker.end_offsets(topic)
        return json.dumps({topic: {str(p): max(0, end - rows // PARTITIONS) for p, end in ends.items()}})

    def memory(self, topic: str, events_total: int) -> list[dict[str, Any]]:
        """Peak RSS as the batch grows: 1x and 10x of events/100 (two batches each) and 100x (the whole topic, one batch)."""
        base = events_total // 100
        out = []
        for mode in MEMORY_MODES:
            for scale in (1, 10, 100):
                batch = base * scale
                rows = min(events_total, 2 * batch)
                name = f"mem-{mode}-{scale}x"
                log(f"memory: {mode} at {scale}x ({batch} rows per batch)")
                null_stats(self.null_url, reset=True)
                try:
                    result = run_driver(self.spec(mode, topic, batch, name, self.starting_offsets(topic, rows)), self.work, name)
                    self.verify(mode, result, name, rows)
                except RuntimeError as error:
                    log(f"  FAILED: {error}")
                    self.errors.append({"part": "memory", "mode": mode, "scale": scale, "error": str(error)[-2000:]})
                    continue
                out.append({"mode": mode, "scale": scale, "batch_rows": batch, "batches": result["batches"],
                            "rss_mib": result["rss_mib"], "seconds": result["seconds"]})
                log(f"  rss {result['rss_mib']}")
        return out

    def restart(self, batch: int) -> list[dict[str, Any]]:
        """Process start -> first batch committed, on a checkpoint that already has batches (a restart)."""
        topic = "bench-restart"
        produce(self.broker, topic, 2 * batch)
        for mode in RESTART_MODES:
            name = f"restart-{mode}"
            log(f"restart: first run of {mode}")
            run_driver(self.spec(mode, topic, batch, name), self.work, f"{name}-1")
        produce(self.broker, topic, batch, start=2 * batch)
        out = []
        for mode in RESTART_MODES:
            name = f"restart-{mode}"
            log(f"restart: {mode} on its checkpoint")
            result = run_driver(self.spec(mode, topic, batch, name), self.work, f"{name}-2")
            out.append({"mode": mode, "first_batch_after_launch_s": result["first_batch_after_launch_s"],
                        "query_start_after_launch_s": result["started"] - result["launched"], "rows": result["rows"]})
            log(f"  {out[-1]['first_batch_after_launch_s']:.1f}s to the first committed batch")
        noop = next(r for r in out if r["mode"] == "noop")
        for row in out:
            row["vs_noop_s"] = row["first_batch_after_launch_s"] - noop["first_batch_after_launch_s"]
        return out

    def profile(self, topic: str, events_total: int, batches: int) -> dict[str, Any]:
        """cProfile of the driver's foreachBatch and of every writer task, two throughput-sized batches."""
        per_batch = events_total // batches
        out: dict[str, Any] = {}
        for mode in PROFILE_MODES:
            directory = self.work / "profiles" / mode
            directory.mkdir(parents=True, exist_ok=True)
            name = f"profile-{mode}"
            log(f"profile: {mode}")
            null_stats(self.null_url, reset=True)
            result = run_driver(self.spec(mode, topic, per_batch, name, self.starting_offsets(topic, 2 * per_batch),
                                          profile_dir=str(directory)), self.work, name)
            out[mode] = {"batches": result["batches"], "rows": result["rows"], "phases": result["phases"],
                         "driver": top_entries([directory / "driver.prof"]),
                         "tasks": top_entries(sorted(directory.glob("task-*.prof")))}
        return out


def top_entries(files: list[Path], count: int = 14) -> dict[str, Any]:
    """The functions with the most time of their own, and the most cumulative time, over the profiles given."""
    files = [f for f in files if f.exists()]
    if not files:
        return {}
    stats = pstats.Stats(*map(str, files))
    total = stats.total_tt  # type: ignore[attr-defined]

    def name(func: tuple[str, int, str]) -> str:
        path, line, function = func
        # relative to site-packages, the repository or the standard library: no path of this machine is recorded
        short = path.split("site-packages/")[-1].replace(str(REPO) + "/", "").replace(STDLIB + "/", "")
        return f"{short}:{line}({function})" if line else function

    rows = stats.stats  # type: ignore[attr-defined]
    by_own = sorted(rows.items(), key=lambda item: -item[1][2])[:count]
    by_cum = sorted(rows.items(), key=lambda item: -item[1][3])[:count]
    return {
        "profiles": len(files),
        "total_s": round(total, 3),
        "own": [{"function": name(f), "calls": v[1], "own_s": round(v[2], 3), "cum_s": round(v[3], 3)} for f, v in by_own],
        "cumulative": [{"function": name(f), "calls": v[1], "own_s": round(v[2], 3), "cum_s": round(v[3], 3)} for f, v in by_cum],
    }


def machine() -> dict[str, Any]:
    import importlib.metadata as meta

    from tests.support.services import jars

    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    versions = {name: meta.version(name) for name in ("pyspark", "pyarrow", "chdb", "clickhouse-connect", "redis", "requests")}
    return {"cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)), "cpu": model,
            "memory_gib": round(mem_kb / 1024 / 1024, 1), "os": platform.platform(), "python": platform.python_version(),
            "java": java, "kafka": jars.KAFKA_VERSION, "load_average_at_start": os.getloadavg(), **versions}


def _medians(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each mode's median round (by rows/s), with every round's rows/s and x noop of the same round in `rounds`."""
    noop = {r["round"]: r["rows_per_s"] for r in runs.get("noop", [])}
    results = []
    for done in runs.values():
        if not done:
            continue
        for r in done:
            r["vs_noop"] = r["rows_per_s"] / noop[r["round"]] if r["round"] in noop else None
        median = sorted(done, key=lambda r: r["rows_per_s"])[(len(done) - 1) // 2]
        ratios = sorted(r["vs_noop"] for r in done if r["vs_noop"] is not None)
        results.append({**median, "vs_noop": _lower_median(ratios),  # as the goals take it: within each round
                        "rounds": [{"round": r["round"], "rows_per_s": round(r["rows_per_s"]),
                                    "vs_noop": r["vs_noop"] and round(r["vs_noop"], 3)} for r in done]})
    return results


def _lower_median(values: list[float]) -> float | None:
    """The middle of sorted values, the lower of the two middles for an even count (None for none)."""
    return values[(len(values) - 1) // 2] if values else None


def round_ratios(tp: dict[str, dict[str, Any]], a: str, b: str) -> list[float]:
    """Mode a's rows/s over mode b's, one ratio per round both ran in."""
    if a not in tp or b not in tp:
        return []
    of_b = {r["round"]: r["rows_per_s"] for r in tp[b]["rounds"]}
    return sorted(r["rows_per_s"] / of_b[r["round"]] for r in tp[a]["rounds"] if r["round"] in of_b)


def goals(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals, each judged on the median of its ratio over the rounds, with the lowest and highest."""
    tp = {r["mode"]: r for r in data.get("throughput", [])}

    def ratio(a: str, b: str) -> list[float]:
        return round_ratios(tp, a, b)

    out = []

    def goal(name: str, value: float | list[float] | None, bound: float, unit: str = "x") -> None:
        """`value` a list: the ratio in each round, judged on their median."""
        spread: dict[str, Any] = {}
        if isinstance(value, list):
            spread = {"rounds": [round(r, 3) for r in value]} if len(value) > 1 else {}
            value = _lower_median(value)
        out.append({"goal": name, "value": None if value is None else round(value, 3), "bound": bound, "unit": unit,
                    "met": None if value is None else value >= bound, **spread})

    goal("embedded ClickHouse exactly-once (file store) >= 0.8 x noop", ratio("eo-chdb-file", "noop"), 0.8)
    goal("embedded ClickHouse exactly-once (Redis store) >= 0.8 x noop", ratio("eo-chdb-redis", "noop"), 0.8)
    goal("embedded ClickHouse exactly-once (file store) >= 1.0 x hand-written at-least-once",
         ratio("eo-chdb-file", "alo-chdb-hand"), 1.0)
    for kind in ("starrocks", "doris"):
        goal(f"null server ({kind}) exactly-once, writers in tasks >= 0.8 x noop", ratio(f"eo-null-{kind}", "noop"), 0.8)
        goal(f"null server ({kind}) exactly-once >= 0.95 x the sink's own at-least-once",
             ratio(f"eo-null-{kind}", f"alo-null-{kind}"), 0.95)
    commit = data.get("commit_phase", [])
    if commit:
        worst = max(commit, key=lambda r: r["phase_s"] / r["goal_s"])
        out.append({"goal": "commit phase <= 20 ms + 2 ms per transaction (every N, both protocols)",
                    "value": round(worst["phase_s"] * 1000, 1), "bound": round(worst["goal_s"] * 1000, 1), "unit": "ms",
                    "worst": f"{worst['target']} N={worst['n']}", "met": all(r["met"] for r in commit)})
    for row in data.get("encode_send", []):
        if row["what"] == "encode+send":
            fmt = row.get("format", "csv")
            name = row["target"] if fmt == "csv" else f"{row['target']} {fmt}"  # csv: the names of earlier runs
            goal(f"encode + send >= 280k rows/s per core ({name})", row["rows_per_cpu_s"], 280_000, "rows/s")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"developer size: {SIZES['quick'][0]} events (under 3 minutes)")
    parser.add_argument("--events", type=int, help=f"events in the topic (full: {SIZES['full'][0]})")
    parser.add_argument("--batches", type=int, help="micro-batches of the throughput runs (maxOffsetsPerTrigger = events / batches)")
    parser.add_argument("--modes", default=",".join(THROUGHPUT_MODES), help="throughput modes, comma-separated")
    parser.add_argument("--rounds", type=int, help="rounds of every throughput mode (full: 3, quick: 1); goals take the median")
    parser.add_argument("--skip", default="", help="parts to skip, comma-separated: memory,restart,commit,encode,profile")
    parser.add_argument("--work", type=Path, default=REPO / "data" / "bench", help="scratch directory (wiped)")
    parser.add_argument("--no-record", action="store_true", help="do not write bench/results or bench/README.md")
    args = parser.parse_args(argv)
    size = "quick" if args.quick else "full"
    events_total = args.events or SIZES[size][0]
    batches = args.batches or SIZES[size][1]
    args.modes = [m for m in args.modes.split(",") if m]
    args.rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    skip = set(filter(None, args.skip.split(",")))
    if args.quick:
        skip |= {"restart"}  # three more drivers: the full run measures it
    unknown = set(args.modes) - set(THROUGHPUT_MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; known: {THROUGHPUT_MODES}")

    from bench import micro, report
    from tests.support.services.kafka import KafkaBroker
    from tests.support.services.redis import RedisServer

    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    began = time.time()
    data: dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                            "size": size if not (args.events or args.batches) else "custom", "machine": machine(),
                            "config": {"events": events_total, "batches": batches, "partitions": PARTITIONS,
                                       "max_offsets_per_trigger": events_total // batches, "spark_master": "local[2]",
                                       "rounds": args.rounds,
                                       "trigger": "availableNow", "event_bytes": len(events(1)[0]), "fields": 10}}
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(KafkaBroker(work / "kafka"))
        redis = stack.enter_context(RedisServer(work / "redis"))
        null_url = stack.enter_context(null_server_process(work))
        log(f"kafka {broker.bootstrap}, redis {redis.url}, null server {null_url}; producing {events_total} events")
        topic = "bench-events"
        produce(broker, topic, events_total)
        log(f"produced in {time.time() - began:.0f}s")
        bench = Bench(args, work, broker, redis.url, null_url)
        data["errors"] = bench.errors
        record = (lambda: None) if args.no_record else (lambda: _record(data, size, began, final=False))

        def progress(results: list[dict[str, Any]]) -> None:
            data["throughput"] = results
            record()

        bench.on_progress = progress
        if "encode" not in skip:
            log("encode + send per core")
            data["encode_send"] = micro.encode_send(null_url, rows=100_000 if size == "full" else 50_000)
        data["throughput"] = bench.throughput(topic, events_total, batches)
        record()
        if "commit" not in skip:
            log("commit phase: N = 1, 2, 4 ... prepared transactions")
            data["commit_phase"] = micro.commit_phase(null_url, max_n=256 if size == "full" else 64,
                                                      repeats=3 if size == "full" else 2)
            record()
        if "profile" not in skip:
            data["profile"] = bench.guarded("profile", lambda: bench.profile(topic, events_total, batches))
            record()
        if "memory" not in skip:
            data["memory"] = bench.memory(topic, events_total)
            record()
        if "restart" not in skip:
            data["restart"] = bench.guarded("restart", lambda: bench.restart(events_total // batches))
    log(f"done in {time.time() - began:.0f}s ({bench.runs} drivers)")
    print(report.table(_finish(data, began)))
    if not args.no_record:
        _record(data, size, began, final=True)
    return 0


def _finish(data: dict[str, Any], began: float) -> dict[str, Any]:
    data["goals"] = goals(data)
    data["elapsed_s"] = round(time.time() - began, 1)
    return data


def _record(data: dict[str, Any], size: str, began: float, final: bool) -> None:
    """Write the results so far (a part that fails later loses nothing); the plot and README at the end."""
    from bench import report

    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = f"bench-{datetime.date.today().isoformat()}-{size}"
    data["complete"] = final
    (RESULTS / f"{stem}.json").write_text(json.dumps(_finish(data, began), indent=1) + "\n")
    if final:
        report.plot(data, RESULTS / f"{stem}.png")
        report.update_readme(data, stem)
        log(f"recorded bench/results/{stem}.json and .png, and the table in bench/README.md")


if __name__ == "__main__":
    sys.exit(main())
