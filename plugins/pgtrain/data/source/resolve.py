"""The user's source table: resolve and check its identifiers in the catalog, and describe it (``Source``).

Identifiers given by users are looked up in the catalog (``find_relation``: ``to_regclass``) and only ever
reach SQL quoted. Features come from one array/bytea column (``features_column``) or from scalar numeric
columns (``feature_columns``, feature_format ``"columns"``); the target is an integer class label
(classification) or a numeric column or array (regression). The SQL that selects and checks a source's rows
is ``pgtrain.data.source.rows``; rows as of a planning snapshot, ``pgtrain.data.source.snapshot``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgtrain.config.params import ALL_COLUMNS, TASKS, TrainingConfig
from pgtrain.core.errors import PgtrainError, SourceError
from pgtrain.data.source.planned import PlannedRows

FEATURE_FORMATS = {"real[]": "float4_array", "double precision[]": "float8_array", "bytea": "bytea"}
ARRAY_ELEMENTS = {"float4_array": "real", "float8_array": "double precision", "int8_array": "bigint"}
COLUMNS = "columns"  # the feature_format of scalar feature columns
LABEL_TYPES = {"smallint", "integer", "bigint"}  # class numbers 0..num_classes-1 as they are (no class list)
# Scalar column types, and how each travels to the loader: as float4 or as float8 (cast to float32 there).
# Measured with 100 columns: float8send(c) beats a guarded float4send(c::real) for double precision (the cast
# to real must dodge PostgreSQL's underflow error), and float4send(c) is the fastest for real.
SCALAR_TYPES = {"real": "f4", "smallint": "f4", "integer": "f4", "boolean": "f4",
                "double precision": "f8", "bigint": "f8", "numeric": "f8"}
# Dates and times: days since 1970-01-01 (UTC for timestamps without time zone), as float8.
DATE_TYPES = ("date", "timestamp without time zone", "timestamp with time zone")
# Categorical by type: their values are levels (an enum type is one too, found by its kind in the catalog).
CATEGORY_TYPES = ("text", "character varying", "character")
CLASS_TYPES = (*LABEL_TYPES, "boolean", *CATEGORY_TYPES)  # class labels of any of these (and enums)
NUMBER, DATE, CATEGORY = "number", "date", "category"  # a feature column's kind
# Scalar feature columns travel to the loader as one array per wire type (feature_payload): float4, float8, and
# the 64-bit hashes of categorical values.
WIRE_ARRAYS = {"f4": "float4_array", "f8": "float8_array", "h8": "int8_array"}
TARGET_ARRAY_TYPES = {"real[]": "float4_array", "double precision[]": "float8_array"}
_RELKINDS = {"r": "table", "p": "partitioned table", "m": "materialized view", "v": "view", "f": "foreign table",
             "i": "index", "I": "partitioned index", "S": "sequence", "c": "composite type", "t": "TOAST table"}


@dataclass(frozen=True)
class Column:
    """A scalar feature column: its name, its type (format_type without modifiers) and its kind (NUMBER, DATE or
    CATEGORY); once planned, how it is encoded (``pgtrain.data.encoding``)."""

    name: str
    type: str
    kind: str = NUMBER
    mean: float | None = None  # NUMBER, DATE: the training mean a NULL is imputed with (None: NULL is a bad row)
    missing: bool = False  # NUMBER, DATE: a 0/1 "was missing" input follows (the column had NULLs in training)
    levels: tuple[str, ...] = ()  # CATEGORY: the kept levels as text, codes 2.. (0: other, 1: NULL)
    hashes: tuple[int, ...] = ()  # CATEGORY: hashtextextended(level, 0) of each level
    # NUMBER, DATE: the training rows' quantile bin edges (float32 values, ascending, at least 2) the built-in mlp
    # encodes the value with (``pgtrain.data.quantiles``); (): the standardized value, as before edges
    edges: tuple[float, ...] = ()
    # A plan shared by a search's trials: the edges of each other numeric_bins its trials ask for, (B, edges) by B
    # (``pgtrain.config.bins.for_bins``: a trial's record holds only its own); () in every other record
    bin_edges: tuple[tuple[int, tuple[float, ...]], ...] = ()

    @property
    def wire(self) -> str:
        """How its values travel to the loader: 'f4' or 'f8' (big-endian), or 'h8' (a category's hash)."""
        if self.kind == CATEGORY:
            return "h8"
        return "f8" if self.kind == DATE else SCALAR_TYPES[self.type]


def valued(columns: Sequence[Column]) -> list[Column]:
    """The NUMBER and DATE columns (those with a value, imputed or checked), in order."""
    return [c for c in columns if c.kind != CATEGORY]


def categories(columns: Sequence[Column]) -> list[Column]:
    """The CATEGORY columns, in order."""
    return [c for c in columns if c.kind == CATEGORY]


@dataclass(frozen=True)
class Source:
    schema: str
    table: str
    key_column: str
    features_column: str | None  # None when the features are scalar columns
    label_column: str | None  # None: a source to score, without a target
    key_type: str  # with its modifiers: character(8), numeric(12,2), ...
    feature_format: str  # float4_array, float8_array, bytea, or columns
    plan: PlannedRows | None = None  # set by manifest.source_for once compute_shards has run
    feature_columns: tuple[Column, ...] = ()
    task: str = "classification"
    label_type: str = "integer"
    # Classification whose classes are a list of values (any label type): their text forms in class order and
    # their hashes; None: integer labels are the class numbers themselves.
    classes: tuple[str, ...] | None = None
    class_hashes: tuple[int, ...] = ()
    missing_values: str = "impute"
    label_sql_type: str = ""  # the label's type with its modifiers (character(1), an enum's name): predictions' type

    @property
    def relation(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.table)

    @property
    def key(self) -> sql.Identifier:
        return sql.Identifier(self.key_column)

    @property
    def features(self) -> sql.Identifier:
        if self.features_column is None:
            raise PgtrainError(f"{self.qualified_name}: the features are the columns {self.column_names}")
        return sql.Identifier(self.features_column)

    @property
    def label(self) -> sql.Identifier:
        return sql.Identifier(self.label_column)

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.feature_columns)

    @property
    def target_format(self) -> str:
        """'label' (classification by class number), 'class' (by a list of classes), 'scalar', or the array format
        of a regression target."""
        if self.task == "classification":
            return "label" if self.classes is None and self.label_type in LABEL_TYPES else "class"
        return TARGET_ARRAY_TYPES.get(self.label_type, "scalar")


def source_from_config(conn: psycopg.Connection, config: TrainingConfig) -> Source:
    """resolve_source with the source params of a TrainingConfig."""
    columns = config.feature_columns
    return resolve_source(conn, config.source_table, config.key_column, config.array_features_column,
                          config.label_column, feature_columns=columns,
                          task=config.task, exclude_columns=config.exclude_columns,
                          categorical_columns=config.categorical_columns, missing_values=config.missing_values)


class MissingColumnError(SourceError):
    """A column named by a param is not in the table."""

    def __init__(self, message: str, role: str, columns: list[str]) -> None:
        super().__init__(message)
        self.role, self.columns = role, columns


def resolve_source(conn: psycopg.Connection, table: str, key: str, features: str | None, label: str | None, *,
                   feature_columns: tuple[str, ...] | str | None = None, task: str = "classification",
                   exclude_columns: tuple[str, ...] = (), categorical_columns: tuple[str, ...] = (),
                   missing_values: str = "impute") -> Source:
    """Look the table and columns up in the catalog; raise SourceError saying what is missing and what to do.

    ``feature_columns``: scalar columns in input order, or ALL_COLUMNS (every column but the key, the label and
    ``exclude_columns``); each gets its kind from its type (or CATEGORY when in ``categorical_columns``).
    ``label=None``: a source to score (``pgtrain.store.inference.predict``), without a target; then one array or
    bytea column given as ``feature_columns`` is taken as the features column (a version records either as a list).
    """
    _check_feature_params(features, feature_columns)
    if task not in TASKS:
        raise SourceError(f"task {task!r} is not one of {', '.join(TASKS)}")
    oid, schema, relname, relkind = _relation(conn, table)
    name = sql.Identifier(schema, relname).as_string(conn)
    if relkind not in ("r", "p", "m"):
        raise SourceError(_not_a_table(name, relkind, key))
    catalog = conn.execute(
        """SELECT attname, format_type(atttypid, NULL), format_type(atttypid, atttypmod), t.typtype::text
           FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
           WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum""",
        (oid,),
    ).fetchall()
    columns = {attname: (base, full) for attname, base, full, _ in catalog}
    enums = {attname for attname, _, _, typtype in catalog if typtype == "e"}
    roles = [("key_column", key)] + ([("label_column", label)] if label is not None else [])
    roles += [("exclude_columns", column) for column in exclude_columns]
    roles += [("categorical_columns", column) for column in categorical_columns]
    if feature_columns == ALL_COLUMNS:
        left_out = {key, label, *exclude_columns}
        feature_columns = tuple(c for c in columns if c not in left_out)
        if not feature_columns:
            raise SourceError(f"feature_columns {ALL_COLUMNS!r}: {name} has no column besides the key, the target "
                              "and exclude_columns")
    roles += [("features_column", features)] if features is not None else [
        ("feature_columns", column) for column in feature_columns]
    for role, column in roles:
        if column not in columns:
            missing = [c for r, c in roles if r == role and c not in columns]
            raise MissingColumnError(_missing_column(role, missing, f"{schema}.{relname}", columns), role, missing)
    types = {column: base for column, (base, _) in columns.items()}
    if label is None and features is None and len(feature_columns) == 1 and types[
            feature_columns[0]] in FEATURE_FORMATS:
        features, feature_columns = feature_columns[0], None
    if features is not None and types[features] not in FEATURE_FORMATS:
        raise SourceError(f"features_column {features!r} has type {types[features]}; use one of "
                          + ", ".join(FEATURE_FORMATS) + ", or scalar columns in feature_columns")
    stray = [c for c in categorical_columns if c not in (feature_columns or ())]
    if stray:
        raise SourceError(f"categorical_columns {', '.join(map(repr, stray))} "
                          f"{'is not a feature column' if len(stray) == 1 else 'are not feature columns'}; list "
                          "only columns of feature_columns")
    scalars = tuple(_feature_column(c, types[c], c in enums, c in categorical_columns) for c in feature_columns or ())
    if label is not None and label in (feature_columns or ()):
        raise SourceError(f"label_column {label!r} is also in feature_columns: the model would see its own target; "
                          "remove it from feature_columns")
    if key in (feature_columns or ()):
        raise SourceError(f"key_column {key!r} is also in feature_columns: a key identifies rows, it does not "
                          "describe them; remove it from feature_columns")
    if label is not None:
        _check_label_type(label, types[label], task, label in enums)
    _require_unique_key(conn, oid, name, relkind, key)
    feature_format = COLUMNS if features is None else FEATURE_FORMATS[types[features]]
    return Source(schema, relname, key, features, label, columns[key][1], feature_format,
                  feature_columns=scalars, task=task,
                  label_type=types[label] if label is not None else "",
                  label_sql_type=columns[label][1] if label is not None else "", missing_values=missing_values)


def _feature_column(name: str, type_: str, enum: bool, categorical: bool) -> Column:
    """A feature column of kind NUMBER, DATE or CATEGORY; SourceError naming it, its type and what to do when it
    can be none of them."""
    if categorical or enum or type_ in CATEGORY_TYPES:
        if type_.endswith("[]") or type_ in ("json", "jsonb", "bytea"):
            raise SourceError(f"feature column {name!r} has type {type_}, which cannot be a category; exclude it")
        return Column(name, type_, CATEGORY)
    if type_ in SCALAR_TYPES:
        return Column(name, type_, NUMBER)
    if type_ in DATE_TYPES:
        return Column(name, type_, DATE)
    kinds = ", ".join([*SCALAR_TYPES, *DATE_TYPES, *CATEGORY_TYPES, "enum types"])
    raise SourceError(
        f"feature column {name!r} has type {type_}, which pgtrain cannot use as a feature (it takes {kinds}); "
        f"leave it out with exclude_columns: [{name!r}], or cast it in a view materialized into a table (e.g. "
        "a json field as text or a number)")


def keyed_relation(conn: psycopg.Connection, table: str, key: str) -> tuple[int, str, str, str]:
    """(oid, schema, name, the key's type) of a table whose ``key`` column has a unique index (what keyset
    sharding and a key watermark walk); SourceError saying what is missing and what to do otherwise."""
    oid, schema, relname, relkind = _relation(conn, table)
    name = sql.Identifier(schema, relname).as_string(conn)
    if relkind not in ("r", "p", "m"):
        raise SourceError(_not_a_table(name, relkind, key))
    row = conn.execute(
        """SELECT format_type(atttypid, atttypmod) FROM pg_attribute
           WHERE attrelid = %s AND attname = %s AND attnum > 0 AND NOT attisdropped""",
        (oid, key),
    ).fetchone()
    if row is None:
        raise SourceError(f"key_column {key!r} is not a column of {name}")
    _require_unique_key(conn, oid, name, relkind, key)
    return oid, schema, relname, row[0]


def _require_unique_key(conn: psycopg.Connection, oid: int, name: str, relkind: str, key: str) -> None:
    unique = conn.execute(
        """SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
           WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid AND i.indnkeyatts = 1 AND i.indpred IS NULL
             AND a.attname = %s""",
        (oid, key),
    ).fetchone()
    if unique is None:
        raise SourceError(_no_unique_index(conn, name, relkind, key))


def _check_feature_params(features: str | None, feature_columns: tuple[str, ...] | str | None) -> None:
    if features is not None and feature_columns is not None:
        raise SourceError(
            f"both features_column ({features!r}) and feature_columns ({feature_columns!r}) are set, but the "
            "features come from one or the other: leave features_column empty to train on the columns, or "
            "feature_columns empty to train on the array column")
    if features is None and not feature_columns:
        raise SourceError(
            f"no features: set feature_columns to {ALL_COLUMNS!r} or to the feature columns (in input order), or "
            "features_column to one real[], double precision[] or bytea column")
    if isinstance(feature_columns, str) and feature_columns != ALL_COLUMNS:
        raise SourceError(f"feature_columns {feature_columns!r}: give {ALL_COLUMNS!r} or a list of columns")
    if isinstance(feature_columns, str):
        return
    duplicates = sorted({c for c in feature_columns or () if feature_columns.count(c) > 1})
    if duplicates:
        raise SourceError(f"feature_columns names {', '.join(map(repr, duplicates))} more than once; "
                          "list each column once")


def _check_label_type(label: str, label_type: str, task: str, enum: bool = False) -> None:
    if task == "classification" and label_type not in CLASS_TYPES and not enum:
        hint = " (for a numeric target, set task='regression')" if label_type in {
            *SCALAR_TYPES, *TARGET_ARRAY_TYPES} - {"boolean"} else ""
        raise SourceError(f"label_column {label!r} has type {label_type}; a class label is an integer, text, "
                          f"varchar, char, boolean or enum column{hint}")
    if task == "regression" and label_type not in ({*SCALAR_TYPES, *TARGET_ARRAY_TYPES} - {"boolean"}):
        raise SourceError(
            f"label_column {label!r} has type {label_type}; a regression target is one of "
            + ", ".join(sorted((set(SCALAR_TYPES) - {"boolean"}) | set(TARGET_ARRAY_TYPES))))


def find_relation(conn: psycopg.Connection, name: str, role: str = "source_table"
                  ) -> tuple[int, str, str, str] | None:
    """(oid, schema, name, relkind) of the relation ``name`` (SQL syntax: optionally qualified, quoted as in SQL)
    refers to, or None. The one place a user's table name is resolved (``to_regclass``), so quoting, the
    search_path and schema qualification mean what they mean in SQL. ``role``: the name's param, for errors."""
    try:
        with conn.transaction():  # a savepoint inside a caller's transaction: a bad name does not abort it
            return conn.execute(
                """SELECT c.oid, n.nspname, c.relname, c.relkind::text FROM pg_class c
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE c.oid = to_regclass(%s)""",
                (name,),
            ).fetchone()
    except (psycopg.OperationalError, psycopg.InterfaceError):
        raise  # the connection, not the name
    except psycopg.Error as exc:
        raise SourceError(f"{role} {name!r} is not a valid table name: {exc.diag.message_primary}; write it as in "
                          'SQL, e.g. myschema.mytable or "MySchema"."My Table"') from None


def _relation(conn: psycopg.Connection, table: str) -> tuple[int, str, str, str]:
    row = find_relation(conn, table)
    if row is None:
        raise SourceError(
            f"source_table {table!r} does not exist (or is not visible to this user); "
            "give an existing table, schema-qualified if it is not on the search_path" + _quoting_hint(conn, table))
    return row


def _quoting_hint(conn: psycopg.Connection, table: str) -> str:
    """For a name that would resolve with other case or quoting: the quoted name to give instead."""
    parts = [part.strip().strip('"') for part in table.split(".")]
    if len(parts) > 2 or not all(parts):
        return ""
    schema, relname = parts if len(parts) == 2 else (None, parts[0])
    found = conn.execute(
        """SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE lower(c.relname) = lower(%(rel)s) AND lower(n.nspname) = lower(coalesce(%(schema)s, n.nspname))
             AND c.relkind IN ('r', 'p', 'm', 'v', 'f')
           ORDER BY pg_table_is_visible(c.oid) DESC, n.nspname, c.relname LIMIT 3""",
        {"rel": relname, "schema": schema},
    ).fetchall()
    if not found:
        return ""
    names = " or ".join(sql.Identifier(*row).as_string(conn) for row in found)
    return (f"; did you mean {names}? Unquoted names are folded to lower case, as in SQL: give mixed-case names "
            "(or names with spaces) in double quotes, for example source_table='" + sql.Identifier(
                *found[0]).as_string(conn) + "'")


def _missing_column(role: str, missing: list[str], table: str, columns: dict[str, object]) -> str:
    named = ", ".join(map(repr, missing))
    message = (f"{role} {named} {'is not a column' if len(missing) == 1 else 'are not columns'} of {table}; its "
               "columns are: " + ", ".join(repr(c) for c in sorted(columns)))
    close = [(m, c) for m in missing for c in columns if c.lower() == m.lower()]
    if close:
        message += f" (did you mean {close[0][1]!r}? column names are matched exactly, case included)"
    return message


def _not_a_table(name: str, relkind: str, key: str) -> str:
    kind = _RELKINDS.get(relkind, f"relation of kind {relkind!r}")
    if relkind == "v":
        return (f"{name} is a view; training reads a snapshot of a table's rows by key ranges and row versions, "
                "and a view has neither a unique index nor row versions (it cannot get a primary key). Train from "
                f"a table (CREATE TABLE ... AS SELECT ...; ALTER TABLE ... ADD PRIMARY KEY ({key})) or a materialized "
                f"view with a unique index on the key (CREATE MATERIALIZED VIEW ... AS SELECT ...; CREATE UNIQUE "
                f"INDEX ON ... ({key}); REFRESH it before each run)")
    if relkind == "f":
        return (f"{name} is a foreign table, which has no unique index or row versions to shard by; copy its rows "
                f"into a table with a primary key on {key!r} and train from that")
    return f"{name} is a {kind}, not a table; give a table or materialized view as source_table"


def _no_unique_index(conn: psycopg.Connection, name: str, relkind: str, key: str) -> str:
    column = sql.Identifier(key).as_string(conn)
    if relkind == "m":
        fix = f"CREATE UNIQUE INDEX ON {name} ({column})"
    else:
        fix = f"ALTER TABLE {name} ADD PRIMARY KEY ({column}), or CREATE UNIQUE INDEX ON {name} ({column})"
    return (f"key_column {key!r} of {name} has no unique index; keyset sharding needs a unique, orderable key "
            f"backed by one (for example: {fix})")
