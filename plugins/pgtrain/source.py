"""The user's source table: resolve and check its identifiers, and the SQL fragments that select its rows.

Identifiers given by users are looked up in the catalog and only ever reach SQL quoted. The
row-selection fragments here are shared by the planner (``compute_shards``) and the trainer's
loader, so both sides agree on which rows a run trains on.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgtrain.errors import SourceError

FEATURE_FORMATS = {"real[]": "float4_array", "double precision[]": "float8_array", "bytea": "bytea"}
LABEL_TYPES = {"smallint", "integer", "bigint"}
# Resolution of the hash-based validation split: fraction is applied in millionths.
_SPLIT_BUCKETS = 1_000_000


@dataclass(frozen=True)
class Source:
    schema: str
    table: str
    key_column: str
    features_column: str
    label_column: str
    key_type: str
    feature_format: str

    @property
    def relation(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.table)

    @property
    def key(self) -> sql.Identifier:
        return sql.Identifier(self.key_column)

    @property
    def features(self) -> sql.Identifier:
        return sql.Identifier(self.features_column)

    @property
    def label(self) -> sql.Identifier:
        return sql.Identifier(self.label_column)

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.table}"


def resolve_source(conn: psycopg.Connection, table: str, key: str, features: str, label: str) -> Source:
    """Look the table and columns up in the catalog; raise SourceError saying what is missing."""
    try:
        row = conn.execute(
            """SELECT c.oid, n.nspname, c.relname FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = to_regclass(%s)""",
            (table,),
        ).fetchone()
    except psycopg.Error as exc:
        conn.rollback()
        raise SourceError(f"source_table {table!r} is not a valid table name: {exc.diag.message_primary}") from exc
    if row is None:
        raise SourceError(
            f"source_table {table!r} does not exist (or is not visible to this user); "
            "give an existing table, schema-qualified if it is not on the search_path"
        )
    oid, schema, relname = row
    columns = dict(
        conn.execute(
            """SELECT attname, format_type(atttypid, NULL) FROM pg_attribute
               WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped""",
            (oid,),
        ).fetchall()
    )
    for role, name in (("key_column", key), ("features_column", features), ("label_column", label)):
        if name not in columns:
            raise SourceError(
                f"{role} {name!r} is not a column of {schema}.{relname}; its columns are: "
                + ", ".join(sorted(columns))
            )
    if columns[features] not in FEATURE_FORMATS:
        raise SourceError(
            f"features_column {features!r} has type {columns[features]}; use one of "
            + ", ".join(FEATURE_FORMATS)
        )
    if columns[label] not in LABEL_TYPES:
        raise SourceError(f"label_column {label!r} has type {columns[label]}; use an integer type")
    unique = conn.execute(
        """SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
           WHERE i.indrelid = %s AND i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL
             AND a.attname = %s""",
        (oid, key),
    ).fetchone()
    if unique is None:
        raise SourceError(
            f"key_column {key!r} of {schema}.{relname} has no unique index; keyset sharding needs a unique, "
            f"orderable key (for example: ALTER TABLE {schema}.{relname} ADD PRIMARY KEY ({key}))"
        )
    return Source(schema, relname, key, features, label, columns[key], FEATURE_FORMATS[columns[features]])


def feature_length(source: Source) -> sql.Composable:
    """SQL for the number of features in a row (NULL when the features are NULL)."""
    if source.feature_format == "bytea":
        return sql.SQL("(octet_length({}) / 4)").format(source.features)
    return sql.SQL("cardinality({})").format(source.features)


def is_validation(source: Source, fraction: float, seed: int) -> sql.Composable:
    """SQL boolean: the row is held out for validation. Deterministic in (key, seed)."""
    threshold = int(round(fraction * _SPLIT_BUCKETS))
    return sql.SQL("(abs(mod(hashtextextended({}::text, {}), {})) < {})").format(
        source.key, sql.Literal(seed), sql.Literal(_SPLIT_BUCKETS), sql.Literal(threshold)
    )


def key_range(source: Source, lo: str, hi: str) -> sql.Composable:
    """SQL boolean: the key lies in [lo, hi] (bounds are the key's text form, cast to its type)."""
    key_type = sql.SQL(source.key_type)  # from format_type() in the catalog, never user text
    return sql.SQL("{k} BETWEEN CAST({lo} AS {t}) AND CAST({hi} AS {t})").format(
        k=source.key, lo=sql.Literal(lo), hi=sql.Literal(hi), t=key_type
    )
