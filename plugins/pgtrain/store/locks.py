"""Leased locks in PostgreSQL with fencing tokens (see docs/locks.md).

A lock is a row of ``pgtrain.locks``. Taking it is one conditional upsert that succeeds only when
the row is free or its lease has expired, and gives the holder a fencing token larger than every
token issued before. Writes that need the lock run inside :func:`fenced`, which re-checks, in the
writer's own transaction and under a row lock, that the token is still the current one and the
lease still valid; a paused holder whose lease was taken over therefore cannot write anything.

Waiters LISTEN on one channel and are woken by the NOTIFY sent in the releasing transaction, or at
the moment the current lease would expire (a holder killed with SIGKILL sends no NOTIFY).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgtrain.core.errors import LockTimeout, PgtrainError, StaleLockToken
from pgtrain.store import lock_statements as statements
from pgtrain.store.control import ControlConnection, released_at_end

log = logging.getLogger(__name__)

CHANNEL = "pgtrain_locks"
DEFAULT_TTL = 30.0
DEFAULT_TIMEOUT = 60.0
# Upper bound on one wait between attempts, in case a wake-up is ever lost (e.g. a NOTIFY
# dropped by a proxy); normal wake-ups are the NOTIFY on release and the lease's expiry.
_MAX_WAIT = 5.0

class LockNotHeld(PgtrainError):
    """A release or renewal of a lock this manager does not hold."""


@dataclass
class Lease:
    """A held lock. ``token`` is the fencing token every guarded write carries."""

    name: str
    token: int
    owner: dict[str, Any]
    acquired_at: datetime
    expires_at: datetime
    ttl: float
    lost: str | None = field(default=None)  # set when a renewal finds the lease taken over
    # set with ``lost``: whoever does work under the lease waits on it to stop that work (run_local)
    lost_event: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)


def owner_identity(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Who is asking: Airflow's task context (from its environment) when present, host and pid, plus ``extra``."""
    owner: dict[str, Any] = {}
    for key, env in (("dag_id", "AIRFLOW_CTX_DAG_ID"), ("run_id", "AIRFLOW_CTX_DAG_RUN_ID"),
                     ("task_id", "AIRFLOW_CTX_TASK_ID")):
        if os.environ.get(env):
            owner[key] = os.environ[env]
    owner.update({k: v for k, v in (extra or {}).items() if v is not None})
    owner["host"] = socket.gethostname()
    owner["pid"] = os.getpid()
    return owner


def describe_owner(owner: Mapping[str, Any] | None) -> str:
    if not owner:
        return "nobody"
    parts = [f"{k}={owner[k]}" for k in ("dag_id", "run_id", "task_id", "host", "pid") if k in owner]
    parts += [f"{k}={v}" for k, v in owner.items() if k not in {"dag_id", "run_id", "task_id", "host", "pid"}]
    return ", ".join(parts)


class LockManager:
    """Take and release leased locks; a background heartbeat renews held leases every ``ttl / 3``.

    ``conn`` (a connection or URL) says which database; the manager talks to it on its own autocommit
    connection, so taking a lock never commits or waits on the caller's transaction; that connection comes back when
    the database drops it (``pgtrain.store.control``). Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, conn: psycopg.Connection | str, *, ttl: float = DEFAULT_TTL, heartbeat: bool = True,
                 owner: Mapping[str, Any] | None = None, default_timeout: float = DEFAULT_TIMEOUT) -> None:
        if ttl <= 0:
            raise PgtrainError(f"lock ttl must be positive seconds, got {ttl!r}")
        self._source = conn
        self.ttl = float(ttl)
        self.heartbeat = heartbeat
        self.default_timeout = default_timeout
        self._owner_extra = dict(owner or {})
        self._ctl = ControlConnection(conn, "pgtrain-locks")
        self._listening = False
        self._held: dict[str, Lease] = {}
        self._held_lock = threading.Lock()
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None

    # -- context management -------------------------------------------------------------------
    def __enter__(self) -> LockManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release every lease still held, stop the heartbeat, close the manager's connections."""
        for name in list(self._held):
            try:
                self.release_lock(name)
            except Exception:  # closing must go on; the lease expires by itself
                log.warning("could not release lock %r while closing; its lease will expire", name,
                            exc_info=True)
        self._stop.set()
        if self._beater is not None:
            self._beater.join()
        self._ctl.close()

    # -- acquire / release ----------------------------------------------------------------------
    def acquire_lock(self, name: str, timeout: float | None = None, ttl: float | None = None,
                     take_over: Mapping[str, Any] | None = None, family: tuple[str, str] | None = None) -> Lease:
        """Take ``name``, waiting up to ``timeout`` seconds (0: try once); raises LockTimeout naming the holder.

        ``take_over``: also take it, at once, from a holder whose owner record holds these fields (its lease ends:
        its renewals find it lost, its release does nothing). ``family``: (family, group): neither is it taken while
        a lock of the family of another group is held (locks of one group are held side by side).
        """
        if not name:
            raise PgtrainError("lock name must be a non-empty string")
        if name in self._held:
            raise PgtrainError(f"lock {name!r} is already held by this manager (token {self._held[name].token}); "
                               "locks are not re-entrant, release it first")
        timeout = self.default_timeout if timeout is None else timeout
        ttl = self.ttl if ttl is None else float(ttl)
        owner = owner_identity(self._owner_extra)
        deadline = time.monotonic() + timeout
        if not self._listening and timeout > 0:
            self._ctl.listen(CHANNEL)
            self._listening = True
        arguments = {"name": name, "owner": Jsonb(owner), "ttl": ttl,
                     "take_over": Jsonb(take_over) if take_over else None,
                     "family": family and family[0], "group": family and family[1]}

        def attempt(conn: psycopg.Connection) -> tuple | None:
            remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
            try:
                # A holder inside a fenced write keeps the row locked: never block past our timeout. The
                # lock_timeout is local to this attempt's transaction, so release and renewal on this
                # connection later run without it.
                with conn.transaction():
                    conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{remaining_ms}ms",))
                    if family:  # a statement of its own: ACQUIRE's snapshot then sees the family's last taker
                        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"pgtrain.locks:{family[0]}",))
                    return conn.execute(statements.ACQUIRE, arguments).fetchone()
            except psycopg.errors.LockNotAvailable:
                busy = conn.execute(statements.HOLDER, (name,)).fetchone()
                return (False, *busy, name) if busy else None

        while True:
            self._drain_notifications()
            row = self._ctl.run(attempt)
            if row is not None and row[0]:
                lease = Lease(name, row[1], owner, row[3], row[4], ttl)
                with self._held_lock:
                    self._held[name] = lease
                self._start_heartbeat()
                return lease
            holder, blocking = (row[1:6], row[6]) if row is not None else (None, name)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timeout_error(name, timeout, holder, blocking)
            if holder is None or holder[1] is None:
                continue  # released or taken since our snapshot: look again at once
            until_expiry = holder[4] if holder[4] is not None else _MAX_WAIT
            self._wait_for_release(blocking, min(remaining, max(until_expiry, 0.0) + 0.005, _MAX_WAIT))

    def release_lock(self, name: str) -> bool:
        """Release ``name``. False (and a warning) when the lease had already been taken over.

        Raises LockNotHeld when this manager holds no lease on ``name``: only the holder releases.
        """
        with self._held_lock:
            lease = self._held.pop(name, None)
        if lease is None:
            holder = self.holder(name)
            who = describe_owner(holder["owner"]) if holder else "nobody"
            raise LockNotHeld(f"cannot release lock {name!r}: this manager does not hold it "
                              f"(held by {who}); only the holder may release a lock")
        return self._release(lease)

    def release(self, lease: Lease) -> bool:
        with self._held_lock:
            if self._held.get(lease.name) is lease:
                del self._held[lease.name]
            else:
                raise LockNotHeld(f"lease on {lease.name!r} (token {lease.token}) is not held by this manager")
        return self._release(lease)

    def _release(self, lease: Lease) -> bool:
        tries = 0

        def release(conn: psycopg.Connection) -> bool:
            nonlocal tries
            tries += 1
            # Again after a lost connection: the lost try may have released it. Only a release clears the owner of
            # a row and keeps its token, and only this lease's holder releases with its token.
            return release_lease(conn, lease.name, lease.token) or (tries > 1 and _released(conn, lease))

        if not self._ctl.run(release):
            log.warning("lease on lock %r (token %s) had already ended before release: %s", lease.name,
                        lease.token, lease.lost or "it expired and was taken over")
            return False
        return True

    @contextmanager
    def lock(self, name: str, timeout: float | None = None, ttl: float | None = None) -> Iterator[Lease]:
        """``with manager.lock("model:x") as lease:`` -- released on exit, also on error (``holding``)."""
        lease = self.acquire_lock(name, timeout=timeout, ttl=ttl)
        with self.holding(lease):
            yield lease

    @contextmanager
    def holding(self, lease: Lease) -> Iterator[Lease]:
        """Work under ``lease``, released when the block ends (unless handed over or released inside it). A release
        that cannot complete changes nothing of the block's outcome (``released_at_end``)."""
        def release() -> bool | None:
            return self.release(lease) if self._held.get(lease.name) is lease else None

        with released_at_end(release, f"lock {lease.name!r} (token {lease.token})",
                             lambda: f"at {lease.expires_at.isoformat()}, where its last renewal left it"):
            yield lease

    def renew(self, lease: Lease) -> bool:
        """Extend the lease by its ttl now (the heartbeat does this; call it yourself with heartbeat=False).

        False when the lock row is busy in the holder's own fenced transaction (nobody can take the
        lock meanwhile); raises StaleLockToken when the lease has ended.
        """
        return self._ctl.run(lambda conn: self._renew(conn, lease))

    def hand_over(self, lease: Lease, owner: Mapping[str, Any], ttl: float) -> None:
        """Stop holding ``lease`` without releasing it: it now runs ``ttl`` seconds from now, its owner record
        changed by ``owner`` (a None drops a key), and whoever it was handed to renews it (``renew_lease``) and
        releases it (``release_lease``); neither this manager's heartbeat nor its close touch it again. Raises
        StaleLockToken when the lease has already ended."""
        with self._held_lock:
            if self._held.get(lease.name) is not lease:
                raise LockNotHeld(f"lease on {lease.name!r} (token {lease.token}) is not held by this manager")
            del self._held[lease.name]
        lease.ttl = float(ttl)
        while not self._ctl.run(lambda conn: self._renew(conn, lease, owner)):  # busy: the heartbeat renews it now
            time.sleep(0.01)

    def _renew(self, conn: psycopg.Connection, lease: Lease, owner: Mapping[str, Any] | None = None) -> bool:
        try:
            expires = renew_lease(conn, lease.name, lease.token, lease.ttl, owner)
        except StaleLockToken as lost:
            lease.lost = str(lost)
            lease.lost_event.set()
            raise
        if expires is None:
            return False
        lease.expires_at = expires
        return True

    def holder(self, name: str) -> dict[str, Any] | None:
        """The current holder of ``name`` (``lock_holder``)."""
        return self._ctl.run(lambda conn: lock_holder(conn, name))

    # -- internals --------------------------------------------------------------------------------
    def _drain_notifications(self) -> None:
        if self._listening:
            self._ctl.run(lambda conn: list(conn.notifies(timeout=0)))

    def _wait_for_release(self, name: str, seconds: float) -> None:
        listening = self._ctl.conn

        def wait(conn: psycopg.Connection) -> None:
            if conn is not listening:
                return  # reconnected: a release meanwhile notified the lost connection, so look again at once
            for notify in conn.notifies(timeout=seconds):
                if notify.payload == name:
                    return

        self._ctl.run(wait)

    def _timeout_error(self, name: str, timeout: float, holder: tuple | None, blocking: str) -> LockTimeout:
        if holder is None or holder[1] is None:
            return LockTimeout(f"could not take lock {name!r} within {timeout:g}s (it was busy and has just "
                               "been released); try again or raise the timeout")
        token, owner, since, expires, _ = holder
        held = "" if blocking == name else f" (its family's lock {blocking!r})"
        return LockTimeout(
            f"could not take lock {name!r} within {timeout:g}s: held{held} by {describe_owner(owner)} since "
            f"{since.isoformat()} (token {token}), lease until {expires.isoformat()} unless renewed. "
            "Wait for that holder to finish or raise the timeout; a dead holder's lease ends by itself.",
            {"name": blocking, "token": token, "owner": owner, "acquired_at": since, "expires_at": expires})

    def _start_heartbeat(self) -> None:
        if not self.heartbeat or self._beater is not None:
            return
        self._beater = threading.Thread(target=self._heartbeat_loop, name="pgtrain-lock-heartbeat", daemon=True)
        self._beater.start()

    def _heartbeat_loop(self) -> None:
        beat: ControlConnection | None = None
        try:
            while True:
                with self._held_lock:
                    leases = [lease for lease in self._held.values() if lease.lost is None]
                interval = min((lease.ttl for lease in leases), default=self.ttl) / 3
                if self._stop.wait(interval):
                    return
                with self._held_lock:
                    leases = [lease for lease in self._held.values() if lease.lost is None]
                if not leases:
                    continue
                try:
                    # one reconnection at once, not the control connection's seconds of them: the next beat retries
                    beat = beat or ControlConnection(self._source, "pgtrain-locks", delays=(0.0,))
                    for lease in leases:
                        try:
                            beat.run(lambda conn, lease=lease: self._renew(conn, lease))
                        except StaleLockToken:
                            if self._held.get(lease.name) is lease:  # not just released by its holder
                                log.error("%s", lease.lost)
                except psycopg.Error:
                    log.warning("lock heartbeat failed; retrying in %.1fs", interval, exc_info=True)
        finally:
            if beat is not None:
                beat.close()


def lock_holder(conn: psycopg.Connection, name: str) -> dict[str, Any] | None:
    """The current holder of ``name`` (owner, token, since, expires) or None when free."""
    row = conn.execute(statements.HOLDER, (name,)).fetchone()
    if row is None or row[1] is None:
        return None
    return {"token": row[0], "owner": row[1], "acquired_at": row[2], "expires_at": row[3]}


def renew_lease(conn: psycopg.Connection, name: str, token: int, ttl: float,
                owner: Mapping[str, Any] | None = None) -> datetime | None:
    """Extend the lease (``name``, ``token``) to ``ttl`` seconds from now, changing ``owner``'s keys in its owner
    record (a None drops one): its new end, or None when the row is busy in the holder's own fenced transaction.
    Raises StaleLockToken when the lease has ended (released, or taken over with a newer token)."""
    row = conn.execute(statements.RENEW, {"name": name, "token": token, "ttl": ttl,
                                          "owner": Jsonb(dict(owner)) if owner else None}).fetchone()
    if row is not None:
        return row[0]
    current = conn.execute(statements.HOLDER, (name,)).fetchone()
    if current is not None and current[0] == token and current[1] is not None:
        return None
    now = f"now held by {describe_owner(current[1])} with token {current[0]}" if current and current[1] else "now free"
    raise StaleLockToken(f"lease on lock {name!r} with token {token} has ended ({now}); take the lock again")


def release_lease(conn: psycopg.Connection, name: str, token: int) -> bool:
    """Free the lock if (``name``, ``token``) is still its lease, waking its waiters; False when it had ended."""
    return bool(conn.execute(statements.RELEASE, {"name": name, "token": token, "channel": CHANNEL}).fetchall())


def _released(conn: psycopg.Connection, lease: Lease) -> bool:
    """Whether the lock row is free with ``lease``'s token: released by its holder (expiry keeps the owner, a taker
    changes the token)."""
    row = conn.execute(statements.HOLDER, (lease.name,)).fetchone()
    return row is not None and row[0] == lease.token and row[1] is None


@contextmanager
def fenced(conn: psycopg.Connection, lease: Lease) -> Iterator[psycopg.Connection]:
    """A transaction on ``conn`` that commits only if ``lease`` is still the lock's current lease.

    The lock row is held FOR SHARE until the transaction ends, so nobody can take the lock over
    between the check and the commit; a stale or expired lease raises StaleLockToken and nothing
    written inside is kept.
    """
    with conn.transaction():
        row = conn.execute(
            """SELECT token, owner, expires_at, expires_at > clock_timestamp()
               FROM pgtrain.locks WHERE name = %s FOR SHARE""",
            (lease.name,),
        ).fetchone()
        if row is None or row[0] != lease.token or row[1] is None:
            now = (f"now held by {describe_owner(row[1])} with token {row[0]}" if row and row[1]
                   else "now free")
            raise StaleLockToken(f"write refused: lock {lease.name!r} token {lease.token} is no longer current "
                                 f"({now}); the lease ended, take the lock again and redo the work")
        if not row[3]:
            raise StaleLockToken(f"write refused: lease on lock {lease.name!r} (token {lease.token}) expired "
                                 f"at {row[2].isoformat()}; take the lock again (or renew it in time)")
        yield conn

