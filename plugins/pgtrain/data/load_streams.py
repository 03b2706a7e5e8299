"""The two streams of a two-connection load (``pgtrain.data.loader.load_shard(..., streams=2)``): which batches
each reads next (``Claims``), and the back stream's thread on a second connection in the first's snapshot
(``BackStream``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import psycopg

from pgtrain.data.source.snapshot import in_snapshot_of, second_connection

# A two-connection load reads its batches in about this many COPYs (Claims): a few more statements, and the
# streams end within a chunk of each other however unevenly they are served.
CHUNKS_PER_LOAD = 8
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchSpan:
    """Which of a rank's batches one COPY reads: ordinals ``first``..``last`` (from 1), last first if
    ``descending`` (the rows inside a batch stay in key order)."""

    first: int
    last: int
    descending: bool = False


class Stopped(Exception):
    """The other stream of the same load failed: this one stops (the other's error is the one raised)."""


class Filling(Protocol):
    """What the back stream needs of the load it fills (``loader._Fill``)."""

    failed: bool

    def back_started(self) -> bool: ...


class Claims:
    """Which batches each stream of a two-connection load reads next, a chunk at a time: the front claims from the
    first batch up, the back from the last down, until they meet, so a stream that starts later or gets less CPU
    reads less instead of holding up the load. The back's first chunk is ``reserved`` for it: it reads at least
    that much, or gives it back before reading any of it."""

    def __init__(self, batches: int) -> None:
        self.size = -(-batches // CHUNKS_PER_LOAD)
        self.reserved = BatchSpan(max(batches - self.size, 1) + 1, batches, descending=True)
        self._reserved_taken = False
        self._next_front, self._next_back = 1, self.reserved.first - 1
        self._lock = threading.Lock()

    def front(self) -> BatchSpan | None:
        with self._lock:
            if self._next_front > self._next_back:
                return None
            last = min(self._next_front + self.size - 1, self._next_back)
            span, self._next_front = BatchSpan(self._next_front, last), last + 1
            return span

    def back(self) -> BatchSpan | None:
        with self._lock:
            if not self._reserved_taken:
                self._reserved_taken = True
                return self.reserved
            if self._next_back < self._next_front:
                return None
            first = max(self._next_back - self.size + 1, self._next_front)
            span, self._next_back = BatchSpan(first, self._next_back, descending=True), first - 1
            return span


class BackStream:
    """The back stream of a two-connection load, read in a thread on a second connection (opened there, while the
    first connection starts reading) in the exported ``snapshot``."""

    def __init__(self, first: psycopg.Connection, snapshot: str, read: Callable[[psycopg.Connection], None],
                 fill: Filling) -> None:
        self.first, self.snapshot, self.read, self.fill = first, snapshot, read, fill
        self.conn: psycopg.Connection | None = None
        self.error: BaseException | None = None
        self.handed_back = False
        self._imported = False

    def run_alongside(self, front: Callable[[], None]) -> bool:
        """Run ``front()`` here while the thread reads from the back; False if the thread gave its reserved chunk
        back before reading any of it (the caller reads it then). An error of the front cancels the back's query;
        an error of the back stops the front at its next batch. The first error is raised; the thread has ended."""
        thread = threading.Thread(target=self._run, name="pgtrain-load", daemon=True)
        thread.start()
        try:
            front()
            thread.join()
        except BaseException as error:
            self.fill.failed = True
            try:
                if self.conn is not None:
                    self.conn.cancel_safe(timeout=5)  # ends the back's COPY or lock wait now
            except Exception as cancel_error:  # the thread still stops at its next batch
                log.warning("could not cancel the second loading connection's query: %s", cancel_error)
            finally:
                thread.join()
            if isinstance(error, Stopped) and self.error is not None:
                raise self.error from None
            if self.error is not None and not isinstance(self.error, Stopped):
                error.add_note(f"the second loading connection failed too: {self.error}")
            raise
        if self.error is not None:
            raise self.error
        return not self.handed_back

    def _run(self) -> None:
        # Reads only the first connection's settings, fixed since it connected, while it streams.
        self.conn = second_connection(self.first, "pgtrain-load", "loading")
        if self.conn is None:
            self.handed_back = True
            return
        try:
            with self.conn, in_snapshot_of(self.conn, self.snapshot):
                if self.fill.failed:  # the front failed while this connection was being opened
                    return
                self._imported = True
                self.read(self.conn)
        except Stopped:
            pass
        except BaseException as error:
            if self._may_hand_back(error):
                log.warning("the second loading connection gave its batches back before reading any of them (%s); "
                            "reading them on the first", str(error).strip())
                self.handed_back = True
            else:
                self.error = error
                self.fill.failed = True

    def _may_hand_back(self, error: BaseException) -> bool:
        """Only a snapshot it could not import or a lock it would wait for, before it placed any row."""
        fits = isinstance(error, psycopg.errors.LockNotAvailable) or (
            isinstance(error, psycopg.Error) and not self._imported)
        return fits and not self.fill.failed and not self.fill.back_started()
