"""The state store: where the sink keeps its two-phase-commit journal (Redis, or a local file store)."""
from __future__ import annotations

from urllib.parse import urlparse

from streaming_sink.errors import BatchSealedError, FencedError, StateStoreError, StateStoreLostError
from streaming_sink.records import BatchRecord
from streaming_sink.state.base import Durability, StateStore
from streaming_sink.state.file import FileStateStore
from streaming_sink.state.memory import MemoryStateStore
from streaming_sink.state.redis import RedisStateStore
from streaming_sink.state.redis_location import SCHEMES as REDIS_SCHEMES
from streaming_sink.state.redis_location import redact_url

__all__ = [
    "BatchRecord",
    "BatchSealedError",
    "Durability",
    "FencedError",
    "FileStateStore",
    "MemoryStateStore",
    "REDIS_SCHEMES",
    "RedisStateStore",
    "StateStore",
    "StateStoreError",
    "StateStoreLostError",
    "STATE_URL_ENV",
    "STORE_SCHEMES",
    "open_store",
]

#: The environment variable that overrides state.url (and --state's default), for a Redis URL with a password.
STATE_URL_ENV = "STREAMING_SINK_STATE_URL"

#: The URL schemes `open_store` takes (the one list config and CLI check against).
STORE_SCHEMES = ("file", *REDIS_SCHEMES)


def open_store(url: str) -> StateStore:
    """A store from its URL: `file:///absolute/path`, or a Redis URL (state/redis_location.py lists the forms).
    A URL that cannot work raises ValueError in one line before anything connects."""
    parsed = urlparse(url)
    if parsed.scheme in REDIS_SCHEMES:
        return RedisStateStore(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path:
            raise ValueError(f"state store URL {url!r}: use file:///absolute/path (three slashes)")
        return FileStateStore(parsed.path)
    raise ValueError(f"state store URL {redact_url(url)!r}: scheme must be one of {', '.join(s + '://' for s in STORE_SCHEMES)}")
