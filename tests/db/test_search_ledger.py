"""A search's ledger against a real PostgreSQL, without ranks (issue 34's review): the trials planned from the search
run's plan, a trial too big for the worker refused before any rank starts, and the commit's checks of what trained."""

from __future__ import annotations

import numpy as np
import pytest

from pgtrain.config.params import TrainingConfig
from pgtrain.config.search import SearchLimits, plan_search
from pgtrain.config.settings import AuthorSettings
from pgtrain.core.errors import CommitRejected, ConfigError
from pgtrain.planning import plan
from pgtrain.runs import record, trials
from pgtrain.store import tensors
from pgtrain.store.catalog import list_versions
from pgtrain.store.search_commit import commit_search
from tests.db.test_model_store import MODEL, SPEC, parameters, prepare_run
from tests.support import make_mixed_table, mixed_params, planned_run

AUTHOR = AuthorSettings(allowed_models=("mlp", "xgboost"), search_limits={"max_trials": 4, "concurrency": 2})
# 16 layers of 65536: about 6.4e10 parameters, some 1.5 TB to train; no worker has that
HUGE = [65536] * 16


def search_run(conn, search: dict, name: str = "search") -> record.Run:
    make_mixed_table(conn, 200)
    return planned_run(conn, name, **mixed_params(model_name="penguins-search", search=search))


def test_a_trial_too_big_for_the_worker_is_refused_and_the_search_goes_on(autocommit):
    search = search_run(autocommit, {"candidates": [{"model": "mlp", "params": {"hidden_sizes": [[8], HUGE]}},
                                                    {"model": "xgboost"}]})
    runs = plan.plan_trials(autocommit, search.run_id, AUTHOR)
    assert runs == [trials.trial_run_id(search.run_id, n) for n in (1, 3)]  # the train task is not mapped over 2
    refused = record.get_run(autocommit, trials.trial_run_id(search.run_id, 2))
    assert refused.status == "refused"
    assert "not trained: hidden_sizes [65536," in refused.status_reason and "of memory" in refused.status_reason
    assert record.get_run(autocommit, search.run_id).status == "sharded"  # the search goes on
    ledger = trials.ledger(autocommit, search.run_id)
    assert [t["status"] for t in ledger] == ["sharded", "refused", "sharded"]


def test_a_search_no_trial_of_which_fits_is_refused(autocommit):
    search = search_run(autocommit, {"candidates": [{"model": "mlp", "params": {"hidden_sizes": [HUGE]}}]})
    with pytest.raises(ConfigError, match="no trial fits in this worker's memory"):
        plan.plan_trials(autocommit, search.run_id, AUTHOR)
    assert record.get_run(autocommit, search.run_id).status == "refused"


def trained_search(conn, accuracies: list[float], nan_trial: int | None = None) -> str:
    """A search run whose trials trained as the train tasks leave them: one trial per accuracy (the validation
    metric it is chosen by), each with staged parameters (not finite for ``nan_trial``) and a checkpoint."""
    block = {"candidates": [{"model": "mlp", "params": {"dropout": [i / 10 for i in range(len(accuracies))]}}],
             "metric": "val_accuracy"}
    config = TrainingConfig(model_name=MODEL, hidden_sizes=SPEC.hidden_sizes, search=block)
    search = record.plan_run(conn, "pgtrain_training", "search", config)
    trials.create_trials(conn, search.run_id, plan_search(block, config.to_dict(), SearchLimits(max_trials=8),
                                                          ("mlp",)))
    for number, accuracy in enumerate(accuracies, 1):
        run_id = trials.trial_run_id(search.run_id, number)
        conn.execute("UPDATE pgtrain.training_runs SET input_dim = %s, num_classes = %s, output_dim = %s, "
                     "status = 'trained' WHERE run_id = %s", (SPEC.input_dim, SPEC.num_classes, SPEC.num_classes,
                                                              run_id))
        tensors.write_staged(conn, run_id, parameters(np.nan if number == nan_trial else 0.5))
        tensors.write_checkpoint(conn, run_id, 1, parameters(0.5), {"epoch": 1})
        record.record_epoch(conn, run_id, 1, {"train_loss": 1.0, "val_loss": 1.0, "val_accuracy": accuracy,
                                              "seconds": 0.1})
    return search.run_id


def kept_tensors(conn, run_id: str) -> tuple[int, bool]:
    return len(tensors.staged_layout(conn, run_id)), tensors.read_checkpoint(conn, run_id) is not None


def test_the_latest_run_is_the_search_run_not_one_of_its_trials(autocommit):
    # the trials' runs are planned after the search run; the report of "the most recent run" is the search's
    search = trained_search(autocommit, [0.7, 0.9])
    assert record.latest_run_id(autocommit) == search


def test_a_rejected_choice_frees_the_other_trials_and_a_re_run_commits_no_runner_up(autocommit):
    search = trained_search(autocommit, [0.9, 0.8, 0.7], nan_trial=1)
    with pytest.raises(CommitRejected, match="not finite|non-finite|nonfinite|NaN"):
        commit_search(autocommit, search, owner={"task_id": "test"})
    assert record.get_run(autocommit, search).status == "rejected"
    for number in (2, 3):  # not chosen: their staged parameters and checkpoints are gone all the same
        other = trials.trial_run_id(search, number)
        assert kept_tensors(autocommit, other) == (0, False)
        assert record.get_run(autocommit, other).status_reason == "not chosen: trial 1 was (it was rejected)"
    # a cleared commit task: the recorded choice stands, the runner-up is not committed in its place
    with pytest.raises(CommitRejected):
        commit_search(autocommit, search, owner={"task_id": "test"})
    assert trials.recorded_choice(autocommit, search).trial == 1
    assert list_versions(autocommit, MODEL) == []


def test_a_committed_choice_frees_the_other_trials_and_a_re_run_is_the_same_commit(autocommit):
    search = trained_search(autocommit, [0.7, 0.9])
    result, choice = commit_search(autocommit, search, owner={"task_id": "test"})
    assert choice.trial == 2 and kept_tensors(autocommit, trials.trial_run_id(search, 1)) == (0, False)
    again, same = commit_search(autocommit, search, owner={"task_id": "test"})
    assert (again.version, same.trial) == (result.version, 2) and len(list_versions(autocommit, MODEL)) == 1


@pytest.mark.parametrize("status", ["training", "sharded", "failed"])
def test_a_plain_run_that_did_not_train_is_not_committed(db_url, autocommit, status):
    run_id = prepare_run(db_url, "plain")  # staged parameters, as an earlier attempt may have left them
    record.set_status(autocommit, run_id, status, "its train task failed" if status == "failed" else None)
    with pytest.raises(CommitRejected, match=f"run {run_id} was not trained: {status}"):
        commit_search(autocommit, run_id)
    assert list_versions(autocommit, MODEL) == []
