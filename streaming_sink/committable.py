"""Committables and transaction references, and the journal's format version.

These are the small serialisable records that flow from writers (in Spark tasks or in the
driver) to the coordinator and into the state store. They know nothing of Spark or of any
particular database.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import JournalFormatError

#: The journal's newest format version, the highest "v" this release reads. A change an older reader may ignore
#: (a new optional key: unknown keys are dropped) keeps it; any other change raises it, and older
#: releases then refuse those records instead of misreading them. Records without "v" are version 1.
#: Version 2: a batch record committed in waves (`BatchRecord.plan`); an older release would take its first
#: wave for the whole batch.
JOURNAL_FORMAT = 2

#: The version a record is written with when it needs nothing newer: releases before waves still read it.
BASE_FORMAT = 1

#: The protocol's fields that records of before format v1 kept in `extra`
#: (see `Committable.typed_from_extra`).
_FIELDS_ONCE_IN_EXTRA = ("flush", "flush_rows", "filtered_rows", "unselected_rows")




def check_format(data: Mapping[str, Any], what: str) -> int:
    """The record's format version, or JournalFormatError when this release cannot read it."""
    version = data.get("v", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise JournalFormatError(f"{what} has format version {version!r}, which no streaming-sink writes")
    if version > JOURNAL_FORMAT:
        raise JournalFormatError(
            f"{what} of format version {version} was written by a newer streaming-sink (this one reads version "
            f"{JOURNAL_FORMAT}); upgrade before running recover/status on this job, or the job itself"
        )
    return version


def _field(data: Mapping[str, Any], key: str, what: str) -> Any:
    try:
        return data[key]
    except KeyError:
        raise JournalFormatError(f"{what} has no {key!r}; it is not a streaming-sink journal record") from None


@dataclass(frozen=True)
class TxnRef:
    """Enough to find and abort one target transaction: what an intent records before `begin`.

    `target` (the kind) and `database` say where the transaction is: operator commands refuse a
    target that is not the one recorded.
    """

    target: str
    database: str
    table: str
    label: str
    partition: int
    attempt: str

    def encode(self) -> dict[str, Any]:
        return {"v": BASE_FORMAT, **{k: getattr(self, k) for k in _REF_FIELDS}}

    @classmethod
    def decode(cls, data: Mapping[str, Any]) -> TxnRef:
        """An intent record of any readable version; unknown keys are ignored."""
        check_format(data, "intent record")
        return TxnRef(**_ref_fields(data, "intent record"))

    def to_json(self) -> str:
        return json.dumps(self.encode(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TxnRef:
        return cls.decode(json.loads(text))


_REF_FIELDS = ("target", "database", "table", "label", "partition", "attempt")


def _ref_fields(data: Mapping[str, Any], what: str) -> dict[str, Any]:
    fields = {k: _field(data, k, what) for k in _REF_FIELDS}
    fields["partition"] = int(fields["partition"])
    return fields


@dataclass(frozen=True)
class Committable(TxnRef):
    """A prepared transaction, ready to be committed by the driver.

    `checksum` is the content checksum of the whole writer partition the transaction came from:
    a replay re-loads only lost parts of a batch, which is correct only if the partition's content
    is the same on replay, and the checksum proves it. The coordinator reads the typed fields;
    `extra` holds the target's diagnostics (`staging`, `load_bytes`), which nothing decides on.
    """

    txn_id: str | None = None
    rows: int = 0
    bytes: int = 0
    checksum: str = ""
    # Which flush of its writer the transaction holds, and that flush's rows, when it holds exactly one
    # (None: it holds several): a replay skips the flushes of a partition that stayed committed.
    flush: int | None = None
    flush_rows: int | None = None
    # Rows the server rejected under the user's max_filter_ratio: accounted for, not lost.
    filtered_rows: int = 0
    unselected_rows: int = 0
    extra: dict[str, Any] = field(default_factory=dict, hash=False)

    def encode(self) -> dict[str, Any]:
        return {
            **super().encode(),
            "txn_id": self.txn_id, "rows": self.rows, "bytes": self.bytes, "checksum": self.checksum,
            "flush": self.flush, "flush_rows": self.flush_rows,
            "filtered_rows": self.filtered_rows, "unselected_rows": self.unselected_rows,
            "extra": dict(self.extra),
        }

    @classmethod
    def decode(cls, data: Mapping[str, Any]) -> Committable:
        """A committable of any readable version; unknown keys are ignored.

        Records of before format v1 (no "v") kept the protocol's fields in `extra`: they move to their attributes.
        """
        check_format(data, "committable")
        typed = {k: data[k] for k in _FIELDS_ONCE_IN_EXTRA if data.get(k) is not None}
        return Committable(
            **_ref_fields(data, "committable"),
            txn_id=data.get("txn_id"),
            rows=int(data.get("rows", 0)),
            bytes=int(data.get("bytes", 0)),
            checksum=data.get("checksum", ""),
            **typed,
            extra=dict(data.get("extra") or {}),
        ).typed_from_extra()

    def typed_from_extra(self) -> Committable:
        """This committable with protocol fields that records before format v1 kept in `extra` moved to
        their attributes."""
        extra = dict(self.extra)
        moved = {k: extra.pop(k) for k in _FIELDS_ONCE_IN_EXTRA if k in extra}
        return replace(
            self,
            flush=_optional_int(moved.get("flush", self.flush)),
            flush_rows=_optional_int(moved.get("flush_rows", self.flush_rows)),
            filtered_rows=int(moved.get("filtered_rows", self.filtered_rows)),
            unselected_rows=int(moved.get("unselected_rows", self.unselected_rows)),
            extra=extra,
        )

    def ref(self) -> TxnRef:
        return TxnRef(self.target, self.database, self.table, self.label, self.partition, self.attempt)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
