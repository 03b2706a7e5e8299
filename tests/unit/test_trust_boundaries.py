"""Who may choose what: a triggerer picks training knobs only; image, Secret, tables and models are the author's."""

from __future__ import annotations

import json
import subprocess

import psycopg
import pytest

from pgtrain.config.params import PARAMETERS, TrainingConfig, unknown_keys
from pgtrain.config.settings import AuthorSettings, load_settings
from pgtrain.core.errors import ConfigError, SourceError
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
        if "pattern" in schema:
            assert schema["pattern"].startswith("^") and schema["pattern"].endswith("$"), name


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


@pytest.fixture
def tables(conn: psycopg.Connection) -> psycopg.Connection:
    conn.autocommit = True
    conn.execute('CREATE SCHEMA "Clinic"; CREATE TABLE "Clinic"."Biopsies" (id bigint PRIMARY KEY)')
    conn.execute("CREATE SCHEMA crm; CREATE TABLE crm.users (id bigint PRIMARY KEY, password_hash text)")
    conn.execute("CREATE TABLE public.samples2 (id bigint PRIMARY KEY)")
    return conn


@pytest.mark.parametrize("table", ["pg_catalog.pg_authid", "pg_authid", "crm.users", '"crm"."users"',
                                   "information_schema.tables", "no_such_table", '"Clinic"."Biopsies"'])
def test_sources_outside_the_allow_list_are_refused_without_reading_them(tables, table):
    settings = AuthorSettings(allowed_sources=("public",))
    with pytest.raises(SourceError, match="not one of the sources this DAG may train on") as refused:
        policy.check_source(tables, table, settings)
    assert "password_hash" not in str(refused.value)


def test_a_search_path_cannot_route_around_the_allow_list(tables):
    tables.execute("SET search_path = crm, public")
    with pytest.raises(SourceError):
        policy.check_source(tables, "users", AuthorSettings(allowed_sources=("public",)))


def test_allowed_schemas_and_tables(tables):
    settings = AuthorSettings(allowed_sources=("public", '"Clinic"."Biopsies"'))
    assert policy.check_source(tables, "samples2", settings) == ("public", "samples2")
    assert policy.check_source(tables, '"Clinic"."Biopsies"', settings) == ("Clinic", "Biopsies")
    assert policy.check_source(tables, "public.samples2", AuthorSettings(allowed_sources=('"public"',)))


def test_models_outside_the_allow_list_are_refused():
    config = TrainingConfig.from_mapping({"model": "subprocess:run"})
    with pytest.raises(ConfigError, match="'subprocess:run' is not one of the models"):
        policy.check_model(config, AuthorSettings())


def test_the_shipped_settings_file_is_valid():
    settings = load_settings(REPO / "dags" / "pgtrain.yaml")
    assert "public" in settings.allowed_sources and "mlp" in settings.allowed_models
    assert settings.kubernetes["image"]


def _dags_test(airflow_env: dict[str, str], db_url: str, conf: dict) -> subprocess.CompletedProcess:
    env = {**airflow_env, "AIRFLOW_CONN_PGTRAIN_DB": db_url}
    return subprocess.run([str(REPO / ".venv/bin/airflow"), "dags", "test", "pgtrain_training", "-c",
                           json.dumps(conf)], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.airflow
def test_a_triggered_image_or_foreign_table_fails_plan_run_and_nothing_is_planned(airflow_env, db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA crm; CREATE TABLE crm.users (id bigint PRIMARY KEY, secret_column real[], "
                     "label int); INSERT INTO crm.users VALUES (424242, '{1,2}', 0), (434343, '{1,2}', 1)")
    image = _dags_test(airflow_env, db_url, {"k8s_image": "attacker/image:1", "epochs": 1})
    table = _dags_test(airflow_env, db_url, {"source_table": "crm.users", "key_column": "id",
                                             "features_column": "secret_column", "epochs": 1})
    image_out, table_out = image.stdout + image.stderr, table.stdout + table.stderr
    assert image.returncode != 0 and "'k8s_image' is not a param of this DAG" in image_out, image_out[-4000:]
    assert table.returncode != 0 and "not one of the sources this DAG may train on" in table_out, table_out[-4000:]
    assert "its columns are" not in table_out  # nothing about the table beyond its name
    assert "424242" not in table_out
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM pgtrain.training_runs").fetchone()[0] == 0


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


@pytest.mark.parametrize("key", ["max_accuracy_drop", "min_val_accuracy", "max_rmse_rise", "max_val_rmse"])
def test_the_quality_gate_is_the_authors_not_a_param(key):
    assert key not in PARAMETERS
    assert unknown_keys({key: 1.0}) and unknown_keys({key: 1.0})[0].startswith(f"'{key}' is not a param")


def test_admitting_a_run_pins_its_source_and_applies_the_authors_gate(tables):
    settings = AuthorSettings(allowed_sources=("public",), quality_gate={"max_accuracy_drop": 0.01,
                                                                         "min_val_accuracy": 0.5})
    tables.execute("SET search_path = public")
    admitted = policy.admit(tables, TrainingConfig.from_mapping({"source_table": "samples2"}), settings)
    assert admitted.source_table == '"public"."samples2"'  # a later search_path cannot route it elsewhere
    assert (admitted.max_accuracy_drop, admitted.min_val_accuracy) == (0.01, 0.5)
    assert TrainingConfig.from_mapping(admitted.to_dict()) == admitted  # the snapshot reads back as recorded


def test_world_size_is_bounded_by_the_author(tables):
    config = TrainingConfig.from_mapping({"source_table": "samples2", "world_size": 65, "launcher": "kubernetes"})
    with pytest.raises(ConfigError, match="world_size 65 is more than the 64 ranks"):
        policy.check_run(tables, config, AuthorSettings(max_world_size=64))


def test_init_from_must_match_whole():
    with pytest.raises(ConfigError, match="init_from"):
        TrainingConfig.from_mapping({"init_from": "5\n"})
