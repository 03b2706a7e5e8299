"""numeric_bins (issue 31) with real Horovod ranks: a version whose numeric inputs go through the quantile bins of its
planning snapshot scores a raw row as its ranks scored it (its recorded test figures, recomputed from
load_predictor's predictions of the test rows) and as ``predict`` scores it in the database."""

from __future__ import annotations

import numpy as np
import pytest
from psycopg.rows import dict_row

from pgtrain.config.settings import AuthorSettings
from pgtrain.models.piecewise import PiecewiseLinear
from pgtrain.planning import plan
from pgtrain.runs import record, trials
from pgtrain.store import model_store
from pgtrain.store.inference import load_predictor, predict
from pgtrain.store.search_commit import commit_search
from tests.integration.horovod.test_test_rows import TEST_ROWS
from tests.support import make_mixed_table, mixed_params, planned_run, run_job
from tests.unit.test_metrics import reference

pytestmark = pytest.mark.horovod
SPLIT = {"validation_fraction": 0.2, "test_fraction": 0.25, "seed": 3}


def test_a_binned_version_scores_a_raw_row_as_its_ranks_and_predict_do(autocommit, db_url):
    make_mixed_table(autocommit, 900)
    run = planned_run(autocommit, **mixed_params(world_size=2, epochs=6, hidden_sizes=[16], batch_size=16,
                                                 learning_rate=0.02, numeric_bins=8, **SPLIT))
    run_job(run, db_url)
    version = model_store.commit_run(autocommit, run.run_id, owner={"task_id": "test"}).version
    (metrics,) = autocommit.execute("SELECT metrics FROM pgtrain.model_versions WHERE model_name = %s AND version = %s",
                                    (run.model_name, version)).fetchone()

    predictor = load_predictor(autocommit, run.model_name, version)
    assert isinstance(predictor.model.normalizer.piecewise, PiecewiseLinear)  # the edges came with the version
    assert predictor.model.net[0].in_features > predictor.model.normalizer.numeric + 4  # bins, not 4 values
    scores_as_its_ranks_did(autocommit, run.model_name, version, metrics)


def test_a_search_over_numeric_bins_commits_a_trial_that_scores_as_its_ranks_did(autocommit, db_url):
    """One plan for mlp trials of numeric_bins 0 and 8 (issue 31 over issue 34): both train from it on real ranks,
    each with its own input (8 bins, or the standardized values); the committed one (the binned: the other is barely
    trained) records exactly its 8-bin edges and scores a raw row as its ranks did."""
    make_mixed_table(autocommit, 900)
    search = {"candidates": [{"model": "mlp", "params": {"numeric_bins": [0], "epochs": [1], "learning_rate": [1e-5]}},
                             {"model": "mlp", "params": {"numeric_bins": [8]}}], "metric": "val_accuracy"}
    run = planned_run(autocommit, **mixed_params(world_size=2, epochs=6, hidden_sizes=[16], batch_size=16,
                                                 learning_rate=0.02, model_name="binned-search", search=search,
                                                 **SPLIT))
    author = AuthorSettings(allowed_models=("mlp",), search_limits={"max_trials": 2, "max_total_world_size": 2})
    runs = plan.plan_trials(autocommit, run.run_id, author)
    for run_id in runs:
        run_job(record.get_run(autocommit, run_id), db_url)
    assert [t["status"] for t in trials.ledger(autocommit, run.run_id)] == ["trained", "trained"]
    widths = [int(autocommit.execute("SELECT (model_layout->'net.0.weight'->'shape'->>1) "
                                     "FROM pgtrain.training_runs WHERE run_id = %s", (r,)).fetchone()[0])
              for r in runs]
    assert widths[0] < widths[1]  # each trial's first layer is as wide as its own input: values, or their bins

    result, choice = commit_search(autocommit, run.run_id, owner={"task_id": "test"})
    assert choice.run_id == runs[1], choice.explanation
    spec, metrics = autocommit.execute("SELECT spec, metrics FROM pgtrain.model_versions "
                                       "WHERE model_name = 'binned-search' AND version = %s",
                                       (result.version,)).fetchone()
    assert spec["encoding"] == record.get_run(autocommit, runs[1]).encoding
    edges = {c["name"]: c.get("edges") for c in spec["encoding"]["columns"]}
    assert len(edges["body_mass"]) == 9 and all("bin_edges" not in c for c in spec["encoding"]["columns"])
    predictor = load_predictor(autocommit, "binned-search", result.version)
    assert isinstance(predictor.model.normalizer.piecewise, PiecewiseLinear)
    assert predictor.model.net[0].in_features == widths[1]
    scores_as_its_ranks_did(autocommit, "binned-search", result.version, metrics)


def scores_as_its_ranks_did(autocommit, model_name: str, version: int, metrics: dict) -> None:
    """The version's recorded test figures, recomputed from load_predictor's predictions of the test rows, and
    predict's scores in the database, row by row, those of load_predictor."""
    predictor = load_predictor(autocommit, model_name, version)

    # As the ranks scored the test rows: the version's recorded test figures, from load_predictor's probabilities.
    with autocommit.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(TEST_ROWS, SPLIT).fetchall()
    probabilities = predictor.predict_proba(rows)
    truth = np.array([predictor.classes.index(r["species"]) for r in rows])
    assert len(set(probabilities.argmax(1))) > 1  # a real comparison: several classes predicted
    for name, value in reference(probabilities.astype(np.float64), truth).items():
        recorded = metrics["test_" + name.removeprefix("val_")]
        assert recorded == pytest.approx(value, rel=1e-5, abs=1e-6), (name, metrics)

    # As predict scores them in the database: the same classes and probabilities, row by row.
    predict(autocommit, model_name, version, "public.penguins", "id", "public.scored", probabilities=True)
    scored = dict((k, (p, q)) for k, p, q in autocommit.execute(
        "SELECT id, prediction, probabilities FROM public.scored"))
    assert [scored[r["id"]][0] for r in rows] == predictor.predict(rows)
    np.testing.assert_allclose([scored[r["id"]][1] for r in rows], probabilities, rtol=0, atol=1e-6)
