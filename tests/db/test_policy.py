"""Who may choose what, on a real PostgreSQL: the author's allow-list of sources (no search_path routes around it),
the author's gate and rank limit applied when a run is admitted, and a triggered image or foreign table refused by
plan_run under `airflow dags test`. (The params and settings alone: tests/unit/test_trust_boundaries.py.)"""

from __future__ import annotations

import json
import subprocess

import psycopg
import pytest

from pgtrain.config.params import TrainingConfig
from pgtrain.config.settings import AuthorSettings
from pgtrain.core.errors import ConfigError, SourceError
from pgtrain.data import policy
from tests.conftest import REPO


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


def test_admitting_a_run_pins_its_source_and_applies_the_authors_gate(tables):
    settings = AuthorSettings(allowed_sources=("public",), quality_gate={"max_accuracy_drop": 0.01,
                                                                         "min_val_accuracy": 0.5})
    tables.execute("SET search_path = public")
    admitted = policy.admit(tables, TrainingConfig.from_mapping({"source_table": "samples2"}), settings)
    assert admitted.source_table == '"public"."samples2"'  # a later search_path cannot route it elsewhere
    assert (admitted.max_accuracy_drop, admitted.min_val_accuracy) == (0.01, 0.5)
    assert TrainingConfig.from_mapping(admitted.to_dict()) == admitted  # the snapshot reads back as recorded


def test_a_run_the_authors_gate_cannot_judge_is_refused_when_admitted(tables):
    settings = AuthorSettings(allowed_sources=("public",), quality_gate={"metric": "val_roc_auc", "max_drop": 0.01})
    classifier = policy.admit(tables, TrainingConfig.from_mapping({"source_table": "public.samples2"}), settings)
    assert (classifier.metric, classifier.max_drop) == ("val_roc_auc", 0.01)
    regression = TrainingConfig.from_mapping({"source_table": "public.samples2", "task": "regression"})
    with pytest.raises(ConfigError, match="val_roc_auc is a classification metric, and the run's task is regression"):
        policy.admit(tables, regression, settings)


def test_world_size_is_bounded_by_the_author(tables):
    config = TrainingConfig.from_mapping({"source_table": "samples2", "world_size": 65, "launcher": "kubernetes"})
    with pytest.raises(ConfigError, match="world_size 65 is more than the 64 ranks"):
        policy.check_run(tables, config, AuthorSettings(max_world_size=64))


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
