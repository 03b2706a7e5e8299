"""Database URLs keep every setting on their way through devdb and the Airflow connection."""

from __future__ import annotations

import psycopg
import pytest

from dev.devdb import database_url_for
from pgtrain.airflow.dag.connection import database_url


def test_database_url_for_keeps_password_port_and_options():
    url = database_url_for("postgresql://bob:s3c%40r%2Ft@db:5433/postgres?sslmode=require&connect_timeout=5", "x")
    assert psycopg.conninfo.conninfo_to_dict(url) == {
        "user": "bob", "password": "s3c@r/t", "host": "db", "port": "5433", "dbname": "x",
        "sslmode": "require", "connect_timeout": "5"}


def test_database_url_for_a_socket_directory():
    url = database_url_for("host=/tmp/pg dbname=postgres user=postgres port=5999", "train")
    assert psycopg.conninfo.conninfo_to_dict(url) == {
        "host": "/tmp/pg", "port": "5999", "dbname": "train", "user": "postgres"}


def test_airflow_connection_passes_libpq_settings_from_extras(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PGTRAIN_SOCKET",
                       "postgresql://bob@/train?host=%2Fvar%2Frun%2Fpostgresql&port=5433&sslcert=%2Fc.pem&x_other=1")
    monkeypatch.setenv("AIRFLOW_CONN_PGTRAIN_TCP", "postgresql://bob:p%40ss@db.internal:6432/train?sslmode=verify-full")
    assert psycopg.conninfo.conninfo_to_dict(database_url("pgtrain_socket")) == {
        "host": "/var/run/postgresql", "port": "5433", "sslcert": "/c.pem", "dbname": "train", "user": "bob"}
    assert psycopg.conninfo.conninfo_to_dict(database_url("pgtrain_tcp")) == {
        "host": "db.internal", "port": "6432", "sslmode": "verify-full", "dbname": "train", "user": "bob",
        "password": "p@ss"}


def test_a_missing_connection_is_bad_settings_that_say_how_to_define_it(monkeypatch):
    """Not a crash to retry: the DAG's retry policy fails a ConfigError for good."""
    from airflow.sdk import RetryAction

    from pgtrain.airflow.dag.failures import RETRY_POLICY
    from pgtrain.core.errors import ConfigError

    monkeypatch.delenv("AIRFLOW_CONN_PGTRAIN_NOWHERE", raising=False)
    with pytest.raises(ConfigError, match=r"isn't defined: define the training database's Airflow connection, e\.g\. "
                                          r"the environment variable AIRFLOW_CONN_PGTRAIN_NOWHERE=") as error:
        database_url("pgtrain_nowhere")
    assert RETRY_POLICY.evaluate(error.value, try_number=1, max_tries=3).action == RetryAction.FAIL
