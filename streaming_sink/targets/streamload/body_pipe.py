"""One load request's body, fed while it is being sent: the writer puts encoded pieces, the request's thread sends them.

Why: a Doris 2PC Stream Load is one server transaction per request, so a writer that sends each flush of a table as
its own request holds one transaction per flush. Keeping one request open per (table, writer) for the whole batch,
its chunked body fed flush by flush, holds one transaction whatever the size, with memory bounded by `depth` pieces.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator

from ...errors import TargetError


class BodyPipe:
    """A bounded hand-over of pieces from one writer thread (`put`, `end`, `cancel`) to one request thread (`body`)."""

    def __init__(self, depth: int = 2) -> None:
        self._pieces: deque[bytes] = deque()
        self._depth = depth
        self._changed = threading.Condition()
        self._ended = False  # the writer put its last piece
        self._cancelled = False  # the writer gave up: the body fails instead of ending
        self._closed = False  # the request is over: nothing more is read
        self._asked = False  # the server asked for the body: the request got past the server's begin

    @property
    def asked(self) -> bool:
        """Whether the server asked for the body: from then on the request cannot be sent again."""
        with self._changed:
            return self._asked

    def put(self, piece: bytes) -> bool:
        """Queue one piece, waiting while `depth` are queued; False when the request is over and reads no more."""
        with self._changed:
            self._changed.wait_for(lambda: self._closed or len(self._pieces) < self._depth)
            if self._closed:
                return False
            self._pieces.append(piece)
            self._changed.notify_all()
            return True

    def wait_asked(self) -> bool:
        """Wait until the server asks for the body (its transaction is begun) or the request is over; True: asked."""
        with self._changed:
            self._changed.wait_for(lambda: self._asked or self._closed)
            return self._asked

    def end(self) -> None:
        """No more pieces: the body ends (and the server finishes the load) once the queued ones are sent."""
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def cancel(self) -> None:
        """The writer gives up: the body fails at its next piece, so the request ends without the body's end."""
        with self._changed:
            self._cancelled = True
            self._changed.notify_all()

    def close(self) -> None:
        """The request is over (by its thread, whatever the outcome): a waiting `put` returns."""
        with self._changed:
            self._closed = True
            self._pieces.clear()
            self._changed.notify_all()

    def body(self) -> Iterator[bytes]:
        """The body, for the HTTP client to send; asked for again (a repeat after a lost connection) only while none
        of it was sent, since sent pieces are not kept."""
        with self._changed:
            if self._asked:
                raise TargetError("the load's request would be sent again after the server asked for its body, which "
                                  "is not kept to be sent again; the writer fails and its task is retried under a new label")
            self._asked = True
            self._changed.notify_all()
        return self._read()

    def _read(self) -> Iterator[bytes]:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pieces or self._ended or self._cancelled)
                if self._cancelled:
                    # the body stops without its final chunk, so the server never takes it whole
                    raise TargetError("the writer gave the load up before its body ended")
                if not self._pieces:
                    return
                piece = self._pieces.popleft()
                self._changed.notify_all()
            yield piece
