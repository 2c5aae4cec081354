"""Redis state store: every mutation is one Lua script that checks the fencing epoch first.

Layout under `streaming-sink:{job}:` — `epoch`, `owner`, `index` (set of "query_id|batch_id"),
`batch:{q}:{n}` (record JSON), `gate:{q}:{n}` (which writer attempts may still record intents),
`done:{q}:{n}` (set of labels), `intents:{q}:{n}` (hash label -> TxnRef JSON). Run Redis with AOF
(`appendfsync always` or `everysec`) for durability; a script
is atomic on one Redis instance (not written for Redis Cluster: keys share no hash slot).
"""
from __future__ import annotations

import json
import re
import time
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import redis

from ..committable import TxnRef

from .base import (
    BatchRecord, BatchSealedError, StateStore, StateStoreError, decode_owner, fencing_error, intent_gate, owner_record,
)

# ARGV[1] expected epoch; ARGV[2] JSON list of redis commands; ARGV[3] the batch's gate key ('' for
# none) and ARGV[4] the writer attempt it must admit (see state.base.intent_gate); ARGV[5] an intents
# hash key and ARGV[6] a label that must be in it ('' for none). KEYS[1] is the epoch key.
_FENCED_SCRIPT = """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  return redis.error_reply('FENCED ' .. tostring(current))
end
if ARGV[3] ~= '' then
  local gate = redis.call('GET', ARGV[3]) or ''
  if gate ~= '' then
    local admitted = false
    if string.sub(gate, 1, 9) == 'PREPARED:' then
      local prefix = string.sub(gate, 10)
      admitted = prefix ~= '' and string.sub(ARGV[4], 1, #prefix + 1) == prefix .. 't'
    end
    if not admitted then
      return redis.error_reply('SEALED ' .. gate)
    end
  end
end
if ARGV[5] ~= '' and redis.call('HEXISTS', ARGV[5], ARGV[6]) == 0 then
  return redis.error_reply('SEALED the intent was aborted before it began')
end
for _, command in ipairs(cjson.decode(ARGV[2])) do
  redis.call(unpack(command))
end
return 1
"""

# KEYS[1] epoch key, KEYS[2] owner key; ARGV[1] the lowest acceptable epoch; ARGV[2] owner JSON without the epoch.
_TAKE_EPOCH_SCRIPT = """
local epoch = redis.call('INCR', KEYS[1])
local floor = tonumber(ARGV[1])
if epoch < floor then
  redis.call('SET', KEYS[1], floor)
  epoch = floor
end
local owner = cjson.decode(ARGV[2])
owner['epoch'] = epoch
redis.call('SET', KEYS[2], cjson.encode(owner))
return epoch
"""


_QUERY_SECRET = re.compile(r"(?i)((?:^|&)password=)[^&]*")


def redact_url(url: str) -> str:
    """`redis://user:pw@host:port/db` as `redis://***@host:port/db` (and `?password=` as `***`): the form that
    may appear in output, errors and logs. A URL without credentials is returned unchanged."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = _QUERY_SECRET.sub(r"\1***", parts.query)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


class RedisStateStore(StateStore):
    """The production state store: one Redis instance (or a primary with AOF) per deployment.

    `url` is redacted (review S1: the password must never reach output, errors or logs); the raw URL is kept
    private, to connect and to pickle the store for Spark tasks.
    """

    def __init__(self, url: str, prefix: str = "streaming-sink", socket_timeout: float = 10.0) -> None:
        self._raw_url = url
        self.url = redact_url(url)
        self._prefix = prefix
        # decode_responses=True: every reply is str. redis-py types replies `bytes | str` whatever the client
        # decodes, so the reads below cast to str (`cast` only informs the type checker; nothing is converted).
        self._client = redis.Redis.from_url(self._raw_url, socket_timeout=socket_timeout, decode_responses=True)
        self._script = self._client.register_script(_FENCED_SCRIPT)
        self._take_epoch_script = self._client.register_script(_TAKE_EPOCH_SCRIPT)

    def __repr__(self) -> str:
        return f"RedisStateStore({self.url!r})"

    def __getstate__(self) -> dict[str, str]:
        return {"url": self._raw_url, "prefix": self._prefix}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.__init__(state["url"], state["prefix"])  # type: ignore[misc]

    def _key(self, job_id: str, *parts: object) -> str:
        return ":".join([self._prefix, job_id, *map(str, parts)])

    def _fenced(
        self, job_id: str, epoch: int, commands: list[list[object]], gate_key: str = "", attempt: str = "",
        intents_key: str = "", label: str = "",
    ) -> None:
        try:
            self._script(
                keys=[self._key(job_id, "epoch")],
                args=[str(epoch), json.dumps(commands), gate_key, attempt, intents_key, label],
            )
        except redis.ResponseError as error:
            message = str(error)
            if message.startswith("FENCED"):
                current = message.split(" ", 1)[1]
                raise fencing_error(job_id, epoch, int(current) if current.isdigit() else None) from None
            if message.startswith("SEALED"):
                raise BatchSealedError(f"job {job_id!r}: {gate_key} refuses attempt {attempt}: {message[7:]}") from None
            raise StateStoreError(f"redis state store {self.url}: {message}") from error

    def take_epoch(self, job_id: str, owner: str, at_least: int = 0) -> int:
        return int(
            self._take_epoch_script(
                keys=[self._key(job_id, "epoch"), self._key(job_id, "owner")],
                args=[str(at_least), json.dumps(owner_record(owner, time.time()))],
            )
        )

    def current_epoch(self, job_id: str) -> int:
        value = self._client.get(self._key(job_id, "epoch"))
        return int(value) if value else 0

    def epoch_owner(self, job_id: str) -> dict[str, Any] | None:
        value, seen = self._client.mget([self._key(job_id, "owner"), self._key(job_id, "seen")])
        return decode_owner(json.loads(value), json.loads(seen) if seen else None) if value else None

    def beat(self, job_id: str, epoch: int, at: float) -> None:
        self._fenced(job_id, epoch, [["SET", self._key(job_id, "seen"), json.dumps({"epoch": epoch, "at": at})]])

    def add_intent(self, job_id: str, epoch: int, query_id: str, batch_id: int, ref: TxnRef) -> None:
        self._fenced(
            job_id,
            epoch,
            [
                ["HSET", self._key(job_id, "intents", query_id, batch_id), ref.label, ref.to_json()],
                ["SADD", self._key(job_id, "index"), f"{query_id}|{batch_id}"],
            ],
            gate_key=self._key(job_id, "gate", query_id, batch_id),
            attempt=ref.attempt,
        )

    def confirm_intent(self, job_id: str, epoch: int, query_id: str, batch_id: int, ref: TxnRef) -> None:
        self._fenced(
            job_id,
            epoch,
            [],
            gate_key=self._key(job_id, "gate", query_id, batch_id),
            attempt=ref.attempt,
            intents_key=self._key(job_id, "intents", query_id, batch_id),
            label=ref.label,
        )

    def intents(self, job_id: str, query_id: str, batch_id: int) -> list[TxnRef]:
        values = cast(list[str], self._client.hvals(self._key(job_id, "intents", query_id, batch_id)))  # see _client
        return sorted((TxnRef.from_json(v) for v in values), key=lambda r: r.label)

    def remove_intents(self, job_id: str, epoch: int, query_id: str, batch_id: int, labels: list[str]) -> None:
        if labels:
            self._fenced(job_id, epoch, [["HDEL", self._key(job_id, "intents", query_id, batch_id), *labels]])

    def put_batch(self, job_id: str, epoch: int, record: BatchRecord) -> None:
        key = self._key(job_id, "batch", record.query_id, record.batch_id)
        self._fenced(
            job_id,
            epoch,
            [
                ["SET", key, record.to_json()],
                ["SET", self._key(job_id, "gate", record.query_id, record.batch_id), intent_gate(record)],
                ["SADD", self._key(job_id, "index"), f"{record.query_id}|{record.batch_id}"],
            ],
        )

    def get_batch(self, job_id: str, query_id: str, batch_id: int) -> BatchRecord | None:
        value = cast("str | None", self._client.get(self._key(job_id, "batch", query_id, batch_id)))  # see _client
        return BatchRecord.from_json(value) if value else None

    def mark_done(self, job_id: str, epoch: int, query_id: str, batch_id: int, label: str) -> None:
        self._fenced(job_id, epoch, [["SADD", self._key(job_id, "done", query_id, batch_id), label]])

    def mark_done_many(self, job_id: str, epoch: int, query_id: str, batch_id: int, labels: list[str]) -> None:
        if labels:
            self._fenced(job_id, epoch, [["SADD", self._key(job_id, "done", query_id, batch_id), *labels]])

    def done_labels(self, job_id: str, query_id: str, batch_id: int) -> set[str]:
        return set(cast(set[str], self._client.smembers(self._key(job_id, "done", query_id, batch_id))))  # see _client

    def job_ids(self) -> list[str]:
        jobs: set[str] = set()
        for kind in ("epoch", "index"):
            head, tail = f"{self._prefix}:", f":{kind}"
            for key in self._client.scan_iter(match=f"{_glob_escape(self._prefix)}:*{tail}", count=1000):
                job = key[len(head):-len(tail)]
                if job and ":" not in job:
                    jobs.add(job)
        return sorted(jobs)

    def batch_keys(self, job_id: str) -> list[tuple[str, int]]:
        keys: list[tuple[str, int]] = []
        for member in cast(set[str], self._client.smembers(self._key(job_id, "index"))):  # see _client
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
                ["DEL", self._key(job_id, "gate", query_id, batch_id)],
                ["SREM", self._key(job_id, "index"), f"{query_id}|{batch_id}"],
            ],
        )

    def durability_warning(self) -> str | None:
        try:
            config = self._client.config_get("append*")
        except redis.ResponseError as error:  # managed services often disable CONFIG
            return f"cannot read the persistence settings ({error}); make sure AOF is on (appendonly yes)"
        if config.get("appendonly") != "yes":
            return ("appendonly is off: a restart loses the journal. The job then stops (StateStoreLostError) "
                    "instead of duplicating, but needs an operator; set appendonly yes and appendfsync everysec or always")
        if config.get("appendfsync") == "no":
            return "appendfsync is 'no': the last writes may be lost on a crash of the host; use everysec or always"
        return None

    def close(self) -> None:
        self._client.close()


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
