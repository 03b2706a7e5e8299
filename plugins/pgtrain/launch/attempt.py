"""A train attempt: every launch of a run's job is a new one, and only the newest may write.

Both launchers start one right before their ranks start (the local one before horovodrun, the Kubernetes
operator before it creates the MPIJob): the run's attempt number goes up, which fences every write of an
older attempt's ranks (sql/007_verdicts.sql), and what an earlier attempt left behind is cleared. Before that, the
run takes its model's training claim, so that a second run of the model launches nothing beside a running one; the
trials of one search train side by side, but beside no other run of the model (``training_claim``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from pgtrain.core.errors import ClaimLost, LockTimeout, TrainingBusy
from pgtrain.runs import record, trials
from pgtrain.store import tensors
from pgtrain.store.locks import (
    DEFAULT_TTL,
    Lease,
    LockManager,
    describe_owner,
    lock_holder,
    release_lease,
    renew_lease,
)

# How long a run waits for another run of its model to finish training before it is refused: a run that is just
# ending (its commit is not under the claim) hands over; one that is training keeps its model for far longer.
CLAIM_WAIT = 10.0
# The lease of a claim handed to the trigger of a deferred train task, renewed on each of its polls: long enough for
# the triggerer to pick the trigger up, or for Airflow to move it to another triggerer when one dies (its health
# check gives up on a triggerer after 30 s); a dead triggerer with no successor leaves the model claimed this long.
DEFERRED_TTL = 120.0


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


def claim_name(model_name: str, trial: tuple[str, int] | None = None) -> str:
    """The lock (``pgtrain.locks``) a run of the model holds while its job trains; a search's trials (``trial``:
    its search run and number) each hold a claim of their own. All of a model's claims are one lock family
    (``claim_family``)."""
    return f"training:{model_name}" + (f"#{trial[0]}/trial-{trial[1]}" if trial else "")


def claim_family(model_name: str, run_id: str, trial: tuple[str, int] | None = None) -> tuple[str, str]:
    """The (family, group) of a run's claim (``LockManager.acquire_lock``): the claims of a model exclude each other,
    but those of one search's trials (its group: the search run) are held side by side."""
    return claim_name(model_name), trial[0] if trial else run_id


@dataclass
class TrainingClaim:
    """A held training claim (``training_claim``'s block)."""

    lease: Lease
    locks: LockManager

    def hand_over(self, ttl: float, **owner: Any) -> dict[str, Any]:
        """Keep the claim past the block, for whoever watches the job now (a deferred task's trigger): its lease
        runs ``ttl`` seconds from now and ends unless renewed (``renew_claim``); ``owner``'s keys change in its
        owner record (None drops one). Returns what the new holder keeps to renew and release it."""
        self.locks.hand_over(self.lease, owner, ttl)
        return {"name": self.lease.name, "token": self.lease.token, "ttl": float(ttl),
                "training_run": self.lease.owner.get("training_run")}


@contextmanager
def training_claim(conn: psycopg.Connection | str, run: record.Run, owner: Mapping[str, Any] | None = None,
                   wait: float = CLAIM_WAIT) -> Iterator[TrainingClaim]:
    """Hold the model's training claim while this run's job is launched and watched.

    Two runs of one model started outside the scheduler (two ``airflow dags test``, a cleared task beside a
    running one) would otherwise each launch a job. The claim is a leased lock renewed in the background: it
    ends when the block does (unless handed over), or one lease (``DEFAULT_TTL``) after its holder was killed.
    Raises TrainingBusy, naming the run that holds it, when it is not free within ``wait`` seconds; nothing has
    been launched then. A claim of this same run is taken over at once: it is an earlier try's (Airflow starts a new
    try of a task once the earlier one has ended: killed, failed, or its trigger gone), whose job a Kubernetes retry
    re-attaches to rather than launching another, and whose writes the new attempt fences off. The trials of one
    search hold their claims side by side; a claim of a run of the model that is not of that search (a plain run,
    another search's trial) is refused beside them, and theirs beside it (``claim_family``).
    """
    trial = _trial_of(conn, run.run_id)
    name = claim_name(run.model_name, trial)
    with LockManager(conn, owner={**(owner or {}), "training_run": run.run_id}, heartbeat=True) as locks:
        try:
            lease = locks.acquire_lock(name, timeout=wait, take_over={"training_run": run.run_id},
                                       family=claim_family(run.model_name, run.run_id, trial))
        except LockTimeout as busy:
            holder = busy.holder or locks.holder(name) or {}
            who = holder.get("owner") or {}
            raise TrainingBusy(
                f"model {run.model_name!r} is being trained by run {who.get('training_run', '?')} "
                f"({describe_owner({k: v for k, v in who.items() if k != 'training_run'})}; since "
                f"{holder.get('acquired_at')}, lease until {holder.get('expires_at')}): run {run.run_id} launches no "
                f"second job beside it. Run this train task again once that run's train task has ended (a killed "
                f"one's claim ends {DEFAULT_TTL:g} s after it stopped, {DEFERRED_TTL:g} s if its trigger held it)"
            ) from None
        # released at the end unless handed over; a release that cannot complete fails no job and hides no error
        with locks.holding(lease):
            yield TrainingClaim(lease, locks)


def _trial_of(conn: psycopg.Connection | str, run_id: str) -> tuple[str, int] | None:
    if isinstance(conn, str):
        from pgtrain.core.db import connect

        with connect(conn) as own:
            return trials.trial_of(own, run_id)
    return trials.trial_of(conn, run_id)


def claim_lost(conn: psycopg.Connection, name: str, training_run: str) -> ClaimLost:
    """The error of the job of ``training_run``, whose claim ``name`` was found lost, naming who took the claim: the
    job must stop, unless a new try of the same run holds it (``superseded``: on Kubernetes that try re-attached to
    this very job, which must go on)."""
    holder = lock_holder(conn, name)
    owner = holder["owner"] if holder else None
    if owner and owner.get("training_run") == training_run:
        return ClaimLost(f"the training claim {name} of run {training_run} was taken over by a new try of the run, "
                         "which watches the job now: this try leaves the job and the run's outcome to it",
                         superseded=True)
    others = {k: v for k, v in (owner or {}).items() if k != "training_run"}
    taker = (f"run {owner.get('training_run', '?')} ({describe_owner(others)}) took it at {holder['acquired_at']}"
             if owner else "another holder took it and has released it since")
    return ClaimLost(f"the training claim {name} of run {training_run} was lost: its holder could not renew the lease "
                     f"for a whole lease (a lost link to the database, or a paused process), and {taker}. This run's "
                     "job was stopped so that two jobs do not train the model at once; a retry is refused while "
                     "another run holds the claim. Check the worker's link to the database")


def renew_claim(conn: psycopg.Connection, claim: Mapping[str, Any]) -> bool:
    """Renew a handed-over claim (``{"name", "token", "ttl"}``) for ``ttl`` seconds, recording this process as its
    holder; False when its row is busy this instant. Raises StaleLockToken when it has ended."""
    owner = {"host": socket.gethostname(), "pid": os.getpid()}
    return renew_lease(conn, claim["name"], claim["token"], claim["ttl"], owner) is not None


def release_claim(conn: psycopg.Connection, claim: Mapping[str, Any]) -> bool:
    """Release a handed-over claim; False when it had already ended (its lease ran out, or a retry took it)."""
    return release_lease(conn, claim["name"], claim["token"])
