"""numeric_bins (issue 31) with real Horovod ranks: a version whose numeric inputs go through the quantile bins of its
planning snapshot scores a raw row as its ranks scored it (its recorded test figures, recomputed from
load_predictor's predictions of the test rows) and as ``predict`` scores it in the database."""

from __future__ import annotations

import numpy as np
import pytest
from psycopg.rows import dict_row

from pgtrain.models.piecewise import PiecewiseLinear
from pgtrain.store import model_store
from pgtrain.store.inference import load_predictor, predict
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
    predict(autocommit, run.model_name, version, "public.penguins", "id", "public.scored", probabilities=True)
    scored = dict((k, (p, q)) for k, p, q in autocommit.execute(
        "SELECT id, prediction, probabilities FROM public.scored"))
    assert [scored[r["id"]][0] for r in rows] == predictor.predict(rows)
    np.testing.assert_allclose([scored[r["id"]][1] for r in rows], probabilities, rtol=0, atol=1e-6)
