"""The models file: validation of each entry on its own, and one DAG per valid entry in a real DagBag.
(A model's DAG run end to end: tests/integration/horovod/test_model_dags.py.)"""

from __future__ import annotations

import textwrap

import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk.exceptions import ParamValidationError

from pgtrain.config.model_entries import (
    FIXED_PARAMS,
    MODELS_ENV,
    find_entry,
    load_entries,
    model_owners,
)
from pgtrain.config.params import TrainingConfig
from pgtrain.config.settings import AuthorSettings
from pgtrain.core.errors import ConfigError
from tests.conftest import REPO

SHIPPED_MODELS_FILE = REPO / "dags" / "models.yaml"

TASK_ORDER = ["provision_tables", "plan_run", "compute_shards", "train", "commit_parameters", "report"]
GOOD = """
  - name: {name}
    source: {{table: public.samples, key_column: id, features_column: features, label_column: label}}
    schedule: {schedule}
    params: {{epochs: 2, world_size: 1}}
"""


def models_file(tmp_path, *entries: str):
    path = tmp_path / "models.yaml"
    path.write_text("models:\n" + "".join(textwrap.dedent(e).strip("\n") + "\n" for e in entries))
    return path


def good(name: str, schedule: str = "{cron: '@daily'}") -> str:
    return GOOD.format(name=name, schedule=schedule).strip("\n")


def test_the_default_file_schedules_the_digits_model_of_the_demo():
    entries, errors = load_entries(SHIPPED_MODELS_FILE)
    assert errors == []
    digits = find_entry("digits-mlp", SHIPPED_MODELS_FILE)
    demo = TrainingConfig()  # what `make demo` trained before it ran this entry's DAG
    config = TrainingConfig.from_mapping({**digits.params, **digits.fixed_params(digits.settings(AuthorSettings()))})
    for name in ("model_name", "source_table", "key_column", "array_features_column", "label_column", "task",
                 "hidden_sizes", "launcher"):
        assert getattr(config, name) == getattr(demo, name), name
    assert config.world_size == 2  # the demo shows the distributed path (the default is one rank)
    assert digits.cron == "@daily" and digits.min_new_rows == 500
    assert digits.quality_gate["max_accuracy_drop"] is not None  # the gate is on


def test_the_env_var_names_another_file(tmp_path, monkeypatch):
    path = models_file(tmp_path, good("other"))
    monkeypatch.setenv(MODELS_ENV, str(path))
    assert [e.name for e in load_entries(default=SHIPPED_MODELS_FILE)[0]] == ["other"]


def test_a_missing_default_file_means_no_models_but_a_named_one_is_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv(MODELS_ENV, raising=False)
    assert load_entries(default=tmp_path / "models.yaml") == ([], [])
    monkeypatch.setenv(MODELS_ENV, str(tmp_path / "models.yaml"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_entries(default=SHIPPED_MODELS_FILE)


def test_the_quality_gate_is_on_unless_an_entry_turns_it_off(tmp_path):
    path = models_file(tmp_path, good("gated"), good("ungated") + "\n    quality_gate: {max_accuracy_drop: null}")
    gated, ungated = load_entries(path)[0]
    assert gated.quality_gate == {"max_accuracy_drop": 0.0, "max_rmse_rise": 0.0}
    assert ungated.quality_gate["max_accuracy_drop"] is None


def test_an_entrys_category_rules_go_over_the_settings_files_and_add_hashed_columns(tmp_path):
    path = models_file(tmp_path, good("private") + "\n    categories: {max_clear_levels: 0, hashed_columns: [ssn]}")
    (entry,), _ = load_entries(path)
    base = AuthorSettings(categories={"max_categories": 50, "max_clear_levels": 10, "hashed_columns": ["email"]})
    assert entry.settings(base).category_rules() == {"max_categories": 50, "min_category_count": 1,
                                                     "hashed_columns": ["email", "ssn"], "max_clear_levels": 0,
                                                     "max_level_length": 64}


def test_an_entry_may_gate_on_any_metric_of_its_task(tmp_path):
    gate = "\n    quality_gate: {metric: val_rmse, max_drop: 0.5, floor: 3}"
    path = models_file(tmp_path, good("houses").replace("epochs: 2", "task: regression") + gate)
    [entry], errors = load_entries(path)
    assert errors == []
    assert entry.quality_gate == {"max_accuracy_drop": 0.0, "max_rmse_rise": 0.0, "metric": "val_rmse",
                                  "max_drop": 0.5, "floor": 3}


@pytest.mark.parametrize("entry, field, words", [
    (good("a") + "\n    colour: red", "entry", "'colour' was unexpected"),
    (good("a").replace("epochs: 2", "epochs: two"), "params.epochs", "'two' is not of type 'integer'"),
    (good("a").replace("epochs: 2", "epoch: 2"), "params", "did you mean 'epochs'"),
    (good("a").replace("epochs: 2", "model_name: other"), "params.model_name", "fixed by the entry"),
    (good("a", "{}"), "schedule", "give cron, min_new_rows, or both"),
    (good("a", "{min_new_rows: 0}"), "schedule.min_new_rows", "less than the minimum of 1"),
    (good("a", "{cron: 'every day'}"), "schedule.cron", "is not a cron expression"),
    (good("a") + "\n    kubernetes: {gpus_per_worker: many}", "kubernetes.gpus_per_worker", "not of type"),
    (good("a") + "\n    launcher: slurm", "launcher", "is not one of"),
    (good("a").replace("label_column: label", "label: label"), "source", "'label_column' is a required"),
    (good("bad name!"), "name", "does not match"),
    (good("a").replace("table: public.samples", "table: samples"), "source.table", "must be schema-qualified"),
    (good("a") + "\n    quality_gate: {metric: val_auc}", "quality_gate.metric", "is not one of"),
    (good("a") + "\n    quality_gate: {max_drop: 0.01}", "quality_gate.max_drop", "needs metric"),
    (good("a") + "\n    intra_op_threads: 0", "intra_op_threads", "less than the minimum of 1"),
    (good("a").replace("epochs: 2", "intra_op_threads: 2"), "params.intra_op_threads",
     "not a training param: set it on the entry itself"),
    (good("a").replace("epochs: 2", "task: regression") + "\n    quality_gate: {metric: val_roc_auc, max_drop: 0.01}",
     "quality_gate.metric", "val_roc_auc is a classification metric, and the run's task is regression"),
])
def test_a_bad_entry_names_the_file_the_entry_and_the_field(tmp_path, entry, field, words):
    path = models_file(tmp_path, good("fine"), entry)
    entries, errors = load_entries(path)
    assert [e.name for e in entries] == ["fine"]
    assert len(errors) == 1
    message = str(errors[0])
    assert message.startswith(f"{path}: models[1]")
    assert f"{field}: " in message and words in message, message


def test_duplicate_names_are_errors_and_the_first_entry_stays(tmp_path):
    path = models_file(tmp_path, good("twin"), good("twin", "{min_new_rows: 10}"))
    entries, errors = load_entries(path)
    assert [(e.name, e.cron) for e in entries] == [("twin", "@daily")]
    assert "models[1] (name 'twin'): name: duplicate model name 'twin', already used by models[0]" in str(errors[0])


def test_every_model_of_the_file_is_owned_by_its_dag_even_a_bad_entry(tmp_path):
    from pgtrain.data.policy import check_unowned

    path = models_file(tmp_path, good("kept"), good("broken", schedule="{cron: 'not a cron'}"))
    owners = model_owners(path)
    assert owners == {"kept": "pgtrain_model_kept", "broken": "pgtrain_model_broken"}
    with pytest.raises(ConfigError, match="model 'broken' is trained by its own DAG pgtrain_model_broken"):
        check_unowned("broken", owners)
    check_unowned("adhoc-model", owners)  # any other name is the generic DAG's to train
    (tmp_path / "models.yaml").write_text("not: [a models list")
    with pytest.raises(ConfigError, match="until the models file is fixed, ad-hoc runs cannot tell"):
        model_owners(path)  # fails closed: a typo in the file must not open its models to ad-hoc runs


def test_a_file_that_is_not_a_models_list_is_refused_whole(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("model:\n  - name: x\n")
    with pytest.raises(ConfigError, match="models.yaml: .*'models' is a required property"):
        load_entries(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_entries(tmp_path / "missing.yaml")


@pytest.fixture(scope="module")
def mixed_bag(tmp_path_factory):
    """A real DagBag of the dags folder with a models file holding good and bad entries."""
    path = models_file(tmp_path_factory.mktemp("models"),
                       good("cron-only"), good("rows-only", "{min_new_rows: 100, poll_seconds: 5}"),
                       good("both", "{cron: '0 3 * * *', min_new_rows: 100}"),
                       good("broken").replace("epochs: 2", "epochs: 0"), good("both"))
    with pytest.MonkeyPatch.context() as patch:  # only while the DagBag parses the folder
        patch.setenv(MODELS_ENV, str(path))
        bag = DagBag(dag_folder=str(REPO / "dags"))
    return bag, path


def test_bad_entries_are_one_import_error_and_the_good_entries_load(mixed_bag):
    bag, path = mixed_bag
    assert {"pgtrain_model_cron-only", "pgtrain_model_rows-only", "pgtrain_model_both", "pgtrain_training"} <= set(
        bag.dags)
    assert "pgtrain_model_broken" not in bag.dags
    [(where, error)] = bag.import_errors.items()
    assert where.endswith("dags/pgtrain_models_check.py")
    assert f"{path}: models[3] (name 'broken'): params.epochs: 0 is less than the minimum of 1" in error
    assert f"{path}: models[4] (name 'both'): name: duplicate model name 'both'" in error


def test_the_models_file_next_to_the_dag_files_is_checked_without_any_env_var(tmp_path, monkeypatch):
    """The shipped layout: dags/models.yaml beside the DAG files, no $PGTRAIN_MODELS. A bad entry there is the
    checker file's import error, the good entries' DAGs load."""
    import shutil

    monkeypatch.delenv(MODELS_ENV, raising=False)
    monkeypatch.delenv("PGTRAIN_SETTINGS", raising=False)
    folder = tmp_path / "dags"
    shutil.copytree(REPO / "dags", folder)
    models_file(folder, good("kept"), good("broken").replace("epochs: 2", "epochs: 0"))
    bag = DagBag(dag_folder=str(folder))
    assert "pgtrain_model_kept" in bag.dags and "pgtrain_model_broken" not in bag.dags
    [(where, error)] = bag.import_errors.items()
    assert where.endswith("pgtrain_models_check.py") and "models[1] (name 'broken'): params.epochs" in error


def test_each_entry_has_its_schedule(mixed_bag):
    from airflow.sdk import AssetOrTimeSchedule

    from pgtrain.airflow.dag.timetable import NextTickCronTimetable

    bag, _ = mixed_bag
    assert bag.dags["pgtrain_model_cron-only"].schedule == NextTickCronTimetable("@daily", timezone="UTC")
    rows = bag.dags["pgtrain_model_rows-only"].timetable.asset_condition
    [watcher] = rows.watchers
    assert watcher.trigger.serialize()[1] | {} == {
        "model_name": "rows-only", "source_table": "public.samples", "key_column": "id", "min_new_rows": 100,
        "poll_seconds": 5, "conn_id": "pgtrain_db", "max_backoff_seconds": 60.0, "statement_timeout_ms": 60000}
    both = bag.dags["pgtrain_model_both"].schedule
    assert isinstance(both, AssetOrTimeSchedule)
    assert both.asset_condition.uri == "pgtrain://pgtrain_db/both/new-rows"
    assert both.timetable == NextTickCronTimetable("0 3 * * *", timezone="UTC")


def test_every_generated_dag_runs_the_designed_tasks_with_the_entry_fixed(mixed_bag):
    bag, _ = mixed_bag
    for dag_id in ("pgtrain_model_cron-only", "pgtrain_model_rows-only", "pgtrain_model_both"):
        dag = bag.dags[dag_id]
        assert {t.task_id for t in dag.tasks} == set(TASK_ORDER)
        for earlier, later in zip(TASK_ORDER, TASK_ORDER[1:], strict=False):
            assert earlier in dag.get_task(later).get_flat_relative_ids(upstream=True), (dag_id, earlier, later)
        assert not set(FIXED_PARAMS) & set(dag.params), "the model, its source and launcher are not params"
        assert dag.params["epochs"] == 2 and dag.params["world_size"] == 1  # the entry's defaults
        dag.params.validate()
        with pytest.raises(ParamValidationError):
            dag.params.get_param("epochs").resolve(0)
        assert dag.catchup is False and dag.max_active_runs == 1
