"""Spark's side of a streaming query, as the sink meets it: a Kafka topic, and the checkpoint folder's offset log
(`offsets/N`), commit log (`commits/N`) and `metadata`, beside the sink's own marker (`streaming-sink/<job>.json`).

Spark plans batch N from the end of `offsets/N-1`, writes `offsets/N`, calls the sink, and writes `commits/N` when
the call returns; a restart re-runs the newest planned batch that has no commit, from its offset file. What an
operator or a disk can do to that folder is what this model adds to the simulation: the last offset file deleted
(the remedy for a corrupt one) or the folder restored from a snapshot, after which Spark plans a batch the journal
holds again with another range (I10); the marker lost; and a re-run that numbers its partitions differently.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pyarrow as pa

TOPIC = "t"
KAFKA_PARTITIONS = 3
Rows = list[tuple[int, str]]  # (row id, table) by offset
Partitions = list[list[pa.RecordBatch]]  # one Spark partition per Kafka partition: its Arrow batches
Ends = tuple[int, ...]  # end offset of each Kafka partition


class SparkCheckpoint:
    """The topic's rows by partition and offset, and the checkpoint folder Spark reads and writes."""

    def __init__(self, root: str, seed: int, query_id: str, data: list[Partitions], tables: list[str], next_id: int) -> None:
        self.root, self.seed = Path(root), seed
        self.log: list[Rows] = [[] for _ in range(KAFKA_PARTITIONS)]
        self.sizes: list[tuple[int, ...]] = []  # batch -> rows per Kafka partition as first planned
        self.frames: dict[tuple[Ends, Ends], Partitions] = {}  # the drawn batches, by their range
        for partitions in data:  # the schedule's drawn batches are the topic's first ranges
            start = self.ends_now()
            for k, batches in enumerate(partitions):
                for batch in batches:
                    self.log[k] += zip(batch.column("id").to_pylist(), batch.column("__table").to_pylist())
            self.sizes.append(tuple(len(self.log[k]) - start[k] for k in range(KAFKA_PARTITIONS)))
            self.frames[(start, self.ends_now())] = partitions
        tail = random.Random(f"tail-{seed}")  # rows past the drawn batches, for a re-plan that reaches further
        for k in range(KAFKA_PARTITIONS):
            for _ in range(tail.randint(0, 6)):
                self.log[k].append((next_id, tail.choice(tables)))
                next_id += 1
        self.planned: dict[int, int] = {}  # batch -> how many times Spark planned it
        self.snapshots: list[dict[str, str]] = []
        self._write("metadata", json.dumps({"id": query_id}) + "\n")

    def ends_now(self) -> Ends:
        return tuple(len(rows) for rows in self.log)

    # -- the folder ------------------------------------------------------------------------------

    def _write(self, relative: str, text: str) -> None:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def _read(self, relative: str) -> str | None:
        try:
            return (self.root / relative).read_text()
        except FileNotFoundError:
            return None

    def _latest(self, log: str) -> int | None:
        folder = self.root / log
        ids = [int(n) for n in os.listdir(folder) if n.isdigit()] if folder.is_dir() else []
        return max(ids) if ids else None

    def ends(self, batch_id: int) -> Ends | None:
        """The end offsets `offsets/<batch_id>` holds (zeros before batch 0), None when the file is gone."""
        if batch_id < 0:
            return (0,) * KAFKA_PARTITIONS
        text = self._read(f"offsets/{batch_id}")
        return None if text is None else self.parse(text)

    @staticmethod
    def parse(text: str) -> Ends:
        """The end offsets of an offset-log file's text (Spark's format: version, metadata, one line per source)."""
        found = json.loads(text.splitlines()[2])[TOPIC]
        return tuple(int(found[str(k)]) for k in range(KAFKA_PARTITIONS))

    def committed(self) -> int:
        """How many batches the commit log says are done (the newest commit's id + 1)."""
        latest = self._latest("commits")
        return 0 if latest is None else latest + 1

    # -- Spark's steps ---------------------------------------------------------------------------

    def next_batch(self) -> int:
        """The batch a (re)started query runs: the newest planned one without a commit, else the next."""
        planned, committed = self._latest("offsets"), self._latest("commits")
        if planned is None:
            return 0
        return planned if committed is None or committed < planned else planned + 1

    def plan(self, batch_id: int, clock_ms: int, last: int) -> bool:
        """Write `offsets/<batch_id>` unless it is there; False when Spark cannot (the one before is gone).

        The first plan of a batch takes the drawn size; a batch planned again (its file was lost) takes another,
        as Spark does when more data arrived meanwhile; batch `last` (the final, empty one) takes nothing."""
        if self.ends(batch_id) is not None:
            return True
        start = self.ends(batch_id - 1)
        if start is None:
            return False
        times = self.planned.get(batch_id, 0)
        self.planned[batch_id] = times + 1
        if batch_id >= last:
            sizes: tuple[int, ...] = (0,) * KAFKA_PARTITIONS
        elif times == 0:
            sizes = self.sizes[batch_id]
        else:
            draw = random.Random(f"replan-{self.seed}-{batch_id}-{times}")
            sizes = tuple(draw.randint(0, 4) for _ in range(KAFKA_PARTITIONS))
        ends = tuple(min(s + n, len(rows)) for s, n, rows in zip(start, sizes, self.log))
        metadata = {"batchWatermarkMs": 0, "batchTimestampMs": clock_ms, "conf": {}}
        offsets = {TOPIC: {str(k): end for k, end in enumerate(ends)}}
        self._write(f"offsets/{batch_id}", "v1\n" + json.dumps(metadata) + "\n" + json.dumps(offsets) + "\n")
        return True

    def commit(self, batch_id: int) -> None:
        self._write(f"commits/{batch_id}", "v1\n{\"nextBatchWatermarkMs\":0}\n")
        self.snapshots.append(self._snapshot())

    def frame(self, batch_id: int, renumber: random.Random | None = None) -> Partitions | None:
        """The batch's DataFrame: Arrow batches of each Kafka partition's range, from the offset files (None: gone).
        With `renumber`, the partitions come in another order (a re-run that learned the offsets in another order)."""
        start, end = self.ends(batch_id - 1), self.ends(batch_id)
        if start is None or end is None:
            return None
        partitions = self.frames.get((start, end))
        if partitions is None:
            partitions = [self._split(k, start[k], end[k]) for k in range(KAFKA_PARTITIONS)]
        partitions = list(partitions)
        if renumber is not None:
            renumber.shuffle(partitions)
        return partitions

    def _split(self, k: int, start: int, end: int) -> list[pa.RecordBatch]:
        """A range's rows in Arrow batches; the same range always splits the same way (a replay must flush alike)."""
        rows, draw, batches = self.log[k][start:end], random.Random(f"split-{self.seed}-{k}-{start}-{end}"), []
        while rows:
            n = draw.randint(1, 4)
            chunk, rows = rows[:n], rows[n:]
            batches.append(pa.RecordBatch.from_pydict({"__table": [t for _, t in chunk], "id": [i for i, _ in chunk]}))
        return batches

    def rows_through(self, batch_id: int) -> dict[str, list[int]]:
        """Every row up to the end of `offsets/<batch_id>`, by table: what exactly-once must leave visible."""
        ends = self.ends(batch_id)
        assert ends is not None
        found: dict[str, list[int]] = {}
        for rows, end in zip(self.log, ends):
            for row_id, table in rows[:end]:
                found.setdefault(table, []).append(row_id)
        return found

    # -- what happens to the folder --------------------------------------------------------------

    def drop_last_offsets(self) -> int | None:
        """The operator deletes the last offset file (and its commit): the remedy for a corrupt one."""
        latest = self._latest("offsets")
        if latest is None or latest == 0:
            return None
        for log in ("offsets", "commits"):
            (self.root / log / str(latest)).unlink(missing_ok=True)
        return latest

    def restore_snapshot(self, draw: random.Random) -> int | None:
        """The folder restored from an earlier snapshot (offset and commit logs, and the sink's marker with them)."""
        if not self.snapshots:
            return None
        index = draw.randrange(len(self.snapshots))
        for log in ("offsets", "commits", "streaming-sink"):
            shutil.rmtree(self.root / log, ignore_errors=True)
        for relative, text in self.snapshots[index].items():
            self._write(relative, text)
        return index

    def lose_marker(self) -> None:
        shutil.rmtree(self.root / "streaming-sink", ignore_errors=True)

    def _snapshot(self) -> dict[str, str]:
        files: dict[str, str] = {}
        for log in ("offsets", "commits", "streaming-sink"):
            folder = self.root / log
            for name in os.listdir(folder) if folder.is_dir() else []:
                files[f"{log}/{name}"] = (folder / name).read_text()
        return files
