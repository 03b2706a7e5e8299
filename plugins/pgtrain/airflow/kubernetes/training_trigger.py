"""TrainingRunMPIJobTrigger: the deferred train task's wait, holding the model's training claim meanwhile.

A deferrable train task hands its run's training claim (docs/locks.md, "The training claim") to this trigger
instead of releasing it: while the triggerer watches the MPIJob, a second run of the model is still refused.
The trigger renews the claim's lease on each poll (one short UPDATE, in a worker thread, on a connection it keeps),
hands the claim back in its event for ``execute_complete`` to release, and releases it itself when the deferred
task is killed (mark failed, clear). A triggerer that dies stops renewing: the lease then runs out by itself. A
renewal that finds the claim taken by another run deletes the job (docs/locks.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import TriggerEvent

from pgtrain.airflow.dag.connection import DEFAULT_CONN_ID
from pgtrain.airflow.kubernetes.trigger import MPIJobTrigger
from pgtrain.core.errors import StaleLockToken
from pgtrain.launch.attempt import claim_lost, release_claim, renew_claim
from pgtrain.store.control import connection_lost

if TYPE_CHECKING:
    import psycopg

STATEMENT_TIMEOUT_MS = 10_000  # a renewal never holds the poll loop longer than this
STALLED = "stalled"  # an error event's reason: no epoch for stall_timeout, and the MPIJob was deleted


class TrainingRunMPIJobTrigger(MPIJobTrigger):
    """An MPIJobTrigger that holds its run's training claim while it watches; its event carries ``claim``.

    :param claim: the handed-over claim (``pgtrain.launch.attempt.TrainingClaim.hand_over``: name, token, ttl)
    :param conn_id: Airflow connection of the training database
    :param stall_timeout, training_run_id: once the job runs, it is deleted when the run records no epoch for
        ``stall_timeout`` seconds (``pgtrain.launch.stall``); None: not watched for stalls
    """

    def __init__(self, *, claim: dict[str, Any], conn_id: str = DEFAULT_CONN_ID, stall_timeout: float | None = None,
                 training_run_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.claim = claim
        self.conn_id = conn_id
        self.stall_timeout = stall_timeout
        self.training_run_id = training_run_id
        self._stalled = False
        self._conn: psycopg.Connection | None = None
        self._claim_lost = False
        self._superseded = False  # a new try of the run took the claim over and watches the job

    def serialize(self) -> tuple[str, dict[str, Any]]:
        classpath, kwargs = super().serialize()
        return classpath, {**kwargs, "claim": self.claim, "conn_id": self.conn_id,
                           "stall_timeout": self.stall_timeout, "training_run_id": self.training_run_id}

    def _event(self, status: str, message: str, **extra: Any) -> TriggerEvent:
        if self._stalled:
            extra["reason"] = STALLED
        return super()._event(status, message, claim=self.claim, **extra)

    async def on_poll(self) -> str | None:
        """Renew the claim's lease, then (once the job runs) look for a stall (``_stall``)."""
        stop = await self._renew()
        return stop if stop is not None else await self._stall()

    async def _stall(self) -> str | None:
        """Why the running job is stalled (no epoch for ``stall_timeout``: it is then deleted), or None."""
        if not self.stall_timeout or self.running_at is None or self.training_run_id is None:
            return None
        from pgtrain.launch.stall import check_stall

        since_running = time.monotonic() - self.running_at
        try:
            stalled = await self._in_database(
                lambda conn, _: check_stall(conn, self.training_run_id, since_running, self.stall_timeout))
        except Exception as error:  # asked again at the next poll
            self.log.warning("could not read the epochs of run %s: %s", self.training_run_id, error)
            await asyncio.to_thread(self._close)
            return None
        if stalled is not None:
            self._stalled = True
            self.log.error("%s", stalled)
        return stalled

    async def _renew(self) -> str | None:
        """Renew the claim's lease; a failed renewal is logged, and the next poll tries again. A claim found lost
        stops the job when another run (or nobody) holds it now (``claim_lost``); when a new try of this
        run does, that try watches this very job: it goes on, and this trigger no longer deletes it."""
        if self._claim_lost:
            return None
        try:
            await self._in_database(renew_claim)
            return None
        except StaleLockToken as lost:
            found = str(lost)
        except Exception as error:  # the database away: the lease lasts its ttl, later polls renew it
            self.log.warning("could not renew the training claim %s (token %s): %s; it lasts %g s from its last "
                             "renewal", self.claim["name"], self.claim["token"], error, self.claim["ttl"])
            await asyncio.to_thread(self._close)
            return None
        run = self.claim.get("training_run")
        if run is None:  # handed over by an earlier pgtrain, whose claims did not name their run
            self._claim_lost = True
            self.log.error("training claim of MPIJob %s/%s lost: %s. This trigger cannot tell who took it (its claim "
                           "does not name its run), so the job goes on.", self.namespace, self.name, found)
            return None
        try:
            lost = await self._in_database(lambda conn, claim: claim_lost(conn, claim["name"], run))
        except Exception as error:  # asked again at the next poll, whose renewal finds the claim lost again
            self.log.warning("training claim %s lost; who holds it now could not be read (%s), asking again at the "
                             "next poll", self.claim["name"], error)
            await asyncio.to_thread(self._close)
            return None
        self._claim_lost = True
        self._superseded = lost.superseded
        self.log.error("%s", lost)
        return None if lost.superseded else str(lost)

    async def on_kill(self) -> None:
        """The deferred task was killed: delete the MPIJob (MPIJobTrigger), unless a new try of the run watches it
        now, then free the model."""
        try:
            if not self._superseded:
                await super().on_kill()
        finally:
            try:
                await self._in_database(release_claim)
            except Exception:
                self.log.exception("could not release the training claim %s; its lease ends by itself within "
                                   "%g s", self.claim["name"], self.claim["ttl"])

    async def cleanup(self) -> None:
        await asyncio.to_thread(self._close)

    async def _in_database(self, action: Callable[[psycopg.Connection, dict[str, Any]], Any]) -> Any:
        """``action`` on the trigger's connection; once more, on a new one, when the database had dropped it (every
        claim statement names the claim's token: running it again is safe)."""
        try:
            return await self._on_connection(action)
        except Exception as error:
            if self._conn is None or not connection_lost(self._conn, error):
                raise
        return await self._on_connection(action)

    async def _on_connection(self, action: Callable[[psycopg.Connection, dict[str, Any]], Any]) -> Any:
        if self._conn is None or self._conn.closed:
            from asgiref.sync import sync_to_async

            from pgtrain.airflow.dag.connection import database_url

            # Airflow's connection through its sync hook (asgiref's bridge, as a trigger must call it); the database
            # itself is used from a worker thread, off the triggerer's event loop.
            url = await sync_to_async(database_url)(self.conn_id)
            self._conn = await asyncio.to_thread(self._connect, url)
        return await asyncio.to_thread(action, self._conn, self.claim)

    @staticmethod
    def _connect(url: str) -> psycopg.Connection:
        from pgtrain.core.db import connect

        conn = connect(url, application_name="pgtrain-training-claim")
        conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        return conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
