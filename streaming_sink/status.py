"""What the state store says about a job, for operators: batches, pending transactions, leftovers.

Reads only; safe to run while the job runs.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from state import StateStore

from .committable import BatchState
from .recovery import leftover_labels
from .targets.base import Target


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


@dataclass
class PendingTransaction:
    """A prepared transaction not yet committed, with how long the server may still keep it."""

    batch_id: int
    table: str
    label: str
    txn_id: str | None
    age_s: float
    expires_in_s: float | None


def job_status(
    store: StateStore, job_id: str, last: int = 20, prepared_timeout_s: float | None = None, target: Target | None = None
) -> dict[str, Any]:
    now = time.time()
    batches: list[BatchStatus] = []
    pending: list[PendingTransaction] = []
    for query_id, batch_id in store.batch_keys(job_id)[-last:]:
        record = store.get_batch(job_id, query_id, batch_id)
        intents = store.intents(job_id, query_id, batch_id)
        if record is None:
            batches.append(BatchStatus(query_id, batch_id, "BEGUN", sorted({r.table for r in intents}), 0, 0,
                                       len(intents), 0, len(intents), None))
            continue
        live = record.live_committables()
        done = store.done_labels(job_id, query_id, batch_id)
        age = now - record.created_at
        batches.append(BatchStatus(
            query_id, batch_id, record.state.value, sorted({c.table for c in live}),
            sum(c.rows for c in live), sum(c.bytes for c in live), len(live),
            len(live) if record.state is BatchState.COMMITTED else len(done & {c.label for c in live}),
            len(intents), age, record.timings, record.events,
        ))
        if record.state is BatchState.PREPARED:
            for c in live:
                if c.label not in done:
                    left = prepared_timeout_s - age if prepared_timeout_s is not None else None
                    pending.append(PendingTransaction(batch_id, c.table, c.label, c.txn_id, age, left))
    return {
        "job_id": job_id,
        "state_store": store.url,
        "epoch": store.epoch_owner(job_id),
        "batches": [asdict(b) for b in batches],
        "pending_transactions": [asdict(p) for p in pending],
        "leftover_intents": sum(b.intents for b in batches if b.state != "PREPARED"),
        # transactions on the server that no record or intent names (None: no target given, or it cannot list)
        "server_leftovers": leftover_labels(store, target, job_id) if target is not None else None,
    }


def render_status(status: dict[str, Any]) -> str:
    lines = [f"job {status['job_id']}  (state store {status['state_store']})"]
    epoch = status["epoch"]
    if epoch:
        lines.append(f"  driver epoch {epoch['epoch']} taken by {epoch['owner']} at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(epoch['at']))}")
    else:
        lines.append("  no driver has run this job yet")
    lines.append(f"  {'batch':>7} {'state':<10} {'rows':>10} {'bytes':>12} {'txns':>5} {'done':>5} {'intents':>7}  {'write/record/commit s':<22} tables")
    for b in status["batches"]:
        t = b["timings"]
        phases = "/".join(f"{t[k]:.2f}" if k in t else "-" for k in ("write_s", "record_s", "commit_s"))
        lines.append(
            f"  {b['batch_id']:>7} {b['state']:<10} {b['rows']:>10} {b['bytes']:>12} {b['transactions']:>5} "
            f"{b['committed']:>5} {b['intents']:>7}  {phases:<22} {','.join(b['tables'])}"
        )
        for event in b["events"]:
            lines.append(f"          event: {event}")
    if status["pending_transactions"]:
        lines.append("  prepared, not yet committed:")
        for p in status["pending_transactions"]:
            expiry = f", server drops it in {p['expires_in_s']:.0f}s" if p["expires_in_s"] is not None else ""
            lines.append(f"    batch {p['batch_id']} {p['table']} {p['label']} age {p['age_s']:.0f}s{expiry}")
    lines.append(f"  leftover intents (begun, never prepared or not chosen): {status['leftover_intents']}")
    if status["server_leftovers"]:
        lines.append(f"  on the server, named by no record or intent ({len(status['server_leftovers'])}; `recover --apply` drops them):")
        lines += [f"    {label}" for label in status["server_leftovers"]]
    return "\n".join(lines)
