"""The roots of every error the sink raises, so a caller can catch the sink's failures as one kind.

    StreamingSinkError
    ├── ConfigurationError (ValueError)      a mistake found before any data moved (KafkaUnreachableError)
    ├── TargetError (RuntimeError)           the target refused in a way retrying will not fix (targets/base.py);
    │                                        TransactionLimitError: a batch holds more open transactions than the
    │                                        server allows
    ├── HttpError (RuntimeError)             an HTTP exchange failed (http.py)
    ├── StateStoreError (RuntimeError)       the journal could not be read or written; FencedError: another
    │                                        driver holds the job; StateStoreLostError (state/base.py);
    │                                        ReplicationError: a write its replicas did not get (state/redis.py)
    ├── JournalFormatError (RuntimeError)    a record this release cannot read (committable.py)
    ├── OperatorActionRefused (RuntimeError) an operator command that would lose or duplicate rows (recovery.py)
    ├── StopForOperator (RuntimeError)       the job stops and a runbook section says what to decide:
    │                                        ReplayMismatchError, ReplayImpossibleError, ReplayAmbiguousError,
    │                                        SourceReplannedError
    ├── InvariantBreach (RuntimeError)       a protocol invariant does not hold; the batch is refused:
    │                                        BatchDoesNotAddUpError, ReplayAlignmentError, ReplayLostAgainError
    ├── UnknownTableError (ValueError)       a row names a table the target does not have (routing.py)
    └── EncodingError (ValueError)           a value the wire format cannot carry (targets/encoding.py)

The builtin second bases keep `except ValueError` / `except RuntimeError` callers working.
An error raised in a Spark task reaches the caller with its own type and message, its traceback as
the cause (`execution.sink_error_of`).
"""
from __future__ import annotations

import re

_SECTION = re.compile("section " + "'([^']+)'")  # how every message names its runbook section


class StreamingSinkError(Exception):
    """The root of the sink's errors."""


class ConfigurationError(StreamingSinkError, ValueError):
    """A configuration mistake found before any data moved."""


class StopForOperator(StreamingSinkError, RuntimeError):
    """The job cannot go on without a decision only an operator can make; the message names the runbook section."""

    # the batch the decision is about, when it is not the one Spark was running (an older query's, found by the sweep)
    query_id: str | None = None
    batch_id: int | None = None

    @property
    def runbook_section(self) -> str | None:
        """The runbook section the message names, for status and metrics."""
        found = _SECTION.search(str(self))
        return found.group(1) if found else None


class SourceReplannedError(StopForOperator):
    """Spark re-planned a batch the journal holds with another source range (its offsets/N was deleted or rolled
    back): skipping it would lose the new rows, writing it could duplicate the old ones."""


class InvariantBreach(StreamingSinkError, RuntimeError):
    """A protocol invariant does not hold (docs/design.md); the sink refuses the batch rather than guess."""


class BatchDoesNotAddUpError(InvariantBreach):
    """The writers received a number of rows that the prepared transactions do not account for."""


class ReplayLostAgainError(InvariantBreach):
    """Transactions replayed for lost ones were lost again before they could be committed."""
