"""Redis state store: every mutation is one Lua script that checks the fencing epoch first.

Layout under `streaming-sink:{job}:` — `epoch`, `owner`, `index` (set of "query_id|batch_id"),
`batch:{q}:{n}` (record JSON), `done:{q}:{n}` (set of labels), `intents:{q}:{n}` (hash label ->
TxnRef JSON). Run Redis with AOF (`appendfsync always` or `everysec`) for durability; a script
is atomic on one Redis instance (not written for Redis Cluster: keys share no hash slot).
"""
from __future__ import annotations

import json
import time
from typing import Any

import redis

from streaming_sink.committable import TxnRef

from .base import BatchRecord, BatchSealedError, FencedError, StateStore, StateStoreError

# ARGV[1] expected epoch; ARGV[2] JSON list of redis commands; ARGV[3] batch key whose COMMITTED
# state refuses the write ('' for none). KEYS[1] is the epoch key.
_FENCED_SCRIPT = """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  return redis.error_reply('FENCED ' .. tostring(current))
end
if ARGV[3] ~= '' then
  local record = redis.call('GET', ARGV[3])
  if record and cjson.decode(record)['state'] == 'COMMITTED' then
    return redis.error_reply('SEALED')
  end
end
for _, command in ipairs(cjson.decode(ARGV[2])) do
  redis.call(unpack(command))
end
return 1
"""


class RedisStateStore(StateStore):
    """The production state store: one Redis instance (or a primary with AOF) per deployment."""

    def __init__(self, url: str, prefix: str = "streaming-sink", socket_timeout: float = 10.0) -> None:
        self.url = url
        self._prefix = prefix
        self._client = redis.Redis.from_url(url, socket_timeout=socket_timeout, decode_responses=True)
        self._script = self._client.register_script(_FENCED_SCRIPT)

    def __getstate__(self) -> dict:
        return {"url": self.url, "prefix": self._prefix}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["url"], state["prefix"])  # type: ignore[misc]

    def _key(self, job_id: str, *parts: object) -> str:
        return ":".join([self._prefix, job_id, *map(str, parts)])

    def _fenced(self, job_id: str, epoch: int, commands: list[list[object]], sealed_key: str = "") -> None:
        try:
            self._script(keys=[self._key(job_id, "epoch")], args=[str(epoch), json.dumps(commands), sealed_key])
        except redis.ResponseError as error:
            message = str(error)
            if message.startswith("FENCED"):
                current = message.split(" ", 1)[1]
                raise FencedError(job_id, epoch, int(current) if current.isdigit() else None) from None
            if message.startswith("SEALED"):
                raise BatchSealedError(f"job {job_id!r}: batch {sealed_key} is already COMMITTED") from None
            raise StateStoreError(f"redis state store {self.url}: {message}") from error

    def take_epoch(self, job_id: str, owner: str) -> int:
        epoch = int(self._client.incr(self._key(job_id, "epoch")))
        self._client.set(self._key(job_id, "owner"), json.dumps({"epoch": epoch, "owner": owner, "at": time.time()}))
        return epoch

    def current_epoch(self, job_id: str) -> int:
        value = self._client.get(self._key(job_id, "epoch"))
        return int(value) if value else 0

    def epoch_owner(self, job_id: str) -> dict[str, Any] | None:
        value = self._client.get(self._key(job_id, "owner"))
        return json.loads(value) if value else None

    def add_intent(self, job_id: str, epoch: int, query_id: str, batch_id: int, ref: TxnRef) -> None:
        self._fenced(
            job_id,
            epoch,
            [
                ["HSET", self._key(job_id, "intents", query_id, batch_id), ref.label, ref.to_json()],
                ["SADD", self._key(job_id, "index"), f"{query_id}|{batch_id}"],
            ],
            sealed_key=self._key(job_id, "batch", query_id, batch_id),
        )

    def intents(self, job_id: str, query_id: str, batch_id: int) -> list[TxnRef]:
        values = self._client.hvals(self._key(job_id, "intents", query_id, batch_id))
        return sorted((TxnRef.from_json(v) for v in values), key=lambda r: r.label)

    def remove_intents(self, job_id: str, epoch: int, query_id: str, batch_id: int, labels: list[str]) -> None:
        if labels:
            self._fenced(job_id, epoch, [["HDEL", self._key(job_id, "intents", query_id, batch_id), *labels]])

    def put_batch(self, job_id: str, epoch: int, record: BatchRecord) -> None:
        key = self._key(job_id, "batch", record.query_id, record.batch_id)
        self._fenced(
            job_id,
            epoch,
            [["SET", key, record.to_json()], ["SADD", self._key(job_id, "index"), f"{record.query_id}|{record.batch_id}"]],
        )

    def get_batch(self, job_id: str, query_id: str, batch_id: int) -> BatchRecord | None:
        value = self._client.get(self._key(job_id, "batch", query_id, batch_id))
        return BatchRecord.from_json(value) if value else None

    def mark_done(self, job_id: str, epoch: int, query_id: str, batch_id: int, label: str) -> None:
        self._fenced(job_id, epoch, [["SADD", self._key(job_id, "done", query_id, batch_id), label]])

    def done_labels(self, job_id: str, query_id: str, batch_id: int) -> set[str]:
        return set(self._client.smembers(self._key(job_id, "done", query_id, batch_id)))

    def batch_keys(self, job_id: str) -> list[tuple[str, int]]:
        keys = []
        for member in self._client.smembers(self._key(job_id, "index")):
            query_id, batch = member.rsplit("|", 1)
            keys.append((query_id, int(batch)))
        return sorted(keys, key=lambda k: (k[1], k[0]))

    def delete_batch(self, job_id: str, epoch: int, query_id: str, batch_id: int) -> None:
        self._fenced(
            job_id,
            epoch,
            [
                ["DEL", self._key(job_id, "batch", query_id, batch_id)],
                ["DEL", self._key(job_id, "done", query_id, batch_id)],
                ["DEL", self._key(job_id, "intents", query_id, batch_id)],
                ["SREM", self._key(job_id, "index"), f"{query_id}|{batch_id}"],
            ],
        )

    def close(self) -> None:
        self._client.close()

