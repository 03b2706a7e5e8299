"""One manifest for all trials of a search (issue 34) on a real PostgreSQL: a trial's run reads the search run's plan
(``training_runs.plan_run``, ``pgtrain.plan_of``) instead of a copy; every reader of the plan sees the same rows for
it as for its search; a plan that trials read is neither planned again nor deleted; a trial planned by the copying
code before (its own plan rows) still reads those; a search's training claims exclude other runs of the model."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from pgtrain.config.params import TrainingConfig
from pgtrain.config.search import SearchLimits, plan_search
from pgtrain.core.errors import PgtrainError, TrainingBusy
from pgtrain.data import loader, manifest
from pgtrain.launch.attempt import training_claim
from pgtrain.planning import plan
from pgtrain.runs import record, report, trials
from pgtrain.store.commit_checks import version_spec
from tests.db.test_search_ledger import AUTHOR
from tests.support import make_mixed_table, mixed_params, planned_run

PLAN_TABLES = ("shard_manifest", "shard_plans", "shard_batches")
SEARCH = {"candidates": [{"model": "mlp", "params": {"hidden_sizes": [[8], [16]]}}, {"model": "xgboost"}]}


def search_run(conn, search: dict, **params) -> record.Run:
    make_mixed_table(conn, 200)
    return planned_run(conn, "search", **mixed_params(model_name="penguins-search", search=search, **params))


def plan_row_counts(conn, run_ids: list[str]) -> dict[str, int]:
    return {table: conn.execute(f"SELECT count(*) FROM pgtrain.{table} WHERE run_id = ANY(%s)",  # noqa: S608
                                (run_ids,)).fetchone()[0] for table in PLAN_TABLES}


def loaded(conn, run_id: str) -> list[tuple[np.ndarray, ...]]:
    """What each rank of the run loads, as a rank does: the run's source and manifest, then its shard."""
    run = record.get_run(conn, run_id)
    source = manifest.source_for(conn, run)
    return [(data.features, data.labels, data.part) for data in (
        loader.load_shard(conn, source, shard, run.input_dim, run.config.validation_fraction, run.config.seed,
                          test_fraction=run.config.test_fraction)
        for shard in record.get_manifest(conn, run_id))]


def test_a_searchs_trials_add_no_plan_rows_and_read_exactly_its_plan(autocommit):
    search = search_run(autocommit, SEARCH, world_size=2)
    runs = plan.plan_trials(autocommit, search.run_id, AUTHOR)
    assert len(runs) == 3
    # one manifest: the trials add no row to the plan tables
    assert plan_row_counts(autocommit, [search.run_id, *runs]) == plan_row_counts(autocommit, [search.run_id])
    assert plan_row_counts(autocommit, runs) == dict.fromkeys(PLAN_TABLES, 0)
    planned = loaded(autocommit, search.run_id)
    assert sum(len(part) for _, _, part in planned) == sum(s.row_count for s in
                                                         record.get_manifest(autocommit, search.run_id))
    summary = report.build_summary(autocommit, search.run_id)
    spec = version_spec(autocommit, record.get_run(autocommit, search.run_id))
    assert spec["watermark"]["snapshot"] and spec["watermark"]["max_key"]
    for run_id in runs:
        assert record.get_manifest(autocommit, run_id) == record.get_manifest(autocommit, search.run_id)
        assert manifest.read_plan(autocommit, run_id) == manifest.read_plan(autocommit, search.run_id)
        for mine, theirs in zip(loaded(autocommit, run_id), planned, strict=True):  # every rank: the same rows
            assert all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True))
        # the commit's checks (snapshot, last key) and the report read the shared plan
        assert version_spec(autocommit, record.get_run(autocommit, run_id))["watermark"] == spec["watermark"]
        trial_summary = report.build_summary(autocommit, run_id)
        assert trial_summary["rows_per_rank"] == summary["rows_per_rank"] and trial_summary["rows_per_rank"]


def test_a_plan_its_trials_read_is_neither_planned_again_nor_deleted(autocommit):
    search = search_run(autocommit, SEARCH)
    plan.plan_trials(autocommit, search.run_id, AUTHOR)
    before = plan_row_counts(autocommit, [search.run_id])
    shards = record.get_manifest(autocommit, search.run_id)
    with pytest.raises(PgtrainError, match=rf"the plan of run {search.run_id} is read by run "
                                           rf"{search.run_id}/trial-\d .*start a new DAG run"):
        manifest.plan_shards(autocommit, record.get_run(autocommit, search.run_id))
    for table in ("shard_manifest", "shard_plans"):
        with pytest.raises(psycopg.errors.RestrictViolation, match="is read by run"):
            autocommit.execute(f"DELETE FROM pgtrain.{table} WHERE run_id = %s", (search.run_id,))  # noqa: S608
    with pytest.raises(psycopg.errors.IntegrityError):
        autocommit.execute("DELETE FROM pgtrain.training_runs WHERE run_id = %s", (search.run_id,))
    assert plan_row_counts(autocommit, [search.run_id]) == before
    assert record.get_manifest(autocommit, search.run_id) == shards
    # compute_shards run again (its DAG run cleared once the search committed): refused, the verdict kept
    record.set_status(autocommit, search.run_id, "committed")
    with pytest.raises(PgtrainError, match=rf"run {search.run_id} is planned already and its plan is read by 3 "
                                           r"trial\(s\) of its search .*start a new DAG run"):
        plan.plan_shards_checked(autocommit, search.run_id, AUTHOR)
    assert record.get_run(autocommit, search.run_id).status == "committed"


def copied_trial(conn, search_run_id: str, run_id: str) -> None:
    """Make ``run_id`` a trial as the copying code created them before sql/016: its own copy of the plan rows."""
    conn.execute("UPDATE pgtrain.training_runs SET plan_run = NULL WHERE run_id = %s", (run_id,))
    for table in PLAN_TABLES:
        conn.execute(f"""INSERT INTO pgtrain.{table}
                         SELECT (jsonb_populate_record(NULL::pgtrain.{table},
                                                       to_jsonb(p) || jsonb_build_object('run_id', %s::text))).*
                         FROM pgtrain.{table} p WHERE p.run_id = %s""", (run_id, search_run_id))  # noqa: S608


def test_a_trial_with_its_own_copied_plan_still_reads_it(autocommit):
    search = search_run(autocommit, SEARCH)
    old, *new = plan.plan_trials(autocommit, search.run_id, AUTHOR)
    copied_trial(autocommit, search.run_id, old)
    planned = loaded(autocommit, search.run_id)
    # the search's plan stays while the new-style trial reads it; the old trial's copy is its own to replan
    autocommit.execute("DELETE FROM pgtrain.training_runs WHERE run_id = ANY(%s)", (new,))
    autocommit.execute("DELETE FROM pgtrain.shard_manifest WHERE run_id = %s", (search.run_id,))
    assert manifest.read_plan(autocommit, old).run_id == old
    assert [s.row_count for s in record.get_manifest(autocommit, old)] == [len(p) for _, _, p in planned]
    for mine, theirs in zip(loaded(autocommit, old), planned, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True))


def claim_search(conn, name: str) -> list[record.Run]:
    """A search run of the model ``claimed`` and its two trials (no plan needed to claim)."""
    block = {"candidates": [{"model": "mlp", "params": {"dropout": [0.1, 0.2]}}]}
    config = TrainingConfig(model_name="claimed", search=block)
    search = record.plan_run(conn, "pgtrain_training", name, config)
    runs = trials.create_trials(conn, search.run_id, plan_search(block, config.to_dict(), SearchLimits(max_trials=8),
                                                                  ("mlp",)))
    return [record.get_run(conn, r) for r in runs]


def test_a_searchs_trials_train_side_by_side_but_beside_no_other_run_of_the_model(autocommit, db_url):
    first, second = claim_search(autocommit, "search")
    other_search, _ = claim_search(autocommit, "other-search")
    plain = record.plan_run(autocommit, "pgtrain_training", "plain", TrainingConfig(model_name="claimed"))
    elsewhere = record.plan_run(autocommit, "pgtrain_training", "elsewhere", TrainingConfig(model_name="elsewhere"))
    owner = {"dag_id": "d", "task_id": "train"}
    with training_claim(db_url, first, owner), training_claim(db_url, second, owner, wait=0):
        for refused in (plain, other_search):
            with pytest.raises(TrainingBusy, match=rf"model 'claimed' is being trained by run "
                                                   rf"pgtrain_training/search/trial-\d \(dag_id=d, task_id=train, "
                                                   rf".*run {refused.run_id} launches no second job"):
                with training_claim(db_url, refused, wait=0):
                    pytest.fail(f"{refused.run_id} got the claim beside a search's trials")
        with training_claim(db_url, elsewhere, wait=0):  # another model trains meanwhile
            pass
    with training_claim(db_url, plain, owner):
        with pytest.raises(TrainingBusy, match=r"being trained by run pgtrain_training/plain .*run "
                                               r"pgtrain_training/search/trial-1 launches no second job"):
            with training_claim(db_url, first, wait=0):
                pytest.fail("a trial got the claim beside a plain run of its model")
    with training_claim(db_url, other_search, wait=0):  # free again once the plain run's block ended
        pass
