"""File state store: the embedded default, for one machine (local Spark, tests, demos).

Every file is replaced by write-to-temp, fsync, rename, fsync-directory, so a reader sees the
old or the new content and never a torn one, even after kill -9 or power loss. Mutations take an
exclusive `flock` on the job's lock file and check the fencing epoch under it, so writers in
several processes (Spark's Python workers and the driver) serialise correctly.
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from streaming_sink.committable import TxnRef
from streaming_sink.errors import BatchSealedError
from streaming_sink.job_id import JOB_ID, JOB_ID_RULE
from streaming_sink.labels import gate_admits
from streaming_sink.records import BatchRecord, decode_owner, intent_gate, owner_record
from streaming_sink.state.base import StateStore, fencing_error


@dataclass(frozen=True)
class FileLayout:
    """Every path of the journal under `root`; the layout is frozen by tests/integration/test_journal_layout.py.

    `<job_id>/epoch.json` (owner, epoch and heartbeat), `<job_id>/.lock` (the writers' flock),
    `<job_id>/batches/<query_id>/<n>.<kind>.json` with kind `record`, `done` (labels) or `intents` (label -> TxnRef).
    """

    root: Path

    KINDS: ClassVar[tuple[str, ...]] = ("record", "done", "intents")

    def job(self, job_id: str) -> Path:
        if not JOB_ID.match(job_id):
            raise ValueError(f"job_id {job_id!r}: use {JOB_ID_RULE}")
        return self.root / job_id

    def epoch(self, job_id: str) -> Path:
        return self.job(job_id) / "epoch.json"

    def lock(self, job_id: str) -> Path:
        return self.job(job_id) / ".lock"

    def batches(self, job_id: str) -> Path:
        return self.job(job_id) / "batches"

    def batch_file(self, job_id: str, query_id: str, batch_id: int, kind: str) -> Path:
        return self.batches(job_id) / query_id / f"{batch_id}.{kind}.json"

    def batch_files(self, job_id: str) -> Iterator[tuple[Path, str, int, str]]:
        """Every batch file of the job: (path, query_id, batch_id, kind)."""
        for path in self.batches(job_id).glob("*/*.json"):
            batch, kind = path.name.split(".")[:2]
            yield path, path.parent.name, int(batch), kind

    def is_job(self, folder: Path) -> bool:
        """Whether a folder under the root holds a job's journal (not a stray folder)."""
        return bool(JOB_ID.match(folder.name)) and (
            (folder / "epoch.json").is_file() or (folder / "batches").is_dir())


class FileStateStore(StateStore):
    """Journal under `root`, laid out as `FileLayout` says."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.layout = FileLayout(self.root)
        self.url = f"file://{self.root.resolve()}"
        # Nothing is created here or on any read: `status` and the dry runs must leave no trace, and a
        # mistyped root or job id must read as unknown, not as an empty job. The first write creates the folders.

    def _batch_file(self, job_id: str, query_id: str, batch_id: int, kind: str) -> Path:
        return self.layout.batch_file(job_id, query_id, batch_id, kind)

    @contextmanager
    def _locked(self, job_id: str, epoch: int | None) -> Iterator[None]:
        self.layout.job(job_id).mkdir(parents=True, exist_ok=True)
        lock_path = self.layout.lock(job_id)
        with open(lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if epoch is not None:
                    current = self._read_epoch(job_id)
                    if current != epoch:
                        raise fencing_error(job_id, epoch, current)
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read_epoch(self, job_id: str) -> int:
        data = _read_json(self.layout.epoch(job_id))
        return decode_owner(data)["epoch"] if data else 0

    def take_epoch(self, job_id: str, owner: str, at_least: int = 0) -> int:
        with self._locked(job_id, None):
            epoch = max(self._read_epoch(job_id) + 1, at_least)
            write_json_atomic(self.layout.epoch(job_id), owner_record(owner, time.time(), epoch))
            return epoch

    def current_epoch(self, job_id: str) -> int:
        return self._read_epoch(job_id)

    def epoch_owner(self, job_id: str) -> dict[str, Any] | None:
        data = _read_json(self.layout.epoch(job_id))
        return decode_owner(data) if data else None

    def beat(self, job_id: str, epoch: int, at: float) -> None:
        path = self.layout.epoch(job_id)
        with self._locked(job_id, epoch):
            write_json_atomic(path, {**(_read_json(path) or {}), "seen": {"epoch": epoch, "at": at}})

    def add_intent(self, job_id: str, epoch: int, query_id: str, batch_id: int, ref: TxnRef) -> None:
        with self._locked(job_id, epoch):
            self._check_gate(job_id, query_id, batch_id, ref)
            self._update(self._batch_file(job_id, query_id, batch_id, "intents"), dict, lambda d: d.update({ref.label: ref.to_json()}))

    def confirm_intent(self, job_id: str, epoch: int, query_id: str, batch_id: int, ref: TxnRef) -> None:
        with self._locked(job_id, epoch):
            self._check_gate(job_id, query_id, batch_id, ref)
            if ref.label not in (_read_json(self._batch_file(job_id, query_id, batch_id, "intents")) or {}):
                raise BatchSealedError(f"job {job_id!r}: the intent {ref.label} of batch {batch_id} was aborted before it began")

    def _check_gate(self, job_id: str, query_id: str, batch_id: int, ref: TxnRef) -> None:
        gate = intent_gate(self.get_batch(job_id, query_id, batch_id))
        if not gate_admits(gate, ref.attempt):
            raise BatchSealedError(f"job {job_id!r}: batch {batch_id} of query {query_id} is closed to attempt {ref.attempt} ({gate})")

    def intents(self, job_id: str, query_id: str, batch_id: int) -> list[TxnRef]:
        data = _read_json(self._batch_file(job_id, query_id, batch_id, "intents")) or {}
        return sorted((TxnRef.from_json(v) for v in data.values()), key=lambda r: r.label)

    def remove_intents(self, job_id: str, epoch: int, query_id: str, batch_id: int, labels: list[str]) -> None:
        if not labels:
            return
        with self._locked(job_id, epoch):
            def drop(data: dict[str, str]) -> None:
                for label in labels:
                    data.pop(label, None)

            self._update(self._batch_file(job_id, query_id, batch_id, "intents"), dict, drop)

    def put_batch(self, job_id: str, epoch: int, record: BatchRecord) -> None:
        with self._locked(job_id, epoch):
            write_json_atomic(self._batch_file(job_id, record.query_id, record.batch_id, "record"), record.encode())

    def get_batch(self, job_id: str, query_id: str, batch_id: int) -> BatchRecord | None:
        data = _read_json(self._batch_file(job_id, query_id, batch_id, "record"))
        return BatchRecord.decode(data) if data else None

    def mark_done(self, job_id: str, epoch: int, query_id: str, batch_id: int, label: str) -> None:
        self.mark_done_many(job_id, epoch, query_id, batch_id, [label])

    def mark_done_many(self, job_id: str, epoch: int, query_id: str, batch_id: int, labels: list[str]) -> None:
        if not labels:
            return
        with self._locked(job_id, epoch):
            self._update(self._batch_file(job_id, query_id, batch_id, "done"), list, lambda d: d.extend(labels))

    def done_labels(self, job_id: str, query_id: str, batch_id: int) -> set[str]:
        return set(_read_json(self._batch_file(job_id, query_id, batch_id, "done")) or [])

    def job_ids(self) -> list[str]:
        try:
            entries = list(self.root.iterdir())
        except FileNotFoundError:
            return []
        return sorted(p.name for p in entries if self.layout.is_job(p))

    def batch_keys(self, job_id: str) -> list[tuple[str, int]]:
        keys: set[tuple[str, int]] = set()
        for path, query_id, batch_id, kind in self.layout.batch_files(job_id):
            if kind == "record" or (kind == "intents" and _read_json(path)):
                keys.add((query_id, batch_id))
        return sorted(keys, key=lambda k: (k[1], k[0]))

    def delete_batch(self, job_id: str, epoch: int, query_id: str, batch_id: int) -> None:
        with self._locked(job_id, epoch):
            for kind in FileLayout.KINDS:
                self._batch_file(job_id, query_id, batch_id, kind).unlink(missing_ok=True)

    @staticmethod
    def _update(path: Path, empty: Callable[[], Any], change: Callable[[Any], None]) -> None:
        data = _read_json(path) or empty()
        change(data)
        write_json_atomic(path, data)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def write_json_atomic(path: Path, data: Any) -> None:
    """Replace `path` with `data` as JSON so that a crash at any instant leaves either the old or the new content."""
    write_text_atomic(path, json.dumps(data, sort_keys=True))


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` so that a crash at any instant leaves either the old or the new content."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)  # one write
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
