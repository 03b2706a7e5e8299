"""Fixtures of the tests against a real PostgreSQL (the session's server and per-test databases: tests/conftest.py)."""

from __future__ import annotations

import psycopg
import pytest

from pgtrain.data import manifest


@pytest.fixture
def ac(autocommit: psycopg.Connection) -> psycopg.Connection:
    """``autocommit`` (tests/conftest.py), under the shard and loader tests' name for it."""
    return autocommit


@pytest.fixture
def aconn(autocommit: psycopg.Connection) -> psycopg.Connection:
    """``autocommit`` (tests/conftest.py), under the store and inference tests' name for it."""
    return autocommit


@pytest.fixture
def small_batches(monkeypatch):
    """Batches of 16 rows, so that every shard spans many batches and batch edges fall inside shards."""
    monkeypatch.setattr(manifest, "BATCH_BYTES", 1)
