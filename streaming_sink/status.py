"""What the state store says about a job, for operators: batches, pending transactions, leftovers, a verdict.

Reads only; safe to run while the job runs. The verdict (`problems`, empty when healthy) makes `status` usable
as a monitoring check: a job stopped for an operator (the stop its driver recorded, with the runbook section),
a batch left PREPARED or begun with no driver running (liveness.py), expired or expiring prepared transactions,
intents left in old batches, and server transactions no record names are problems; a batch being written or
committed by a running driver is not.
"""
from __future__ import annotations

import difflib
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from .committer import leftover_labels
from .liveness import running_driver
from .metrics import scrape_unknown_fields
from .records import COMMITTED_AT, BatchState
from .state import StateStore
from .targets.base import Target

#: Without --expiry-margin, a prepared transaction with less than this share of the timeout left is "about to expire".
DEFAULT_EXPIRY_SHARE = 0.25


@dataclass
class BatchStatus:
    query_id: str
    batch_id: int
    state: str  # PREPARED | COMMITTED | BEGUN (intents, no record: a crashed or running write)
    tables: list[str]
    rows: int
    bytes: int
    transactions: int
    committed: int
    intents: int
    age_s: float | None
    timings: dict[str, float] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    created_at: str | None = None  # ISO-8601 UTC of age_s
    committed_at: str | None = None  # ISO-8601 UTC of timings["committed_at"]
    waves: list[int] | None = None  # a batch committed in waves: [waves recorded, waves in its plan]


@dataclass
class PendingTransaction:
    """A prepared transaction not yet committed, with how long the server may still keep it."""

    batch_id: int
    table: str
    label: str
    txn_id: str | None
    age_s: float
    expires_in_s: float | None  # negative once expired
    expires_at: str | None = None  # ISO-8601 UTC
    expired: bool = False


def iso_utc(timestamp: float | None) -> str | None:
    """`2026-05-01T09:03:04Z`: one unambiguous form whatever the operator's time zone."""
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def human_duration(seconds: float) -> str:
    """`45 s`, `23 min`, `3 h 12 min`, `2 d 4 h`: an age an on-call engineer reads at a glance."""
    s = int(abs(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        hours, minutes = divmod(s // 60, 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(s // 3600, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def unknown_job(store: StateStore, job_id: str) -> str | None:
    """None when the store holds something for the job; else a message naming the jobs it does hold.

    A job that any driver ran has an epoch, so "nothing at all" means a mistyped id or the wrong store.
    """
    if store.epoch_owner(job_id) is not None or store.batch_keys(job_id):
        return None
    jobs = store.job_ids()
    if not jobs:
        return f"unknown job {job_id!r}; the state store {store.url} holds no job: check --state (or state.url)"
    shown = ", ".join(jobs[:10]) + (f" and {len(jobs) - 10} more" if len(jobs) > 10 else "")
    close = difflib.get_close_matches(job_id, jobs, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown job {job_id!r}; this store holds: {shown}{hint}"


def job_status(
    store: StateStore,
    job_id: str,
    last: int = 20,
    prepared_timeout_s: float | None = None,
    target: Target | None = None,
    expiry_margin_s: float | None = None,
    now: float | None = None,
    metrics_url: str | None = None,
) -> dict[str, Any]:
    """The last `last` batches for display; the verdict looks at every batch the store keeps. With `metrics_url` (the
    running job's endpoint), also its messages with unknown fields per table: Spark hands those counts only to the
    running driver (observed metrics), so no journal holds them."""
    now = time.time() if now is None else now
    if expiry_margin_s is None and prepared_timeout_s is not None:
        expiry_margin_s = prepared_timeout_s * DEFAULT_EXPIRY_SHARE
    keys = store.batch_keys(job_id)
    shown = set(keys[-last:]) if last > 0 else set()
    newest: dict[str, int] = {}
    for query_id, batch_id in keys:
        newest[query_id] = max(batch_id, newest.get(query_id, batch_id))

    batches: list[BatchStatus] = []
    pending: list[PendingTransaction] = []
    leftover_intents = 0
    stale: list[dict[str, Any]] = []  # intents left in batches older than their query's newest
    stops: list[dict[str, Any]] = []  # why the driver stopped for an operator, on the batch it is about
    unfinished: list[dict[str, Any]] = []  # PREPARED batches and begun transactions (what a driver finishes)
    for query_id, batch_id in keys:
        record = store.get_batch(job_id, query_id, batch_id)
        intents = store.intents(job_id, query_id, batch_id)
        named = {c.label for c in record.committables} if record else set()
        leftover = [r.label for r in intents if r.label not in named]
        leftover_intents += len(leftover)
        if leftover and batch_id < newest[query_id]:
            stale.append({"query_id": query_id, "batch_id": batch_id, "labels": leftover})
        if leftover or (record is not None and record.state is BatchState.PREPARED):
            unfinished.append({"query_id": query_id, "batch_id": batch_id, "state": (record.state if record else BatchState.BEGUN).value})
        if record is not None and record.stop:
            stops.append({"query_id": query_id, "batch_id": batch_id, **record.stop, "at_iso": iso_utc(record.stop.get("at"))})
        if record is None:
            if (query_id, batch_id) in shown:
                batches.append(BatchStatus(query_id, batch_id, BatchState.BEGUN.value, sorted({r.table for r in intents}), 0, 0,
                                           len(intents), 0, len(intents), None))
            continue
        live = record.live_committables()
        done = store.done_labels(job_id, query_id, batch_id) if record.state is BatchState.PREPARED else set()
        age = now - record.created_at
        if (query_id, batch_id) in shown:
            batches.append(BatchStatus(
                query_id, batch_id, record.state.value, sorted({c.table for c in live}),
                sum(c.rows for c in live), sum(c.bytes for c in live), len(live),
                len(live) if record.state is BatchState.COMMITTED else len(done & {c.label for c in live}),
                len(intents), age, record.timings, record.events,
                iso_utc(record.created_at), iso_utc(record.timings.get(COMMITTED_AT)),
                [record.waves_prepared, len(record.plan.waves)] if record.plan and len(record.plan.waves) > 1 else None,
            ))
        if record.state is BatchState.PREPARED:
            for c in live:
                if c.label not in done:
                    left = prepared_timeout_s - age if prepared_timeout_s is not None else None
                    expires_at = iso_utc(record.created_at + prepared_timeout_s) if prepared_timeout_s is not None else None
                    pending.append(PendingTransaction(batch_id, c.table, c.label, c.txn_id, age, left, expires_at,
                                                      left is not None and left <= 0))

    owner = store.epoch_owner(job_id)
    running = running_driver(owner, now)
    epoch = dict(owner, at_iso=iso_utc(owner.get("at")), running=running) if owner else None
    server_leftovers = leftover_labels(store, target, job_id) if target is not None else None
    problems = [_stopped(stop) for stop in stops]
    if running is None and unfinished:
        problems.append(_left_unfinished(unfinished))
    problems += _problems(pending, expiry_margin_s, stale, server_leftovers)
    return {
        "job_id": job_id,
        "state_store": str(store.url),  # a plain str: the store's url is redacted (no password)
        "checked_at": iso_utc(now),
        "epoch": epoch,
        "batches": [asdict(b) for b in batches],
        "pending_transactions": [asdict(p) for p in pending],
        "prepared_timeout_s": prepared_timeout_s,
        "leftover_intents": leftover_intents,
        "stale_intents": stale,
        # transactions on the server that no record or intent names (None: no target given, or it cannot list)
        "server_leftovers": server_leftovers,
        "stops": stops,
        "unknown_fields": _unknown_fields(metrics_url, job_id) if metrics_url else None,
        "problems": problems,
        "healthy": not problems,
    }


def _unknown_fields(url: str, job_id: str) -> dict[str, Any]:
    """What the running job counted; an endpoint that does not answer is no problem of the job's (it may be stopped)."""
    try:
        counts, started = scrape_unknown_fields(url, job_id)
    except (OSError, ValueError) as error:
        return {"source": url, "error": str(error)}
    return {"source": url, "since": iso_utc(started), "by_table": counts}


def _stopped(stop: dict[str, Any]) -> str:
    section = f"; see docs/runbook.md, section {stop['section']!r}" if stop.get("section") else ""
    return (f"the job stopped for an operator on batch {stop['batch_id']} of query {stop['query_id']} at "
            f"{stop.get('at_iso')}: {stop.get('error')}{section}")


def _left_unfinished(unfinished: list[dict[str, Any]]) -> str:
    shown = ", ".join(f"{u['batch_id']} ({u['state']})" for u in unfinished[:5]) + (" ..." if len(unfinished) > 5 else "")
    return (f"no driver is running and {len(unfinished)} batch(es) are unfinished: {shown}; restart the job, or run "
            "`recover` (dry run, then --apply); prepared data (the target's staging tables or open "
            "transactions) waits until then")


def _problems(
    pending: list[PendingTransaction], margin_s: float | None, stale: list[dict[str, Any]], server_leftovers: list[str] | None
) -> list[str]:
    problems = []
    expired = [p for p in pending if p.expired]
    if expired:
        worst = max(-(p.expires_in_s or 0) for p in expired)
        problems.append(
            f"{len(expired)} prepared transaction(s) EXPIRED (up to {human_duration(worst)} ago, batch "
            f"{', '.join(sorted({str(p.batch_id) for p in expired}))}): the server dropped them; restart the job, "
            "it replays them from Kafka (runbook section 'A server was down longer than the prepared timeout')")
    expiring = [p for p in pending if not p.expired and p.expires_in_s is not None and margin_s is not None
                and p.expires_in_s <= margin_s]
    if expiring:
        soonest = min(p.expires_in_s or 0 for p in expiring)
        problems.append(
            f"{len(expiring)} prepared transaction(s) expire within {human_duration(soonest)}: restart the job "
            "or run `recover --apply` now")
    if stale:
        count = sum(len(s["labels"]) for s in stale)
        problems.append(
            f"{count} leftover intent(s) in old batch(es) {', '.join(str(s['batch_id']) for s in stale)}: "
            "run `recover` (dry run, then --apply) to abort them")
    if server_leftovers:
        problems.append(
            f"{len(server_leftovers)} transaction(s) on the server that no record names: `recover --apply` drops them")
    return problems


def render_status(status: dict[str, Any]) -> str:
    lines = [f"job {status['job_id']}  (state store {status['state_store']}, checked {status['checked_at']})"]
    epoch = status["epoch"]
    if epoch:
        ago = f" ({human_duration(time.time() - epoch['at'])} ago)" if epoch.get("at") else ""
        running = "running" if epoch.get("running") else "not running"
        lines.append(f"  driver epoch {epoch['epoch']} taken by {epoch['owner']} at {epoch.get('at_iso')}{ago}; {running}")
    else:
        lines.append("  no driver has run this job yet")
    lines.append(f"  {'batch':>7} {'state':<10} {'rows':>10} {'bytes':>12} {'txns':>5} {'done':>5} {'intents':>7}  "
                 f"{'age':<11} {'write/record/commit s':<22} tables")
    for b in status["batches"]:
        t = b["timings"]
        phases = "/".join(f"{t[k]:.2f}" if k in t else "-" for k in ("write_s", "record_s", "commit_s"))
        age = human_duration(b["age_s"]) if b["age_s"] is not None else "-"
        lines.append(
            f"  {b['batch_id']:>7} {b['state']:<10} {b['rows']:>10} {b['bytes']:>12} {b['transactions']:>5} "
            f"{b['committed']:>5} {b['intents']:>7}  {age:<11} {phases:<22} {','.join(b['tables'])}"
        )
        if b.get("waves"):
            lines.append(f"          waves: {b['waves'][0]} of {b['waves'][1]} recorded")
        for event in b["events"]:
            lines.append(f"          event: {event}")
    if status["pending_transactions"]:
        lines.append("  prepared, not yet committed:")
        for p in status["pending_transactions"]:
            if p["expires_in_s"] is None:
                expiry = ""
            elif p["expired"]:
                expiry = f", EXPIRED {human_duration(p['expires_in_s'])} ago ({p['expires_at']})"
            else:
                expiry = f", server drops it in {human_duration(p['expires_in_s'])} ({p['expires_at']})"
            lines.append(f"    batch {p['batch_id']} {p['table']} {p['label']} age {human_duration(p['age_s'])}{expiry}")
    lines.append(f"  leftover intents (begun, never prepared or not chosen): {status['leftover_intents']}")
    unknown = status.get("unknown_fields")
    if unknown and "error" in unknown:
        lines.append(f"  messages with unknown fields: cannot read {unknown['source']} (is the job running?): {unknown['error']}")
    elif unknown:
        counts = ", ".join(f"{table} {n}" for table, n in sorted(unknown["by_table"].items())) or "no table counted yet"
        lines.append(f"  messages with unknown fields (sink.on_unknown_field), since the driver started at {unknown['since']}: "
                     f"{counts}")
    if status["server_leftovers"]:
        lines.append(f"  on the server, named by no record or intent ({len(status['server_leftovers'])}; `recover --apply` drops them):")
        lines += [f"    {label}" for label in status["server_leftovers"]]
    if status["problems"]:
        lines.append(f"verdict: PROBLEM ({len(status['problems'])})")
        lines += [f"  - {problem}" for problem in status["problems"]]
    else:
        lines.append("verdict: OK")
    return "\n".join(lines)
