"""One retry policy for every call that is safe to repeat: exponential backoff, capped, within a deadline.

Every repeat in the sink goes through here: the HTTP client's (requests that never reached the server,
idempotent ones), the Stream Load targets' (a busy label, a write-lock timeout, a commit whose answer was
lost) and the ClickHouse target's (a statement safe to repeat: reads, DDL with IF NOT EXISTS, a commit or
an abort that resumes where it stopped). Which calls are safe to repeat is the caller's knowledge; how
often and how long is this module's. The deadline bounds the whole: no repeat starts after it, so a
server that keeps failing ends in an error, not in a wait that outlives the batch.

Every repeat is counted here, by level (`REPEAT_LEVELS`), for the metrics (`streaming_sink_retries_total`): the
process's own repeats, plus those the writers' Spark tasks report back with their results (`count_repeats`).
"""
from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import monotonic, sleep  # module globals, so tests replace the pauses here and nowhere else
from typing import TypeVar

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: What a repeat sends again: a target's request or statement (or a commit's sequence of them), a batch's write pass
#: (written again by the sink under fresh labels), the packaged job's streaming query (restarted from its checkpoint).
REPEAT_LEVELS = ("statement", "write", "query")
_REPEATS: Counter[str] = Counter()
_REPEATS_LOCK = threading.Lock()


def count_repeats(level: str, times: int = 1) -> None:
    """Count repeats at `level` (one of `REPEAT_LEVELS`)."""
    with _REPEATS_LOCK:
        _REPEATS[level] += times


def repeats() -> dict[str, int]:
    """Repeats counted in this process so far, by level."""
    with _REPEATS_LOCK:
        return {level: _REPEATS[level] for level in REPEAT_LEVELS}


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long a call safe to repeat is repeated. Picklable: it travels to Spark tasks."""

    retries: int = 3  # repeats after the first attempt
    backoff_s: float = 0.2  # the first pause; each next one doubles
    backoff_max_s: float = 5.0  # no pause is longer
    deadline_s: float = 300.0  # no repeat starts later than this after the first attempt

    def pauses(self) -> Iterator[float]:
        """The pause before each repeat, in order; it ends when the repeats or the deadline run out."""
        started = monotonic()
        for attempt in range(self.retries):
            pause = min(self.backoff_max_s, self.backoff_s * 2 ** min(attempt, 16))
            if monotonic() - started + pause > self.deadline_s:
                return
            yield pause

    def run(self, what: str, step: Callable[[], _T], repeatable: Callable[[BaseException], bool],
            level: str = "statement") -> _T:
        """`step()`, repeated after each error `repeatable` accepts while the policy allows; the last error raises."""
        pauses = self.pauses()
        while True:
            try:
                return step()
            except Exception as error:
                if not repeatable(error):
                    raise
                pause = next(pauses, None)
                if pause is None:
                    raise
                wait(pause, f"{what}: {error}", level)


def wait(pause: float, why: str, level: str = "statement") -> None:
    """Pause before a repeat, saying why in the log; the repeat is counted at `level`."""
    log.warning("repeating in %.2fs: %s", pause, why)
    count_repeats(level)
    sleep(pause)
