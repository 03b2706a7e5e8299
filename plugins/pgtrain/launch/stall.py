"""Whether a running job has stopped making progress: no new epoch recorded for the author's ``stall_timeout``.
A hung collective (a rank stuck in NCCL, a deadlock) otherwise holds the job's GPUs until the MPIJob's
activeDeadlineSeconds; the watchers (the operator's synchronous watch and its trigger) ask this on each poll."""

from __future__ import annotations

import psycopg

from pgtrain.runs import record


def stall_reason(since_epoch: float | None, since_running: float, stall_timeout: float) -> str | None:
    """Why the job is stalled, or None. ``since_epoch``: seconds since its latest epoch was recorded (None: none
    yet); ``since_running``: seconds since the watcher first saw it running (its first epoch counts from there)."""
    quiet = since_running if since_epoch is None else min(since_epoch, since_running)
    if quiet < stall_timeout:
        return None
    waited = "its first epoch" if since_epoch is None or since_epoch > since_running else "a new epoch"
    return (f"the job stalled: no epoch recorded for {quiet:.0f} s since it started running or since its last one "
            f"(waiting for {waited}; stall_timeout {stall_timeout:g} s). Its ranks are likely hung (a collective "
            "waiting on a dead or stuck rank); the MPIJob was deleted, and the retry resumes from the last "
            "checkpoint. If an epoch (or the data load before the first) really takes that long, raise stall_timeout "
            "in the DAG author's settings file")


def check_stall(conn: psycopg.Connection, run_id: str, since_running: float, stall_timeout: float) -> str | None:
    """``stall_reason`` for the run's latest epoch, as the database records it (its clock, not the watcher's)."""
    return stall_reason(record.seconds_since_last_epoch(conn, run_id), since_running, stall_timeout)
