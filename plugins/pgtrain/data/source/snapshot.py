"""Rows as of the planning snapshot: the REPEATABLE READ transaction planning and loading run in, the xid
clock of a snapshot, and ``planned_rows``: the row was visible to the snapshot the manifest was cut in. Rows
inserted (or updated) after planning have a newer ``xmin`` and are left out; see ``PlannedRows``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from pgtrain.core.db import connect_like
from pgtrain.core.errors import PgtrainError, SourceError
from pgtrain.data.source.resolve import Source


@dataclass(frozen=True)
class PlannedRows:
    """What compute_shards planned for a run, as the loader needs it to read exactly those rows.

    Rows are selected "as of" the planning snapshot by their ``xmin``, with the snapshot's own rule: a row the
    loader sees was planned iff its inserting transaction had committed when the snapshot was taken, that is,
    its xid is below the snapshot's ``xmin``, or below its ``xmax`` and not one of its ``in_progress`` xids
    (``planned_rows``). That needs no list of the transactions that touched the table, however many there were.

    ``xmin`` is a 32-bit xid that wraps, and VACUUM freezes old rows but keeps their raw (possibly very old)
    ``xmin``, so such a row's xmin can wrap into the window that is judged by it. Wrapped rows that land on an
    in-progress xid or at/after ``xmax`` would look new: ``seen_xmins`` lists their raw xmins (planning can tell
    them apart, since the planning snapshot cannot see a row of such a transaction), complete for xids below
    ``xid_horizon``; a load that starts later refuses.
    """

    run_id: str
    snapshot: str
    xmin: int  # 64-bit xmin of the planning snapshot
    xmax: int  # 64-bit xmax of the planning snapshot
    in_progress: tuple[int, ...]  # raw 32-bit xids the planning snapshot saw as in progress (pg_snapshot_xip)
    seen_xmins: tuple[int, ...]  # raw 32-bit xmins of wrapped frozen planned rows that look new
    xid_horizon: int  # 64-bit
    input_dim: int
    num_classes: int | None  # classification only
    exclude_bad_rows: bool
    batch_rows: int
    output_dim: int | None = None  # classes, or the regression target's width
    encoding: dict[str, Any] | None = None  # the run's input record (pgtrain.data.input_record), as JSON
    # The scalar feature columns NULL in some planned row (statistics.nullable_columns); None: any may be.
    nullable_columns: tuple[str, ...] | None = None


@contextmanager
def snapshot_transaction(conn: psycopg.Connection, snapshot: str | None = None) -> Iterator[None]:
    """One REPEATABLE READ transaction: every statement in it sees the same rows; with ``snapshot`` (from
    ``pg_export_snapshot()`` in a transaction still open), the same rows as that transaction."""
    if not conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        raise PgtrainError(
            "planning and loading shards need an autocommit connection outside any transaction "
            "(pgtrain.core.db.connect() gives one), to run in their own REPEATABLE READ snapshot"
        )
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        if snapshot is not None:
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
        yield


# How long a second connection working in an exported snapshot waits for a lock (the loader's back stream, the
# planner's vocabulary scan). The first connection holds its locks until it is done, so a lock the second waits
# for may be queued behind a DDL that waits for the first: a wait PostgreSQL cannot see as a deadlock. Past
# this the second gives its work back to the first.
SECOND_CONNECTION_LOCK_TIMEOUT = "1s"
log = logging.getLogger(__name__)


def second_connection(conn: psycopg.Connection, name: str, what: str) -> psycopg.Connection | None:
    """A second connection as ``conn``'s user (``connect_like``), or None with a warning when the server or the
    role's connection limit refuses it (``what`` then runs on ``conn`` alone)."""
    try:
        return connect_like(conn, name)
    except psycopg.OperationalError as error:
        log.warning("%s on one connection: a second one could not be opened (%s)", what, str(error).strip())
        return None


@contextmanager
def in_snapshot_of(conn: psycopg.Connection, snapshot: str) -> Iterator[None]:
    """``snapshot_transaction(conn, snapshot)`` for a second connection: it waits at most
    SECOND_CONNECTION_LOCK_TIMEOUT for a lock."""
    with snapshot_transaction(conn, snapshot):
        conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(SECOND_CONNECTION_LOCK_TIMEOUT)))
        yield


class Beside:
    """``work(connection)`` run in a thread on a second connection, in the snapshot of ``conn``'s open REPEATABLE
    READ transaction, while ``conn`` does something else. ``result()`` waits for it: its value, or None when it
    could not run there (no second connection, the snapshot could not be imported, a lock it would wait for);
    the caller then does the work on ``conn``. An error of the work itself is raised by ``result()``."""

    def __init__(self, conn: psycopg.Connection, work: Callable[[psycopg.Connection], object], name: str,
                 what: str) -> None:
        self._value: object = None
        self._error: BaseException | None = None
        self._other = None
        snapshot = conn.execute("SELECT pg_export_snapshot()").fetchone()[0]
        self._other = second_connection(conn, name, what)
        self._thread = None
        if self._other is not None:
            self._thread = threading.Thread(target=self._run, args=(work, snapshot, what), name=name, daemon=True)
            self._thread.start()

    def _run(self, work: Callable[[psycopg.Connection], object], snapshot: str, what: str) -> None:
        imported = False
        try:
            with self._other, in_snapshot_of(self._other, snapshot):
                imported = True
                self._value = work(self._other)
        except psycopg.Error as error:
            if imported and not isinstance(error, psycopg.errors.LockNotAvailable | psycopg.errors.QueryCanceled):
                self._error = error
            else:
                log.warning("%s: the second connection gave its work back (%s)", what, str(error).strip())
        except BaseException as error:
            self._error = error

    def result(self) -> object:
        if self._thread is None:
            return None
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value

    def running(self) -> bool:
        """Whether the work is still under way on the second connection (False when it never started there)."""
        return self._thread is not None and self._thread.is_alive()

    def cancel(self) -> None:
        """Stop the work (the caller failed): cancel its query and wait for the thread."""
        if self._thread is None or not self._thread.is_alive():
            return
        try:
            self._other.cancel_safe(timeout=5)
        except Exception as error:  # the query then ends on its own
            log.warning("could not cancel the second connection's query: %s", error)
        self._thread.join()


def prefer_index_order(conn: psycopg.Connection) -> None:
    """For the rest of this transaction, read rows in key order by walking the key's unique index, never by
    sorting them: a freshly loaded table has no visibility map or statistics yet, and PostgreSQL may otherwise
    pick a sequential (or bitmap) scan and a sort, which is never the cheaper plan for these queries."""
    conn.execute("SET LOCAL enable_sort = off")


# --- rows as of the planning snapshot -------------------------------------------------------------------------

_XID_SPACE = 1 << 32
# How far past the planning snapshot's xmax a rank may still load, and how many distinct raw xmins of wrapped
# frozen rows that look newer than that xmax the plan may list (past that, the horizon comes nearer).
XID_HORIZON = 1 << 30
SEEN_XMINS_MAX = 10_000
_AGE_MAX = (1 << 31) - 1  # age() is an int4: two xids further apart than this cannot be told apart by it


@dataclass(frozen=True)
class XidClock:
    """The current transaction's snapshot, and the xid that ``age()`` counts from in it, all 64-bit."""

    snapshot: str
    xmin: int
    xmax: int
    now: int
    xip: tuple[int, ...] = ()  # the snapshot's in-progress xids


def read_xid_clock(conn: psycopg.Connection) -> XidClock:
    """Read in a REPEATABLE READ transaction: then ``now`` is fixed and no visible row is younger than it."""
    snapshot, xmin, xmax, age_of_3, xip = conn.execute(
        """SELECT s::text, pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint, age('3'::xid),
                  array(SELECT x::text::bigint FROM pg_snapshot_xip(s) AS x ORDER BY 1)
           FROM pg_current_snapshot() AS s"""
    ).fetchone()
    return XidClock(snapshot, xmin, xmax, widen_xid((age_of_3 + 3) % _XID_SPACE, xmax), tuple(xip))


def widen_xid(xid32: int, floor: int) -> int:
    """The smallest 64-bit xid >= ``floor`` whose low 32 bits are ``xid32``."""
    return floor + (xid32 - floor) % _XID_SPACE


def xid_limit(clock: XidClock) -> int:
    """The furthest 64-bit xid (exclusive) a load of a plan made with ``clock`` may start at."""
    return min(clock.xmax + XID_HORIZON, clock.xmin + _AGE_MAX)


def _xid_array(xids: tuple[int, ...]) -> sql.Composable:
    return sql.SQL("CAST({} AS xid[])").format(sql.Literal("{" + ",".join(str(x % _XID_SPACE) for x in xids) + "}"))


def alias_xmin_age(source: Source, clock: XidClock) -> sql.Composable:
    """SQL: age(xmin) of a row visible to ``clock``'s snapshot whose xmin is one of its in-progress xids or lies in
    [xmax, ``xid_limit``), else NULL. Such a row can only be a frozen one whose old raw xmin wrapped there."""
    x = sql.Identifier(source.schema, source.table, "xmin")
    return sql.SQL("CASE WHEN age({x}) BETWEEN {far} AND {near} OR {x} = ANY({xip}) THEN age({x}) END").format(
        x=x, far=sql.Literal(clock.now - xid_limit(clock) + 1), near=sql.Literal(clock.now - clock.xmax),
        xip=_xid_array(clock.xip))


def xmins_may_alias(clock: XidClock) -> bool:
    """Whether a row visible to ``clock``'s snapshot can have a raw xmin that ``alias_xmin_age`` looks for.

    Not before the cluster's xids pass one 32-bit round plus XID_HORIZON: until then every raw xmin is its own
    64-bit xid X (3 <= X < xmax), whose age() is either above the window or, once it exceeds 2^31, X + 2^32 -
    now, in the window only if X + 2^32 < ``xid_limit``; and an in-progress xid is no visible row's xmin."""
    return xid_limit(clock) > _XID_SPACE + 3


def seen_xmins(ages: list[int], clock: XidClock) -> tuple[tuple[int, ...], int]:
    """From the ``alias_xmin_age`` values of the planned rows: (their raw xmins, in-progress ones first, then the
    nearest the snapshot's xmax first; 64-bit xid below which that list is complete)."""
    distances = sorted({clock.now - age - clock.xmax for age in ages})  # < 0: an in-progress xid
    in_progress = [d for d in distances if d < 0]  # as many as the snapshot had in-progress xids, at most
    later = [d for d in distances if d >= 0]
    horizon = xid_limit(clock)
    if len(later) > SEEN_XMINS_MAX:
        horizon, later = clock.xmax + later[SEEN_XMINS_MAX], later[:SEEN_XMINS_MAX]
    return tuple((clock.xmax + d) % _XID_SPACE for d in in_progress + later), horizon


def planned_rows(source: Source, clock: XidClock, alias: str | None = None) -> sql.Composable:
    """SQL boolean: the row was visible to the planning snapshot (``clock`` read in the loading transaction).

    ``alias``: the name the source table has in the query, if it is aliased there.

    A row the loader sees is committed. age() places its raw xmin in the window [planning xmin, now] or outside
    it; the horizon keeps that window under 2^31 xids, so inside it the placement is exact. Outside it, the xid
    is older than the planning snapshot, or a frozen row's wrapped one: planned. Inside it, the row is either
    the real inserting transaction's, planned iff committed before the snapshot (below xmax, not in progress),
    or a frozen row wrapped there, which is old and planned: below xmax and not in progress it passes the same
    test, and elsewhere ``seen_xmins`` names it (complete below ``xid_horizon``, hence the refusal past it).
    Aborted inserts never reach here (the loader's snapshot hides them); and no per-transaction list is needed.
    One case the snapshot cannot tell: pg_snapshot lists no subtransaction xids, so a row inserted in a savepoint
    of a transaction in progress at planning, committed since, is read; the rank then reads more rows than
    planned and refuses (load_shard's count check).
    """
    plan = source.plan
    if plan is None:
        raise PgtrainError(f"{source.qualified_name} has no planned snapshot; manifest.source_for gives one")
    if not (plan.xmin <= clock.now < plan.xid_horizon and clock.now - plan.xmin <= _AGE_MAX):
        raise SourceError(
            f"run {plan.run_id} was planned at transaction {plan.xmin} and the database is now at {clock.now}: "
            "too far apart to tell the planned rows from newer ones by their xmin; re-run the DAG run from "
            "compute_shards"
        )
    xmin = sql.Identifier(alias, "xmin") if alias else sql.Identifier(source.schema, source.table, "xmin")
    return sql.SQL("CASE WHEN age({x}) BETWEEN 0 AND {since_xmin} "
                   "THEN (age({x}) > {since_xmax} AND NOT ({x} = ANY({in_progress}))) OR {x} = ANY({seen}) "
                   "ELSE true END").format(
        x=xmin, since_xmin=sql.Literal(clock.now - plan.xmin), since_xmax=sql.Literal(clock.now - plan.xmax),
        in_progress=_xid_array(plan.in_progress), seen=_xid_array(plan.seen_xmins))
