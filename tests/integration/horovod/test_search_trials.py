"""A search with real Horovod ranks and a real PostgreSQL (issue 34): one plan for every trial (mlp and xgboost), each
trial a run of its own trained by the local launcher, the best by the validation metric committed under the usual
commit, a failed trial not failing the search, and the version's figures read on rows no trial chose by."""

from __future__ import annotations

import os
import re
import signal
from html import escape as html_escape

import psycopg
import pytest

from pgtrain.config.metrics import reported
from pgtrain.config.settings import AuthorSettings
from pgtrain.core.errors import CommitRejected, TrainingFailed
from pgtrain.data import manifest
from pgtrain.launch.attempt import training_claim
from pgtrain.planning import plan
from pgtrain.runs import record, trials
from pgtrain.store.search_commit import commit_search
from tests.db import test_models_catalog
from tests.db.test_search_plan import copied_trial
from tests.integration.horovod.test_resume import trainer_rank
from tests.support import (
    job_in_background,
    make_mixed_table,
    mixed_params,
    planned_run,
    run_job,
    seed_samples,
    wait_for_checkpoint,
)

pytestmark = pytest.mark.horovod
page_client_of = test_models_catalog.page_client_of  # the models page app, as its own tests get it

AUTHOR = AuthorSettings(allowed_models=("mlp", "xgboost"),
                        search_limits={"max_trials": 4, "concurrency": 2, "max_total_world_size": 2})
SEARCH = {"candidates": [{"model": "mlp", "params": {"hidden_sizes": [[16]], "epochs": [8]}},
                         {"model": "xgboost", "model_options": {"n_estimators": [60], "max_depth": [3]}}],
          "metric": "val_accuracy"}


def search_run(conn, name: str = "search", **extra) -> record.Run:
    return planned_run(conn, name, **mixed_params(**{
        "model_name": "penguins-search", "world_size": 1, "batch_size": 32, "validation_fraction": 0.2,
        "test_fraction": 0.2, "seed": 5, "search": SEARCH, **extra}))


def plan_rows(conn, run_id: str) -> tuple:
    """Everything a run's ranks read of its plan, as they read it (a trial: its search run's plan), with the run that
    planned it."""
    encoding = conn.execute("SELECT input_dim, num_classes, output_dim, encoding FROM pgtrain.training_runs "
                            "WHERE run_id = %s", (run_id,)).fetchone()
    return record.get_manifest(conn, run_id), manifest.read_plan(conn, run_id), encoding


def own_plan_rows(conn, run_ids: list[str]) -> int:
    """The rows the runs hold in the plan tables under their own ids (a trial: none, it reads its search's)."""
    return sum(conn.execute(f"SELECT count(*) FROM pgtrain.{table} WHERE run_id = ANY(%s)",  # noqa: S608
                            (run_ids,)).fetchone()[0] for table in ("shard_manifest", "shard_plans", "shard_batches"))


def test_two_trials_of_two_kinds_over_one_plan_and_the_best_committed(autocommit, db_url, page_client_of):
    make_mixed_table(autocommit, 600)
    search = search_run(autocommit)
    runs = plan.plan_trials(autocommit, search.run_id, AUTHOR)
    assert runs == [f"{search.run_id}/trial-1", f"{search.run_id}/trial-2"]
    assert plan.plan_trials(autocommit, search.run_id, AUTHOR) == runs  # a retried task plans no second set
    # one plan: each trial reads exactly the search run's snapshot, ranges, batches, encoding, and copies none of it
    assert own_plan_rows(autocommit, runs) == 0
    for run_id in runs:
        assert plan_rows(autocommit, run_id) == plan_rows(autocommit, search.run_id)
    kinds = [record.get_run(autocommit, r).config.model for r in runs]
    assert kinds == ["mlp", "xgboost"] and all(record.get_run(autocommit, r).config.search is None for r in runs)

    for run_id in runs:
        run_job(record.get_run(autocommit, run_id), db_url)
    ledger = trials.ledger(autocommit, search.run_id)
    assert [t["status"] for t in ledger] == ["trained", "trained"]
    assert all(t["curve"] and t["seconds"] > 0 and t["test_metrics"] for t in ledger)
    best = max(ledger, key=lambda t: (t["metrics"]["val_accuracy"], -t["trial"]))

    result, choice = commit_search(autocommit, search.run_id, owner={"task_id": "test"})
    assert choice.trial == best["trial"] and choice.run_id == best["run_id"]
    version_run, metrics = autocommit.execute(
        "SELECT run_id, metrics FROM pgtrain.model_versions WHERE model_name = 'penguins-search' AND version = %s",
        (result.version,)).fetchone()
    assert version_run == best["run_id"] and result.head_moved
    assert autocommit.execute("SELECT version FROM pgtrain.model_heads WHERE model_name = 'penguins-search'"
                              ).fetchone() == (result.version,)
    # The choice is recorded with its metric and direction; the search run says which version it became.
    assert trials.recorded_choice(autocommit, search.run_id) == choice
    assert "higher is better" in choice.explanation and f"trial {best['trial']} chosen" in choice.explanation
    assert record.get_run(autocommit, search.run_id).status == "committed"
    # The reported figure is the chosen trial's kept parameters on the test rows, which chose nothing: not the
    # validation figure the trial was picked by.
    assert metrics["figures_from"] == "test"
    assert reported(metrics, "val_accuracy") == metrics["test_accuracy"] == best["test_metrics"]["test_accuracy"]
    assert metrics["val_accuracy"] == pytest.approx(best["metrics"]["val_accuracy"])
    # The other trial is recorded (params, metrics, curve, time) but its parameters are gone.
    other = next(r for r in runs if r != best["run_id"])
    assert record.get_run(autocommit, other).status_reason.startswith(f"not chosen: trial {best['trial']} was")
    assert autocommit.execute("SELECT count(*) FROM pgtrain.staged_parameters").fetchone() == (0,)
    # The models page shows the version's search: every trial, the chosen one marked, and the choice in words.
    client, token = page_client_of(db_url)
    html = client.get("/pgtrain/models/penguins-search", params={"version": result.version},
                      headers={"Authorization": f"Bearer {token}", "Accept": "text/html"}).text
    trial_rows = re.findall(r'<tr data-trial="(\d+)"( class=chosen)?>', html)
    assert trial_rows == [(str(t["trial"]), " class=chosen" if t is best else "") for t in ledger]
    assert "model=xgboost" in html and "hidden_sizes=[16]" in html and "max_depth=3" in html
    assert html_escape(choice.explanation) in html
    # Committing the search again yields the same version.
    again, _ = commit_search(autocommit, search.run_id, owner={"task_id": "test"})
    assert again.version == result.version and not again.created


def test_a_failed_trial_does_not_fail_the_search(autocommit, db_url):
    make_mixed_table(autocommit, 400)
    search = search_run(autocommit, "failing")
    first, second = plan.plan_trials(autocommit, search.run_id, AUTHOR)
    record.record_verdict(autocommit, first, "failed", "RuntimeError: the rank was killed")  # as its launcher does
    run_job(record.get_run(autocommit, second), db_url)
    result, choice = commit_search(autocommit, search.run_id, owner={"task_id": "test"})
    assert choice.run_id == second and "trial 1 failed (RuntimeError: the rank was killed)" in choice.explanation
    assert autocommit.execute("SELECT run_id FROM pgtrain.model_versions WHERE version = %s",
                              (result.version,)).fetchone() == (second,)


def test_no_trial_trained_fails_the_search_with_what_each_did(autocommit):
    make_mixed_table(autocommit, 300)
    search = search_run(autocommit, "none")
    for run_id in plan.plan_trials(autocommit, search.run_id, AUTHOR):
        record.record_verdict(autocommit, run_id, "refused", "bad input")
    with pytest.raises(CommitRejected, match="no trial trained .* trial 1 refused .*trial 2 refused"):
        commit_search(autocommit, search.run_id)
    assert record.get_run(autocommit, search.run_id).status == "failed"
    assert autocommit.execute("SELECT count(*) FROM pgtrain.model_versions").fetchone() == (0,)


def test_a_search_beyond_the_authors_caps_is_refused_before_any_trial(autocommit):
    make_mixed_table(autocommit, 300)
    search = search_run(autocommit, "too-big", world_size=2)
    narrow = AuthorSettings(allowed_models=("mlp", "xgboost"),
                            search_limits={"max_trials": 1, "concurrency": 2, "max_total_world_size": 2})
    with pytest.raises(Exception, match=r"2 trials, and the DAG's author allows at most 1.*"
                                        r"need 4 ranks, and the DAG's author allows 2 in all"):
        plan.plan_trials(autocommit, search.run_id, narrow)
    assert record.get_run(autocommit, search.run_id).status == "refused"
    assert trials.trial_runs(autocommit, search.run_id) == []
    with pytest.raises(Exception, match="allows no search"):
        plan.plan_trials(autocommit, search.run_id, AuthorSettings(allowed_models=("mlp", "xgboost")))


def test_killing_one_trials_rank_fails_only_that_trial_and_its_retry_resumes(autocommit, db_url):
    """Two trials training at once, each under its own training claim; one's rank is SIGKILLed after its epoch-2
    checkpoint: that trial's job fails, the other's ends trained, the retry of the first resumes from its own
    checkpoint, and the search commits the better of the two."""
    seed_samples(autocommit, rows=240, dim=8, classes=4, seed=5)
    search = planned_run(autocommit, "killed", world_size=1, epochs=5, batch_size=16, learning_rate=0.05,
                         checkpoint_every=1, early_stopping_patience=0,
                         search={"candidates": [{"model": "mlp", "params": {"hidden_sizes": [[8], [16]]}}]})
    first, second = (record.get_run(autocommit, r) for r in plan.plan_trials(autocommit, search.run_id, AUTHOR))
    owner = {"dag_id": "pgtrain_test", "task_id": "train"}
    with training_claim(db_url, first, owner), training_claim(db_url, second, owner), \
            psycopg.connect(db_url) as blocker:
        # Hold the first trial's rank at its epoch-3 metrics: its epoch-2 checkpoint is written by then.
        blocker.execute("INSERT INTO pgtrain.run_metrics (run_id, epoch, train_loss, seconds) VALUES (%s, 3, 0, 0)",
                        (first.run_id,))
        killed, killed_failure = job_in_background(first, db_url)
        other, other_failure = job_in_background(second, db_url)
        wait_for_checkpoint(db_url, first.run_id, 2)
        rank = trainer_rank(first.run_id, 0)
        assert rank is not None
        os.kill(rank.pid, signal.SIGKILL)
        killed.join(timeout=240)
        other.join(timeout=240)
        blocker.rollback()
    assert len(killed_failure) == 1 and isinstance(killed_failure[0], TrainingFailed), killed_failure
    assert other_failure == [] and record.get_run(autocommit, second.run_id).status == "trained"
    assert record.get_run(autocommit, first.run_id).status != "trained"

    lines = run_job(first, db_url)  # the trial's retry: a new attempt of its own run
    assert any("resuming from the checkpoint of epoch 2" in line for line in lines)
    result, choice = commit_search(autocommit, search.run_id, owner={"task_id": "test"})
    assert {t["status"] for t in trials.ledger(autocommit, search.run_id)} == {"trained", "committed"}
    assert result.created and choice.run_id in (first.run_id, second.run_id)
    assert choice.metric == "val_loss" and "lower is better" in choice.explanation


def test_a_trial_planned_with_its_own_copy_of_the_plan_still_trains_and_commits(autocommit, db_url):
    """A trial the copying code created before sql/016 (its own plan rows, no plan_run) reads its own copy: its ranks
    train on it and its commit checks it, while the other trial reads the search run's plan."""
    seed_samples(autocommit, rows=160, dim=6, classes=3, seed=7)
    search = planned_run(autocommit, "copied", world_size=1, epochs=2, batch_size=16, test_fraction=0.2,
                         search={"candidates": [{"model": "mlp", "params": {"hidden_sizes": [[8], [4]]}}]})
    old, new = plan.plan_trials(autocommit, search.run_id, AUTHOR)
    copied_trial(autocommit, search.run_id, old)
    autocommit.execute("DELETE FROM pgtrain.training_runs WHERE run_id = %s", (new,))  # the search's plan: unread now
    autocommit.execute("DELETE FROM pgtrain.shard_manifest WHERE run_id = %s", (search.run_id,))
    run_job(record.get_run(autocommit, old), db_url)
    result, choice = commit_search(autocommit, search.run_id, owner={"task_id": "test"})
    assert result.created and choice.run_id == old
    rows, watermark = autocommit.execute(
        "SELECT (SELECT sum(row_count) FROM pgtrain.shard_manifest WHERE run_id = %s), spec->'watermark' "
        "FROM pgtrain.model_versions WHERE version = %s", (old, result.version)).fetchone()
    assert rows == 160 and watermark["max_key"] is not None
