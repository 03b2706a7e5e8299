"""Shared fixtures: a real PostgreSQL (TEST_DATABASE_URL, else an embedded server), one server per session shared
by tests/db and tests/integration, a new database per test; the Airflow environment; a password sentinel.

The fixtures of one folder only are in its conftest.py: db/ (connections, small batches), integration/k8s/ (the
simulated cluster), integration/stack/ (the real Airflow stack); unit/ refuses the database and Airflow fixtures."""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from dev import devdb
from pgtrain.core.migrations import apply_migrations

REPO = Path(__file__).resolve().parents[1]
logging.getLogger("pgserver").setLevel(logging.WARNING)  # its exit-time INFO lines outlive pytest's capture

# A project-local Airflow (SQLite metadata DB), set before anything imports airflow.
os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".airflow"))
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO / "dags"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


@pytest.fixture(scope="session")
def airflow_env() -> dict[str, str]:
    """Environment for `airflow` subprocesses, with the metadata DB migrated once."""
    home = Path(os.environ["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    if not (home / ".migrated").exists():
        subprocess.run([str(REPO / ".venv/bin/airflow"), "db", "migrate"], check=True, capture_output=True)
        (home / ".migrated").touch()
    return dict(os.environ)


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    explicit = os.environ.get("TEST_DATABASE_URL")
    if explicit:
        yield explicit
        return
    with tempfile.TemporaryDirectory(prefix="pgtrain-test-pg-") as data_dir:
        yield devdb.start(data_dir)
        devdb.stop(data_dir)


@pytest.fixture
def make_database(pg_admin_url: str) -> Iterator:
    """Factory: a new empty database (migrated unless migrate=False); returns its URL. Dropped after the test."""
    names: list[str] = []

    def make(migrate: bool = True) -> str:
        names.append(f"pgtrain_test_{uuid.uuid4().hex[:12]}")
        url = devdb.create_database(pg_admin_url, names[-1])
        if migrate:
            with psycopg.connect(url) as conn:
                apply_migrations(conn)
        return url

    yield make
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def db_url(make_database) -> str:
    """A fresh, migrated database for one test."""
    return make_database()


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url) as connection:
        yield connection


@pytest.fixture
def autocommit(db_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection (planning and loading run their own transactions)."""
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def sentinel() -> str:
    """A password that no output may show (the embedded PostgreSQL trusts local connections)."""
    return f"sentinel-{uuid.uuid4().hex}"
