"""Fixtures of the tests against a real PostgreSQL (the session's server and per-test databases: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from pgtrain.data import manifest


@pytest.fixture
def ac(db_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the test's database (the shard and loader tests' name for it)."""
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def aconn(db_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the test's database (the store and inference tests' name for it)."""
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def small_batches(monkeypatch):
    """Batches of 16 rows, so that every shard spans many batches and batch edges fall inside shards."""
    monkeypatch.setattr(manifest, "BATCH_BYTES", 1)
