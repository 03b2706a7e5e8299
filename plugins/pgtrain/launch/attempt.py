"""A train attempt: every launch of a run's job is a new one, and only the newest may write.

Both launchers start one right before their ranks start (the local one before horovodrun, the Kubernetes
operator before it creates the MPIJob): the run's attempt number goes up, which fences every write of an
older attempt's ranks (sql/007_verdicts.sql), and what an earlier attempt left behind is cleared. Before that, the
run takes its model's training claim, so that a second run of the model launches nothing beside a running one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg

from pgtrain.core.errors import LockTimeout, TrainingBusy
from pgtrain.runs import record
from pgtrain.store import tensors
from pgtrain.store.locks import DEFAULT_TTL, Lease, LockManager, describe_owner

# How long a run waits for another run of its model to finish training before it is refused: a run that is just
# ending (its commit is not under the claim) hands over; one that is training keeps its model for far longer.
CLAIM_WAIT = 10.0


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


def claim_name(model_name: str) -> str:
    """The lock (``pgtrain.locks``) a run of the model holds while its job trains."""
    return f"training:{model_name}"


@contextmanager
def training_claim(conn: psycopg.Connection | str, run: record.Run, owner: Mapping[str, Any] | None = None,
                   wait: float = CLAIM_WAIT) -> Iterator[Lease]:
    """Hold the model's training claim while this run's job is launched and watched.

    Two runs of one model started outside the scheduler (two ``airflow dags test``, a cleared task beside a
    running one) would otherwise each launch a job. The claim is a leased lock renewed in the background: it
    ends when the block does, or one lease (``DEFAULT_TTL``) after its holder was killed. Raises TrainingBusy,
    naming the run that holds it, when it is not free within ``wait`` seconds; nothing has been launched then.
    """
    with LockManager(conn, owner={**(owner or {}), "training_run": run.run_id}, heartbeat=True) as locks:
        try:
            lease = locks.acquire_lock(claim_name(run.model_name), timeout=wait)
        except LockTimeout:
            holder = locks.holder(claim_name(run.model_name)) or {}
            who = holder.get("owner") or {}
            raise TrainingBusy(
                f"model {run.model_name!r} is being trained by run {who.get('training_run', '?')} "
                f"({describe_owner({k: v for k, v in who.items() if k != 'training_run'})}; since "
                f"{holder.get('acquired_at')}, lease until {holder.get('expires_at')}): run {run.run_id} launches no "
                f"second job beside it. Run this train task again once that run's train task has ended (a killed "
                f"one's claim ends {DEFAULT_TTL:g} s after it stopped)", who.get("training_run")) from None
        try:
            yield lease
        finally:
            locks.release(lease)
