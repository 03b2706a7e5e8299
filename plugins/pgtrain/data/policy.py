"""What a triggered run may touch, checked against the DAG author's allow-lists before anything is read.

The source is resolved in the catalog first (``to_regclass``), so quoting, the search_path and
schema qualification cannot route around a listed name; only then are its columns or rows looked at.
"""

from __future__ import annotations

import dataclasses

import psycopg
from psycopg import sql

from pgtrain.config.params import CATEGORY_STORAGE, TrainingConfig
from pgtrain.config.settings import AuthorSettings
from pgtrain.core.errors import ConfigError, SourceError
from pgtrain.data.source.resolve import find_relation


def resolve_relation(conn: psycopg.Connection, name: str) -> tuple[str, str] | None:
    """(schema, table) that ``name`` (SQL syntax, optionally qualified and quoted) refers to, or None."""
    row = find_relation(conn, name)
    return None if row is None else (row[1], row[2])


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


def check_run(conn: psycopg.Connection, config: TrainingConfig, settings: AuthorSettings) -> tuple[str, str]:
    """Refuse a run whose model, size or source the author has not allowed; returns the source's (schema, table)."""
    check_model(config, settings)
    if config.world_size > settings.max_world_size:
        raise ConfigError(f"world_size {config.world_size} is more than the {settings.max_world_size} ranks this "
                          "DAG's author allows (max_world_size in the pgtrain settings file)")
    check_categories(config, settings)
    return check_source(conn, config.source_table, settings)


def check_categories(config: TrainingConfig, settings: AuthorSettings) -> None:
    """Refuse category params beyond the author's bounds: more levels per column than ``categories.max_categories``
    or levels rarer than ``categories.min_category_count`` would let a run keep (and store) what the author does
    not allow."""
    rules = settings.category_rules()
    if config.max_categories > rules["max_categories"]:
        raise ConfigError(f"max_categories {config.max_categories} is more than the {rules['max_categories']} levels "
                          "per categorical column this DAG's author allows (categories.max_categories in the "
                          f"pgtrain settings file or the model's entry): ask for at most {rules['max_categories']}")
    if config.min_category_count < rules["min_category_count"]:
        raise ConfigError(f"min_category_count {config.min_category_count} is less than the "
                          f"{rules['min_category_count']} training rows a kept level needs by this DAG's author "
                          "(categories.min_category_count in the pgtrain settings file or the model's entry): ask "
                          f"for at least {rules['min_category_count']}")


def check_unowned(model_name: str, owners: dict[str, str]) -> None:
    """The generic DAG may not train a model of the models file: its DAG fixes its source, columns and gate.

    ``owners``: model name -> the DAG that trains it (pgtrain.config.model_entries.model_owners).
    """
    if model_name in owners:
        raise ConfigError(f"model {model_name!r} is trained by its own DAG {owners[model_name]} (the models file "
                          "fixes its source, columns and quality gate): trigger that DAG, or choose another "
                          "model_name for an ad-hoc run")


def admit(conn: psycopg.Connection, config: TrainingConfig, settings: AuthorSettings) -> TrainingConfig:
    """The run's config as it is recorded: checked against the author's settings, the source pinned to the
    schema-qualified, quoted name it resolved to (a later search_path cannot point it elsewhere), the author's
    quality gate and rules of what is stored in clear in force, and the author's threads per rank (which the ranks
    read from the snapshot)."""
    schema, table = check_run(conn, config, settings)
    pinned = sql.Identifier(schema, table).as_string(conn)
    rules = settings.category_rules()
    storage = {name: rules[name] for name in CATEGORY_STORAGE}
    storage["hashed_columns"] = tuple(storage["hashed_columns"])
    return dataclasses.replace(config, source_table=pinned, intra_op_threads=settings.intra_op_threads,
                               **settings.quality_gate, **storage)


def _unquote(identifier: str) -> str:
    """A schema name as the catalog spells it: quoted names keep their case, unquoted ones fold to lower."""
    if len(identifier) >= 2 and identifier[0] == identifier[-1] == '"':
        return identifier[1:-1].replace('""', '"')
    return identifier.lower()

