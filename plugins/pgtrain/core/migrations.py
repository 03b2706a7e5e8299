"""Apply the numbered migrations in ``sql/`` in order, once each, recorded in ``pgtrain.schema_migrations``."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import psycopg

from pgtrain.core.errors import PgtrainError

SQL_DIR_ENV = "PGTRAIN_SQL_DIR"
SCHEMA = "pgtrain"  # the schema every migration's table lives in (sql/)
_FILE_PATTERN = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
# Serializes concurrent provision_tables runs (any constant works; this one spells "pgtrain").
_MIGRATION_LOCK_KEY = 0x7067747261696E


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    @property
    def text(self) -> str:
        return self.path.read_text()

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def sql_dir() -> Path:
    """``$PGTRAIN_SQL_DIR``, else the migrations shipped in the package (``pgtrain/core/sql``, which in the
    repository is a link to the top-level ``sql/``, their one home)."""
    return Path(os.environ.get(SQL_DIR_ENV) or Path(__file__).resolve().parent / "sql")


def discover(directory: Path | None = None) -> list[Migration]:
    directory = directory or sql_dir()
    migrations = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_PATTERN.match(path.name)
        if not match:
            raise PgtrainError(f"{path}: migration files are named NNN_name.sql (for example 004_add_index.sql)")
        migrations.append(Migration(int(match.group(1)), match.group(2), path))
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise PgtrainError(f"{directory}: two migration files share a version number: {versions}")
    if not migrations:
        raise PgtrainError(f"no migrations found in {directory}; set {SQL_DIR_ENV} to the project's sql/ folder")
    return migrations


def apply_migrations(conn: psycopg.Connection, directory: Path | None = None) -> list[int]:
    """Apply what has not run yet, in one transaction; returns the versions applied now."""
    migrations = discover(directory)
    applied_now = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_KEY,))
        conn.execute("CREATE SCHEMA IF NOT EXISTS pgtrain")
        conn.execute(
            """CREATE TABLE IF NOT EXISTS pgtrain.schema_migrations (
                   version    integer PRIMARY KEY,
                   name       text NOT NULL,
                   checksum   text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        done = dict(conn.execute("SELECT version, checksum FROM pgtrain.schema_migrations").fetchall())
        for migration in migrations:
            if migration.version in done:
                if done[migration.version] != migration.checksum:
                    raise PgtrainError(
                        f"migration {migration.path.name} changed after it was applied; "
                        "never edit an applied migration, add a new numbered file instead"
                    )
                continue
            conn.execute(migration.text)
            conn.execute(
                "INSERT INTO pgtrain.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (migration.version, migration.name, migration.checksum),
            )
            applied_now.append(migration.version)
    return applied_now
