"""`streaming-sink`: run the packaged job, and the operator's commands for a stopped or crashed job.

Human-readable output by default, `--json` for scripts. `recover` and `abort` are dry runs unless
`--apply` is given; applying takes the job's fencing epoch, so a driver that is still running
stops at its next state write instead of racing the operator.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any

from state import open_store

from .recovery import OperatorActionRefused, Recovery, abort_batch, apply_recovery, plan_recovery, settle_label
from .status import job_status, render_status
from .targets import ConfigurationError, target_from_url


def _add_job_arguments(parser: argparse.ArgumentParser, needs_target: bool) -> None:
    parser.add_argument("--job", required=True, help="the job_id")
    parser.add_argument("--state", required=True, help="state store URL: redis://host:port/db or file:///path")
    if needs_target:
        parser.add_argument("--target", required=True, help="target URL: chdb:///path, clickhouse://h:8123, starrocks://fe:8030, doris://fe:8030")
        parser.add_argument("--database", required=True, help="target database")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streaming-sink", description="Exactly-once Kafka ingestion into OLAP databases")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the packaged Kafka ingestion job")
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="path of the TOML job configuration (see docs/configuration.md)")
    source.add_argument("--spec", help="path of a resolved JSON job spec (streaming_sink/job.py JobSpec)")

    status = commands.add_parser("status", help="batches, pending prepared transactions and leftovers of a job")
    _add_job_arguments(status, needs_target=False)
    status.add_argument("--last", type=int, default=20, help="how many recent batches to show")
    status.add_argument("--prepared-timeout", type=float, default=None,
                        help="the server's prepared-transaction timeout in seconds, to show time left")
    status.add_argument("--target", help="also list the job's transactions on this target that the journal does not name")
    status.add_argument("--database", default="default", help="target database (with --target)")

    recover = commands.add_parser("recover", help="commit PREPARED batches and abort leftover intents, without Spark")
    _add_job_arguments(recover, needs_target=True)
    recover.add_argument("--apply", action="store_true", help="act (default: only say what would be done)")

    abort = commands.add_parser("abort", help="abort the transactions of a batch that is not PREPARED")
    _add_job_arguments(abort, needs_target=True)
    abort.add_argument("--batch", type=int, required=True)
    abort.add_argument("--query-id", help="streaming query id (default: the only one, or the newest batch's)")
    abort.add_argument("--apply", action="store_true", help="act (default: only say what would be done)")
    settle = commands.add_parser("settle", help="record the verdict on a label the target forgot (ReplayAmbiguousError)")
    _add_job_arguments(settle, needs_target=True)
    settle.add_argument("--batch", type=int, required=True)
    settle.add_argument("--query-id", required=True, help="streaming query id (in the error message and `status`)")
    settle.add_argument("--label", required=True)
    verdict = settle.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--committed", action="store_true", help="its rows are in the target: do not load them again")
    verdict.add_argument("--not-committed", action="store_true", help="its rows are not in the target: replay them")
    doctor = commands.add_parser("doctor", help="check Kafka, state store, target, tables and timeouts of a job")
    doctor.add_argument("--config", required=True, help="path of the TOML job configuration")
    doctor.add_argument("--outage-tolerance", default="1 hour",
                        help="the longest outage the job must survive without replaying (default: 1 hour)")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str) if args.json else text)


def _progress(args: argparse.Namespace):
    return (lambda message: None) if args.json else (lambda message: print(message, file=sys.stderr, flush=True))


def cmd_status(args: argparse.Namespace) -> int:
    target = target_from_url(args.target, args.database) if args.target else None
    status = job_status(open_store(args.state), args.job, args.last, args.prepared_timeout, target)
    _emit(args, status, render_status(status))
    return 0


def _take_over(args: argparse.Namespace) -> Recovery:
    store = open_store(args.state)
    target = target_from_url(args.target, args.database)
    epoch = store.take_epoch(args.job, owner=f"streaming-sink {args.command} on {socket.gethostname()}:{os.getpid()}")
    return Recovery(target, store, args.job, epoch)


def cmd_recover(args: argparse.Namespace) -> int:
    actions = plan_recovery(open_store(args.state), args.job, target_from_url(args.target, args.database))
    if not args.apply:
        lines = [f"dry run: {len(actions)} action(s); re-run with --apply to carry them out"]
        lines += [f"  batch {a.batch_id} ({a.query_id}): {a.action} {a.transactions} transaction(s) {a.detail}" for a in actions]
        _emit(args, {"applied": False, "actions": [a.__dict__ for a in actions]}, "\n".join(lines))
        return 0
    recovery = _take_over(args)
    done = apply_recovery(recovery, plan_recovery(recovery.store, args.job, recovery.target), _progress(args))
    kept = [a for a in done if a.action == "keep-for-replay"]
    lines = [f"applied {len(done)} action(s) with fencing epoch {recovery.epoch}"]
    lines += [f"  batch {a.batch_id}: {a.action} {a.transactions} {a.detail}" for a in done]
    if kept:
        lines.append("  some prepared transactions can no longer be committed: restart the job so it replays "
                     "them from the source (docs/runbook.md, section 3)")
    _emit(args, {"applied": True, "epoch": recovery.epoch, "actions": [a.__dict__ for a in done]}, "\n".join(lines))
    return 1 if kept else 0


def cmd_abort(args: argparse.Namespace) -> int:
    store = open_store(args.state)
    candidates = [(q, b) for q, b in store.batch_keys(args.job) if b == args.batch and (args.query_id in (None, q))]
    if not candidates:
        print(f"job {args.job} has no batch {args.batch} in {store.url}", file=sys.stderr)
        return 2
    query_id, batch_id = candidates[-1]
    record = store.get_batch(args.job, query_id, batch_id)
    if record is not None:
        print(f"refusing: batch {batch_id} is {record.state.value}; a PREPARED batch must be committed (run `recover`), "
              "aborting it would lose rows that the source will not send again", file=sys.stderr)
        return 2
    intents = store.intents(args.job, query_id, batch_id)
    if not args.apply:
        _emit(args, {"applied": False, "batch": batch_id, "intents": [r.label for r in intents]},
              f"dry run: would abort {len(intents)} transaction(s) of batch {batch_id}: " + ", ".join(r.label for r in intents))
        return 0
    recovery = _take_over(args)
    try:
        aborted = abort_batch(recovery, query_id, batch_id)  # re-reads the record under the new epoch (R5)
    except OperatorActionRefused as error:
        print(f"refusing: {error}", file=sys.stderr)
        return 2
    _emit(args, {"applied": True, "batch": batch_id, "aborted": aborted}, f"aborted {aborted} transaction(s) of batch {batch_id}")
    return 0


def cmd_settle(args: argparse.Namespace) -> int:
    recovery = _take_over(args)
    try:
        settle_label(recovery, args.query_id, args.batch, args.label, committed=args.committed)
    except OperatorActionRefused as error:
        print(f"refusing: {error}", file=sys.stderr)
        return 2
    verdict = "committed" if args.committed else "not committed (the job replays it)"
    _emit(args, {"settled": args.label, "committed": args.committed}, f"settled {args.label}: {verdict}; restart the job")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from .config import load_config, parse_interval
    from .doctor import diagnose, render
    from .spark_session import build_session

    spec = load_config(args.config)
    tolerance = parse_interval(args.outage_tolerance, "--outage-tolerance")
    # local: reads nothing but schemas and Kafka metadata, with the job's own Kafka client settings
    spark = build_session("streaming-sink doctor", {**spec.spark_conf, "spark.ui.enabled": "false"}, master="local[1]")
    try:
        checks = diagnose(spec, tolerance, spark)
    finally:
        spark.stop()
    _emit(args, [c.__dict__ for c in checks], render(checks))
    return 1 if any(c.verdict == "FAIL" for c in checks) else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        from . import job

        return job.main(["--config", args.config] if args.config else ["--spec", args.spec])
    try:
        return {"status": cmd_status, "recover": cmd_recover, "abort": cmd_abort, "settle": cmd_settle, "doctor": cmd_doctor}[args.command](args)
    except ConfigurationError as error:
        print(f"streaming-sink: configuration error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
