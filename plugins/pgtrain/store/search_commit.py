"""Commit a search: choose the best trial by its validation metric (``pgtrain.runs.trials.choose``), record the
choice, and commit that trial's run as the model's next version under the usual lock, gate and fencing
(``commit_run``). A run without a search is committed as it is, once it has trained.

A choice once recorded is the search's: a re-run of the commit (a cleared task) commits, or is refused for, the same
trial, never the runner-up of a trial the gate rejected. A choice of no trial (none had trained) is made again."""

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

# A plain run's statuses commit_run may take: trained, or one it has already decided (it answers as it did then).
_COMMITTABLE = ("trained", "committed", "rejected")


def commit_search(conn: psycopg.Connection, run_id: str, owner: Mapping[str, Any] | None = None
                  ) -> tuple[CommitResult, trials.Choice | None]:
    """(the commit, the search's choice; None without a search). A plain run that has not trained (its train task
    failed: a search DAG commits after every train task ended) raises CommitRejected with its status. No trial that
    trained: the search run is marked 'failed' with what each trial did, and CommitRejected is raised; a chosen trial
    the gate rejects marks the search run 'rejected' with that reason. Once the chosen trial's commit has decided,
    the other trials' staged parameters and checkpoints are deleted (the ledger keeps their params, metrics and
    curves)."""
    run = get_run(conn, run_id)
    if run.config.search is None:
        if run.status not in _COMMITTABLE:  # its verdict stays
            raise CommitRejected(f"run {run_id} was not trained: {run.status}"
                                 + (f": {run.status_reason}" if run.status_reason else ""))
        return commit_run(conn, run_id, owner=owner), None
    if not trials.trial_runs(conn, run_id):
        raise CommitRejected(f"search {run_id} planned no trials (its status: {run.status}); its plan_trials task "
                             "failed or did not run")
    choice = trials.recorded_choice(conn, run_id)
    if choice is None or choice.run_id is None:
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
        _discard_others(conn, run_id, choice, "it was rejected")
        raise
    set_status(conn, run_id, "committed", f"v{result.version}: {choice.explanation}")
    _discard_others(conn, run_id, choice, f"v{result.version}")
    return result, choice


def _discard_others(conn: psycopg.Connection, search_run: str, choice: trials.Choice, outcome: str) -> None:
    """The trials not chosen: their staged parameters and checkpoints go (no commit will read them); the ledger keeps
    their params, metrics and curve."""
    for other in trials.trial_runs(conn, search_run):
        if other != choice.run_id and get_run(conn, other).status == "trained":
            with conn.transaction():
                set_status(conn, other, "trained", f"not chosen: trial {choice.trial} was ({outcome})")
                tensors.delete_staged(conn, other)
                tensors.delete_checkpoints(conn, other)
