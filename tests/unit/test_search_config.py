"""The search block (pgtrain.config.search): the trials a grid or a seeded random search asks for, the author's caps,
and every bad block refused with a message naming the field and what to change, before anything trains."""

from __future__ import annotations

import pytest

from pgtrain.config.model_entries import parse_entry
from pgtrain.config.params import TrainingConfig
from pgtrain.config.search import SearchLimits, plan_search
from pgtrain.config.settings import AuthorSettings
from pgtrain.core.errors import ConfigError
from pgtrain.launch.capacity import check_launch

BOTH = ("mlp", "xgboost")
LIMITS = SearchLimits(max_trials=8, concurrency=2, max_total_world_size=4)
GRID = {"candidates": [{"model": "mlp", "params": {"hidden_sizes": [[16], [32, 16]], "dropout": [0.0, 0.1]}},
                       {"model": "xgboost", "model_options": {"max_depth": [3, 6]}}]}


def test_a_grid_is_every_combination_in_order_over_the_run_s_params():
    search = plan_search(GRID, {"task": "classification"}, LIMITS, BOTH)
    assert [t.params for t in search.trials] == [
        {"model": "mlp", "hidden_sizes": [16], "dropout": 0.0}, {"model": "mlp", "hidden_sizes": [16], "dropout": 0.1},
        {"model": "mlp", "hidden_sizes": [32, 16], "dropout": 0.0},
        {"model": "mlp", "hidden_sizes": [32, 16], "dropout": 0.1},
        {"model": "xgboost", "model_options": {"max_depth": 3}},
        {"model": "xgboost", "model_options": {"max_depth": 6}}]
    assert [t.number for t in search.trials] == [1, 2, 3, 4, 5, 6]
    # the metric: the run's early stopping metric unless the block names one; its direction the registry's
    assert (search.metric, search.higher_is_better) == ("val_loss", False)
    assert plan_search({**GRID, "trials": 2, "metric": "val_roc_auc"}, {}, LIMITS, BOTH).higher_is_better
    assert len(plan_search({**GRID, "trials": 2}, {}, LIMITS, BOTH).trials) == 2


def test_a_random_search_is_seeded_and_draws_within_its_ranges():
    block = {"strategy": "random", "seed": 7, "trials": 6, "candidates": [
        {"model": "mlp", "params": {"learning_rate": {"low": 0.001, "high": 0.1, "log": True}}},
        {"model": "xgboost", "model_options": {"max_depth": {"low": 2, "high": 8, "integer": True}}}]}
    first = plan_search(block, {}, LIMITS, BOTH)
    assert first == plan_search(block, {}, LIMITS, BOTH)  # the same seed, the same trials
    assert first != plan_search({**block, "seed": 8}, {}, LIMITS, BOTH)
    assert [t.params["model"] for t in first.trials] == ["mlp", "xgboost"] * 3
    assert all(0.001 <= t.params["learning_rate"] <= 0.1 for t in first.trials[::2])
    assert all(isinstance(d := t.params["model_options"]["max_depth"], int) and 2 <= d <= 8
               for t in first.trials[1::2])


@pytest.mark.parametrize(("block", "base", "limits", "message"), [
    (GRID, {}, None, "allows no search (set search_limits"),
    (GRID, {}, SearchLimits(max_trials=4),
     "6 trials, and the DAG's author allows at most 4 (search_limits.max_trials)"),
    (GRID, {"world_size": 3}, LIMITS, "2 trials at once of 3 ranks each need 6 ranks, and the DAG's author allows 4"),
    (GRID, {"world_size": 3}, SearchLimits(max_trials=4, concurrency=2, max_total_world_size=4),
     "allows at most 4 (search_limits.max_trials): ask for fewer; world_size: 2 trials at once"),  # both at once
    ({"candidates": [{"model": "mlp", "params": {"world_size": [1, 2]}}]}, {}, LIMITS,
     "candidates[0].params.world_size: the plan's or the author's"),
    # the split is the plan's: a trial with its own seed or fractions would count other rows than the manifest's
    ({"candidates": [{"model": "mlp", "params": {"seed": [1, 2]}}]}, {}, LIMITS,
     "candidates[0].params.seed: the plan's or the author's, the same for every trial; set it outside the search"),
    ({"candidates": [{"model": "mlp", "params": {"validation_fraction": [0.2]}}]}, {}, LIMITS,
     "candidates[0].params.validation_fraction: the plan's"),
    ({"candidates": [{"model": "mlp", "params": {"max_clear_levels": [10]}}]}, {}, LIMITS,
     "candidates[0].params.max_clear_levels: the plan's"),
    ({"candidates": [{"model": "mlp", "params": {"hiden_sizes": [[8]]}}]}, {}, LIMITS,
     "candidates[0].params.hiden_sizes: not a training param"),
    ({"candidates": [{"model": "lightgbm"}]}, {}, LIMITS, "'lightgbm' is not allowed by the DAG's author"),
    ({"candidates": [{"model": "mlp", "params": {"dropout": {"low": 0, "high": 0.5}}}]}, {}, LIMITS,
     "a range needs strategy: random"),
    ({"strategy": "random", "candidates": [{"model": "mlp", "params": {"learning_rate": {"low": 0, "high": 1,
                                                                                         "log": True}}}]},
     {}, LIMITS, "a range needs low < high (and low > 0 with log: true)"),
    ({"candidates": [{"model": "mlp", "params": {"dropout": [2.0]}}]}, {}, LIMITS,
     "search trial 1 (model=mlp dropout=2.0): invalid training parameters: dropout"),
    ({"candidates": [{"model": "xgboost", "model_options": {"max_dept": [3]}}]}, {}, LIMITS,
     "search trial 1 (model=xgboost max_dept=3)"),
    ({"candidates": [{"model": "mlp"}], "metric": "val_rmse"}, {"task": "classification"}, LIMITS,
     "search.metric: val_rmse is a regression metric"),
    ({"candidates": []}, {}, LIMITS, "search.candidates: [] should be non-empty"),
    (GRID, {"test_fraction": 0}, LIMITS, "set test_fraction > 0 so the reported figure comes from rows no trial was "
                                         "chosen by"),
    # numeric_bins: each value's edges are planned once for every trial, so a list of values, of the mlp, a few
    ({"strategy": "random", "candidates": [{"model": "mlp", "params": {"numeric_bins": {"low": 8, "high": 64,
                                                                                         "integer": True}}}]},
     {}, LIMITS, "candidates[0].params.numeric_bins: a list of values (e.g. [0, 32]), not a range"),
    ({"candidates": [{"model": "xgboost", "params": {"numeric_bins": [0, 32]}}]}, {}, LIMITS,
     "candidates[0].params.numeric_bins: quantile bins are the built-in mlp's input encoding; xgboost reads"),
    ({"candidates": [{"model": "mlp", "params": {"numeric_bins": [0, 8, 16, 24, 32, 64]}}]}, {}, LIMITS,
     "numeric_bins: the candidates ask for 5 bin counts ([8, 16, 24, 32, 64]), and one plan records the quantile "
     "edges of at most 4: ask for fewer"),
    ({"candidates": [{"model": "mlp", "params": {"numeric_bins": [0, 1000]}}]}, {}, LIMITS,
     "search trial 2 (model=mlp numeric_bins=1000): invalid training parameters: numeric_bins"),
])
def test_a_bad_search_is_refused_naming_the_field(block, base, limits, message):
    with pytest.raises(ConfigError) as refused:
        plan_search(block, base, limits, BOTH)
    assert message in str(refused.value)


def test_a_search_varies_numeric_bins_and_its_plan_computes_the_edges_of_every_asked_value():
    from pgtrain.config.bins import bin_counts

    block = {"candidates": [{"model": "mlp", "params": {"numeric_bins": [0, 32, 8]}}, {"model": "mlp"},
                            {"model": "xgboost"}]}
    search = plan_search(block, {"numeric_bins": 16}, LIMITS, BOTH)
    assert [t.params.get("numeric_bins") for t in search.trials] == [0, 32, 8, None, None]
    # the mlp candidate without the knob trains with the run's 16; xgboost reads standardized values
    assert bin_counts(TrainingConfig.from_mapping({"numeric_bins": 16, "search": block})) == (8, 16, 32)
    assert bin_counts(TrainingConfig.from_mapping({"search": block})) == (8, 32)
    assert bin_counts(TrainingConfig.from_mapping({"model": "xgboost", "numeric_bins": 16})) == ()
    assert bin_counts(TrainingConfig.from_mapping({"search": {"candidates": [{"model": "mlp"}]}})) == ()


def test_plan_run_s_launch_check_refuses_a_search_the_author_does_not_allow():
    config = TrainingConfig.from_mapping({"search": GRID})
    with pytest.raises(ConfigError, match="allows no search"):
        check_launch(config, AuthorSettings(allowed_models=BOTH))
    check_launch(config, AuthorSettings(allowed_models=BOTH, search_limits={"max_trials": 6}))


def test_a_models_file_entry_sets_the_search_and_its_caps():
    entry = parse_entry({"name": "m", "source": {"table": "public.t", "label_column": "y"},
                         "schedule": {"cron": "@daily"}, "params": {"search": GRID},
                         "search_limits": {"max_trials": 6, "concurrency": 2}})
    assert entry.params["search"] == GRID
    assert entry.settings(AuthorSettings()).search_limits == {"max_trials": 6, "concurrency": 2}
    with pytest.raises(ConfigError, match=r"params.search.candidates.0: .*'model_option' was unexpected"):
        parse_entry({"name": "m", "source": {"table": "public.t", "label_column": "y"},
                     "schedule": {"cron": "@daily"}, "params": {"search": {"candidates": [
                         {"model": "mlp", "model_option": {}}]}}})
    with pytest.raises(ConfigError, match=r"search_limits.*max_trials"):
        parse_entry({"name": "m", "source": {"table": "public.t", "label_column": "y"},
                     "schedule": {"cron": "@daily"}, "search_limits": {"concurrency": 2}})


def test_where_the_author_allows_a_search_the_train_task_is_mapped_over_the_trials(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    from tests.conftest import REPO

    settings = tmp_path / "pgtrain.yaml"
    settings.write_text("allowed_models: [mlp, xgboost]\nsearch_limits: {max_trials: 8, concurrency: 3}\n")
    monkeypatch.setenv("PGTRAIN_SETTINGS", str(settings))
    dag = DagBag(dag_folder=str(REPO / "dags" / "pgtrain_training.py")).dags["pgtrain_training"]
    train, commit, report = (dag.get_task(t) for t in ("train", "commit_parameters", "report_search"))
    assert type(train).__name__ == "MappedOperator" and train.upstream_task_ids == {"plan_trials"}
    assert train.partial_kwargs["max_active_tis_per_dagrun"] == 3  # the author's concurrency
    # the best is committed whatever became of the other trials, but not after a skipped run
    assert commit.trigger_rule == "all_done_min_one_success" and "train" in commit.upstream_task_ids
    assert "commit_parameters" in report.upstream_task_ids
    assert dag.get_task("plan_trials").upstream_task_ids == {"plan_run", "compute_shards"}


@pytest.mark.timeout(60)
def test_the_trials_cap_is_checked_before_any_trial_is_drawn():
    # too many for the schema: refused as the block parses, nothing drawn
    with pytest.raises(ConfigError, match=r"search.trials: 3000000 is greater than the maximum of 1000"):
        plan_search({"strategy": "random", "trials": 3_000_000, "candidates": [{"model": "mlp"}]}, {},
                    SearchLimits(max_trials=1000), BOTH)
    block = {"candidates": [{"model": "mlp", "params": {"dropout": [i / 10**7 for i in range(10**6)],
                                                        "learning_rate": [0.01, 0.001]}}]}
    with pytest.raises(ConfigError, match=r"2000000 trials, and the DAG's author allows at most 8"):
        plan_search(block, {}, LIMITS, BOTH)
    # a grid's first ``trials`` combinations are built, not the rest
    assert [t.params["learning_rate"] for t in plan_search({**block, "trials": 3}, {}, LIMITS, BOTH).trials] == [
        0.01, 0.001, 0.01]


def test_a_regression_search_chooses_by_val_rmse_unless_told_and_refuses_a_val_loss_of_mixed_scales():
    regression = {"task": "regression"}
    # val_loss: the mlp's on the standardized target, xgboost's in the target's units; val_rmse is both's
    assert plan_search(GRID, regression, LIMITS, BOTH).metric == "val_rmse"
    assert plan_search(GRID, {**regression, "early_stopping_metric": "val_mae"}, LIMITS, BOTH).metric == "val_mae"
    assert plan_search(GRID, {"task": "classification"}, LIMITS, BOTH).metric == "val_loss"
    mlps = {"candidates": [{"model": "mlp", "params": {"dropout": [0.0, 0.1]}}], "metric": "val_loss"}
    assert plan_search(mlps, regression, LIMITS, BOTH).metric == "val_loss"  # one scale: allowed
    for block in ({**GRID, "metric": "val_loss"},
                  {**mlps, "candidates": [{"model": "mlp", "params": {"standardize_target": [True, False]}}]}):
        with pytest.raises(ConfigError, match="val_loss is not comparable across these trials.*val_rmse or val_r2"):
            plan_search(block, regression, LIMITS, BOTH)


def test_a_models_file_entry_with_a_search_and_no_search_limits_anywhere_is_a_bad_entry():
    raw = {"name": "m", "source": {"table": "public.t", "label_column": "y"}, "schedule": {"cron": "@daily"},
           "params": {"search": GRID}}
    with pytest.raises(ConfigError, match=r"params.search: the entry's author allows no search .*set search_limits"):
        parse_entry(raw)
    assert parse_entry(raw, {"max_trials": 6}).params["search"] == GRID  # the settings file's caps
    assert parse_entry({**raw, "search_limits": {"max_trials": 6}}).params["search"] == GRID
