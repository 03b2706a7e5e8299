"""What a triggered run may touch, checked against the DAG author's allow-lists before anything is read.

The source is resolved in the catalog first (``to_regclass``), so quoting, the search_path and
schema qualification cannot route around a listed name; only then are its columns or rows looked at.
"""

from __future__ import annotations

import psycopg

from pgtrain.config import TrainingConfig
from pgtrain.errors import ConfigError, SourceError
from pgtrain.settings import AuthorSettings


def resolve_relation(conn: psycopg.Connection, name: str) -> tuple[str, str] | None:
    """(schema, table) that ``name`` (SQL syntax, optionally qualified and quoted) refers to, or None."""
    try:
        with conn.transaction():
            row = conn.execute(
                """SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE c.oid = to_regclass(%s)""",
                (name,),
            ).fetchone()
    except psycopg.Error as error:
        raise SourceError(f"source_table {name!r} is not a valid table name: {error.diag.message_primary}; "
                          "write it as in SQL, e.g. myschema.mytable or \"MySchema\".\"My Table\"") from error
    return None if row is None else (row[0], row[1])


def allowed_relations(conn: psycopg.Connection, entries: tuple[str, ...]) -> tuple[set[str], set[tuple[str, str]]]:
    """The author's entries as (schemas, (schema, table) pairs). An entry with a dot names a table."""
    schemas: set[str] = set()
    tables: set[tuple[str, str]] = set()
    for entry in entries:
        relation = resolve_relation(conn, entry) if "." in entry else None
        if relation is not None:
            tables.add(relation)
        elif "." not in entry:
            schemas.add(_unquote(entry))
    return schemas, tables


def check_source(conn: psycopg.Connection, table: str, settings: AuthorSettings) -> tuple[str, str]:
    """The (schema, table) of ``table`` if the author allows it; else SourceError (saying nothing about it)."""
    relation = resolve_relation(conn, table)
    schemas, tables = allowed_relations(conn, settings.allowed_sources)
    if relation is None or not (relation[0] in schemas or relation in tables):
        allowed = ", ".join(settings.allowed_sources)
        raise SourceError(
            f"source_table {table!r} is not one of the sources this DAG may train on ({allowed}), or does not "
            "exist; ask the DAG's author to add it to allowed_sources in the pgtrain settings file"
        )
    return relation


def check_model(config: TrainingConfig, settings: AuthorSettings) -> None:
    if config.model not in settings.allowed_models:
        raise ConfigError(
            f"model {config.model!r} is not one of the models this DAG may build "
            f"({', '.join(settings.allowed_models)}); ask the DAG's author to add it to allowed_models"
        )


def check_run(conn: psycopg.Connection, config: TrainingConfig, settings: AuthorSettings) -> None:
    """Refuse a run whose model or source the author has not allowed."""
    check_model(config, settings)
    check_source(conn, config.source_table, settings)


def _unquote(identifier: str) -> str:
    """A schema name as the catalog spells it: quoted names keep their case, unquoted ones fold to lower."""
    if len(identifier) >= 2 and identifier[0] == identifier[-1] == '"':
        return identifier[1:-1].replace('""', '"')
    return identifier.lower()

