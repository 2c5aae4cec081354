"""The transaction protocol every target speaks. Targets know nothing of Spark or of the state store.

A writer asks a target to `begin` a `TableTransaction` for one table; the transaction asks for a
label and records an intent (through the callbacks it was given) *before* it begins anything on
the server, streams chunks, and `prepare`s at the end. The driver later calls `commit` or `abort`
on the target with what the writer returned. Both must be idempotent: the driver may repeat them
after a crash.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from ..batch_plan import ServerLimits
from ..committable import Committable, TxnRef
from ..errors import (  # noqa: F401  moved to streaming_sink/errors.py
    CommitAmbiguousError,
    CommittedNotChosenError,
    ConfigurationError,  # noqa: F401  (re-exported)
    TargetError,
    TransactionLimitError,
)

NewRef = Callable[[int], TxnRef]  # chunk number -> the reference (with its label) of a new server transaction
RecordIntent = Callable[[TxnRef], None]  # durably records the intent; raises to forbid the begin


class CommitOutcome(str, Enum):
    """What a commit found. The coordinator replays ABORTED parts; a LOST part only if no commit was ever sent for it."""

    COMMITTED = "COMMITTED"  # visible now (or already was)
    ABORTED = "ABORTED"  # the server knows it rolled this transaction back: it was never visible, replay is safe
    LOST = "LOST"  # the server no longer knows the transaction at all: committed and forgotten, or never committed
    # Unknown to the server, and a commit this very call sent may have landed (its answer was lost) before the
    # server forgot the label: committed or not, no one can tell, so it is never replayed (label memory by count
    # can forget a label seconds after its commit: docs/protocol.md, StarRocks: label retention).
    LOST_AFTER_SEND = "LOST_AFTER_SEND"


class ExpiryKind(str, Enum):
    """What an expiry limit is about, so metrics and doctor can pick one out without reading its text."""

    PREPARED = "prepared"  # a prepared transaction the server rolls back
    LABELS = "label_history"  # the transaction states the server remembers (a commit's answer can be asked again)
    LEDGER = "ledger"  # the sink's own record of commits kept in the target
    DEDUP = "dedup"  # the window in which a repeated write is recognised


@dataclass(frozen=True)
class ExpiryLimit:
    """Something recovery depends on that the server forgets, as `doctor` reports it.

    `seconds`: forgotten after this long (None: never by age). `count`: also forgotten once the
    database holds more than this many newer transactions (None: no such limit). A count depends on
    the traffic, not on time, so it cannot be judged against an outage: `doctor` warns about it.
    """

    what: str
    seconds: float | None
    count: int | None = None
    note: str = ""  # what is lost past the limit and which server setting raises it
    kind: ExpiryKind = field(kw_only=True)


@dataclass
class PreparedPart:
    """One prepared server transaction, before the writer adds its partition checksum."""

    ref: TxnRef
    txn_id: str | None
    rows: int
    bytes: int
    extra: dict[str, Any] = field(default_factory=dict)  # diagnostics only; nothing decides on them
    # rows the server rejected under the user's max_filter_ratio: accounted for, not lost
    filtered_rows: int = 0
    unselected_rows: int = 0

    def committable(self, checksum: str) -> Committable:
        r = self.ref
        return Committable(
            r.target, r.database, r.table, r.label, r.partition, r.attempt,
            txn_id=self.txn_id, rows=self.rows, bytes=self.bytes, checksum=checksum, extra=self.extra,
            filtered_rows=self.filtered_rows, unselected_rows=self.unselected_rows,
        )


class TableTransaction(ABC):
    """Rows for one table from one writer attempt, streamed in chunks and prepared at the end."""

    @abstractmethod
    def write(self, chunk: pa.Table) -> None:
        """Send one chunk (never empty). The first call begins the server transaction."""

    @abstractmethod
    def prepare(self) -> list[PreparedPart]:
        """Make everything written durable but invisible; after this only commit or abort remain."""

    @abstractmethod
    def abort(self) -> None:
        """Best-effort rollback of whatever was begun (the driver's sweep is the safety net)."""


class Target(ABC):
    """A database that can take part in the sink's two-phase commit. Must be picklable (tasks)."""

    kind: str
    database: str

    @property
    def runs_writers_in_driver(self) -> bool:
        """True for embedded engines that only one process may open (chdb); network targets write from tasks."""
        return False

    @property
    def commit_parallelism(self) -> int:
        """How many commits the driver may run at once against this target."""
        return 8

    @abstractmethod
    def routable_tables(self) -> set[str] | None:
        """Tables rows may be routed to (None: cannot tell, the server will refuse unknown ones).

        Called once when a driver starts: it is also where a target checks connectivity and
        credentials, so configuration mistakes fail before any data moves.
        """

    def table_columns(self, table: str) -> dict[str, str] | None:
        """The table's columns in table order, name -> type as the target spells it (`VARCHAR(10)`,
        `Nullable(Int32)`), where the target can tell (None: it cannot). The job checks names and
        values against them before anything is sent."""
        return None

    def table_key(self, table: str) -> tuple[str, ...] | None:
        """The columns that identify a row of the table (its primary, unique or sorting key), where the product
        tells them (None: it cannot): a change stream's key when job.toml names none (changes.py)."""
        return None

    def check_schema(self, table: str, schema: pa.Schema) -> None:  # noqa: B027 - optional check, none by default
        """Refuse, before any data moves, rows of `schema` this target could not send to `table`."""

    def refusal(self, table: str) -> str | None:
        """Why the sink cannot load `table` exactly once (its engine, say), where the target can tell; None otherwise.
        The job names it when a table it was given is not among `routable_tables`."""
        return None

    def server_limits(self) -> ServerLimits:
        """What the server allows at once per database (running transactions, remembered labels), read from the
        server where it says, else its release defaults or the configured values: the sink keeps each batch within
        a share of them (`batch_plan.py`). None for each: no limit."""
        return ServerLimits()

    def expiry_limits(self) -> list[ExpiryLimit]:
        """What the server forgets that recovery depends on, and when. For `doctor`."""
        return []

    def transport_warning(self) -> str | None:
        """For `doctor`: a way the configured transport exposes data or credentials that the user allowed (None: none)."""
        return None

    def server_readiness(self) -> str | None:
        """For `doctor`: what the commits need of the server beyond reaching it (a release, a grant), checked live; raises
        naming what to change. None: nothing to check."""
        return None

    def leftover_transactions(self, label_prefix: str) -> list[str] | None:
        """Labels of open server-side transactions starting with `label_prefix` (None: the server cannot list them)."""
        return None

    @abstractmethod
    def begin(self, table: str, new_ref: NewRef, record_intent: RecordIntent) -> TableTransaction:
        """A transaction handle for `table`; nothing happens on the server before its first write."""

    @abstractmethod
    def commit(self, committable: Committable) -> CommitOutcome:
        """Make a prepared transaction visible. Repeating it after success returns COMMITTED."""

    def commit_table(self, table: str, committables: Sequence[Committable]) -> dict[str, CommitOutcome]:
        """Make one batch's prepared parts of `table` visible together, answering per label; repeating it after
        success answers COMMITTED for each. A target whose commit is one act per table (a table format's snapshot)
        overrides it, and the committer then calls it once per table per commit phase, tables in parallel. The
        default commits each part alone; the committer then runs `commit` itself, part by part, in parallel."""
        return {c.label: self.commit(c) for c in committables}

    @property
    def commits_per_table(self) -> bool:
        """Whether this target overrides `commit_table` (commits a table's parts in one act)."""
        return type(self).commit_table is not Target.commit_table

    @abstractmethod
    def abort(self, ref: TxnRef) -> None:
        """Roll back a transaction that is not in a PREPARED record. Harmless if it never began."""

    def close(self) -> None:  # noqa: B027 - a target with no connections has nothing to release
        """Release connections."""


@runtime_checkable
class SupportsCreateTable(Protocol):
    """A target the job may ask to create a missing table (its descriptor says `creates_tables`)."""

    def create_table(self, table: str, schema: pa.Schema, key: Sequence[str] = ()) -> None:
        """Create `table` for rows of `schema` unless it exists; change rows (changes.py) need the `key` of their table."""


def own_names(options: Mapping[str, Any], common_names: Mapping[str, str], target: str) -> dict[str, Any]:
    """Options under the shared vocabulary renamed to a target's own names; both spellings at once is an error."""
    renamed: dict[str, Any] = {}
    for key, value in options.items():
        own = common_names.get(key, key)
        if own in renamed:
            raise ConfigurationError(f"{target}: {key!r} and {own!r} are the same option; give one")
        renamed[own] = value
    return renamed


class SupportsAddColumns(Protocol):
    """A target that adds columns to a table the job created (change events' new fields: `on_unknown_field = "add-column"`)."""

    def add_columns(self, table: str, fields: Sequence[pa.Field]) -> None:
        """Add a Nullable column for each of `fields` the table lacks; refused for a table the job did not create."""
