"""Tables shaped the way users have them, through the whole DAG (`airflow dags test`, 2 real Horovod ranks):
30 scalar columns with spaces in a mixed-case schema, a smallint label; a regression target. The committed
version must be as good as scikit-learn on the very same train/validation rows."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import psycopg
import pytest
from psycopg import sql

from dev import examples
from pgtrain.data import manifest
from pgtrain.runs import record
from tests.conftest import REPO
from tests.support import make_mixed_table

pytestmark = [pytest.mark.airflow, pytest.mark.horovod]


@pytest.fixture
def settings_file(tmp_path) -> str:
    """The author allows the example schemas (the default allows only public)."""
    path = tmp_path / "pgtrain.yaml"
    path.write_text('allowed_sources: [public, \'"Clinic"\']\nallowed_models: [mlp]\n')
    return str(path)


def dags_test(airflow_env: dict[str, str], db_url: str, settings: str, conf: dict) -> str:
    env = {**airflow_env, "AIRFLOW_CONN_PGTRAIN_DB": db_url, "PGTRAIN_SETTINGS": settings}
    result = subprocess.run([str(REPO / ".venv/bin/airflow"), "dags", "test", "pgtrain_training", "-c",
                             json.dumps(conf)], env=env, capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return output


def split_rows(conn: psycopg.Connection, model_name: str, columns: list[str], target: str
               ) -> tuple[dict[str, float], tuple[np.ndarray, ...]]:
    """The committed version's metrics, and the run's own training/validation rows (by pgtrain's split)."""
    run_id, metrics = conn.execute(
        "SELECT run_id, metrics FROM pgtrain.model_versions WHERE model_name = %s", (model_name,)).fetchone()
    run = record.get_run(conn, run_id)
    source = manifest.source_for(conn, run)
    from pgtrain.data.source.rows import is_held_out, is_validation

    config = run.config
    query = sql.SQL("SELECT {cols}, {target}, {is_val}, {held} FROM {rel} ORDER BY {key}").format(
        cols=sql.SQL(", ").join(map(sql.Identifier, columns)), target=sql.Identifier(target),
        is_val=is_validation(source, config.validation_fraction, config.seed),
        held=is_held_out(source, config.validation_fraction, config.test_fraction, config.seed), rel=source.relation,
        key=source.key)
    rows = conn.execute(query).fetchall()
    x = np.array([r[:-3] for r in rows], dtype=np.float64)
    y = np.array([r[-3] for r in rows], dtype=np.float64)
    val, held = (np.array([r[i] for r in rows], dtype=bool) for i in (-2, -1))
    return metrics, (x[~held], y[~held], x[val], y[val])


def test_breast_cancer_scalar_columns_match_logistic_regression(airflow_env, db_url, settings_file):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    with psycopg.connect(db_url, autocommit=True) as conn:
        examples.load_breast_cancer(conn)
        names = examples.breast_cancer()[0]
    conf = {"source_table": '"Clinic"."Biopsies"', "features_column": None, "feature_columns": names,
            "label_column": "diagnosis", "model_name": "biopsies", "world_size": 2, "epochs": 30,
            "batch_size": 16, "learning_rate": 0.01, "hidden_sizes": [16], "validation_fraction": 0.3}
    dags_test(airflow_env, db_url, settings_file, conf)

    with psycopg.connect(db_url) as conn:
        metrics, (x_train, y_train, x_val, y_val) = split_rows(conn, "biopsies", names, "diagnosis")
        recorded = conn.execute("SELECT spec FROM pgtrain.model_versions WHERE model_name = 'biopsies'").fetchone()[0]
    assert recorded["feature_columns"] == names  # which column is which input, in order
    baseline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000)).fit(x_train, y_train)
    sklearn_accuracy = baseline.score(x_val, y_val)
    assert len(y_val) > 100 and sklearn_accuracy > 0.9
    assert metrics["val_accuracy"] == pytest.approx(sklearn_accuracy, abs=0.02), (metrics, sklearn_accuracy)


def test_diabetes_regression_matches_ridge(airflow_env, db_url, settings_file):
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    with psycopg.connect(db_url, autocommit=True) as conn:
        examples.load_diabetes(conn)
        names = examples.diabetes()[0]
    conf = {"source_table": "public.diabetes", "features_column": None, "feature_columns": names,
            "label_column": "progression", "task": "regression", "model_name": "diabetes", "world_size": 2,
            "epochs": 40, "batch_size": 16, "learning_rate": 0.005, "hidden_sizes": [8],
            "validation_fraction": 0.3}
    dags_test(airflow_env, db_url, settings_file, conf)

    with psycopg.connect(db_url) as conn:
        metrics, (x_train, y_train, x_val, y_val) = split_rows(conn, "diabetes", names, "progression")
    ridge = make_pipeline(StandardScaler(), Ridge(alpha=1.0)).fit(x_train, y_train)
    ridge_r2 = r2_score(y_val, ridge.predict(x_val))
    assert ridge_r2 > 0.3
    assert metrics["val_r2"] == pytest.approx(ridge_r2, abs=0.05), (metrics, ridge_r2)
    assert metrics["val_rmse"] > 0 and "val_accuracy" not in metrics


def test_a_table_with_categories_nulls_and_a_text_label_trains_through_the_dag_on_one_and_two_ranks(
        airflow_env, db_url, settings_file):
    with psycopg.connect(db_url, autocommit=True) as conn:
        make_mixed_table(conn, 900)
    for ranks in (1, 2):
        dags_test(airflow_env, db_url, settings_file, {
            "source_table": "public.penguins", "feature_columns": "*", "label_column": "species",
            "model_name": f"penguins-{ranks}", "world_size": ranks, "epochs": 15, "hidden_sizes": [16]})
    with psycopg.connect(db_url, autocommit=True) as conn:
        specs = dict(conn.execute("SELECT model_name, spec FROM pgtrain.model_versions WHERE model_name LIKE "
                                  "'penguins-%' ORDER BY model_name").fetchall())
        one, two = specs["penguins-1"], specs["penguins-2"]
        assert one["encoding"] == two["encoding"] and one["input_dim"] == two["input_dim"] == 9  # same vocabularies
        assert one["feature_columns"] == ["island", "sex", "colour", "cut", "flagged", "body_mass", "bill", "seen"]
        subprocess.run([str(REPO / ".venv/bin/pgtrain-models"), "predict", "--model", "penguins-2", "--source",
                        "public.penguins", "--key-column", "id", "--into", "public.scored"],
                       env={**airflow_env, "PGTRAIN_DATABASE_URL": db_url}, check=True, capture_output=True)
        accuracy, labels = conn.execute(
            "SELECT avg((s.prediction = p.species)::int), array_agg(DISTINCT s.prediction) "
            "FROM public.scored s JOIN public.penguins p USING (id)").fetchone()
    assert set(labels) <= {"Adelie", "Chinstrap", "Gentoo"} and accuracy > 0.6  # text labels; chance is 1/3
