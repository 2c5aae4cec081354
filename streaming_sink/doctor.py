"""`streaming-sink doctor`: check every part a job needs, each with a verdict, before a 3 a.m. surprise.

Checks connectivity and credentials (Kafka, state store, target), how loads reach the target (an
https FE that redirects to plain-http BEs), that the tables exist with the columns the job writes (or
that `run` will create them: target.create_tables), and that the server keeps prepared transactions
and labels longer than the outage the operator plans to survive, and how many transactions a batch may hold
(the budget its waves keep to). Reads only: safe while the job runs.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .batch_plan import DEFAULT_SHARE, TransactionBudget
from .errors import UnknownDatabaseError
from .frame import check_columns, table_schemas
from .job import tables_run_creates
from .job_spec import JobSpec
from .kafka_source import describe_topics, read_topics
from .labels import partition_wave
from .records import BatchRecord
from .state import open_store
from .target_tables import job_tables
from .targets import descriptor_for, target_from_url
from .targets.base import ExpiryLimit, Target


@dataclass
class Check:
    name: str
    verdict: str  # OK | WARN | FAIL
    detail: str


def _run(name: str, check: Callable[[], str]) -> Check:
    try:
        return Check(name, "OK", check())
    except Exception as error:  # a doctor reports every failure instead of stopping at the first
        return Check(name, "FAIL", f"{type(error).__name__}: {error}")


def diagnose(spec: JobSpec, outage_tolerance_s: float, spark: Any) -> list[Check]:
    """`spark` reads the schemas' Spark DDL and reaches Kafka with the job's own client and settings;
    a local session is enough."""
    checks: list[Check] = []
    target = target_from_url(spec.target_url, spec.database, spec.target_options)

    topics: list[str] = []  # those the job would read now, once Kafka answered

    def kafka() -> str:
        source = spec.kafka_source()
        topics.extend(read_topics(spark, source))
        return describe_topics(source, topics)

    largest: list[int] = []  # transactions in the job's largest retained wave, once the store was read
    records: list[BatchRecord] = []

    def state() -> str:
        store = open_store(spec.state_url)
        owner = store.epoch_owner(spec.job_id)
        records.extend(_records(store, spec.job_id))
        largest.extend(largest_wave(record) for record in records)
        return f"{store.url}: reachable; " + (f"epoch {owner['epoch']} held by {owner['owner']}" if owner else "no driver yet")

    known: dict[str, set[str] | None] = {}

    def connect() -> str:
        where = f"{spec.target_url} database {spec.database!r}"
        try:
            known["tables"] = target.routable_tables()
        except UnknownDatabaseError:
            if not tables_run_creates(spec, target, set()):
                raise
            known["tables"] = set()  # `run` creates the database with the first of its tables
            return f"{where}: reachable; the database does not exist yet: `run` creates it (target.create_tables)"
        return f"{where}: reachable, credentials accepted"

    def tables() -> str:
        if "tables" not in known:
            raise RuntimeError("skipped: the target check failed")
        existing = known["tables"]
        created = tables_run_creates(spec, target, existing)  # as `run` would, without creating anything here
        found = job_tables(spec, target, None if existing is None else existing | set(created), topics)
        resolved = found.tables
        schemas = table_schemas(spec, resolved)
        check_columns(target, descriptor_for(spec.target_url).columns,
                      {table: schema for table, schema in schemas.items() if table not in created})
        if existing is None:
            return f"tables {sorted(resolved)}: this target cannot list tables over its load protocol; not checked"
        there = sorted(set(schemas) - set(created))
        there_line = f"tables {there} exist with every column the job writes" if there else ""
        will = (f"table(s) {sorted(created)} do not exist yet: `run` creates them from the job's schemas "
                "(target.create_tables)") if created else ""
        skipped = "; ".join(f"table {table}: its topics' messages go to the dead letters: {why}"
                            for table, why in found.unavailable.items())
        return "; ".join(filter(None, [there_line, will, skipped]))

    checks += [_run("kafka", kafka), _run("state store", state), _durability(spec.state_url),
               _run("target", connect), *_transport(target), _run("tables", tables)]
    checks += _server(target)
    checks.append(_run("transaction budget", lambda: budget(target, records)))
    return checks + expiry_checks(target.expiry_limits(), outage_tolerance_s, max(largest, default=None))


def _records(store: Any, job_id: str) -> list[BatchRecord]:
    """The batch records the store keeps for the job (none before its first batch)."""
    found = (store.get_batch(job_id, query_id, batch_id) for query_id, batch_id in store.batch_keys(job_id))
    return [record for record in found if record is not None]


def largest_wave(record: BatchRecord) -> int:
    """The most transactions one commit round of the batch held: its whole record, or its largest wave. A wave's
    labels are what the server must remember while it commits."""
    waves: dict[int, int] = {}
    for c in record.committables:
        waves[partition_wave(c.partition)] = waves.get(partition_wave(c.partition), 0) + 1
    return max(waves.values(), default=0)


def budget(target: Target, records: list[BatchRecord], share: float = DEFAULT_SHARE) -> str:
    """The limits the sink assumes (and where they come from), the share a batch takes, the transactions a wave may
    hold, and the largest batch the journal still shows."""
    limits = target.server_limits()
    per_wave = TransactionBudget(limits, share).per_wave
    assumed = (f"the server allows {limits.running_transactions or 'unlimited'} running transactions and remembers "
               f"{limits.label_memory or 'unlimited'} labels per database ({limits.source}); ")
    allowed = (f"a batch holds at most {per_wave} at once (share {share:g}), more commit in waves" if per_wave
               else "no limit: every batch commits in one round")
    if not records:
        return assumed + allowed + "; no batch recorded yet"
    widest = max(records, key=lambda r: len(r.committables))
    waves = len(widest.plan.waves) if widest.plan is not None else 1
    return (assumed + allowed + f"; largest batch recorded: {len({c.table for c in widest.committables})} tables, "
            f"{len(widest.committables)} transactions in {waves} wave(s) (batch {widest.batch_id})")


def _transport(target: Any) -> list[Check]:
    """A WARN when an https FE's loads go on to a BE over plain http (`allow_plain_http_redirect`); without that
    consent an https FE that redirects to plain http fails the target check itself (`routable_tables`)."""
    warning = target.transport_warning()
    return [Check("target transport", "WARN", warning)] if warning else []


def _server(target: Target) -> list[Check]:
    """What the target's commits need of its server (a release, a grant), for targets that say."""
    try:
        detail = target.server_readiness()
    except Exception as error:  # as _run: reported, not raised
        return [Check("target server", "FAIL", f"{type(error).__name__}: {error}")]
    return [Check("target server", "OK", detail)] if detail else []


def _durability(state_url: str) -> Check:
    """A store that forgets on restart or rolls back in a failover is detected by the job (it stops), but an operator
    must step in: say what the store runs with, and warn where it could lose acknowledged writes."""
    try:
        durability = open_store(state_url).durability()
    except Exception as error:
        return Check("state store durability", "FAIL", f"{type(error).__name__}: {error}")
    if durability.warning:
        return Check("state store durability", "WARN", f"{durability.warning} ({durability.found})")
    return Check("state store durability", "OK", durability.found)


_DEFAULT_CONSEQUENCE = (
    "prepared data of a job that is down longer is lost on the server and must be replayed from Kafka (retention "
    "permitting); raise it on the server (and in target.options where the sink sends it)"
)


def expiry_checks(limits: list[ExpiryLimit], outage_tolerance_s: float, largest_batch: int | None = None) -> list[Check]:
    """Judge each limit by age against the planned outage; a limit by count only warns, since how soon
    it is reached depends on the database's traffic, not on the outage, unless the job's largest batch
    (transactions in one batch record) alone exceeds it: then a crash mid-commit can stop the job."""
    checks = []
    for limit in sorted(limits, key=lambda limit: limit.what):
        name, note = f"timeout {limit.what}", limit.note or _DEFAULT_CONSEQUENCE
        tolerance = f"the planned outage tolerance {outage_tolerance_s:g} s"
        by_count = None if limit.count is None else _count_history(limit.count, largest_batch)
        if limit.count is not None and largest_batch is not None and largest_batch >= limit.count:
            checks.append(Check(name, "FAIL", f"{by_count}: {note}"))
        elif limit.seconds is not None and limit.seconds < outage_tolerance_s:
            detail = f"{limit.seconds:g} s is shorter than {tolerance}" + (f"; {by_count}" if by_count else "")
            checks.append(Check(name, "FAIL", f"{detail}: {note}"))
        elif by_count:
            by_age = "no limit by age" if limit.seconds is None else f"{limit.seconds:g} s >= {tolerance}"
            checks.append(Check(name, "WARN", f"{by_age}, but {by_count}: {note}"))
        elif limit.seconds is None:
            checks.append(Check(name, "OK", "never expires"))
        else:
            checks.append(Check(name, "OK", f"{limit.seconds:g} s >= outage tolerance {outage_tolerance_s:g} s"))
    return checks


def _count_history(count: int, largest_batch: int | None) -> str:
    """The history a count limit leaves the job: what its own largest batch takes of it."""
    text = f"it is also forgotten once {count} newer transactions have finished in its database, however soon"
    if largest_batch is None:
        return text
    if largest_batch >= count:
        return (f"{text}; the job's largest batch so far held {largest_batch} transactions, more than the server remembers, "
                "so it forgets the batch's own labels while the batch commits and a crash then stops the job for an "
                "operator (docs/runbook.md, section 'Replay ambiguous: a committed label was forgotten'): make batches "
                "smaller or raise the limit")
    return (f"{text}; the job's largest batch so far held {largest_batch} transactions, so a crash mid-commit is resolved "
            f"by the server only while fewer than {count - largest_batch} other transactions finish in the database")


def render(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"  {c.verdict:<4}  {c.name:<{width}}  {c.detail}" for c in checks]
    failed = sum(c.verdict == "FAIL" for c in checks)
    lines.append(f"verdict: {'FAIL' if failed else 'OK'} ({failed} of {len(checks)} checks failed)")
    return "\n".join(lines)
