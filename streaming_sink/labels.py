"""The formats of labels, writer attempts and intent gates: written and read only here.

A label names one target transaction; an attempt names the writer that began it (`e<epoch>w<pass>t<task>`); a
gate, stored beside a batch's record, says which attempts may still record intents. Each is parsed back somewhere
(ClickHouse lists staging tables by label shape, an abort refuses a newer epoch's attempt, a store checks the gate),
so the writing and the reading sit together. One reader cannot import this module: the Redis store's Lua script
checks the gate inside Redis (`state/redis.py`); `tests/unit/test_intent_gate_lua.py` runs it against `gate_admits`.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

LABEL_MAX_LENGTH = 128
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_]")
_HASH_CHARS = 12

#: The shape of every label `make_label` writes: "ss_", sanitised parts joined by "_", "_" and the hash's hex digits.
LABEL_PATTERN = re.compile(r"ss_\w*_[0-9a-f]{" + str(_HASH_CHARS) + "}", re.ASCII)


def make_label(
    job_id: str,
    query_id: str,
    batch_id: int,
    table: str,
    partition: int,
    attempt: str,
    chunk: int = 0,
) -> str:
    """A deterministic transaction label, valid for every target's names.

    The readable part helps operators; the hash of every component keeps labels unique even
    when the readable part is sanitised or truncated (invariant I4). The query id changes with
    a new checkpoint, so labels never collide across checkpoints.
    """
    identity = "\x1f".join([job_id, query_id, str(batch_id), table, str(partition), attempt, str(chunk)])
    digest = hashlib.sha256(identity.encode("utf-8")).hexdigest()[:_HASH_CHARS]
    readable = "_".join(
        [
            "ss",
            _sanitise(job_id, 24),
            _sanitise(query_id.replace("-", ""), 8),
            str(batch_id),
            _sanitise(table, 24),
            f"p{partition}",
            _sanitise(attempt, 16),
            f"c{chunk}",
        ]
    )
    room = LABEL_MAX_LENGTH - _HASH_CHARS - 1
    return f"{readable[:room]}_{digest}"


def label_prefix(job_id: str, query_id: str) -> str:
    """What every label of one job and query starts with: how leftovers on a server are recognised."""
    return "_".join(["ss", _sanitise(job_id, 24), _sanitise(query_id.replace("-", ""), 8), ""])


@dataclass(frozen=True)
class LabelParts:
    """What the readable part of a label says. The protocol reads labels back only where the journal has nothing: a
    server's leftover transaction no record or intent names (its attempt's epoch, `Committer.refuse_newer_epochs`);
    operators' tools and tests read them too, through `parse_label` only."""

    query: str  # the query id's first characters, as the label keeps them
    batch_id: int
    table: str  # as the label keeps it: characters a label cannot hold are "_", cut to 24
    partition: int
    attempt: Attempt
    chunk: int


def parse_label(label: str, job_id: str) -> LabelParts | None:
    """The parts the readable part of a label `make_label` wrote for `job_id` says (None: not such a label, or one cut
    short past LABEL_MAX_LENGTH). The job id anchors the left end and the attempt the right, so tables with "_" or
    digits parse; what follows the chunk (the hash) is not read."""
    found = re.match(
        r"ss_" + re.escape(_sanitise(job_id, 24)) + r"_(?P<query>[A-Za-z0-9_]{1,8})_(?P<batch>\d+)_(?P<table>\w+)"
        r"_p(?P<partition>-?\d+)_(?P<attempt>e\d+w\d+t\d+)_c(?P<chunk>\d+)_",
        label, re.ASCII)
    if found is None:
        return None
    attempt = Attempt.parse(found["attempt"])
    assert attempt is not None  # the pattern above is the attempt's
    return LabelParts(found["query"], int(found["batch"]), found["table"], int(found["partition"]), attempt,
                      int(found["chunk"]))


def label_batch(label: str, table: str, partition: int) -> tuple[str, int] | None:
    """(what every label of the label's job and query begins with, its batch id), read back from a label `make_label`
    wrote for `table` and writer `partition`; None where the readable part was cut short of them."""
    head, found, _ = label.rpartition(f"_{_sanitise(table, 24)}_p{partition}_")
    series, _, batch = head.rpartition("_")
    return (series, int(batch)) if found and series and batch.isdigit() else None


def _sanitise(text: str, limit: int) -> str:
    return _LABEL_UNSAFE.sub("_", text)[:limit] or "x"


@dataclass(frozen=True)
class Attempt:
    """One writer attempt: the driver's fencing epoch, its write pass over the batch, Spark's task attempt id.

    Every label holds its attempt, so two attempts never share a label (I4); the epoch in it lets an abort
    refuse a newer driver's transaction (I5); the pass prefix is what a replay's gate admits."""

    epoch: int
    write_pass: int
    task: int

    def __str__(self) -> str:
        return f"{pass_prefix(self.epoch, self.write_pass)}t{self.task}"

    @classmethod
    def parse(cls, text: str) -> Attempt | None:
        """The attempt an attempt string names; None for a string `Attempt` did not write."""
        found = _ATTEMPT.fullmatch(text)
        return cls(*(int(part) for part in found.groups())) if found else None


_ATTEMPT = re.compile(r"e(\d+)w(\d+)t(\d+)", re.ASCII)
_ATTEMPT_EPOCH = re.compile(r"^e(\d+)w", re.ASCII)


def pass_prefix(epoch: int, write_pass: int) -> str:
    """What every attempt of one write pass starts with (before `t<task>`): the unit a replay's gate admits."""
    return f"e{epoch}w{write_pass}"


def attempt_epoch(attempt: str) -> int | None:
    """The fencing epoch an attempt string was written under (None: not an attempt string)."""
    found = _ATTEMPT_EPOCH.match(attempt)
    return int(found.group(1)) if found else None


#: The gates. Open: any attempt of the current epoch may record intents (the batch has no record). Sealed: none
#: (COMMITTED). A replay's gate admits only its own pass: `PREPARED:<pass prefix>`; `PREPARED:` admits none.
GATE_OPEN = ""
GATE_SEALED = "COMMITTED"
_GATE_REPLAY = "PREPARED:"


def replay_gate(open_pass: str | None) -> str:
    """The gate of a PREPARED batch: admits the attempts of `open_pass` (a `pass_prefix`), or none (None)."""
    return _GATE_REPLAY + (open_pass or "")


def gate_admits(gate: str, attempt: str) -> bool:
    """Whether a writer attempt may record an intent under `gate` (the rule the Lua in `state/redis.py` repeats).

    Closing the gate before the final abort is what keeps a late writer from leaking a transaction (R6)."""
    if gate == GATE_OPEN:
        return True
    if gate.startswith(_GATE_REPLAY):
        prefix = gate[len(_GATE_REPLAY):]
        return bool(prefix) and attempt.startswith(prefix + "t")
    return False


#: A batch committed in waves numbers the writer partitions of wave k from k * WAVE_STRIDE, so the waves' labels and
#: checksums never collide (a Spark batch has far fewer partitions); wave 0 keeps Spark's numbers.
WAVE_STRIDE = 100_000


def wave_partition(wave: int, partition: int) -> int:
    """The writer partition `partition` (a runner's number: Spark's, or a replay's negative no-match) is in `wave`."""
    if partition >= WAVE_STRIDE:
        raise ValueError(f"writer partition {partition}: a batch committed in waves has fewer than {WAVE_STRIDE}")
    return partition if partition < 0 else wave * WAVE_STRIDE + partition


def partition_wave(partition: int) -> int:
    """The wave a recorded writer partition belongs to (0 for a batch written in one round)."""
    return max(0, partition) // WAVE_STRIDE
