"""The streaming checkpoint folder, read and written as Spark keeps it: a local path or any Hadoop filesystem.

Two things of the sink live there: its own marker (checkpoint_marker.py) and what it reads of Spark's
offset log, `offsets/<N>`: the source range Spark planned batch N with. Spark writes that file before it
calls the sink with batch N, and re-runs an uncommitted batch from it; an operator who deletes it (the
usual remedy for a corrupt last offset file) or restores the folder from a snapshot makes Spark plan
batch N again, with another range (docs/runbook.md, section 'Batch re-planned with another range').
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .errors import ConfigurationError
from .state.file import write_text_atomic


class CheckpointFolder:
    """Files under a checkpoint root, by path relative to it."""

    def __init__(self, location: str, spark: Any = None) -> None:
        self.location = location.rstrip("/")
        parsed = urlparse(location)
        self._local = parsed.scheme in ("", "file")
        self._root = Path(parsed.path if parsed.scheme == "file" else location)
        self._spark = spark
        if not self._local and spark is None:
            raise ValueError(f"checkpoint location {location!r} is not local: reading it needs the SparkSession")

    def read(self, relative: str) -> str | None:
        """The file's text, or None when it does not exist."""
        if self._local:
            try:
                return (self._root / relative).read_text()
            except FileNotFoundError:
                return None
        fs, path = self._hadoop(relative)
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            text: str = self._spark.sparkContext._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
            return text
        finally:
            stream.close()

    def write(self, relative: str, text: str) -> None:
        """Replace the file whole (atomically where the filesystem can)."""
        if self._local:
            write_text_atomic(self._root / relative, text)
            return
        fs, path = self._hadoop(relative)
        stream = fs.create(path, True)  # overwrite: one small file, written by one process at a time
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()

    def delete(self, relative: str) -> None:
        if self._local:
            try:
                os.unlink(self._root / relative)
            except FileNotFoundError:
                pass
            return
        fs, path = self._hadoop(relative)
        fs.delete(path, False)

    def names(self, relative: str) -> list[str]:
        """The names of the files in a folder ([] when it does not exist)."""
        if self._local:
            folder = self._root / relative
            return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        fs, path = self._hadoop(relative)
        if not fs.exists(path):
            return []
        return sorted(status.getPath().getName() for status in fs.listStatus(path))

    def _hadoop(self, relative: str) -> tuple[Any, Any]:
        jvm = self._spark.sparkContext._jvm
        path = jvm.org.apache.hadoop.fs.Path(f"{self.location}/{relative}")
        return path.getFileSystem(self._spark.sparkContext._jsc.hadoopConfiguration()), path


# -- Spark's offset log ------------------------------------------------------------------------------------------------


def checkpoint_query_id(folder: CheckpointFolder) -> str:
    """The streaming query id Spark keeps in the checkpoint's `metadata` file."""
    text = folder.read("metadata")
    if not text:
        raise ConfigurationError(f"{folder.location} has no Spark metadata file: it is not a streaming checkpoint "
                                 "(check --checkpoint, or checkpoint in the config)")
    return str(json.loads(text.splitlines()[0])["id"])


def planned_offsets(folder: CheckpointFolder, batch_id: int) -> str | None:
    """The text of `offsets/<batch_id>` as Spark wrote it (None: not there, e.g. no Spark checkpoint)."""
    return folder.read(f"offsets/{batch_id}")


def source_ranges(offset_log_text: str) -> list[Any]:
    """The sources' end offsets of an offset-log file, one per source, comparable across re-plans.

    The file is a version line (`v1`), one line of batch metadata (its timestamp changes on every re-plan, so
    it is left out), then one line per source (JSON of its end offsets, or `-` for none); a line that is not
    JSON is compared as text.
    """
    lines = offset_log_text.splitlines()
    ranges: list[Any] = []
    for line in lines[2:]:
        try:
            ranges.append(json.loads(line))
        except ValueError:
            ranges.append(line)
    return ranges


def same_source(recorded: str | None, planned: str | None) -> bool:
    """Whether two offset-log texts plan the same source range; True when either is unknown (nothing to compare)."""
    if recorded is None or planned is None:
        return True
    return source_ranges(recorded) == source_ranges(planned)


def kafka_layout_changes(recorded: str | None, planned: str | None) -> list[str]:
    """What changed in the Kafka sources between `recorded` and `planned` (offset-log texts: an earlier batch's and
    this one's) that breaks the order of offsets: a topic with more or fewer partitions, or a partition whose end
    offset went back (the topic re-created). A Kafka source's line maps each topic to its partitions' end offsets;
    other sources' lines are left out, as are topics only one of them has."""
    before, now = _kafka_ends(recorded), _kafka_ends(planned)
    changes = []
    for topic in sorted(set(before) & set(now)):
        was, is_ = before[topic], now[topic]
        if len(was) != len(is_):
            changes.append(f"topic {topic}: {len(was)} partitions, now {len(is_)}")
        changes += [f"topic {topic} partition {p}: offset {was[p]}, now {is_[p]}"
                    for p in sorted(set(was) & set(is_), key=int) if is_[p] < was[p]]
    return changes


def _kafka_ends(offset_log_text: str | None) -> dict[str, dict[str, int]]:
    """topic -> partition -> end offset, from the Kafka sources of an offset-log text ({} when unknown)."""
    found: dict[str, dict[str, int]] = {}
    for source in source_ranges(offset_log_text) if offset_log_text else []:
        for topic, ends in source.items() if isinstance(source, dict) else []:
            if isinstance(ends, dict) and ends and all(str(p).isdigit() and isinstance(e, int) for p, e in ends.items()):
                found.setdefault(topic, {}).update(ends)
    return found


def latest_batch(folder: CheckpointFolder, log: str) -> int | None:
    """The newest batch id of an offset or commit log (`offsets`, `commits`); None when it has none."""
    ids = [int(name) for name in folder.names(log) if name.isdigit()]
    return max(ids) if ids else None


def delete_log_entry(folder: CheckpointFolder, log: str, batch_id: int) -> None:
    """Remove batch N of an offset or commit log with its checksum file (`.N.crc`, which Hadoop's local
    filesystem checks when present: a stale one would make Spark refuse the file written in its place)."""
    folder.delete(f"{log}/.{batch_id}.crc")
    folder.delete(f"{log}/{batch_id}")


def restore_offsets(folder: CheckpointFolder, batch_id: int, text: str) -> None:
    """Write `offsets/<batch_id>` back as the journal recorded it, in place of whatever is there."""
    delete_log_entry(folder, "offsets", batch_id)
    folder.write(f"offsets/{batch_id}", text)
