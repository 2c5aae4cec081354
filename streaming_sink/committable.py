"""Committables, transaction references, labels and batch states.

These are the small serialisable records that flow from writers (in Spark tasks or in the
driver) to the coordinator and into the state store. They know nothing of Spark or of any
particular database.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

LABEL_MAX_LENGTH = 128
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_]")
_HASH_CHARS = 12


class BatchState(str, Enum):
    """What the state store knows of a micro-batch. A batch with no record is only begun."""

    PREPARED = "PREPARED"  # the commit point: every committable in the record will be committed
    COMMITTED = "COMMITTED"  # every committable is visible; re-running the batch changes nothing


@dataclass(frozen=True)
class TxnRef:
    """Enough to find and abort one target transaction: what an intent records before `begin`."""

    target: str
    database: str
    table: str
    label: str
    partition: int
    attempt: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TxnRef":
        data = json.loads(text)
        return cls(**{k: data[k] for k in ("target", "database", "table", "label", "partition", "attempt")})


@dataclass(frozen=True)
class Committable(TxnRef):
    """A prepared transaction, ready to be committed by the driver.

    `checksum` is the content checksum of the whole writer partition the transaction came from:
    a replay re-loads only lost parts of a batch, which is correct only if the partition's content
    is the same on replay, and the checksum proves it.
    """

    txn_id: str | None = None
    rows: int = 0
    bytes: int = 0
    checksum: str = ""
    extra: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Committable":
        return cls(**json.loads(text))

    def ref(self) -> TxnRef:
        return TxnRef(self.target, self.database, self.table, self.label, self.partition, self.attempt)


def make_label(
    job_id: str,
    query_id: str,
    batch_id: int,
    table: str,
    partition: int,
    attempt: str,
    chunk: int = 0,
) -> str:
    """A deterministic transaction label, valid for StarRocks, Doris and ClickHouse names.

    The readable part helps operators; the hash of every component keeps labels unique even
    when the readable part is sanitised or truncated (invariant I4). The query id changes with
    a new checkpoint, so labels never collide across checkpoints.
    """
    identity = "\x1f".join([job_id, query_id, str(batch_id), table, str(partition), attempt, str(chunk)])
    digest = hashlib.sha256(identity.encode("utf-8")).hexdigest()[:_HASH_CHARS]
    readable = "_".join(
        [
            "ss",
            _sanitise(job_id, 24),
            _sanitise(query_id.replace("-", ""), 8),
            str(batch_id),
            _sanitise(table, 24),
            f"p{partition}",
            _sanitise(attempt, 16),
            f"c{chunk}",
        ]
    )
    room = LABEL_MAX_LENGTH - _HASH_CHARS - 1
    return f"{readable[:room]}_{digest}"


def label_prefix(job_id: str, query_id: str) -> str:
    """What every label of one job and query starts with: how leftovers on a server are recognised."""
    return "_".join(["ss", _sanitise(job_id, 24), _sanitise(query_id.replace("-", ""), 8), ""])


def _sanitise(text: str, limit: int) -> str:
    return _LABEL_UNSAFE.sub("_", text)[:limit] or "x"
