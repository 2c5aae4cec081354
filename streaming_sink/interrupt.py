"""Ctrl-C in the packaged job: the first stops it between two batches, a second at once.

Stopping at any instant is what the protocol is built for (a killed driver is recovered by the next run), but a
stop inside a batch leaves it PREPARED or in waves for the next run to finish, and a release upgrade must not hand
such a batch to the new release (docs/runbook.md, 'Moving a job'). So a first Ctrl-C lets the batch being written
finish and starts no other; one between batches stops at once.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

INTERRUPTED = "interrupted; nothing is lost: run the same command to resume"
#: How long a waiting first Ctrl-C sleeps between looks (a second Ctrl-C comes in between).
_LOOK_S = 0.5


class BatchBoundary:
    """The edge between two batches of the sink: `run` passes each batch through, `stop` closes the edge so that no
    batch starts any more and tells which one is being written."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._closed = False
        self._batch: int | None = None
        self._finished = True  # whether the last batch through returned

    def run(self, process: Callable[[Any, int], None], data: Any, batch_id: int) -> None:
        """`process(data, batch_id)`, unless a stop was asked: then this batch never starts (Spark runs it next time),
        and its thread waits for the process to end."""
        with self._lock:
            closed = self._closed
            if not closed:
                self._idle.clear()
                self._batch, self._finished = batch_id, False
        if closed:
            threading.Event().wait()
        try:
            process(data, batch_id)
            self._finished = True
        finally:
            self._idle.set()

    def stop(self) -> int | None:
        """Start no batch from now on; the batch being written, if any."""
        with self._lock:
            self._closed = True
            return None if self._idle.is_set() else self._batch

    def wait(self, timeout: float) -> bool:
        """Whether the batch being written has ended (within `timeout`)."""
        return self._idle.wait(timeout)

    @property
    def finished(self) -> bool:
        """Whether the last batch that started returned (False: it failed)."""
        return self._finished


#: The packaged job's batches (job.py passes each through); one per process, as the SIGINT handler is.
BATCHES = BatchBoundary()


def exit_on_interrupt(prefix: str, batches: BatchBoundary = BATCHES) -> None:
    """Install the job's Ctrl-C handling, in place of PySpark's own handler, whose job cancelling calls into the JVM
    while the main thread waits on it and logs Py4J tracebacks. A first Ctrl-C while a batch is written waits for it
    (and says so); otherwise, or on a second Ctrl-C, the driver ends at once with one line and exit code 130. The JVM
    ignores SIGINT (PySpark starts it so) and ends with the driver, killed here so that its log lines end first."""
    import signal

    asked: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        asked.append(signum)
        if len(asked) == 1:
            batch = batches.stop()
            if batch is not None:
                sys.stderr.write(f"{prefix}stopping after batch {batch}, which is being written (Ctrl-C again to stop "
                                 "at once)\n")
                sys.stderr.flush()
                while not batches.wait(_LOOK_S):  # a second Ctrl-C runs this handler again, within this wait
                    pass
                if batches.finished:
                    _exit(f"{prefix}stopped between batches (batch {batch} finished); run the same command to resume")
        _exit(f"{prefix}{INTERRUPTED}")

    signal.signal(signal.SIGINT, stop)


def _exit(line: str) -> None:
    from pyspark import SparkContext

    # the threads still talking to the JVM (Spark's callback server, the query's) log its end with a traceback
    # through the root logger (py4j's `logging.info(..., exc_info=True)`): nothing is logged from here on
    logging.disable(logging.CRITICAL)
    jvm = getattr(SparkContext._gateway, "proc", None)  # PySpark's launched JVM (spark-submit), if it started one
    if jvm is not None:  # at once, so none of its lines comes after the last one
        try:
            jvm.kill()
            jvm.wait(timeout=10)
        except Exception:  # noqa: BLE001 - gone already, or slow to go: the exit below ends it anyway
            pass
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    os._exit(130)
