"""Redis state store: every mutation is one Lua script that checks the fencing epoch first.

Layout: `RedisKeys` below names every key (it is the one place to read or change it).

Journals written before the tag (`<prefix>:<job>:<name>`) are read where they are, and the next `take_epoch` (a
driver's start, an operator's acting command) moves them under the tag in one script, after fencing any driver
still writing the old layout (the old `epoch` key is left holding the new epoch, so such a driver stays fenced).

Durability: run Redis with AOF (`appendfsync always` or `everysec`). With replicas, each write waits (WAIT) until
`wait_replicas` of them have it before the caller acts on it, so a failover cannot roll back a step the protocol
relied on (docs/state-store.md). Where the store lives and its options: `redis_location.py`.

Failovers are ridden through: a call that fails the way a failover fails is made again, on the master the Sentinels
name then, until `failover_timeout`. That is safe because every journal write may be made twice: each one is a script
that checks the fencing epoch (and the intent gate) again and sets state to values it names (SET, SADD, HSET, HDEL,
DEL), so a write that applied before its answer was lost changes nothing the second time, and one that a fenced
driver or a sealed gate would now refuse is refused. A write whose answer was lost was acted on by nobody; the one
made again is answered only after WAIT says the replicas have it, which covers the first one too (below).
"""
from __future__ import annotations

import functools
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import redis
from redis.cluster import RedisCluster
from redis.sentinel import SentinelConnectionPool

from streaming_sink.committable import TxnRef
from streaming_sink.errors import (
    BatchSealedError,
    ReplicationError,  # moved to streaming_sink/errors.py
    StateStoreError,
)
from streaming_sink.records import BatchRecord, decode_owner, intent_gate, owner_record
from streaming_sink.state.base import Durability, StateStore, fencing_error
from streaming_sink.state.redis_location import RedisLocation, connect, parse_redis_url, redact_url, translated_errors

__all__ = ["RedisKeys", "RedisStateStore", "ReplicationError", "redact_url"]

log = logging.getLogger(__name__)

#: What Sentinel runs with when its configuration sets nothing: down-after-milliseconds 30 s, failover-timeout 180 s
#: (redis.io, "Redis Sentinel", the example sentinel.conf; src/sentinel.c SENTINEL_DEFAULT_DOWN_AFTER and
#: SENTINEL_DEFAULT_FAILOVER_TIMEOUT). The bound of a ride when no Sentinel answers the question (see
#: `_sentinels_failover_seconds` for why the failover-timeout counts twice).
SENTINEL_DEFAULT_FAILOVER_SECONDS = 30.0 + 2 * 180.0

# ARGV[1] expected epoch; ARGV[2] JSON list of redis commands; ARGV[3] the batch's gate key ('' for
# none) and ARGV[4] the writer attempt it must admit (see streaming_sink/labels.py `gate_admits`,
# which tests/unit/test_intent_gate_lua.py holds this script to); ARGV[5] an intents
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
-- always replicate something: a write made again (or a label marked twice) may change nothing, and a script that
-- changes nothing sends nothing to the replicas, so the WAIT after it would count replicas that lack the state the
-- script saw. SET always replicates (src/t_string.c counts it dirty whatever the value), and the epoch stays as it is.
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""

# KEYS[1] epoch key, KEYS[2] owner key, then ARGV[3] old-layout keys and as many new names for them;
# ARGV[1] the lowest acceptable epoch; ARGV[2] owner JSON without the epoch; ARGV[4] the old epoch key ('' for none).
_TAKE_EPOCH_SCRIPT = """
local moves = tonumber(ARGV[3])
for i = 1, moves do
  if redis.call('EXISTS', KEYS[2 + i]) == 1 then
    redis.call('RENAME', KEYS[2 + i], KEYS[2 + moves + i])
  end
end
local epoch = redis.call('INCR', KEYS[1])
local floor = tonumber(ARGV[1])
if epoch < floor then
  redis.call('SET', KEYS[1], floor)
  epoch = floor
end
local owner = cjson.decode(ARGV[2])
owner['epoch'] = epoch
redis.call('SET', KEYS[2], cjson.encode(owner))
if ARGV[4] ~= '' then
  redis.call('SET', ARGV[4], epoch)
end
return epoch
"""


@dataclass(frozen=True)
class RedisKeys:
    """Every key of one job's journal; the layout is frozen by tests/integration/test_journal_layout.py.

    `<prefix>:{<job>}:<name>`: the braces are a Redis Cluster hash tag, so a job's keys share one slot and its
    scripts run on Cluster too (`legacy`: the untagged `<prefix>:<job>:<name>` of older journals). Names: `epoch`,
    `owner`, `seen` (heartbeat), `index` (set of `member`s, "query_id|batch_id"), `batch:<q>:<n>` (record JSON),
    `gate:<q>:<n>` (which writer attempts may still record intents), `done:<q>:<n>` (set of labels),
    `intents:<q>:<n>` (hash label -> TxnRef JSON).
    """

    prefix: str
    job_id: str
    legacy: bool = False

    @property
    def job(self) -> str:
        """The head every key of the job starts with."""
        return f"{self.prefix}:{self.job_id}" if self.legacy else f"{self.prefix}:{{{self.job_id}}}"

    def _name(self, *parts: object) -> str:
        return ":".join([self.job, *map(str, parts)])

    @property
    def epoch(self) -> str:
        return self._name("epoch")

    @property
    def owner(self) -> str:
        return self._name("owner")

    @property
    def seen(self) -> str:
        return self._name("seen")

    @property
    def index(self) -> str:
        return self._name("index")

    def batch(self, query_id: str, batch_id: int) -> str:
        return self._name("batch", query_id, batch_id)

    def gate(self, query_id: str, batch_id: int) -> str:
        return self._name("gate", query_id, batch_id)

    def done(self, query_id: str, batch_id: int) -> str:
        return self._name("done", query_id, batch_id)

    def intents(self, query_id: str, batch_id: int) -> str:
        return self._name("intents", query_id, batch_id)

    def tagged(self, legacy_key: str) -> str:
        """Where a key of the legacy layout moves to under the tag."""
        old, new = RedisKeys(self.prefix, self.job_id, legacy=True), RedisKeys(self.prefix, self.job_id)
        return new.job + legacy_key[len(old.job):]

    @staticmethod
    def member(query_id: str, batch_id: int) -> str:
        """A batch as the `index` set holds it."""
        return f"{query_id}|{batch_id}"

    @staticmethod
    def parse_member(member: str) -> tuple[str, int]:
        query_id, batch = member.rsplit("|", 1)
        return query_id, int(batch)

    @staticmethod
    def job_pattern(prefix: str, name: str) -> str:
        """A SCAN pattern for the `name` key (epoch, index) of every job, in both layouts."""
        return f"{_glob_escape(prefix)}:*:{name}"

    @staticmethod
    def job_of(prefix: str, key: str, name: str) -> str | None:
        """The job a key found by `job_pattern` belongs to; None for a key of no job."""
        job = key[len(prefix) + 1:-len(name) - 1]
        if job.startswith("{") and job.endswith("}"):
            job = job[1:-1]
        return job if job and not set(job) & set(":{}") else None


_Method = TypeVar("_Method", bound=Callable[..., Any])
_Class = TypeVar("_Class", bound=type)
_Result = TypeVar("_Result")


def _riding(method: _Method) -> _Method:
    @functools.wraps(method)
    def call(self: RedisStateStore, *args: Any, **kwargs: Any) -> Any:
        with translated_errors():
            return self._ride(functools.partial(method, self, *args, **kwargs))

    return cast(_Method, call)


def _riding_failovers(cls: _Class) -> _Class:
    """Every public method of `cls` rides a failover (`RedisStateStore._ride`) and raises redis-py's errors as the
    sink's own (`translated_errors`)."""
    for name, member in list(vars(cls).items()):
        if callable(member) and not name.startswith("_") and name != "close":
            setattr(cls, name, _riding(member))
    return cls


_FAILOVER_REPLIES = ("READONLY", "NOREPLICAS", "MASTERDOWN", "LOADING")


def _failover_explains(error: Exception) -> bool:
    """A failure a failover in progress explains, and that its end cures: the master gone (connection refused, lost,
    timed out; no master named), the old master now a replica (READONLY), a new master without its replicas yet
    (NOREPLICAS under min-replicas-to-write, ReplicationError under WAIT). Wrong credentials are not one."""
    if isinstance(error, redis.AuthenticationError):
        return False
    if isinstance(error, (redis.ConnectionError, redis.TimeoutError, ReplicationError)):
        return True
    return isinstance(error, redis.ResponseError) and str(error).startswith(_FAILOVER_REPLIES)


@dataclass(frozen=True)
class _Server:
    """One Redis server to talk to: the store's client, or a Cluster primary's own client."""

    client: redis.Redis
    name: str


@_riding_failovers
class RedisStateStore(StateStore):
    """The production state store: one Redis server, a Sentinel-watched master, or a Redis Cluster.

    `url` is redacted (review S1: the password must never reach output, errors or logs); the raw URL is kept
    private, to connect and to pickle the store for Spark tasks.
    """

    def __init__(self, url: str, prefix: str = "streaming-sink", socket_timeout: float = 10.0) -> None:
        self._location: RedisLocation = parse_redis_url(url)
        self.url = self._location.shown
        self._prefix = prefix
        # decode_responses=True: every reply is str. redis-py types replies `bytes | str` whatever the client
        # decodes, so the reads below cast to str (`cast` only informs the type checker; nothing is converted).
        self._client = connect(self._location, socket_timeout)
        self._replicas_seen: int | None = None  # under `auto`: the most replicas found connected (None: not asked)
        self._seen_lock = threading.Lock()
        self._reached = False  # a call succeeded once: from then on, a failover is ridden through (`_ride`)
        self._failover_seconds = self._location.failover_timeout  # None until the Sentinels are asked
        self._tagged: set[str] = set()  # jobs known to be under the tagged layout

    def __repr__(self) -> str:
        return f"RedisStateStore({self.url!r})"

    def __getstate__(self) -> dict[str, Any]:
        # what the driver learnt travels with the store: its tasks wait for as many replicas, and ride failovers
        return {"url": self._location.url, "prefix": self._prefix, "replicas_seen": self._replicas_seen,
                "reached": self._reached, "failover_seconds": self._failover_seconds}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["prefix"])  # type: ignore[misc]
        self._replicas_seen = state.get("replicas_seen")
        self._reached = state.get("reached", False)
        self._failover_seconds = state.get("failover_seconds", self._failover_seconds)

    # -- failovers -------------------------------------------------------------------------------------------

    def _ride(self, call: Callable[[], _Result]) -> _Result:
        """`call()`, made again while it fails the way a failover fails, up to the failover bound after its first
        failure. redis-py asks the Sentinels for the master at each new connection, so a call made again goes to
        the master they name then. A store that never answered fails at once: a wrong URL is not a failover."""
        deadline, pause = None, 0.05
        while True:
            try:
                result = call()
            except Exception as error:
                if not (self._reached and _failover_explains(error)):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._failover_bound()
                    if deadline > now:
                        log.warning("redis state store %s: %s; trying again for up to %g s (failover_timeout)",
                                    self.url, error, deadline - now)
                if now >= deadline:
                    raise
                time.sleep(min(pause, deadline - now))  # back off: a failover takes seconds
                pause = min(2 * pause, 1.0)
                continue
            if deadline is not None:
                log.warning("redis state store %s: answering again", self.url)
            self._reached = True
            return result

    def _failover_bound(self) -> float:
        """Seconds a failing call is made again: `failover_timeout`, else what the Sentinels allow a failover of the
        master (down-after-milliseconds + 2 × failover-timeout), asked once."""
        if self._failover_seconds is None:
            self._failover_seconds = self._sentinels_failover_seconds()
        return self._failover_seconds

    def _sentinels_failover_seconds(self) -> float:
        """A Sentinel starts a failover of a master only twice its failover-timeout after the last one it started or
        voted for (src/sentinel.c, sentinelStartFailoverIfNeeded): a failover whose first election split, or one that
        follows another, comes that late. With one failover-timeout, a test's second failover outlasted the bound."""
        pool = cast(SentinelConnectionPool, cast(redis.Redis, self._client).connection_pool)  # kind "sentinel"
        for sentinel in pool.sentinel_manager.sentinels:
            try:
                master = sentinel.sentinel_master(self._location.master)
                return (int(master["down-after-milliseconds"]) + 2 * int(master["failover-timeout"])) / 1000
            except (redis.RedisError, KeyError, ValueError):
                continue
        return SENTINEL_DEFAULT_FAILOVER_SECONDS

    # -- keys ------------------------------------------------------------------------------------------------

    def _keys(self, job_id: str) -> RedisKeys:
        return RedisKeys(self._prefix, job_id)

    def _read_keys(self, job_id: str) -> RedisKeys:
        """How a read names the job's keys: under the tag, or in the old layout until `take_epoch` moves it
        (decided once per read, whatever number of keys the read needs)."""
        keys, legacy = self._keys(job_id), RedisKeys(self._prefix, job_id, legacy=True)
        if job_id not in self._tagged and self._location.kind != "cluster":
            if self._client.exists(keys.epoch, keys.index):
                self._tagged.add(job_id)
            elif self._client.exists(legacy.epoch, legacy.index):
                return legacy
        return keys

    def _legacy_keys(self, job_id: str) -> list[str]:
        """The job's keys in the old layout, to move, after fencing any driver that still writes them."""
        legacy = RedisKeys(self._prefix, job_id, legacy=True)
        if self._location.kind == "cluster" or self._client.exists(self._keys(job_id).epoch):
            return []
        if not self._client.exists(legacy.epoch, legacy.index):
            return []
        self._client.incr(legacy.epoch)  # an old-layout driver is fenced before its keys are listed
        pattern = _glob_escape(legacy.job) + ":*"
        return sorted(cast(list[str], list(self._client.scan_iter(match=pattern, count=1000))))

    # -- writes ----------------------------------------------------------------------------------------------

    def _server_of(self, key: str) -> _Server:
        """The server that holds `key` (WAIT must follow the write on the same connection)."""
        if isinstance(self._client, RedisCluster):
            node = self._client.get_node_from_key(key)
            return _Server(self._client.get_redis_connection(node), node.name)
        return _Server(self._client, self.url)

    def _replicas_to_wait(self, connected: int) -> int:
        """How many replicas a write waits for when `connected` are: `wait_replicas`, or under `auto` all of them,
        and never fewer than this store has seen (a replica that left may be the one Sentinel promotes when it is
        back; until then writes fail, or wait for it while a failover is ridden through)."""
        if self._location.wait_replicas is not None:
            return self._location.wait_replicas
        with self._seen_lock:
            self._replicas_seen = max(self._replicas_seen or 0, connected)
            return self._replicas_seen

    def _write(self, script: str, keys: list[str], args: list[str]) -> Any:
        """Run a write script; with replicas to wait for, WAIT on the same connection before answering: a write
        only the primary has can be rolled back by a failover, so nobody may act on it before it is replicated.

        Under `auto` the pipeline also reads how many replicas are connected; when more are than the write waited
        for (one attached since), the write is made again waiting for them all (it may be made twice, and the
        second replicates, so its WAIT covers the first: _FENCED_SCRIPT)."""
        server = self._server_of(keys[0])
        if self._location.wait_replicas is None and self._replicas_seen is None:  # the first write: count them now
            wanted = self._replicas_to_wait(int(server.client.info("replication").get("connected_slaves", 0)))
        else:
            wanted = self._replicas_to_wait(0)
        while True:
            reply, reached, connected = self._write_once(server, script, keys, args, wanted)
            if connected is None or connected <= wanted:
                break
            wanted = self._replicas_to_wait(connected)
        if wanted and reached < wanted:
            raise ReplicationError(
                f"redis state store {server.name}: a journal write reached {reached} of the {wanted} replica(s) it "
                f"waits for within {self._location.wait_timeout:g} s (wait_replicas, wait_timeout); a failover could "
                "lose it, so it counts as a failed write. See docs/state-store.md."
            )
        return reply

    def _write_once(self, server: _Server, script: str, keys: list[str], args: list[str],
                    wanted: int) -> tuple[Any, int, int | None]:
        """(the script's reply, replicas that acknowledged it, replicas connected: None unless `auto`)."""
        auto = self._location.wait_replicas is None
        with server.client.pipeline(transaction=False) as pipe:
            pipe.eval(script, len(keys), *keys, *args)
            if wanted:
                pipe.execute_command("WAIT", wanted, int(self._location.wait_timeout * 1000))
            if auto:
                pipe.info("replication")
            replies = pipe.execute(raise_on_error=False)
        failed = next((reply for reply in replies if isinstance(reply, Exception)), None)
        if failed is not None:
            raise failed
        connected = int(replies[-1].get("connected_slaves", 0)) if auto else None
        return replies[0], int(replies[1]) if wanted else 0, connected

    def _fenced(
        self, job_id: str, epoch: int, commands: list[list[object]], gate_key: str = "", attempt: str = "",
        intents_key: str = "", label: str = "",
    ) -> None:
        try:
            self._write(_FENCED_SCRIPT, [self._keys(job_id).epoch],
                        [str(epoch), json.dumps(commands), gate_key, attempt, intents_key, label])
        except redis.ResponseError as error:
            if _failover_explains(error):
                raise  # made again by _ride
            message = str(error)
            if message.startswith("FENCED"):
                current = message.split(" ", 1)[1]
                raise fencing_error(job_id, epoch, int(current) if current.isdigit() else None) from None
            if message.startswith("SEALED"):
                raise BatchSealedError(f"job {job_id!r}: {gate_key} refuses attempt {attempt}: {message[7:]}") from None
            raise StateStoreError(f"redis state store {self.url}: {message}") from error

    def take_epoch(self, job_id: str, owner: str, at_least: int = 0) -> int:
        keys, moves = self._keys(job_id), self._legacy_keys(job_id)
        epoch = int(self._write(
            _TAKE_EPOCH_SCRIPT,
            [keys.epoch, keys.owner, *moves, *map(keys.tagged, moves)],
            [str(at_least), json.dumps(owner_record(owner, time.time())), str(len(moves)),
             RedisKeys(self._prefix, job_id, legacy=True).epoch if moves else ""],
        ))
        self._tagged.add(job_id)
        return epoch

    def beat(self, job_id: str, epoch: int, at: float) -> None:
        # how many replicas this driver's writes wait for travels with its heartbeat, for `doctor` (`durability`)
        waits = self._location.wait_replicas if self._location.wait_replicas is not None else self._replicas_seen or 0
        self._fenced(job_id, epoch, [["SET", self._keys(job_id).seen,
                                      json.dumps({"epoch": epoch, "at": at, "waits": waits})]])

    def add_intent(self, job_id: str, epoch: int, query_id: str, batch_id: int, ref: TxnRef) -> None:
        keys = self._keys(job_id)
        self._fenced(
            job_id,
            epoch,
            [
                ["HSET", keys.intents(query_id, batch_id), ref.label, ref.to_json()],
                ["SADD", keys.index, keys.member(query_id, batch_id)],
            ],
            gate_key=keys.gate(query_id, batch_id),
            attempt=ref.attempt,
        )

    def confirm_intent(self, job_id: str, epoch: int, query_id: str, batch_id: int, ref: TxnRef) -> None:
        keys = self._keys(job_id)
        self._fenced(
            job_id,
            epoch,
            [],
            gate_key=keys.gate(query_id, batch_id),
            attempt=ref.attempt,
            intents_key=keys.intents(query_id, batch_id),
            label=ref.label,
        )

    def remove_intents(self, job_id: str, epoch: int, query_id: str, batch_id: int, labels: list[str]) -> None:
        if labels:
            self._fenced(job_id, epoch, [["HDEL", self._keys(job_id).intents(query_id, batch_id), *labels]])

    def put_batch(self, job_id: str, epoch: int, record: BatchRecord) -> None:
        keys, query_id, batch_id = self._keys(job_id), record.query_id, record.batch_id
        self._fenced(
            job_id,
            epoch,
            [
                ["SET", keys.batch(query_id, batch_id), record.to_json()],
                ["SET", keys.gate(query_id, batch_id), intent_gate(record)],
                ["SADD", keys.index, keys.member(query_id, batch_id)],
            ],
        )

    def mark_done(self, job_id: str, epoch: int, query_id: str, batch_id: int, label: str) -> None:
        self._fenced(job_id, epoch, [["SADD", self._keys(job_id).done(query_id, batch_id), label]])

    def mark_done_many(self, job_id: str, epoch: int, query_id: str, batch_id: int, labels: list[str]) -> None:
        if labels:
            self._fenced(job_id, epoch, [["SADD", self._keys(job_id).done(query_id, batch_id), *labels]])

    def delete_batch(self, job_id: str, epoch: int, query_id: str, batch_id: int) -> None:
        keys = self._keys(job_id)
        self._fenced(
            job_id,
            epoch,
            [
                ["DEL", keys.batch(query_id, batch_id)],
                ["DEL", keys.done(query_id, batch_id)],
                ["DEL", keys.intents(query_id, batch_id)],
                ["DEL", keys.gate(query_id, batch_id)],
                ["SREM", keys.index, keys.member(query_id, batch_id)],
            ],
        )

    # -- reads -----------------------------------------------------------------------------------------------

    def current_epoch(self, job_id: str) -> int:
        value = self._client.get(self._read_keys(job_id).epoch)
        return int(value) if value else 0

    def epoch_owner(self, job_id: str) -> dict[str, Any] | None:
        keys = self._read_keys(job_id)
        value, seen = self._client.mget([keys.owner, keys.seen])
        return decode_owner(json.loads(value), json.loads(seen) if seen else None) if value else None

    def intents(self, job_id: str, query_id: str, batch_id: int) -> list[TxnRef]:
        values = cast(list[str], self._client.hvals(self._read_keys(job_id).intents(query_id, batch_id)))
        return sorted((TxnRef.from_json(v) for v in values), key=lambda r: r.label)

    def get_batch(self, job_id: str, query_id: str, batch_id: int) -> BatchRecord | None:
        value = cast("str | None", self._client.get(self._read_keys(job_id).batch(query_id, batch_id)))
        return BatchRecord.from_json(value) if value else None

    def done_labels(self, job_id: str, query_id: str, batch_id: int) -> set[str]:
        return set(cast(set[str], self._client.smembers(self._read_keys(job_id).done(query_id, batch_id))))

    def job_ids(self) -> list[str]:
        jobs: set[str] = set()
        for name in ("epoch", "index"):
            for key in self._client.scan_iter(match=RedisKeys.job_pattern(self._prefix, name), count=1000):
                job = RedisKeys.job_of(self._prefix, key, name)
                if job:
                    jobs.add(job)
        return sorted(jobs)

    def batch_keys(self, job_id: str) -> list[tuple[str, int]]:
        members = cast(set[str], self._client.smembers(self._read_keys(job_id).index))
        return sorted(map(RedisKeys.parse_member, members), key=lambda k: (k[1], k[0]))

    # -- operations ------------------------------------------------------------------------------------------

    def _servers(self) -> list[_Server]:
        if isinstance(self._client, RedisCluster):
            return [_Server(self._client.get_redis_connection(node), node.name) for node in self._client.get_primaries()]
        return [_Server(self._client, self.url)]

    def durability(self) -> Durability:
        found, warnings = [], []
        for server in self._servers():
            seen, warning = self._server_durability(server)
            found.append(seen)
            warnings += [warning] if warning else []
        if not isinstance(self._client, RedisCluster):
            drivers, warning = self._drivers_durability(self._servers()[0])
            found += drivers
            warnings += [warning] if warning else []
        return Durability("; ".join([*found, self._failover_found()]), "; ".join(warnings) or None)

    def _drivers_durability(self, server: _Server) -> tuple[list[str], str | None]:
        """What each running driver's journal writes wait for (its heartbeat says; under `auto` it may be more than
        are connected now, after a replica left), and a warning when that is more than are connected."""
        connected = int(server.client.info("replication").get("connected_slaves", 0))
        found, short = [], []
        for job in self.job_ids():
            keys = self._read_keys(job)
            owner, seen = (json.loads(value) if value else None for value in self._client.mget([keys.owner, keys.seen]))
            if not (owner and seen and "waits" in seen and seen.get("at") and seen.get("epoch") == owner.get("epoch")):
                continue  # no driver of this release, or it ended (its last beat is at 0)
            found.append(f"the driver of job {job!r} waits for {seen['waits']}")
            if int(seen["waits"]) > connected:
                short.append(job)
        if not short:
            return found, None
        return found, (f"the driver of job(s) {', '.join(map(repr, short))} waits for more replicas than the {connected} "
                       "connected (one it saw has left): its journal writes fail, or wait while it rides a failover, "
                       "until the replica is back or the job is restarted")

    def _failover_found(self) -> str:
        bound = self._failover_bound()
        if not bound:
            return "a lost connection fails a journal write at once (failover_timeout 0)"
        return f"rides a failover for up to {bound:g} s (failover_timeout)"

    def _server_durability(self, server: _Server) -> tuple[str, str | None]:
        """What one server keeps through a restart and a failover: (what was found, a warning or None)."""
        try:
            config = server.client.config_get("append*")
            config.update(server.client.config_get("min-replicas-to-write"))
        except redis.ResponseError as error:  # managed services often disable CONFIG
            return (f"{server.name}: persistence settings not readable",
                    f"cannot read the persistence settings ({error}); make sure AOF is on (appendonly yes)")
        info = server.client.info("replication")
        replicas = int(info.get("connected_slaves", 0))
        lags = [int(value.get("lag", 0)) for name, value in info.items() if name.startswith("slave") and
                isinstance(value, dict)]
        wanted = self._replicas_to_wait(replicas)
        auto = " (auto: every replica connected at each write)" if self._location.wait_replicas is None else ""
        found = (f"{server.name}: role {info.get('role')}, appendonly {config.get('appendonly')}, appendfsync "
                 f"{config.get('appendfsync')}, {replicas} replica(s) connected"
                 + (f" (lag up to {max(lags)} s)" if lags else "")
                 + f", journal writes wait for {wanted}{auto}, min-replicas-to-write "
                 f"{config.get('min-replicas-to-write')}")
        if config.get("appendonly") != "yes":
            return found, ("appendonly is off: a restart loses the journal. The job then stops (StateStoreLostError) "
                           "instead of duplicating, but needs an operator; set appendonly yes and appendfsync everysec "
                           "or always")
        if config.get("appendfsync") == "no":
            return found, "appendfsync is 'no': the last writes may be lost on a crash of the host; use everysec or always"
        if replicas > wanted:
            return found, (f"{replicas} replica(s) connected but journal writes wait for {wanted}: a failover can "
                           "promote a replica that missed the last journal writes, and the job then stops for an "
                           "operator; use wait_replicas=auto (docs/state-store.md)")
        if wanted > replicas:
            return found, (f"journal writes wait for {wanted} replica(s) but {replicas} are connected: every write "
                           "will fail after wait_timeout")
        return found, None

    def close(self) -> None:
        self._client.close()


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
