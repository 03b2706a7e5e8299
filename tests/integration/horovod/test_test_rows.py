"""Figures no choice has seen, with real Horovod ranks: the version's test figures are its kept parameters on the
test rows (computed here independently: scikit-learn on load_predictor's predictions of exactly those rows, chosen
by the SQL docs/configuration.md gives), and neither the training nor the epoch early stopping keeps depends on
them."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from psycopg.rows import dict_row

from pgtrain.runs import record
from pgtrain.store import model_store
from pgtrain.store.inference import load_predictor
from tests.support import make_mixed_table, mixed_params, planned_run, run_job
from tests.unit.test_metrics import reference

SPLIT = {"validation_fraction": 0.2, "test_fraction": 0.25, "seed": 3}
# docs/configuration.md, "The split": the test rows.
TEST_ROWS = """SELECT * FROM public.penguins
               WHERE abs(mod(hashtextextended(id::text, %(seed)s), 1000000))
                     BETWEEN round(%(validation_fraction)s * 1000000)
                         AND round((%(validation_fraction)s + %(test_fraction)s) * 1000000) - 1
               ORDER BY id"""


def trained_version(conn: psycopg.Connection, db_url: str, dag_run: str) -> tuple[record.Run, dict]:
    run = planned_run(conn, dag_run, **mixed_params(world_size=2, epochs=12, hidden_sizes=[16], batch_size=16,
                                                    early_stopping_patience=3, learning_rate=0.02, **SPLIT))
    run_job(run, db_url)
    result = model_store.commit_run(conn, run.run_id, owner={"task_id": "test"})
    (metrics,) = conn.execute("SELECT metrics FROM pgtrain.model_versions WHERE model_name = %s AND version = %s",
                              (run.model_name, result.version)).fetchone()
    return run, {**metrics, "version": result.version}


def test_the_test_figures_are_the_kept_parameters_on_rows_that_chose_nothing(autocommit, db_url):
    make_mixed_table(autocommit, 900)
    run, metrics = trained_version(autocommit, db_url, "first")
    shards = record.get_manifest(autocommit, run.run_id)

    # Early stopping chose by the validation rows: the kept epoch is the best validation loss of the epochs trained.
    epochs = record.epoch_metrics(autocommit, run.run_id)
    best = min(epochs, key=lambda e: e["val_loss"])
    assert metrics["best_epoch"] == best["epoch"] and metrics["val_loss"] == pytest.approx(best["val_loss"])
    assert metrics["figures_from"] == "test"

    with autocommit.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(TEST_ROWS, SPLIT).fetchall()
    assert len(rows) == sum(s.test_count for s in shards) > 150
    predictor = load_predictor(autocommit, run.model_name, metrics["version"])
    probabilities = predictor.predict_proba(rows)
    truth = np.array([predictor.classes.index(r["species"]) for r in rows])
    expected = reference(probabilities.astype(np.float64), truth)
    assert len(set(probabilities.argmax(1))) > 1  # a real comparison: several classes predicted
    for name, value in expected.items():
        test_name = "test_" + name.removeprefix("val_")
        assert metrics[test_name] == pytest.approx(value, rel=1e-5, abs=1e-6), (test_name, metrics, expected)

    # The test rows chose nothing: with their labels scrambled, a new run trains the same parameters and keeps the
    # same epoch; only its test figures move.
    autocommit.execute("UPDATE public.penguins SET species = CASE species WHEN 'Adelie' THEN 'Gentoo' WHEN 'Gentoo' "
                       "THEN 'Chinstrap' ELSE 'Adelie' END WHERE id = ANY(%s)", ([r["id"] for r in rows],))
    again, scrambled = trained_version(autocommit, db_url, "second")
    assert [s.test_count for s in record.get_manifest(autocommit, again.run_id)] == [s.test_count for s in shards]
    assert (scrambled["best_epoch"], scrambled["epochs"]) == (metrics["best_epoch"], metrics["epochs"])
    assert scrambled["val_loss"] == pytest.approx(metrics["val_loss"], rel=1e-6)
    _, first = model_store.load_tensors(autocommit, run.model_name, metrics["version"])
    _, second = model_store.load_tensors(autocommit, again.model_name, scrambled["version"])
    for name, array in first.items():
        np.testing.assert_allclose(second[name], array, rtol=1e-6, atol=1e-7, err_msg=name)
    assert scrambled["test_accuracy"] < metrics["test_accuracy"] - 0.3


def test_a_run_planned_before_the_test_part_trains_on_its_planned_rows_and_reports_validation_figures(
        autocommit, db_url):
    """A manifest from before the test part (no test rows) whose config snapshot has no test_fraction (it reads
    as the default): the ranks split its rows as planned, and its version says its figures are the validation
    rows'."""
    make_mixed_table(autocommit, 300)
    run = planned_run(autocommit, "old", **mixed_params(world_size=2, epochs=2, hidden_sizes=[8], test_fraction=0))
    autocommit.execute("UPDATE pgtrain.training_runs SET config = config - 'test_fraction' WHERE run_id = %s",
                       (run.run_id,))
    assert record.get_run(autocommit, run.run_id).config.test_fraction == 0.1  # the new default
    run_job(run, db_url)
    metrics = model_store.commit_run(autocommit, run.run_id, owner={"task_id": "test"}).metrics
    assert metrics["figures_from"] == "validation" and not any(k.startswith("test_") for k in metrics)
    assert metrics["val_accuracy"] is not None
