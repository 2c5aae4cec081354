"""Do a load's rows add up? Loaded + filtered + unselected must be every row sent, for both products.

Why: a wire encoding the server parses differently (a separator, an enclose character) can turn n rows
into m without any error; committing such a transaction would make the wrong rows visible. Rows the
server filtered (within `max_filter_ratio`) or left unselected (a `where` header) are accounted for,
not lost: the sink counts them apart and logs where the server keeps them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from .fe import Answer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowCounts:
    """A load or prepare answer's row counts (`NumberLoadedRows`, `NumberFilteredRows`, `NumberUnselectedRows`)."""

    loaded: int
    filtered: int = 0
    unselected: int = 0

    @classmethod
    def of(cls, answer: Answer) -> RowCounts | None:
        """The counts the answer reports; None when it reports none (a StarRocks prepare before 2.5 does not)."""
        body = answer.body
        if body.get("NumberLoadedRows") is None:
            return None
        return cls(int(body["NumberLoadedRows"]), int(body.get("NumberFilteredRows") or 0),
                   int(body.get("NumberUnselectedRows") or 0))

    @property
    def read(self) -> int:
        """Every row the server read."""
        return self.loaded + self.filtered + self.unselected

    def adds_up_to(self, sent: int) -> bool:
        return self.read == sent

    def mismatch(self, product: str, label: str, sent: int) -> str:
        """Why a load whose counts do not add up is refused."""
        return (f"{product} read {self.loaded} loaded + {self.filtered} filtered + {self.unselected} unselected rows "
                f"under label {label}, but {sent} rows were sent: the wire encoding and the server's parsing disagree "
                "(format, separator, row_delimiter or enclose options?)")

    def log_rejected(self, product: str, label: str, answer: Answer) -> None:
        """Says, once per load, which rows the server kept out and where to read them."""
        if self.filtered or self.unselected:
            log.warning(
                "%s label %s: %d rows were filtered (within max_filter_ratio) and %d unselected of the %d the server "
                "read; they will not be visible. Rejected rows: %s",
                product, label, self.filtered, self.unselected, self.read, answer.error_url or "n/a",
            )
