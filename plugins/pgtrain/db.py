"""Connections and identifier handling. Every other module gets its connections here."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

from pgtrain.errors import ConfigError
from pgtrain.trainer_command import DATABASE_URL_ENV


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


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]
