"""The built-in's ensemble (issue 31, `ensemble_members`): a shared-weight ensemble of members, trained by real
ranks, committed, loaded and scored;
a regression's predictions stay within its training targets' range however far a row lies outside."""

from __future__ import annotations

import numpy as np
import pytest

from pgtrain.config.params import CLAMP_TARGET
from pgtrain.models.ensemble import EnsembleMLP
from pgtrain.store import model_store, tensors
from pgtrain.store.inference import load_predictor
from tests.integration.horovod.test_training import seed_regression
from tests.support import planned_run, run_job, seed_samples

pytestmark = pytest.mark.horovod
MEMBERS = 32  # TabM's k


def test_a_regression_ensemble_trains_loads_and_keeps_predictions_within_the_targets_range(
        autocommit, db_url):
    price = seed_regression(autocommit, rows=160, dim=4, seed=5)
    run = planned_run(autocommit, world_size=2, epochs=3, source_table="public.houses", label_column="price",
                      task="regression", model_name="houses", ensemble_members=MEMBERS)
    run_job(run, db_url)
    staged = tensors.read_staged(autocommit, run.run_id)
    version = model_store.commit_run(autocommit, run.run_id, owner={"task_id": "test"}).version

    spec = model_store.get_version(autocommit, "houses", version)["spec"]
    assert spec["model_options"]["members"] == MEMBERS and spec["model_options"][CLAMP_TARGET]
    # the bounds are training targets (the whole table's range contains them, and they are some row's price, as the
    # trainer reads it: float32)
    low, high = float(staged["target.low"][0]), float(staged["target.high"][0])
    read = price.astype(np.float32)
    assert read.min() <= low < high <= read.max() and low in read and high in read

    predictor = load_predictor(autocommit, "houses", version)
    assert isinstance(predictor.model.net, EnsembleMLP) and not predictor.model.training
    extreme = [{"features": [1e4, -1e4, 1e4, -1e4]}, {"features": [-1e4, 1e4, -1e4, 1e4]}]
    ordinary = [{"features": [0.0, 0.0, 0.0, 0.0]}]
    predicted = predictor.predict(extreme + ordinary)
    assert all(low <= p <= high for p in predicted)
    assert {predicted[0], predicted[1]} == {low, high}  # so far out, each lands on a bound: the clamp acted
    assert low < predicted[2] < high


def test_a_classification_ensemble_averages_its_members_probabilities(autocommit, db_url):
    seed_samples(autocommit, rows=200, dim=6, classes=3, seed=2)
    run = planned_run(autocommit, world_size=1, epochs=2, hidden_sizes=[8], model_name="clf",
                      ensemble_members=MEMBERS)
    run_job(run, db_url)
    version = model_store.commit_run(autocommit, run.run_id, owner={"task_id": "test"}).version
    predictor = load_predictor(autocommit, "clf", version)
    rows = [{"features": list(np.random.default_rng(i).normal(size=6))} for i in range(5)]

    import torch

    x = torch.tensor([r["features"] for r in rows], dtype=torch.float32)
    model = predictor.model
    model.train()  # every member's logits
    with torch.no_grad():
        members = torch.softmax(model.standardized(x), -1)
    model.eval()
    assert members.shape == (5, MEMBERS, 3)
    np.testing.assert_allclose(predictor.predict_proba(rows), members.mean(1).numpy(), atol=1e-5, rtol=0)


def test_a_regression_version_from_before_the_clamp_warm_starts_and_its_child_gets_the_training_range(
        autocommit, db_url):
    """A regression mlp committed before the clamp has no target.low / target.high: a run with init_from=head loads
    it (no layout refusal) and fills the bounds from its own training rows."""
    from pgtrain.models.network import build_model, state_layout
    from pgtrain.runs import record

    price = seed_regression(autocommit, rows=160, dim=4, seed=7)
    params = {"source_table": "public.houses", "label_column": "price", "task": "regression", "model_name": "old",
              "epochs": 2}
    run = planned_run(autocommit, "before-the-clamp", **params)
    options = {k: v for k, v in run.config.model_options_for_build.items() if k != CLAMP_TARGET}
    model = build_model("mlp", run.input_dim, run.output_dim, options, run.config.seed)
    assert "target.low" not in model.state_dict()
    record.set_model_layout(autocommit, run.run_id, state_layout(model))
    tensors.write_staged(autocommit, run.run_id, {n: t.numpy() for n, t in model.state_dict().items()})
    record.record_epoch(autocommit, run.run_id, 1, {"train_loss": 1.0, "val_loss": 1.0, "val_rmse": 50.0,
                                                    "seconds": 0.1})
    record.set_status(autocommit, run.run_id, "trained")
    assert model_store.commit_run(autocommit, run.run_id, owner={"task_id": "test"}).version == 1
    autocommit.execute("UPDATE pgtrain.model_versions SET spec = spec #- '{model_options,clamp_target}' "
                       "WHERE model_name = 'old'")  # as the release before the clamp wrote it

    warm = planned_run(autocommit, "warm", init_from="head", **params)
    lines = run_job(warm, db_url)
    assert any("warm start from version 1" in line for line in lines), lines[-20:]
    staged = tensors.read_staged(autocommit, warm.run_id)
    low, high = float(staged["target.low"][0]), float(staged["target.high"][0])
    read = price.astype(np.float32)
    assert read.min() <= low < high <= read.max() and low in read and high in read
