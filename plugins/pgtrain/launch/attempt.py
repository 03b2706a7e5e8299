"""A train attempt: every launch of a run's job is a new one, and only the newest may write.

Both launchers start one right before their ranks start (the local one before horovodrun, the Kubernetes
operator before it creates the MPIJob): the run's attempt number goes up, which fences every write of an
older attempt's ranks (sql/007_verdicts.sql), and what an earlier attempt left behind is cleared.
"""

from __future__ import annotations

import psycopg

from pgtrain.runs import record
from pgtrain.store import tensors


def clear_output(conn: psycopg.Connection, run_id: str) -> None:
    """Forget the metrics and staged parameters of an earlier attempt of this run."""
    with conn.transaction():
        record.delete_epoch_metrics(conn, run_id)
        tensors.delete_staged(conn, run_id)


def start_attempt(conn: psycopg.Connection, run_id: str) -> int:
    """Begin the run's next train attempt (its number) and clear the earlier one's output."""
    attempt = record.begin_attempt(conn, run_id)
    clear_output(conn, run_id)
    return attempt
