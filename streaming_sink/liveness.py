"""Is the job's driver running? Its heartbeat, and the judgement the operator's commands make from it.

A running driver writes a heartbeat beside its fencing epoch every `HEARTBEAT_SECONDS`, idle or not (Spark
calls foreachBatch only when there is data, so batch records alone cannot tell an idle driver from a dead
one). An operator command that would take the epoch (and so stop that driver at its next state write) or
rewrite its checkpoint first asks `running_driver`; it acts beside a running driver only with `--force`.
"""
from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from typing import Any

from .state import StateStore
from .state.base import FencedError

log = logging.getLogger(__name__)

#: How often a driver beats; a holder silent for `MISSED_BEATS` of them is taken for dead.
HEARTBEAT_SECONDS = 5.0
MISSED_BEATS = 3
SILENT_SECONDS = MISSED_BEATS * HEARTBEAT_SECONDS
#: The last beat of a driver that ended (closed): gone at once, wherever it ran.
ENDED = 0.0

# "host:pid" at the end of an owner text: the sink's "host:pid", an operator's "streaming-sink recover on host:pid"
_HOST_PID = re.compile(r"(?P<host>[^\s:]+):(?P<pid>\d+)$")


def process_owner() -> str:
    """How this process names itself as an epoch's owner."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Heartbeat:
    """A daemon thread that beats for one epoch until stopped, fenced, or the store is gone."""

    def __init__(self, store: StateStore, job_id: str, epoch: int, every: float = HEARTBEAT_SECONDS) -> None:
        self._store, self._job_id, self._epoch = store, job_id, epoch
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True, name=f"heartbeat-{job_id}")
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stopped.wait(every):
            try:
                self._store.beat(self._job_id, self._epoch, time.time())
            except FencedError:
                return  # a newer driver or an operator holds the job: this one is not its driver any more
            except Exception as error:  # a store that failed once may answer the next beat; the batches will tell
                log.debug("job %s: heartbeat not written (%s)", self._job_id, error)

    def stop(self) -> None:
        self._stopped.set()

    def end(self) -> None:
        """Stop, and say so in the store: operators' commands need not wait for the beats to be missed."""
        self.stop()
        self._thread.join()
        try:
            self._store.beat(self._job_id, self._epoch, ENDED)
        except Exception as error:  # fenced, or the store is gone: the missed beats will tell
            log.debug("job %s: last heartbeat not written (%s)", self._job_id, error)


def running_driver(owner: dict[str, Any] | None, now: float | None = None) -> str | None:
    """Why the epoch's holder must be taken for a running process (None: it is not running).

    A holder that ended, or whose process on this machine is gone, is not running; otherwise it is while it
    beat (or took the epoch) within `MISSED_BEATS` heartbeats."""
    if owner is None:
        return None
    now = time.time() if now is None else now
    name = str(owner.get("owner") or "")
    found = _HOST_PID.search(name)
    if found and found["host"] == socket.gethostname() and not _process_exists(int(found["pid"])):
        return None
    if owner.get("seen") == ENDED:
        return None
    last = owner.get("seen") or owner.get("at") or 0.0
    silent = now - float(last)
    if silent >= SILENT_SECONDS:
        return None
    return (f"{name or 'a process'} holds the job's epoch {owner.get('epoch')} and was active {max(silent, 0):.0f} s "
            "ago")


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
