"""What a target's client object keeps per thread, and why a pickled copy leaves it behind.

Targets travel to Spark tasks by pickle. Their connections (a `requests` session, a clickhouse-connect
client, an SSL context) belong to the thread that opened them and cannot be pickled; a copy unpickled in a
task starts with none and each of its threads opens its own on first use.
"""
from __future__ import annotations

import threading
from typing import Any


class PerThread:
    """Holds this thread's connections in `_local`; pickling drops them and unpickling starts empty."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_local")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()
