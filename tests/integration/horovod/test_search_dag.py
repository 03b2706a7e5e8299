"""A search in a real Airflow run (`airflow dags test` of pgtrain_training, real Horovod ranks, real PostgreSQL):
4 trials of mixed kinds over one plan, each a mapped task instance of the train task with its own verdict, one of
them refused in its rank without failing the search, and the best trial committed as the version."""

from __future__ import annotations

import json
import subprocess

import psycopg
import pytest

from pgtrain.runs import record, trials
from tests.conftest import REPO
from tests.integration.horovod.test_real_tables import dags_test
from tests.integration.horovod.test_search_trials import own_plan_rows, plan_rows
from tests.support import make_mixed_table, mixed_params

pytestmark = [pytest.mark.airflow, pytest.mark.horovod]

SEARCH = {"candidates": [
    {"model": "mlp", "params": {"hidden_sizes": [[16], [32]], "epochs": [6]}},
    {"model": "xgboost", "model_options": {"n_estimators": [40], "max_depth": [3]}},
    # refused in its rank: the factory raises (a bad candidate is one trial's verdict, not the search's)
    {"model": "trainer.examples.resmlp:residual_mlp", "model_options": {"width": [0]}},
], "metric": "val_accuracy"}


@pytest.fixture
def settings_file(tmp_path) -> str:
    path = tmp_path / "pgtrain.yaml"
    path.write_text("allowed_sources: [public]\n"
                    "allowed_models: [mlp, xgboost, 'trainer.examples.resmlp:residual_mlp']\n"
                    "search_limits: {max_trials: 4, concurrency: 2, max_total_world_size: 2}\n")
    return str(path)


def test_a_search_dag_run_commits_the_best_of_four_mapped_trials(airflow_env, db_url, settings_file):
    with psycopg.connect(db_url, autocommit=True) as conn:
        make_mixed_table(conn, 600)
    conf = mixed_params(model_name="penguins-search", world_size=1, batch_size=32, validation_fraction=0.2,
                        test_fraction=0.2, search=SEARCH)
    dags_test(airflow_env, db_url, settings_file, conf)
    with psycopg.connect(db_url, autocommit=True) as conn:
        (search_run, dag_run_id), = conn.execute(
            "SELECT run_id, dag_run_id FROM pgtrain.training_runs WHERE config->'search' <> 'null'::jsonb").fetchall()
        runs = trials.trial_runs(conn, search_run)
        assert len(runs) == 4
        assert own_plan_rows(conn, runs) == 0  # one plan for all trials: the search run's, read by each
        for run_id in runs:
            assert plan_rows(conn, run_id) == plan_rows(conn, search_run)
        ledger = trials.ledger(conn, search_run)
        assert [t["params"]["model"] for t in ledger] == ["mlp", "mlp", "xgboost",
                                                          "trainer.examples.resmlp:residual_mlp"]
        assert ledger[3]["status"] == "refused" and "factory raised" in ledger[3]["status_reason"]
        best = max(ledger[:3], key=lambda t: (t["metrics"]["val_accuracy"], -t["trial"]))
        assert [t["status"] for t in ledger[:3]] == ["committed" if t is best else "trained" for t in ledger[:3]]
        assert all(t["curve"] and t["seconds"] > 0 for t in ledger[:3])
        assert conn.execute("SELECT count(DISTINCT run_id) FROM pgtrain.staged_parameters").fetchone() == (0,)
        version_run, metrics = conn.execute(
            "SELECT v.run_id, v.metrics FROM pgtrain.model_versions v JOIN pgtrain.model_heads h "
            "USING (model_name, version) WHERE v.model_name = 'penguins-search'").fetchone()
        assert version_run == best["run_id"] and metrics["figures_from"] == "test"
        choice = trials.recorded_choice(conn, search_run)
        assert choice.run_id == best["run_id"] and "trial 4 refused" in choice.explanation
        summary = record.get_run(conn, search_run)
        assert summary.status == "committed"
        stored, = conn.execute("SELECT summary FROM pgtrain.training_runs WHERE run_id = %s",
                               (search_run,)).fetchone()
        assert stored["run_id"] == best["run_id"] and len(stored["search"]["trials"]) == 4
    # Each trial a mapped task instance of train, with its own state in Airflow.
    states = subprocess.run([str(REPO / ".venv/bin/airflow"), "tasks", "states-for-dag-run", "pgtrain_training",
                             dag_run_id, "-o", "json"], env={**airflow_env, "AIRFLOW_CONN_PGTRAIN_DB": db_url},
                            capture_output=True, text=True, check=True)
    mapped = sorted((int(ti["map_index"]), ti["state"]) for ti in json.loads(states.stdout)
                    if ti["task_id"] == "train")
    assert mapped == [(0, "success"), (1, "success"), (2, "success"), (3, "failed")]
