"""Apply the numbered migrations in ``sql/`` in order, once each, recorded in ``pgtrain.schema_migrations``."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from pgtrain.core.errors import ConfigError, PgtrainError

SQL_DIR_ENV = "PGTRAIN_SQL_DIR"
SCHEMA = "pgtrain"  # the schema every migration's table lives in (sql/)
_FILE_PATTERN = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
# Serializes concurrent provision_tables runs (any constant works; this one spells "pgtrain").
_MIGRATION_LOCK_KEY = 0x7067747261696E
# Earlier texts of a migration that an applied one may still record: 001 lost its CREATE SCHEMA IF NOT EXISTS
# (the runner creates the schema now, only when it is missing); what it creates is the same.
_EARLIER_CHECKSUMS = {1: {"d48c8fb35dc21f1ee3f0658ae1b876b34c61d9e9c43dbad2ed29258ffdc87228"}}


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
    """Apply what has not run yet, in one transaction; returns the versions applied now. A privilege the role
    lacks is a ConfigError naming the GRANT (bad settings: no retry passes it)."""
    try:
        return _apply(conn, discover(directory))
    except psycopg.errors.InsufficientPrivilege as error:
        raise missing_privilege(conn, error) from None


def missing_privilege(conn: psycopg.Connection, error: psycopg.errors.InsufficientPrivilege) -> ConfigError:
    """What to grant, from PostgreSQL's "permission denied for <kind> <name>"."""
    role = conn.info.user
    message = error.diag.message_primary or str(error)
    what = re.search(r"permission denied for (schema|database) (\S+)", message)
    if what and what.group(1) == "database":
        grant = f'CREATE SCHEMA {SCHEMA} AUTHORIZATION "{role}";  -- as the database owner, once'
    elif what:
        grant = f'GRANT CREATE ON SCHEMA "{what.group(2)}" TO "{role}";'
    else:
        grant = "the grants of docs/operations.md"
    return ConfigError(f"provision_tables as role {role!r}: {message}; run {grant} "
                       "(docs/operations.md, \"The training database role\")")


def _apply(conn: psycopg.Connection, migrations: list[Migration]) -> list[int]:
    applied_now = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_KEY,))
        # CREATE SCHEMA IF NOT EXISTS checks CREATE on the database before it looks for the schema: a role that
        # owns an existing pgtrain schema but may not create schemas would be refused.
        if conn.execute("SELECT to_regnamespace(%s)", (SCHEMA,)).fetchone()[0] is None:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
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
                if done[migration.version] not in {migration.checksum, *_EARLIER_CHECKSUMS.get(migration.version, ())}:
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
