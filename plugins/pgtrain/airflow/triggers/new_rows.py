"""NewRowsTrigger: the asset watcher of a model's source table, run in the triggerer.

Every ``poll_seconds`` it counts the rows added since the model's head version (``pgtrain.data.freshness``: a key
watermark, index walk up to the threshold) and, once there are ``min_new_rows``, claims the event in
``pgtrain.new_rows_events`` and fires it; the asset event schedules the model's DAG. Claim before fire: a
restarted or second triggerer reads the claim and never fires twice for the same rows (if the triggerer dies
between the claim and Airflow storing the event, that event is lost, and the rows count towards the next one
or are trained by the next cron run: training twice on a restart is the worse failure for a GPU job).

Database work runs in a worker thread on one autocommit connection (short statements, no transaction held
between or during polls). A lost connection (a database restart, a failover) is logged and retried with
exponential backoff; the first successful poll after it logs the reconnection. Anything else that goes wrong
(the connection not defined yet, the table not created yet) is logged and retried the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from pgtrain.airflow.dag.connection import DEFAULT_CONN_ID
from pgtrain.config.model_entries import DEFAULT_POLL_SECONDS

if TYPE_CHECKING:
    import psycopg


class NewRowsTrigger(BaseEventTrigger):
    """Fires ``{"model_name", "source_table", "new_rows", "since_key", "max_key", "head_version"}`` each time at
    least ``min_new_rows`` rows have landed above the last watermark (``new_rows`` counts them up to that
    threshold, no further: the count stops there); runs until the triggerer stops it."""

    def __init__(self, *, model_name: str, source_table: str, key_column: str, min_new_rows: int,
                 poll_seconds: float = DEFAULT_POLL_SECONDS, conn_id: str = DEFAULT_CONN_ID,
                 max_backoff_seconds: float = 60.0, statement_timeout_ms: int = 60_000) -> None:
        super().__init__()
        self.model_name = model_name
        self.source_table = source_table
        self.key_column = key_column
        self.min_new_rows = min_new_rows
        self.poll_seconds = poll_seconds
        self.conn_id = conn_id
        self.max_backoff_seconds = max_backoff_seconds
        self.statement_timeout_ms = statement_timeout_ms
        self.failures = 0  # consecutive polls that failed (the database away, the source not there yet)
        self._conn: psycopg.Connection | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "model_name": self.model_name, "source_table": self.source_table, "key_column": self.key_column,
            "min_new_rows": self.min_new_rows, "poll_seconds": self.poll_seconds, "conn_id": self.conn_id,
            "max_backoff_seconds": self.max_backoff_seconds, "statement_timeout_ms": self.statement_timeout_ms})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        import psycopg  # here, not at import: parsing a DAG file stays free of database drivers
        from asgiref.sync import sync_to_async

        from pgtrain.airflow.dag.connection import database_url

        while True:
            try:
                if self._conn is None:
                    # The connection's fields through Airflow (secrets backends included): asgiref's bridge is
                    # how a trigger calls a sync hook; the database itself is then used from a worker thread.
                    url = await sync_to_async(database_url)(self.conn_id)
                    await asyncio.to_thread(self._connect, url)
                payload = await asyncio.to_thread(self._poll)
            except Exception as error:  # a watcher outlives what goes wrong: log it, back off, look again
                self.failures += 1
                delay = min(self.max_backoff_seconds, 2.0 ** min(self.failures - 1, 16))
                lost = isinstance(error, psycopg.OperationalError | psycopg.InterfaceError)
                what = "the training database is unreachable" if lost else "cannot watch the source yet"
                self.log.warning("new-rows watch of %s: %s (%s; failure %d); retrying in %.1f s",
                                 self.model_name, what, _first_line(error), self.failures, delay)
                await asyncio.to_thread(self._close)
                await asyncio.sleep(delay)
                continue
            if self.failures:
                self.log.info("new-rows watch of %s: reconnected to the training database after %d failed "
                              "attempt(s)", self.model_name, self.failures)
                self.failures = 0
            if payload is not None:
                self.log.info("new-rows watch of %s: at least %d new rows above key %s (up to %s): firing",
                              self.model_name, payload["new_rows"], payload["since_key"], payload["max_key"])
                yield TriggerEvent(payload)
            await asyncio.sleep(self.poll_seconds)

    def _poll(self) -> dict[str, Any] | None:
        """One look (in a worker thread): the event's payload if this poll claimed one, else None."""
        import psycopg

        from pgtrain.data import freshness

        conn = self._conn
        if conn is None or conn.broken:
            raise psycopg.OperationalError("the connection to the training database was lost")
        watched = freshness.resolve_key(conn, self.source_table, self.key_column)  # each poll: tables get swapped
        found = freshness.count_new_rows(conn, self.model_name, watched, self.min_new_rows)
        if freshness.record_baseline(conn, found):
            self.log.info("new-rows watch of %s: no version yet; the rows already there (keys up to %s) are the "
                          "baseline, rows added from now on count", self.model_name, found.max_key)
            return None
        if found.new_rows < self.min_new_rows or not freshness.claim_event(conn, found):
            return None
        return {"model_name": found.model_name, "source_table": found.source_table, "new_rows": found.new_rows,
                "since_key": found.since_key, "max_key": found.max_key, "head_version": found.head_version}

    def _connect(self, url: str) -> None:
        from pgtrain.core.db import connect
        from pgtrain.core.migrations import apply_migrations

        conn = connect(url, application_name="pgtrain-new-rows")
        try:
            conn.execute(f"SET statement_timeout = {int(self.statement_timeout_ms)}")
            apply_migrations(conn)  # pgtrain.new_rows_events may not exist before the DAG's first run
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    async def cleanup(self) -> None:
        await asyncio.to_thread(self._close)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
