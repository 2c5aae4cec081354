"""`streaming-sink`: run the packaged job, and the operator's commands for a stopped or crashed job.

Human-readable output by default, `--json` for scripts. `recover`, `abort`, `settle` and `restore-offsets`
are dry runs unless `--apply` is given. Each validates everything it can first; only then does applying
take the job's fencing epoch (a driver still running would stop at its next state write), and it refuses
while the job's driver is running (liveness.py) unless `--force` is given.

An operator command never ends in a traceback: every failure is one line on stderr (what failed, why,
what to do; with `--json` also `{"error", "exit_code"}` on stdout) and one of the `ExitCode`s, so an
on-call engineer and a monitoring script can both act on it. `--debug` shows the traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import unquote, urlsplit

from .actions import abort_batch, accept_loss, apply_recovery, check_journal_target, plan_recovery, settle_label, settle_record
from .checkpoint_marker import CheckpointMarker
from .committer import Committer
from .errors import UNEXPECTED, CliError, ExitCode, OperatorActionRefused, StreamingSinkError
from .job_id import JOB_ID, JOB_ID_RULE
from .liveness import SILENT_SECONDS, process_owner, running_driver
from .metrics import metrics_url
from .state import STATE_URL_ENV, STORE_SCHEMES, BatchRecord, StateStore, open_store
from .state.redis import redact_url
from .status import job_status, render_status, unknown_job
from .targets import Target, target_from_url, url_forms

EXIT_CODES_HELP = """exit codes:
  0  ok (status: healthy)
  1  a problem found: status verdict (expired or expiring prepared transactions, leftover
     intents, unknown job), doctor FAIL, recover --apply kept a transaction for replay
  2  usage or configuration error (arguments, --config, URLs, job id, unknown job or batch)
  3  a service unreachable or failing: state store, target or Kafka (run, doctor: Spark
     could not start, e.g. its Kafka source could not be fetched)
  4  refused for safety: the action could lose or duplicate rows, or a driver holds the job
  5  unexpected error (a bug): rerun with --debug for the traceback"""



class _Parser(argparse.ArgumentParser):
    """Usage errors become a CliError, so they get the same one-line (or JSON) treatment as the rest."""

    def error(self, message: str) -> NoReturn:
        raise CliError(ExitCode.USAGE, f"{message} (see `{self.prog} --help`)")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("streaming-sink")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
        return value

    parse.__name__ = kind.__name__
    return parse


def _add_job_arguments(parser: argparse.ArgumentParser, target: str) -> None:
    """target: 'required' (from --target/--database or the config), 'optional' (status) or 'none'."""
    parser.add_argument("--config", help="the job's TOML: supplies job id, state URL, target URL and database; "
                                         "explicit flags win")
    parser.add_argument("--job", help="the job_id (or from --config)")
    parser.add_argument("--state", help=f"state store URL: file:///path, redis://host:port/db, rediss://, "
                                        "redis+sentinel://s1,s2/MASTER or redis+cluster://n1,n2 (docs/state-store.md; "
                                        f"or from --config, else {STATE_URL_ENV}, where a Redis password belongs)")
    if target == "required":
        parser.add_argument("--target", help=f"target URL: {url_forms()} (or from --config)")
        parser.add_argument("--database", help="target database (or from --config)")
    elif target == "optional":
        parser.add_argument("--target", help="also list the job's transactions on this target that the journal "
                                             "does not name (status reads only the state store without it)")
        parser.add_argument("--database", help="target database (with --target; default: from --config, else 'default')")
    parser.add_argument("--json", action="store_true", help="machine-readable output, errors included")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")


def _add_acting_arguments(parser: argparse.ArgumentParser) -> None:
    """--apply and --force of the commands that change the journal, the target or the checkpoint."""
    parser.add_argument("--apply", action="store_true", help="act (default: only say what would be done)")
    parser.add_argument("--force", action="store_true",
                        help=f"act even though the job's driver seems to be running (it beat within the last "
                             f"{SILENT_SECONDS:g} s); it stops at its next state write")


def build_parser() -> argparse.ArgumentParser:
    common: dict[str, Any] = {"epilog": EXIT_CODES_HELP, "formatter_class": argparse.RawDescriptionHelpFormatter}
    parser = _Parser(prog="streaming-sink", description="Exactly-once Kafka ingestion into OLAP databases", **common)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the packaged Kafka ingestion job")
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="path of the TOML job configuration (see docs/configuration.md)")
    source.add_argument("--spec", help="path of a resolved JSON job spec (streaming_sink/job_spec.py JobSpec)")
    run.add_argument("--debug", action="store_true", help="show the traceback of an error that stops the job")

    status = commands.add_parser("status", help="batches, pending prepared transactions and leftovers of a job; "
                                                "exit 1 unless healthy", **common)
    _add_job_arguments(status, target="optional")
    status.add_argument("--last", type=_positive(int), default=20, help="how many recent batches to show (default 20)")
    status.add_argument("--prepared-timeout", type=_positive(float), default=None, metavar="SECONDS",
                        help="the server's prepared-transaction timeout, to show time left and judge expiry")
    status.add_argument("--expiry-margin", type=_positive(float), default=None, metavar="SECONDS",
                        help="a prepared transaction with less time left than this is a problem "
                             "(default: a quarter of --prepared-timeout)")
    status.add_argument("--metrics", metavar="URL", default=None,
                        help="the running job's metrics endpoint, to show its messages with unknown fields per table "
                             "(default: from sink.metrics_port in --config)")

    recover = commands.add_parser("recover", help="commit PREPARED batches and abort leftover intents, without Spark",
                                  **common)
    _add_job_arguments(recover, target="required")
    recover.add_argument("--checkpoint", help="the job's streaming checkpoint folder (or from --config): needed to "
                                              "commit the batch Spark would re-run, whose commits it keeps there")
    _add_acting_arguments(recover)

    abort = commands.add_parser("abort", help="abort the transactions of a batch that is not PREPARED", **common)
    _add_job_arguments(abort, target="required")
    abort.add_argument("--batch", type=int, required=True, help="the batch id (a BEGUN batch in `status`)")
    abort.add_argument("--query-id", help="streaming query id (needed only when two queries have this batch id)")
    _add_acting_arguments(abort)

    settle = commands.add_parser("settle", help="record the verdict on a label the target forgot (ReplayAmbiguousError), "
                                                "or give up an older query's batch (ReplayImpossibleError)", **common)
    _add_job_arguments(settle, target="required")
    settle.add_argument("--batch", type=int, required=True, help="the batch id (in the error message)")
    settle.add_argument("--query-id", required=True, help="streaming query id (in the error message and `status`)")
    settle.add_argument("--label", help="the label the verdict is about (with --committed or --not-committed)")
    verdict = settle.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--committed", action="store_true", help="its rows are in the target: do not load them again")
    verdict.add_argument("--not-committed", action="store_true", help="its rows are not in the target: replay them")
    verdict.add_argument("--accept-loss", action="store_true",
                         help="a batch of an older checkpoint's query: commit what the target still holds and give "
                              "up the rest (re-ingest its offsets yourself)")
    settle.add_argument("--checkpoint", help="with --accept-loss: the job's current checkpoint folder (or from --config)")
    _add_acting_arguments(settle)

    restore = commands.add_parser("restore-offsets", help="write back the offset files the journal recorded "
                                                          "(SourceReplannedError: a batch re-planned with another range)",
                                  **common)
    _add_job_arguments(restore, target="none")
    restore.add_argument("--checkpoint", help="the streaming checkpoint folder (or from --config)")
    _add_acting_arguments(restore)

    doctor = commands.add_parser("doctor", help="check Kafka, state store, target, tables and timeouts of a job; "
                                                "exit 1 on any FAIL", **common)
    doctor.add_argument("--config", required=True, help="path of the TOML job configuration")
    doctor.add_argument("--outage-tolerance", default="1 hour",
                        help="the longest outage the job must survive without replaying (default: 1 hour)")
    doctor.add_argument("--json", action="store_true", help="machine-readable output, errors included")
    doctor.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")
    return parser


# -- settings: flags, else the job's TOML ---------------------------------------------------------------------------


def _resolve(args: argparse.Namespace, target: str) -> None:
    """Fill job, state, target, database and target options from --config where no flag gives them.

    target: as in `_add_job_arguments`."""
    spec = None
    if args.config:
        from .config import load_config  # imports the job's modules: only when asked for

        spec = load_config(args.config)
    args.job = args.job or (spec.job_id if spec else None)
    if hasattr(args, "checkpoint"):
        args.checkpoint = args.checkpoint or (spec.checkpoint if spec else None)
    if hasattr(args, "metrics") and not args.metrics and spec and spec.metrics_port is not None:
        args.metrics = metrics_url(spec.metrics_host, spec.metrics_port)
    args.state = args.state or (spec.state_url if spec else None) or os.environ.get(STATE_URL_ENV) or None
    missing = [flag for flag, value in (("--job", args.job), ("--state", args.state)) if not value]
    if target == "none":
        args.target = args.database = None
    if target == "required" and not args.target and spec:
        args.target = spec.target_url  # status contacts a target only when --target names one
    args.target_options = None
    if spec and args.target and urlsplit(args.target).scheme == urlsplit(spec.target_url).scheme:
        args.target_options = spec.target_options  # options of another kind of target would be refused
    args.database = args.database or (spec.database if spec else None)
    if target == "required":
        missing += [flag for flag, value in (("--target", args.target), ("--database", args.database)) if not value]
    elif target == "optional":
        args.database = args.database or "default"
    if missing:
        raise CliError(ExitCode.USAGE, f"missing {' and '.join(missing)}: give {'them' if len(missing) > 1 else 'it'}, "
                                       "or --config job.toml")
    if not JOB_ID.match(args.job):
        raise CliError(ExitCode.USAGE, f"job id {args.job!r} is not valid: use {JOB_ID_RULE}; "
                                       "check --job (or job_id in the config)")


def _open_state(url: str) -> StateStore:
    """The store, or a usage error that says how to write the URL (never echoing a password)."""
    scheme = urlsplit(url).scheme
    if scheme not in STORE_SCHEMES:
        shown = redact_url(url) if scheme else re.sub(r"^.*@", "***@", url)
        if not scheme:
            hint = f"; for this folder: file://{Path(url).expanduser().resolve()}" if "@" not in url else ""
            raise CliError(ExitCode.USAGE, f"state store URL {shown!r} has no scheme: use redis://host:port/db or "
                                           f"file:///absolute/path{hint}")
        raise CliError(ExitCode.USAGE, f"state store URL {shown!r}: scheme must be one of "
                                       f"{', '.join(s + '://' for s in STORE_SCHEMES)}")
    try:
        return open_store(url)
    except ValueError as error:
        raise CliError(ExitCode.USAGE, str(error)) from None


def _open_target(args: argparse.Namespace) -> Target:
    return target_from_url(args.target, args.database, args.target_options)


def _require_job(store: StateStore, job_id: str, code: ExitCode) -> None:
    message = unknown_job(store, job_id)
    if message:
        raise CliError(code, message)


# -- commands -------------------------------------------------------------------------------------------------------


class _Stdout:
    """Standard output for a reader that may go early (`status --json | head`): a closed pipe is not a failure of
    the command, which keeps its own verdict and exit code; what is left to write is dropped."""

    closed = False

    @classmethod
    def write(cls, text: str) -> None:
        if cls.closed:
            return
        try:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            cls.drop()

    @classmethod
    def drop(cls) -> None:
        """Point file descriptor 1 at /dev/null, so neither this write nor the interpreter's last flush fails."""
        cls.closed = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


OUTPUT_CLOSED = "the reader closed the output early (broken pipe); the rest of it was dropped"


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    _Stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) if args.json else text)


def _progress(args: argparse.Namespace) -> Callable[[str], None]:
    return (lambda message: None) if args.json else (lambda message: print(message, file=sys.stderr, flush=True))


def cmd_status(args: argparse.Namespace) -> int:
    _resolve(args, target="optional")
    store = _open_state(args.state)
    try:
        _require_job(store, args.job, ExitCode.PROBLEM)  # for a monitoring check, a job with no state is a problem
        target = _open_target(args) if args.target else None
        status = job_status(store, args.job, args.last, args.prepared_timeout, target, args.expiry_margin,
                            metrics_url=args.metrics)
    finally:
        store.close()
    _emit(args, status, render_status(status))
    return ExitCode.PROBLEM if status["problems"] else ExitCode.OK


def _refuse_beside_a_driver(args: argparse.Namespace, store: StateStore) -> None:
    """An acting command never stops a running driver by mistake: without --force it refuses (nothing taken)."""
    running = running_driver(store.epoch_owner(args.job))
    if running and not args.force:
        raise OperatorActionRefused(
            f"{running}: the job seems to be running, and acting now would stop it at its next state write. Stop "
            f"the job first (a killed driver counts as gone at once on its own machine, after {SILENT_SECONDS:g} s "
            "elsewhere), or give --force if it is hung")


def _take_over(args: argparse.Namespace, store: StateStore, target: Target | None = None) -> Committer:
    """Take the job's fencing epoch, after everything else was validated: from here on no driver writes."""
    _refuse_beside_a_driver(args, store)
    target = target or _open_target(args)
    epoch = store.take_epoch(args.job, owner=f"streaming-sink {args.command} on {process_owner()}")
    return Committer(target, store, args.job, epoch)


def cmd_recover(args: argparse.Namespace) -> int:
    _resolve(args, target="required")
    store = _open_state(args.state)
    _require_job(store, args.job, ExitCode.USAGE)
    target = _open_target(args)
    marker, checkpoint_query = _checkpoint_of(args)
    if not args.apply:
        actions = plan_recovery(store, args.job, target, checkpoint_query)
        lines = [f"dry run: {len(actions)} action(s); re-run with --apply to carry them out"]
        lines += [f"  batch {a.batch_id} ({a.query_id}): {a.action} {a.transactions} transaction(s) {a.detail}" for a in actions]
        _emit(args, {"applied": False, "actions": [a.__dict__ for a in actions]}, "\n".join(lines))
        return ExitCode.OK
    check_journal_target(store, target, args.job)  # a wrong target is refused before the epoch is taken
    committer = _take_over(args, store, target)
    done = apply_recovery(committer, plan_recovery(committer.store, args.job, committer.target, checkpoint_query),
                          _progress(args), marker, checkpoint_query)
    kept = [a for a in done if a.action == "keep-for-replay"]
    left = [a for a in done if a.action in ("keep-for-job", "commit-recorded-waves")]
    lines = [f"applied {len(done)} action(s) with fencing epoch {committer.epoch}"]
    lines += [f"  batch {a.batch_id}: {a.action} {a.transactions} {a.detail}" for a in done]
    if kept:
        lines.append("  some prepared transactions can no longer be committed: restart the job so it replays "
                     "them from the source (docs/runbook.md, section 'A server was down longer than the prepared timeout')")
    if left:
        lines.append(f"  batch(es) {', '.join(str(a.batch_id) for a in left)} stay PREPARED: only the job (its re-run of "
                     "the batch) finishes them; restart it with the release and configuration that prepared them")
    _emit(args, {"applied": True, "epoch": committer.epoch, "actions": [a.__dict__ for a in done]}, "\n".join(lines))
    return ExitCode.PROBLEM if kept or left else ExitCode.OK


def _checkpoint_of(args: argparse.Namespace) -> tuple[CheckpointMarker | None, str | None]:
    """The sink's marker in the job's checkpoint and the checkpoint's query, when the checkpoint is given (else None)."""
    if not args.checkpoint:
        return None, None
    from .checkpoint import CheckpointFolder, checkpoint_query_id

    folder = CheckpointFolder(args.checkpoint)
    # no query ran on it yet (the job never started there): Spark re-runs none of the journal's batches
    query = checkpoint_query_id(folder) if folder.read("metadata") else ""
    return CheckpointMarker(args.checkpoint, args.job), query


def cmd_abort(args: argparse.Namespace) -> int:
    _resolve(args, target="required")
    store = _open_state(args.state)
    _require_job(store, args.job, ExitCode.USAGE)
    target = _open_target(args)  # a wrong --target fails the dry run already, not only --apply
    keys = store.batch_keys(args.job)
    candidates = [(q, b) for q, b in keys if b == args.batch and args.query_id in (None, q)]
    if not candidates:
        held = sorted({b for _, b in keys})
        span = f"it holds batches {held[0]}-{held[-1]}" if held else "it holds no batch"
        raise CliError(ExitCode.USAGE, f"job {args.job} has no batch {args.batch}"
                                       f"{f' of query {args.query_id}' if args.query_id else ''}; {span} (see `status`)")
    if len(candidates) > 1:
        raise CliError(ExitCode.USAGE, f"batch {args.batch} exists in {len(candidates)} queries "
                                       f"({', '.join(q for q, _ in candidates)}); give --query-id")
    query_id, batch_id = candidates[0]
    record = store.get_batch(args.job, query_id, batch_id)
    if record is not None:
        raise OperatorActionRefused(_abort_refusal(batch_id, record.state.value))
    intents = store.intents(args.job, query_id, batch_id)
    if not args.apply:
        _emit(args, {"applied": False, "batch": batch_id, "intents": [r.label for r in intents]},
              f"dry run: would abort {len(intents)} transaction(s) of batch {batch_id}: " + ", ".join(r.label for r in intents))
        return ExitCode.OK
    committer = _take_over(args, store, target)
    aborted = abort_batch(committer, query_id, batch_id)  # re-reads the record under the new epoch (R5)
    _emit(args, {"applied": True, "batch": batch_id, "aborted": aborted}, f"aborted {aborted} transaction(s) of batch {batch_id}")
    return ExitCode.OK


def _abort_refusal(batch_id: int, state: str) -> str:
    if state == "PREPARED":
        return (f"batch {batch_id} is PREPARED: its transactions must be committed (run `recover`); aborting them "
                "would lose rows the source will not send again")
    return (f"batch {batch_id} is {state}: its transactions are committed, nothing to abort; `recover` aborts "
            "intents it left behind")


def cmd_settle(args: argparse.Namespace) -> int:
    _resolve(args, target="required")
    if args.accept_loss == bool(args.label):
        raise CliError(ExitCode.USAGE, "give --label with --committed or --not-committed, and no --label with "
                                       "--accept-loss (it settles the whole batch)")
    store = _open_state(args.state)
    _require_job(store, args.job, ExitCode.USAGE)
    target = _open_target(args)
    # everything is checked before the epoch is taken: a refused settle leaves a running driver alone
    record = settle_record(store, args.job, args.query_id, args.batch, args.label)
    check_journal_target(store, target, args.job, [(args.query_id, args.batch)])
    if args.accept_loss:
        return _accept_loss(args, store, target, record)
    verdict = "committed" if args.committed else "not committed (the job replays it)"
    if not args.apply:
        _emit(args, {"applied": False, "settled": args.label, "committed": args.committed},
              f"dry run: would record {args.label} as {verdict}; re-run with --apply")
        return ExitCode.OK
    committer = _take_over(args, store, target)
    settle_label(committer, args.query_id, args.batch, args.label, committed=args.committed)
    _emit(args, {"applied": True, "settled": args.label, "committed": args.committed},
          f"settled {args.label}: {verdict}; restart the job")
    return ExitCode.OK


def _accept_loss(args: argparse.Namespace, store: StateStore, target: Target, record: BatchRecord) -> int:
    """settle --accept-loss: only a batch Spark will never re-run (not the checkpoint's own query) may be given up."""
    from .checkpoint import CheckpointFolder, checkpoint_query_id, source_ranges

    if not args.checkpoint:
        raise CliError(ExitCode.USAGE, "missing --checkpoint (the job's current checkpoint folder, or --config): "
                                       "--accept-loss gives up only a batch of another query than the checkpoint's")
    if checkpoint_query_id(CheckpointFolder(args.checkpoint)) == args.query_id:
        raise OperatorActionRefused(
            f"batch {args.batch} belongs to query {args.query_id}, the query of {args.checkpoint}: Spark re-runs it "
            "when the job restarts, and the job replays what it lost from the source. Restart the job instead")
    source = json.dumps(source_ranges(record.source)) if record.source else "not recorded"
    done = store.done_labels(args.job, args.query_id, args.batch)
    pending = [c for c in record.live_committables() if c.label not in done]
    unwritten = record.unwritten_tables()
    never_written = f"{len(unwritten)} table(s) never written (later waves): {', '.join(unwritten)}" if unwritten else ""
    if not args.apply:
        _emit(args, {"applied": False, "batch": args.batch, "query_id": args.query_id, "source": source,
                     "never_written": unwritten},
              f"dry run: would commit what the target still holds of batch {args.batch} ({len(pending)} "
              f"transaction(s), {sum(c.rows for c in pending)} rows) and give up the rest"
              + (f" and the {never_written}" if unwritten else "") + f"; its source range: {source}. "
              "Re-run with --apply after re-ingesting those offsets")
        return ExitCode.OK
    committer = _take_over(args, store, target)
    given_up = accept_loss(committer, args.query_id, args.batch)
    lines = [f"batch {args.batch} of query {args.query_id} closed: {len(given_up)} transaction(s) given up "
             f"({sum(c.rows for c in given_up)} rows); its source range: {source}"]
    lines += [f"  {c.label}: table {c.table}, {c.rows} rows" for c in given_up]
    lines += [f"  and {never_written}"] if unwritten else []
    _emit(args, {"applied": True, "batch": args.batch, "query_id": args.query_id, "source": source,
                 "given_up": [{"label": c.label, "table": c.table, "rows": c.rows} for c in given_up],
                 "never_written": unwritten}, "\n".join(lines))
    return ExitCode.OK


def cmd_restore_offsets(args: argparse.Namespace) -> int:
    from .checkpoint import CheckpointFolder, source_ranges
    from .offset_restore import apply_offset_restore, plan_offset_restore

    _resolve(args, target="none")
    if not args.checkpoint:
        raise CliError(ExitCode.USAGE, "missing --checkpoint: give it, or --config job.toml")
    store = _open_state(args.state)
    try:
        _require_job(store, args.job, ExitCode.USAGE)
        folder = CheckpointFolder(args.checkpoint)
        plan = plan_offset_restore(folder, store, args.job)
        if args.apply and not plan.empty:
            _refuse_beside_a_driver(args, store)  # a running query would read the files as they change
    finally:
        store.close()
    lines = [f"query {plan.query_id}: " + ("the checkpoint agrees with the journal; nothing to do" if plan.empty else
             f"{'would write' if not args.apply else 'writing'} {len(plan.restore)} offset file(s), "
             f"{'would remove' if not args.apply else 'removing'} {len(plan.remove)} batch(es) beyond the journal")]
    for batch_id, (recorded, found) in sorted(plan.restore.items()):
        now = json.dumps(source_ranges(found)) if found is not None else "missing"
        lines.append(f"  offsets/{batch_id}: {now} -> {json.dumps(source_ranges(recorded))}")
    lines += [f"  offsets/{b} and commits/{b}: not in the journal, removed (Spark plans them again)" for b in plan.remove]
    if args.apply and not plan.empty:
        apply_offset_restore(folder, plan)
        lines.append("done; restart the job")
    elif not plan.empty:
        lines.append("dry run; stop the job, then re-run with --apply")
    data = {"applied": args.apply, "query_id": plan.query_id, "restore": sorted(plan.restore), "remove": plan.remove}
    _emit(args, data, "\n".join(lines))
    return ExitCode.OK


def cmd_doctor(args: argparse.Namespace) -> int:
    from .config import load_config
    from .doctor import diagnose, render
    from .intervals import parse_interval
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
    return ExitCode.PROBLEM if any(c.verdict == "FAIL" for c in checks) else ExitCode.OK


# -- failures: one line, a documented code --------------------------------------------------------------------------


def describe_error(error: BaseException) -> tuple[ExitCode, str]:
    """What failed, why and what to do, and the exit code, for any error an operator command can meet: the sink's
    own errors carry both (errors.py; stores and targets translate their libraries' errors into them), an OSError
    names its path, anything else is a bug."""
    if isinstance(error, StreamingSinkError):
        return error.exit_code, error.one_line()
    if type(error).__name__ == "StreamingQueryException":  # PySpark's, not imported: the operator commands run without it
        said = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
        return ExitCode.SERVICE, (f"the streaming query stopped: {said[:400]}; the log above has Spark's account of "
                                  "the cause (rerun with --debug for the traceback). Once it is fixed, the same command "
                                  "resumes where the job stopped")
    if isinstance(error, OSError):
        if error.filename:
            return ExitCode.SERVICE, (f"cannot use {error.filename}: {error.strerror or error}; check the path in "
                                      "--state or --target and its permissions")
        return ExitCode.SERVICE, f"{error}; check that the service named by --state or --target runs"
    return ExitCode.INTERNAL, UNEXPECTED.format(kind=type(error).__name__, error=error)


def _secrets(argv: list[str]) -> list[str]:
    """Passwords that must never reach the output: those of any URL on the command line or in the environment."""
    found = []
    for text in [*argv, os.environ.get(STATE_URL_ENV, "")]:
        if "://" in text:
            parts = urlsplit(text)
            found += [p for p in (parts.password, unquote(parts.password or "")) if p]
            found += [unquote(v) for v in re.findall(r"(?i)(?:^|&)password=([^&]*)", parts.query) if v]
    # very short ones would blank out ordinary words; the stores' redacted `url` is the real protection
    return sorted({s for s in found if len(s) >= 4}, key=len, reverse=True)


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return " ".join(text.split("\n"))


def _fail(argv: list[str], command: str, error: BaseException, json_output: bool, debug: bool) -> int:
    code, message = describe_error(error)
    message = _scrub(message, _secrets(argv))
    if debug and not isinstance(error, CliError):
        sys.stderr.write(_scrub("".join(traceback.format_exception(error)), _secrets(argv)))
    print(f"streaming-sink{f' {command}' if command else ''}: {message}", file=sys.stderr)
    if json_output:
        _Stdout.write(json.dumps({"error": message, "exit_code": int(code)}))
    return int(code)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), "")
    try:
        code = _main(argv)
    except BrokenPipeError:  # argparse's --help and usage text into a closed pipe
        _Stdout.drop()
        code = ExitCode.OK if {"-h", "--help", "--version"} & set(argv) else ExitCode.USAGE
    if _Stdout.closed:
        print(f"streaming-sink{f' {command}' if command else ''}: {OUTPUT_CLOSED}", file=sys.stderr)
    return code


def _main(argv: list[str]) -> int:
    json_output, debug = "--json" in argv, "--debug" in argv
    command = next((a for a in argv if not a.startswith("-")), "")
    try:
        args = build_parser().parse_args(argv)
    except CliError as error:
        return _fail(argv, command, error, json_output, debug)
    if args.command == "run":
        from . import interrupt, job

        try:
            if args.config:
                from .config import load_config

                return job.execute(lambda: load_config(args.config), lambda: interrupt.exit_on_interrupt("streaming-sink run: "))
            return job.main(["--spec", args.spec])
        except KeyboardInterrupt:  # Ctrl-C: the protocol makes a stop at any instant safe; restart with the same command
            print(f"streaming-sink run: {interrupt.INTERRUPTED}", file=sys.stderr)
            return 130
        except Exception as error:  # noqa: BLE001 - the sink's stops, Spark's and bugs alike: one line and a code
            return _fail(argv, "run", error, False, debug)
    commands = {"status": cmd_status, "recover": cmd_recover, "abort": cmd_abort, "settle": cmd_settle,
                "restore-offsets": cmd_restore_offsets, "doctor": cmd_doctor}
    try:
        return int(commands[args.command](args))
    except KeyboardInterrupt:
        print(f"streaming-sink {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - every failure becomes one line and a documented code
        return _fail(argv, args.command, error, args.json, args.debug)


if __name__ == "__main__":
    sys.exit(main())
