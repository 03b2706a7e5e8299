"""Unit tests: no database, no Airflow task execution, no Horovod ranks (pure functions, parsing, manifests, schemas,
DAG files parsed in a DagBag). The shared fixtures that would start PostgreSQL or Airflow fail here instead: a test
that needs them belongs in tests/db or tests/integration."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    pytest.fail("tests/unit uses no database: a test that needs PostgreSQL belongs in tests/db or tests/integration")


@pytest.fixture(scope="session")
def airflow_env() -> dict[str, str]:
    pytest.fail("tests/unit runs no Airflow task: a test that runs `airflow` belongs in tests/db or tests/integration")
