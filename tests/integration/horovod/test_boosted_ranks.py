"""The boosted built-in (model: xgboost) on real Horovod ranks: 2 ranks grow the trees 1 process grows from the same
plan, categories and NULLs included; its figures are the registry's; a warm start adds trees; bad input is refused
before any rank starts."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from pgtrain.core.errors import ConfigError
from pgtrain.data import loader, manifest
from pgtrain.models.booster import BOOSTER, build
from pgtrain.runs import record
from pgtrain.store import model_store, tensors
from pgtrain.store.inference import load_predictor
from tests.support import make_mixed_table, mixed_params, planned_run, run_job

pytestmark = pytest.mark.horovod

BOOSTED_PARAMS = dict(model="xgboost", validation_fraction=0.2, seed=4, **mixed_params())


def every_input_row(conn: psycopg.Connection, run: record.Run) -> np.ndarray:
    """Every row of the run's plan as input rows, loaded as a rank loads its shard."""
    source = manifest.source_for(conn, run)
    rows = [loader.load_shard(conn, source, shard, run.input_dim, run.config.validation_fraction, run.config.seed)
            for shard in record.get_manifest(conn, run.run_id)]
    return np.concatenate([r.features for r in rows])


def staged_model(conn: psycopg.Connection, run: record.Run):
    model = build(run.input_dim, run.num_classes or run.output_dim, run.config.model_options_for_build,
                  run.encoding, run.config.task)
    model.load_state_dict({BOOSTER: __import__("torch").from_numpy(tensors.read_staged(conn, run.run_id)[BOOSTER])})
    return model


def test_two_ranks_grow_the_trees_one_process_grows(autocommit, db_url):
    """Categories (native), NULLs (missing), a text label: 2 ranks vs 1 process on the same rows and split. Every
    feature here has fewer distinct values than max_bin, so the ranks' merged quantile sketch is the single
    process's: the trees are the same, up to float summation order in the histograms."""
    make_mixed_table(autocommit, 600)
    params = dict(BOOSTED_PARAMS, early_stopping_patience=0, model_options={"n_estimators": 40, "max_depth": 4})
    one = planned_run(autocommit, "one", world_size=1, model_name="penguins-1", **{
        k: v for k, v in params.items() if k != "model_name"})
    two = planned_run(autocommit, "two", world_size=2, model_name="penguins-2", **{
        k: v for k, v in params.items() if k != "model_name"})
    assert any(c["missing"] for c in one.encoding["columns"])
    for run in (one, two):
        lines = run_job(run, db_url)
        assert record.get_run(autocommit, run.run_id).status == "trained", "\n".join(lines[-30:])
    x = every_input_row(autocommit, one)
    p1 = staged_model(autocommit, one)(__import__("torch").from_numpy(x)).softmax(1).numpy()
    p2 = staged_model(autocommit, two)(__import__("torch").from_numpy(x)).softmax(1).numpy()
    assert p1.shape == (600, 3)
    difference = np.abs(p1 - p2).max()
    assert difference < 1e-4, difference  # measured: 0 to ~1e-6
    assert (p1.argmax(1) == p2.argmax(1)).all()
    m1, m2 = (record.epoch_metrics(autocommit, r.run_id) for r in (one, two))
    assert len(m1) == len(m2) == 40  # one row per boosting round: the models page's curves
    assert m1[-1]["val_accuracy"] == pytest.approx(m2[-1]["val_accuracy"], abs=1e-9)
    assert m1[-1]["val_f1_macro"] is not None and m1[-1]["val_accuracy"] > 0.6  # the registry's figures; chance 1/3


def test_early_stopping_keeps_the_best_round_and_a_warm_start_adds_trees(autocommit, db_url):
    make_mixed_table(autocommit, 400)
    first = planned_run(autocommit, "first", world_size=2, early_stopping_patience=1,
                        model_options={"n_estimators": 200, "early_stopping_rounds": 5}, **BOOSTED_PARAMS)
    run_job(first, db_url)
    epochs = record.epoch_metrics(autocommit, first.run_id)
    best = epochs[-1]["best_epoch"]
    assert len(epochs) < 200 and best == len(epochs) - 5  # stopped 5 rounds after its best
    kept = record.kept_epoch(epochs)
    assert kept["epoch"] == best and kept["val_roc_auc"] is not None and kept["confusion_matrix"]
    result = model_store.commit_run(autocommit, first.run_id)
    trees = len(staged_model_of_version(autocommit, "penguins", result.version).xgb.get_dump())
    second = planned_run(autocommit, "second", world_size=2, init_from="head", early_stopping_patience=0,
                         model_options={"n_estimators": 3}, **BOOSTED_PARAMS)
    run_job(second, db_url)
    assert record.get_run(autocommit, second.run_id).init_version == result.version
    assert len(staged_model(autocommit, second).xgb.get_dump()) == trees + 3 * 3  # 3 rounds, a tree per class
    # a warm start that stops early: its best round counts this run's rounds, not the parent's too
    third = planned_run(autocommit, "third", world_size=2, init_from="head", early_stopping_patience=1,
                        model_options={"n_estimators": 200, "early_stopping_rounds": 5}, **BOOSTED_PARAMS)
    run_job(third, db_url)
    epochs = record.epoch_metrics(autocommit, third.run_id)
    best = epochs[-1]["best_epoch"]
    assert 1 <= best == len(epochs) - 5
    kept = record.kept_epoch(epochs)
    assert kept["epoch"] == best and kept["val_roc_auc"] is not None and kept["confusion_matrix"]


def staged_model_of_version(conn: psycopg.Connection, name: str, version: int):
    return load_predictor(conn, name, version).model


def test_bad_booster_options_are_refused_before_any_rank_starts(autocommit):
    make_mixed_table(autocommit, 50)
    with pytest.raises(ConfigError, match="unknown option 'depth'.*max_depth"):
        planned_run(autocommit, model_options={"depth": 3}, **BOOSTED_PARAMS)
    with pytest.raises(ConfigError, match="early_stopping_metric='val_f1_macro' cannot be followed"):
        planned_run(autocommit, early_stopping_metric="val_f1_macro", **BOOSTED_PARAMS)
