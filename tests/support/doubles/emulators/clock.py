"""The emulated clock every timeout and label retention is measured on.

The real servers expire prepared transactions, publish with a delay and forget labels after hours or days
(docs/protocol.md, "StarRocks: timeouts", "Doris: timeouts and label retention"). The emulators read time
only from a ``Clock`` that a test moves on purpose, so those expiries happen exactly when a test says, never
by waiting.
"""
from __future__ import annotations

import threading
from collections.abc import Callable


class Clock:
    """Emulated wall clock (seconds). Only ``advance`` moves it, so timeouts are deterministic."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        self._listeners: list[Callable[[float], None]] = []

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move time forward; expiry itself is evaluated lazily by the emulator (``tick``)."""
        if seconds < 0:
            raise ValueError("the clock only moves forward")
        with self._lock:
            self._now += float(seconds)
            now = self._now
        for listener in list(self._listeners):
            listener(now)
        return now

    def set(self, value: float) -> None:
        """Restore a persisted time (used when an emulator reopens a data dir)."""
        with self._lock:
            self._now = float(value)

    def on_change(self, listener: Callable[[float], None]) -> None:
        self._listeners.append(listener)
