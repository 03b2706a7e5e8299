"""Who may choose what: a triggerer picks training knobs only; image, Secret, tables and models are the author's.
(The allow-lists on a real PostgreSQL and under `airflow dags test`: tests/db/test_policy.py.)"""

from __future__ import annotations

import pytest

from pgtrain.config.params import END, PARAMETERS, TrainingConfig, unknown_keys
from pgtrain.config.settings import AuthorSettings, load_settings
from pgtrain.core.errors import ConfigError
from pgtrain.data import policy
from tests.conftest import REPO

CLUSTER_SETTINGS = ["k8s_image", "k8s_namespace", "k8s_database_secret", "k8s_database_secret_key",
                    "k8s_node_selector", "k8s_tolerations", "image", "namespace", "service_account_name"]


@pytest.mark.parametrize("key", CLUSTER_SETTINGS)
def test_a_conf_that_picks_where_the_job_runs_is_refused(key):
    with pytest.raises(ConfigError, match=rf"'{key}' is not a param of this DAG"):
        TrainingConfig.from_mapping({key: "attacker/image:1"})


def test_a_typo_names_the_closest_param():
    assert unknown_keys({"epoch": 3}) == ["'epoch' is not a param of this DAG; did you mean 'epochs'?"]
    # Equally close to two params: both are named, the one the user meant among them.
    [message] = unknown_keys({"feature_column": ["a"]})
    assert "'feature_columns'" in message and "'features_column'" in message, message


@pytest.mark.parametrize("name", ["digits-mlp\n", "digits-mlp\nDROP", "", "-leading-dash", "a" * 64])
def test_model_names_must_match_whole(name):
    with pytest.raises(ConfigError, match="model_name"):
        TrainingConfig.from_mapping({"model_name": name})


@pytest.mark.parametrize("reference", ["mlp\n", "os:system\n", "os.path", "trainer.model:build model"])
def test_model_references_must_match_whole(reference):
    with pytest.raises(ConfigError, match="model"):
        TrainingConfig.from_mapping({"model": reference})


def test_every_pattern_is_anchored_at_both_ends():
    for name, schema in PARAMETERS.items():
        for pattern in [s["pattern"] for s in [schema, *schema.get("anyOf", [])] if "pattern" in s]:
            assert pattern.startswith("^") and pattern.endswith(END) and not pattern.endswith("$"), name


@pytest.mark.parametrize(("name", "value"), [("model_name", "digits-mlp\n"), ("model", "mlp\n"),
                                             ("feature_columns", "*\n"), ("init_from", "5\n")])
def test_airflows_own_param_refuses_a_trailing_newline(name, value):
    """The trigger form's and the REST API's check (Airflow's Param, which searches the pattern), not only plan_run."""
    from airflow.sdk import Param

    from pgtrain.airflow.dag.params import dag_params

    param = dag_params()[name]
    assert isinstance(param, Param)
    with pytest.raises(Exception, match="does not match|is not valid"):
        param.resolve(value)
    param.resolve(value.rstrip("\n"))  # the same value without the newline is fine


@pytest.mark.parametrize("params, where", [
    ({"hidden_sizes": []}, "hidden_sizes"), ({"feature_columns": []}, "feature_columns"),
    ({"world_size": 0}, "world_size"), ({"task": "ranking"}, "task"), ({"init_from": "latest"}, "init_from"),
    ({"init_from": 0}, "init_from"), ({"checkpoint_every": -1}, "checkpoint_every"),
])
def test_params_are_checked_against_the_one_json_schema(params, where):
    with pytest.raises(ConfigError, match=where):
        TrainingConfig.from_mapping(params)


def test_init_from_takes_a_word_or_a_version():
    assert TrainingConfig.from_mapping({"init_from": "3"}).init_from == 3
    assert TrainingConfig.from_mapping({"init_from": 4}).init_version == 4
    assert TrainingConfig.from_mapping({"init_from": "head"}).init_version is None


def test_models_outside_the_allow_list_are_refused():
    config = TrainingConfig.from_mapping({"model": "subprocess:run"})
    with pytest.raises(ConfigError, match="'subprocess:run' is not one of the models"):
        policy.check_model(config, AuthorSettings())


def test_the_shipped_settings_file_is_valid():
    settings = load_settings(REPO / "dags" / "pgtrain.yaml")
    assert "public" in settings.allowed_sources and "mlp" in settings.allowed_models
    assert settings.kubernetes["image"]
    assert settings.category_rules() == {"max_categories": 1000, "min_category_count": 1, "hashed_columns": [],
                                         "max_clear_levels": 100, "max_level_length": 64}


def test_more_local_ranks_than_cpus_is_refused_while_planning():
    from pgtrain.launch import capacity

    config = TrainingConfig.from_mapping({"world_size": 1024, "launcher": "local"})
    with pytest.raises(ConfigError, match=r"world_size 1024 is more ranks than this machine's \d+ CPUs"):
        capacity.check_world_size(config)
    capacity.check_world_size(TrainingConfig.from_mapping({"world_size": 1024, "launcher": "kubernetes"}))


def test_an_mlp_too_big_for_this_machine_is_refused_while_planning():
    from pgtrain.launch import capacity

    config = TrainingConfig.from_mapping({"hidden_sizes": [65536, 65536], "world_size": 1})
    assert capacity.mlp_parameter_count(64, (65536, 65536), 10) > 4 * 10**9
    with pytest.raises(ConfigError, match=r"hidden_sizes \[65536, 65536\] make an mlp of 4,\d{3},\d{3},\d{3} param"):
        capacity.check_model_size(config, 64, 10)
    capacity.check_model_size(TrainingConfig.from_mapping({"hidden_sizes": [50]}), 64, 10)


def test_the_mlp_is_sized_by_the_width_its_first_layer_sees_not_the_input_rows(monkeypatch):
    """One category column is one column of an input row but one input per level in the mlp's first layer (as a
    value column with quantile bins is one per bin): the memory check counts those."""
    from pgtrain.launch import capacity

    monkeypatch.setattr(capacity, "available_bytes", lambda: 64 * 2**30)  # any machine: 64 GiB free
    config = TrainingConfig.from_mapping({"hidden_sizes": [16384], "world_size": 1})
    encoding = {"columns": [{"name": "city", "type": "text", "kind": "category",
                             "levels": [f"city {i}" for i in range(300_000)]}]}
    capacity.check_model_size(config, 1, 10)  # 1 input column: a small mlp
    with pytest.raises(ConfigError, match=r"hidden_sizes \[16384\] make an mlp of 4,9\d{2},\d{3},\d{3} param"):
        capacity.check_model_size(config, 1, 10, encoding)


@pytest.mark.parametrize("key", ["max_accuracy_drop", "min_val_accuracy", "max_rmse_rise", "max_val_rmse",
                                 "metric", "max_drop", "floor"])
def test_the_quality_gate_is_the_authors_not_a_param(key):
    assert key not in PARAMETERS
    assert unknown_keys({key: 1.0}) and unknown_keys({key: 1.0})[0].startswith(f"'{key}' is not a param")


@pytest.mark.parametrize("key", ["hashed_columns", "max_clear_levels", "max_level_length"])
def test_what_is_stored_in_clear_is_the_authors_not_a_param(key):
    assert key not in PARAMETERS
    assert unknown_keys({key: 1})[0].startswith(f"'{key}' is not a param")


def test_the_authors_category_rules_are_checked_when_the_settings_are_read(tmp_path):
    path = tmp_path / "pgtrain.yaml"
    path.write_text("categories: {max_categories: 20000, hashed_colums: [email]}\n")
    with pytest.raises(ConfigError, match=r"categories: Additional properties .*'hashed_colums'.*; "
                                          r"categories\.max_categories: 20000 is greater than the maximum of 10000"):
        load_settings(path)


def test_init_from_must_match_whole():
    with pytest.raises(ConfigError, match="init_from"):
        TrainingConfig.from_mapping({"init_from": "5\n"})
