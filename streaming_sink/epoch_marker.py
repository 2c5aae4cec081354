"""The fencing epoch's high-water mark, kept beside the streaming checkpoint (R2).

A state store that loses its data (Redis restarted without persistence, restored from a backup)
also loses its epoch counter; the next driver would take epoch 1 again, so an old zombie driver
would pass every fencing check and labels would repeat. The checkpoint outlives the store's loss,
so the driver keeps the highest epoch it took there and asks the store for a larger one.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse


class EpochMarker:
    """`<checkpoint>/streaming-sink/<job_id>.epoch`: a local path, or any Hadoop filesystem through Spark."""

    def __init__(self, checkpoint_location: str, job_id: str, spark: Any = None) -> None:
        self.location = f"{checkpoint_location.rstrip('/')}/streaming-sink/{job_id}.epoch"
        parsed = urlparse(checkpoint_location)
        self._local = parsed.scheme in ("", "file")
        self._path = Path(parsed.path if parsed.scheme == "file" else checkpoint_location) / "streaming-sink" / f"{job_id}.epoch"
        self._spark = spark
        if not self._local and spark is None:
            raise ValueError(f"checkpoint location {checkpoint_location!r} is not local: the epoch marker needs the SparkSession")

    def read(self) -> int:
        """The highest epoch a driver of this job took on this checkpoint (0: none yet)."""
        text = self._read_text()
        return int(text.strip()) if text and text.strip() else 0

    def advance(self, epoch: int) -> None:
        """Record `epoch` if it is higher than what is there (a driver never lowers the mark)."""
        if epoch > self.read():
            self._write_text(str(epoch))

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
            return self._spark.sparkContext._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()

    def _write_text(self, text: str) -> None:
        if self._local:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".epoch.", dir=self._path.parent)
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self._path)
            return
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
