"""What the state store must never forget, kept beside the streaming checkpoint too (R2).

A state store can lose its data (Redis restarted without persistence, a failover to a replica
that missed the last writes, a restore from a backup). The checkpoint outlives that, so the driver
keeps two facts there:

* the highest fencing epoch it took: the next driver asks the store for a larger one, so a zombie
  driver never passes fencing again and labels never repeat;
* the newest batch it prepared, written after the `PREPARED` record and before any commit is sent:
  if the store later has no record of that batch, commits may have happened that the store forgot,
  and the job stops instead of writing the batch again. A batch that never reached this point had
  no commit sent, so writing it again after a loss is safe.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .state.file import write_json_atomic


@dataclass(frozen=True)
class Position:
    """The newest batch a driver prepared: commits of it may have been sent."""

    query_id: str
    batch_id: int


class CheckpointMarker:
    """`<checkpoint>/streaming-sink/<job_id>.json`: a local path, or any Hadoop filesystem through Spark."""

    def __init__(self, checkpoint_location: str, job_id: str, spark: Any = None) -> None:
        self.location = f"{checkpoint_location.rstrip('/')}/streaming-sink/{job_id}.json"
        parsed = urlparse(checkpoint_location)
        self._local = parsed.scheme in ("", "file")
        self._path = Path(parsed.path if parsed.scheme == "file" else checkpoint_location) / "streaming-sink" / f"{job_id}.json"
        self._spark = spark
        if not self._local and spark is None:
            raise ValueError(f"checkpoint location {checkpoint_location!r} is not local: the marker needs the SparkSession")
        self._data: dict[str, Any] | None = None

    def epoch(self) -> int:
        """The highest epoch a driver of this job took on this checkpoint (0: none yet)."""
        return int(self._read().get("epoch", 0))

    def prepared(self) -> Position | None:
        found = self._read().get("prepared")
        return Position(found["query_id"], int(found["batch_id"])) if found else None

    def advance_epoch(self, epoch: int) -> None:
        """Record `epoch` if it is higher than what is there (a driver never lowers the mark)."""
        if epoch > self.epoch():
            self._write({**self._read(), "epoch": epoch})

    def record_prepared(self, position: Position) -> None:
        """Called after the PREPARED record is durable and before the first commit is sent."""
        self._write({**self._read(), "prepared": {"query_id": position.query_id, "batch_id": position.batch_id}})

    def _read(self) -> dict[str, Any]:
        if self._data is None:
            text = self._read_text()
            self._data = json.loads(text) if text and text.strip() else {}
        return self._data

    def _write(self, data: dict[str, Any]) -> None:
        if self._local:
            write_json_atomic(self._path, data)
        else:
            self._write_hadoop(json.dumps(data, sort_keys=True))
        self._data = data

    def _read_text(self) -> str | None:
        if self._local:
            try:
                return self._path.read_text()
            except FileNotFoundError:
                return None
        fs, path = self._hadoop()
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            text: str = self._spark.sparkContext._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")  # py4j: a Java String
            return text
        finally:
            stream.close()

    def _write_hadoop(self, text: str) -> None:
        fs, path = self._hadoop()
        stream = fs.create(path, True)  # overwrite: one small file, written by the one live driver
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()

    def _hadoop(self) -> tuple[Any, Any]:
        jvm = self._spark.sparkContext._jvm
        path = jvm.org.apache.hadoop.fs.Path(self.location)
        return path.getFileSystem(self._spark.sparkContext._jsc.hadoopConfiguration()), path
