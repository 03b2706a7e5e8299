"""The lock manager's control connection: an autocommit connection that comes back when the database drops it.

Every lock statement names its lease by token (renew, release, hand-over) or is a read (who holds a lock), so running
it again on a new session is safe and trusts nothing of the lost one: a lease another holder has taken over meanwhile
is refused by its token exactly as before. Taking a lock is one transaction: a lost connection rolled it back, or (its
answer lost after the commit) left a lease nobody renews, which ends by itself one ttl later. LISTEN is the only
session state; it is issued again on the new connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import psycopg
from psycopg import sql

from pgtrain.core.db import connect_like

log = logging.getLogger(__name__)

T = TypeVar("T")

# Waits before each reconnection of one statement (about 8 s in all): a restart of PostgreSQL or a terminated
# backend, not an outage; a statement still failing then raises the connection's error.
RECONNECT_DELAYS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def connection_lost(conn: psycopg.Connection, error: BaseException) -> bool:
    """Whether ``error`` means ``conn`` itself is gone (terminated, restarted, cut off), not that a statement failed."""
    return isinstance(error, psycopg.OperationalError | psycopg.InterfaceError) and conn.broken


class ControlConnection:
    """One autocommit connection (``application_name``) to the database of ``source`` (a connection or URL), for
    statements that :meth:`run` runs again on a new connection when the database dropped the old one."""

    def __init__(self, source: psycopg.Connection | str, application_name: str,
                 delays: tuple[float, ...] | None = None) -> None:
        self._source = source
        self._name = application_name
        self._delays = RECONNECT_DELAYS if delays is None else delays
        self._channels: list[str] = []
        self.conn = connect_like(source, application_name)

    def run(self, statement: Callable[[psycopg.Connection], T]) -> T:
        """``statement(conn)``; when the connection is found lost, again on a new one, up to ``RECONNECT_DELAYS``
        times. Raises the last error when the database stays unreachable; any other error at once."""
        lost: BaseException | None = None
        for delay in (None, *self._delays):
            if delay is not None or self.conn.broken:
                time.sleep(delay or 0.0)
                try:
                    self._reconnect()
                except psycopg.OperationalError as error:
                    lost = error
                    continue
            try:
                return statement(self.conn)
            except (psycopg.OperationalError, psycopg.InterfaceError) as error:
                if not connection_lost(self.conn, error):
                    raise
                lost = error
                log.warning("the lock connection to the database was lost (%s); reconnecting", first_line(error))
        assert lost is not None
        lost.add_note(f"the database could not be reached again within {sum(self._delays):g} s "
                      f"({len(self._delays)} reconnections)")
        raise lost

    def listen(self, channel: str) -> None:
        """LISTEN on ``channel``, also on every connection after this one."""
        self.run(lambda conn: conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel))))
        self._channels.append(channel)

    def close(self) -> None:
        self.conn.close()

    def _reconnect(self) -> None:
        self.conn.close()
        conn = connect_like(self._source, self._name)
        try:
            for channel in self._channels:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        log.info("the lock connection to the database is back (backend pid %s)", conn.info.backend_pid)


@contextmanager
def released_at_end(release: Callable[[], bool | None], what: str, ends: Callable[[], str]) -> Iterator[None]:
    """Run the block, then ``release()`` the lease (``what``) it held. A release that cannot complete (the database
    unreachable past the control connection's reconnections) does not change the block's outcome: work that is done
    stays done, with a warning that the lease ends by itself (``ends()``: when), since nobody renews it any more; and a
    failing block's own error is the one raised, the failed release noted on it."""
    failing: BaseException | None = None
    try:
        yield
    except BaseException as error:
        failing = error
        raise
    finally:
        try:
            release()
        except psycopg.Error as error:
            message = f"could not release {what}: {first_line(error)}; nobody renews it, so it ends by itself {ends()}"
            log.warning("%s", message, exc_info=True)
            if failing is not None:
                failing.add_note(message)
