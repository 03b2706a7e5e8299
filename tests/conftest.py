"""Shared fixtures: a real PostgreSQL (TEST_DATABASE_URL, else an embedded server), one database per session."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgtrain import devdb
from pgtrain.migrations import apply_migrations

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    explicit = os.environ.get("TEST_DATABASE_URL")
    if explicit:
        yield explicit
        return
    with tempfile.TemporaryDirectory(prefix="pgtrain-test-pg-") as data_dir:
        yield devdb.start(data_dir)


@pytest.fixture
def make_database(pg_admin_url: str):
    """Factory: a new empty database (migrated unless migrate=False); returns its URL."""

    def make(migrate: bool = True) -> str:
        url = devdb.create_database(pg_admin_url, f"pgtrain_test_{uuid.uuid4().hex[:12]}")
        if migrate:
            with psycopg.connect(url) as conn:
                apply_migrations(conn)
        return url

    return make


@pytest.fixture
def db_url(make_database) -> str:
    """A fresh, migrated database for one test."""
    return make_database()


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url) as connection:
        yield connection
