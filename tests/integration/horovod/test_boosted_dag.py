"""model: xgboost end to end on CPU: the training DAG (`airflow dags test`: plan, 2 real Horovod ranks, commit, report),
then `pgtrain-models predict --probabilities` and load_predictor, which score the raw rows as the booster does."""

from __future__ import annotations

import subprocess

import numpy as np
import psycopg
import pytest
import torch

from pgtrain.store.inference import load_model, load_predictor
from tests.conftest import REPO
from tests.integration.horovod.test_real_tables import dags_test
from tests.support import make_mixed_table, mixed_rows

pytestmark = [pytest.mark.airflow, pytest.mark.horovod]

COLUMNS = ("id", "island", "sex", "colour", "cut", "flagged", "body_mass", "bill", "seen", "species")


@pytest.fixture
def settings_file(tmp_path) -> str:
    path = tmp_path / "pgtrain.yaml"
    path.write_text("allowed_sources: [public]\nallowed_models: [mlp, xgboost]\n")
    return str(path)


def test_the_dag_trains_commits_and_scores_a_boosted_version(airflow_env, db_url, settings_file):
    with psycopg.connect(db_url, autocommit=True) as conn:
        make_mixed_table(conn, 900)
    dags_test(airflow_env, db_url, settings_file, {
        "source_table": "public.penguins", "feature_columns": "*", "label_column": "species", "model": "xgboost",
        "model_name": "penguins-boosted", "world_size": 2, "model_options": {"n_estimators": 300}})
    with psycopg.connect(db_url, autocommit=True) as conn:
        status, = conn.execute("SELECT status FROM pgtrain.training_runs").fetchone()
        version, metrics, spec = conn.execute(
            "SELECT version, metrics, spec FROM pgtrain.model_versions WHERE model_name = 'penguins-boosted'"
        ).fetchone()
        assert status == "committed" and spec["model"] == "xgboost" and spec["model_options"]["n_estimators"] == 300
        assert conn.execute("SELECT version FROM pgtrain.model_heads").fetchone() == (version,)
        assert metrics["val_accuracy"] > 0.6 and metrics["val_roc_auc"] is not None  # chance is 1/3
        subprocess.run([str(REPO / ".venv/bin/pgtrain-models"), "predict", "--model", "penguins-boosted",
                        "--source", "public.penguins", "--key-column", "id", "--into", "public.scored",
                        "--probabilities"],
                       env={**airflow_env, "PGTRAIN_DATABASE_URL": db_url}, check=True, capture_output=True)
        scored = conn.execute("SELECT s.id, s.prediction, s.probabilities FROM public.scored s ORDER BY s.id"
                              ).fetchall()
        rows = [dict(zip(COLUMNS, r, strict=True)) for r in mixed_rows(900)]
        predictor = load_predictor(conn, "penguins-boosted")
    assert len(scored) == 900 and {s[1] for s in scored} <= {"Adelie", "Chinstrap", "Gentoo"}  # the label's type
    assert predictor.predict(rows) == [s[1] for s in scored]  # a raw row scores as predict scored it
    probabilities = predictor.predict_proba(rows)
    assert np.allclose(probabilities, [s[2] for s in scored], atol=1e-6)
    assert np.allclose(probabilities.sum(1), 1.0, atol=1e-5)
    # The booster itself on the same input rows: what the version's module returns is its softmax.
    booster = predictor.model.xgb
    direct = booster.predict(predictor.model.matrix(predictor.inputs(rows)))
    assert np.allclose(probabilities, direct, atol=1e-5)
    assert isinstance(load_model(db_url, "penguins-boosted")(torch.from_numpy(predictor.inputs(rows[:5]))),
                      torch.Tensor)
