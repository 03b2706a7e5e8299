"""A rank's first connection is retried while the server refuses it (here: a role out of connection slots, as a
server or PgBouncer full of ranks answers), a bounded number of times; a bad URL is not retried. Real PostgreSQL."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgtrain.core.db import connect_retrying
from pgtrain.core.errors import ConfigError


@pytest.fixture
def full_role(db_url: str, ac: psycopg.Connection):
    """A login role whose connection slots are all taken (CONNECTION LIMIT 0), and its URL."""
    role = f"rank_{uuid.uuid4().hex[:8]}"
    ac.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 0").format(sql.Identifier(role)))
    yield role, make_conninfo(**{**conninfo_to_dict(db_url), "user": role})
    ac.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_rank_connects_once_the_server_has_a_slot_for_it(full_role, ac, capsys):
    role, url = full_role
    waits: list[float] = []

    def wait_and_free_a_slot(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 2:  # another rank disconnected
            ac.execute(sql.SQL("ALTER ROLE {} CONNECTION LIMIT -1").format(sql.Identifier(role)))

    with connect_retrying(url, sleep=wait_and_free_a_slot) as conn:
        assert conn.execute("SELECT current_user").fetchone()[0] == role
    assert len(waits) == 2 and 0.5 <= waits[0] <= 1.0 and 1.0 <= waits[1] <= 2.0  # doubling, with jitter
    out = capsys.readouterr().out
    assert "could not connect to the training database (try 1 of 6: " in out and "too many connections" in out


def test_the_retries_are_bounded_and_the_last_error_is_raised(full_role):
    _, url = full_role
    waits: list[float] = []
    with pytest.raises(psycopg.OperationalError, match="too many connections for role"):
        connect_retrying(url, tries=3, sleep=waits.append)
    assert len(waits) == 2


def test_a_malformed_url_is_not_retried():
    waits: list[float] = []
    with pytest.raises(ConfigError, match="cannot be parsed"):
        connect_retrying("postgresql://user:secret@host:5432/db?sslmode=bogus&x==", sleep=waits.append)
    assert waits == []
