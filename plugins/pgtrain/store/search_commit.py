"""Commit a search: choose the best trial by its validation metric (``pgtrain.runs.trials.choose``), record the
choice, and commit that trial's run as the model's next version under the usual lock, gate and fencing
(``commit_run``). A run without a search is committed as it is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from pgtrain.config.metrics import METRICS
from pgtrain.config.search import choice_metric
from pgtrain.core.errors import CommitRejected
from pgtrain.runs import trials
from pgtrain.runs.record import get_run, set_status
from pgtrain.store import tensors
from pgtrain.store.model_store import CommitResult, commit_run


def commit_search(conn: psycopg.Connection, run_id: str, owner: Mapping[str, Any] | None = None
                  ) -> tuple[CommitResult, trials.Choice | None]:
    """(the commit, the search's choice; None without a search). No trial that trained: the search run is marked
    'failed' with what each trial did, and CommitRejected is raised; a chosen trial the gate rejects marks the
    search run 'rejected' with that reason."""
    run = get_run(conn, run_id)
    if run.config.search is None:
        if run.status in ("refused", "failed"):  # its verdict stays (a search DAG commits after a failed train)
            raise CommitRejected(f"run {run_id} was not trained: {run.status}: {run.status_reason}")
        return commit_run(conn, run_id, owner=owner), None
    if not trials.trial_runs(conn, run_id):
        raise CommitRejected(f"search {run_id} planned no trials (its status: {run.status}); its plan_trials task "
                             "failed or did not run")
    metric = choice_metric(run.config.search, run.config.to_dict())  # as plan_search chose it
    choice = trials.choose(trials.ledger(conn, run_id), metric, METRICS[metric].higher_is_better)
    trials.record_choice(conn, run_id, choice)
    if choice.run_id is None:
        set_status(conn, run_id, "failed", choice.explanation)
        raise CommitRejected(f"search {run_id}: {choice.explanation}")
    try:
        result = commit_run(conn, choice.run_id, owner=owner)
    except CommitRejected as rejected:
        set_status(conn, run_id, "rejected", f"{choice.explanation}; the chosen trial was rejected: {rejected}")
        raise
    set_status(conn, run_id, "committed", f"v{result.version}: {choice.explanation}")
    for other in trials.trial_runs(conn, run_id):
        if other != choice.run_id and get_run(conn, other).status == "trained":
            with conn.transaction():  # the ledger keeps its params, metrics and curve; its parameters go
                set_status(conn, other, "trained", f"not chosen: trial {choice.trial} was (v{result.version})")
                tensors.delete_staged(conn, other)
                tensors.delete_checkpoints(conn, other)
    return result, choice
