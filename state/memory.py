"""In-memory state store: the journal contract without a server, for tests and simulations.

Same semantics as the Redis and file stores (every mutation checks the fencing epoch atomically,
the intent gate is derived from the record), in one process. `snapshot()`/`restore()` and `wipe()`
stand in for a store restored from a backup or restarted without persistence.
"""
from __future__ import annotations

import copy
import threading
import time
from typing import Any, NoReturn

from streaming_sink.committable import TxnRef
from streaming_sink.errors import BatchSealedError
from streaming_sink.labels import gate_admits
from streaming_sink.records import BatchRecord, intent_gate
from streaming_sink.state.base import StateStore, fencing_error

Key = tuple[str, str, int]  # (job_id, query_id, batch_id)


class MemoryStateStore(StateStore):
    """Not durable and not shared across processes: never use it for a real job."""

    def __init__(self) -> None:
        self.url = "memory://"
        self._lock = threading.RLock()
        self._epochs: dict[str, dict[str, Any]] = {}
        self._records: dict[Key, str] = {}  # serialised, so callers never share objects with the store
        self._done: dict[Key, set[str]] = {}
        self._intents: dict[Key, dict[str, str]] = {}

    def __getstate__(self) -> NoReturn:
        raise TypeError("MemoryStateStore lives in one process; Spark tasks need the Redis or file store")

    # -- faults a test can inflict ------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy({"epochs": self._epochs, "records": self._records, "done": self._done, "intents": self._intents})

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Go back to an earlier snapshot (a restore from backup, a failover to a lagging replica)."""
        with self._lock:
            data = copy.deepcopy(snapshot)
            self._epochs, self._records, self._done, self._intents = data["epochs"], data["records"], data["done"], data["intents"]

    def wipe(self) -> None:
        """Forget everything (a restart without persistence)."""
        self.restore({"epochs": {}, "records": {}, "done": {}, "intents": {}})

    # -- the contract -----------------------------------------------------------------------------

    def _check(self, job_id: str, epoch: int) -> None:
        current = self.current_epoch(job_id)
        if current != epoch:
            raise fencing_error(job_id, epoch, current)

    def _check_gate(self, key: Key, ref: TxnRef) -> None:
        record = self._records.get(key)
        gate = intent_gate(BatchRecord.from_json(record) if record else None)
        if not gate_admits(gate, ref.attempt):
            raise BatchSealedError(f"job {key[0]!r}: batch {key[2]} of query {key[1]} is closed to attempt {ref.attempt} ({gate})")

    def take_epoch(self, job_id: str, owner: str, at_least: int = 0) -> int:
        with self._lock:
            epoch = max(self.current_epoch(job_id) + 1, at_least)
            self._epochs[job_id] = {"epoch": epoch, "owner": owner, "at": time.time()}
            return epoch

    def current_epoch(self, job_id: str) -> int:
        with self._lock:
            return int(self._epochs.get(job_id, {}).get("epoch", 0))

    def epoch_owner(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            owner = self._epochs.get(job_id)
            return {"seen": None, **owner} if owner else None

    def beat(self, job_id: str, epoch: int, at: float) -> None:
        with self._lock:
            self._check(job_id, epoch)
            self._epochs[job_id]["seen"] = at

    def add_intent(self, job_id: str, epoch: int, query_id: str, batch_id: int, ref: TxnRef) -> None:
        key = (job_id, query_id, batch_id)
        with self._lock:
            self._check(job_id, epoch)
            self._check_gate(key, ref)
            self._intents.setdefault(key, {})[ref.label] = ref.to_json()

    def confirm_intent(self, job_id: str, epoch: int, query_id: str, batch_id: int, ref: TxnRef) -> None:
        key = (job_id, query_id, batch_id)
        with self._lock:
            self._check(job_id, epoch)
            self._check_gate(key, ref)
            if ref.label not in self._intents.get(key, {}):
                raise BatchSealedError(f"job {job_id!r}: the intent {ref.label} of batch {batch_id} was aborted before it began")

    def intents(self, job_id: str, query_id: str, batch_id: int) -> list[TxnRef]:
        with self._lock:
            values = list(self._intents.get((job_id, query_id, batch_id), {}).values())
        return sorted((TxnRef.from_json(v) for v in values), key=lambda r: r.label)

    def remove_intents(self, job_id: str, epoch: int, query_id: str, batch_id: int, labels: list[str]) -> None:
        if not labels:
            return
        with self._lock:
            self._check(job_id, epoch)
            intents = self._intents.get((job_id, query_id, batch_id), {})
            for label in labels:
                intents.pop(label, None)

    def put_batch(self, job_id: str, epoch: int, record: BatchRecord) -> None:
        with self._lock:
            self._check(job_id, epoch)
            self._records[(job_id, record.query_id, record.batch_id)] = record.to_json()

    def get_batch(self, job_id: str, query_id: str, batch_id: int) -> BatchRecord | None:
        with self._lock:
            value = self._records.get((job_id, query_id, batch_id))
        return BatchRecord.from_json(value) if value else None

    def mark_done(self, job_id: str, epoch: int, query_id: str, batch_id: int, label: str) -> None:
        with self._lock:
            self._check(job_id, epoch)
            self._done.setdefault((job_id, query_id, batch_id), set()).add(label)

    def mark_done_many(self, job_id: str, epoch: int, query_id: str, batch_id: int, labels: list[str]) -> None:
        with self._lock:
            self._check(job_id, epoch)
            self._done.setdefault((job_id, query_id, batch_id), set()).update(labels)

    def done_labels(self, job_id: str, query_id: str, batch_id: int) -> set[str]:
        with self._lock:
            return set(self._done.get((job_id, query_id, batch_id), set()))

    def job_ids(self) -> list[str]:
        with self._lock:
            jobs = set(self._epochs) | {j for (j, _, _) in self._records}
            jobs |= {j for (j, _, _), intents in self._intents.items() if intents}
        return sorted(jobs)

    def batch_keys(self, job_id: str) -> list[tuple[str, int]]:
        with self._lock:
            keys = {(q, b) for (j, q, b) in self._records if j == job_id}
            keys |= {(q, b) for (j, q, b), intents in self._intents.items() if j == job_id and intents}
        return sorted(keys, key=lambda k: (k[1], k[0]))

    def delete_batch(self, job_id: str, epoch: int, query_id: str, batch_id: int) -> None:
        key = (job_id, query_id, batch_id)
        with self._lock:
            self._check(job_id, epoch)
            for table in (self._records, self._done, self._intents):
                table.pop(key, None)
