"""Connections and identifier handling. Every other module gets its connections here."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
from psycopg import sql

from pgtrain.errors import ConfigError

DATABASE_URL_ENV = "PGTRAIN_DATABASE_URL"
SCHEMA = "pgtrain"


def database_url(explicit: str | None = None) -> str:
    """The training database URL: an explicit one, else ``$PGTRAIN_DATABASE_URL``."""
    url = explicit or os.environ.get(DATABASE_URL_ENV)
    if not url:
        raise ConfigError(
            f"no training database configured: set {DATABASE_URL_ENV} (for example "
            "postgresql://user@host:5432/dbname, password from PGPASSWORD or ~/.pgpass) "
            "or the Airflow connection pgtrain_db"
        )
    return url


def connect(url: str | None = None, *, autocommit: bool = True) -> psycopg.Connection:
    return psycopg.connect(database_url(url), autocommit=autocommit, application_name="pgtrain")


def table(name: str) -> sql.Composed:
    """A pgtrain-owned table, schema-qualified and quoted."""
    return sql.Identifier(SCHEMA, name)


def redact(url: str) -> str:
    """The URL with any password removed, for logs."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable database URL>"
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo(**params)


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]
