"""The state store: where the sink keeps its two-phase-commit journal (Redis, or a local file store)."""
from __future__ import annotations

from urllib.parse import urlparse

from .base import BatchRecord, BatchSealedError, FencedError, StateStore, StateStoreError, StateStoreLostError
from .file import FileStateStore
from .memory import MemoryStateStore
from .redis import RedisStateStore

__all__ = [
    "BatchRecord",
    "BatchSealedError",
    "FencedError",
    "FileStateStore",
    "MemoryStateStore",
    "RedisStateStore",
    "StateStore",
    "StateStoreError",
    "StateStoreLostError",
    "STORE_SCHEMES",
    "open_store",
]

#: The URL schemes `open_store` takes (the one list config and CLI check against).
STORE_SCHEMES = ("file", "redis", "rediss", "unix")


def open_store(url: str) -> StateStore:
    """A store from its URL: `redis://host:port/db` (or `rediss://`) or `file:///absolute/path`."""
    parsed = urlparse(url)
    if parsed.scheme in STORE_SCHEMES[1:]:
        return RedisStateStore(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path:
            raise ValueError(f"state store URL {url!r}: use file:///absolute/path (three slashes)")
        return FileStateStore(parsed.path)
    raise ValueError(f"state store URL {url!r}: scheme must be redis://, rediss:// or file:///")
