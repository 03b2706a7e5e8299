"""The user's source table: resolve and check its identifiers, and the SQL fragments that select its rows.

Identifiers given by users are looked up in the catalog and only ever reach SQL quoted. The
row-selection fragments here are shared by the planner (``compute_shards``) and the trainer's
loader, so both sides agree on which rows a run trains on:

- ``is_validation``: the deterministic train/validation split (a hash of the key);
- ``row_checks`` / ``bad_row``: what makes a row unusable (NULLs, NaN/Inf, values beyond float32, wrong
  length, bad label or target);
- ``feature_payload`` / ``target_payload``: the binary form of a row's features and target the loader reads;
- ``planned_rows``: the row was visible to the snapshot the manifest was cut in. Rows inserted
  (or updated) after planning have a newer ``xmin`` and are left out; see ``PlannedRows``.

Features come from one array/bytea column (``features_column``) or from scalar numeric columns
(``feature_columns``, feature_format ``"columns"``); the target is an integer class label
(classification) or a numeric column or array (regression).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from pgtrain.config import TASKS, TrainingConfig
from pgtrain.errors import PgtrainError, SourceError

FEATURE_FORMATS = {"real[]": "float4_array", "double precision[]": "float8_array", "bytea": "bytea"}
ARRAY_ELEMENTS = {"float4_array": "real", "float8_array": "double precision"}
COLUMNS = "columns"  # the feature_format of scalar feature columns
LABEL_TYPES = {"smallint", "integer", "bigint"}
# Scalar column types, and how each travels to the loader: as float4 or as float8 (cast to float32 there).
# Measured with 100 columns: float8send(c) beats a guarded float4send(c::real) for double precision (the cast
# to real must dodge PostgreSQL's underflow error), and float4send(c) is the fastest for real.
SCALAR_TYPES = {"real": "f4", "smallint": "f4", "integer": "f4", "boolean": "f4",
                "double precision": "f8", "bigint": "f8", "numeric": "f8"}
# Scalar feature columns travel to the loader as one array per wire type (feature_payload).
WIRE_ARRAYS = {"f4": "float4_array", "f8": "float8_array"}
TARGET_ARRAY_TYPES = {"real[]": "float4_array", "double precision[]": "float8_array"}
_FLOATING = {"real", "double precision", "numeric"}  # may hold NaN and infinities
_WIDER_THAN_FLOAT32 = {"double precision", "numeric"}  # may hold finite values float32 cannot
# float32's largest finite value, exactly, for each type that can exceed it.
_FLOAT32_MAX = {"double precision": "3.4028234663852886e38", "numeric": "340282346638528859811704183484516925440"}
# Resolution of the hash-based validation split: fraction is applied in millionths.
_SPLIT_BUCKETS = 1_000_000
# A packed little-endian float32 is NaN or infinite when its 8 exponent bits are all set: the high bit of its
# third byte and the low 7 bits of its fourth. In hex, 8 characters per value: the 5th is 8-f, the 7th 7 or f,
# the 8th f.
_BYTEA_NON_FINITE = r"^(?:.{8})*.{4}[89a-f].[7f]f"
_RELKINDS = {"r": "table", "p": "partitioned table", "m": "materialized view", "v": "view", "f": "foreign table",
             "i": "index", "I": "partitioned index", "S": "sequence", "c": "composite type", "t": "TOAST table"}

# Bad-row kinds, cheapest check first (bad_row ORs them in this order), and what each means.
BAD_ROW_KINDS: dict[str, str] = {
    "null_key": "the key is NULL",
    "null_features": "the features are NULL",
    "wrong_length": "the feature vector does not hold {dim} values",
    "null_label": "the label is NULL",
    "label_out_of_range": "the label is outside [0, {num_classes})",
    "target_wrong_length": "the target array does not hold {outputs} values",
    "null_elements": "the feature array has NULL elements",
    "non_finite": "a feature is NaN or infinite",
    "out_of_range": "a feature is beyond float32's range (|x| > 3.4028235e38)",
    "target_null_elements": "the target array has NULL elements",
    "target_non_finite": "the target is NaN or infinite",
    "target_out_of_range": "the target is beyond float32's range (|x| > 3.4028235e38)",
}
# The feature kinds that need every value looked at. With bad_rows='fail', compute_shards leaves them to the
# loader, which sees every value anyway (one float32 sum per stored batch: a few percent of a load; the same
# test in SQL is one function call per element and costs 10-12 times the rest of the check): a rank
# that finds one refuses the run with the bad-row report (loader.load_shard). With bad_rows='exclude' the rows
# must be left out of the manifest, so compute_shards checks them too.
LOAD_KINDS = ("non_finite", "out_of_range")
# What a kind means when the features are scalar columns.
COLUMN_KINDS = {"null_features": "a feature column is NULL", "non_finite": "a feature column is NaN or infinite",
                "out_of_range": "a feature column is beyond float32's range (|x| > 3.4028235e38)"}


@dataclass(frozen=True)
class PlannedRows:
    """What compute_shards planned for a run, as the loader needs it to read exactly those rows.

    Rows are selected "as of" the planning snapshot by their ``xmin``, with the snapshot's own rule: a row the
    loader sees was planned iff its inserting transaction had committed when the snapshot was taken, that is,
    its xid is below the snapshot's ``xmin``, or below its ``xmax`` and not one of its ``in_progress`` xids
    (``planned_rows``). That needs no list of the transactions that touched the table, however many there were.

    ``xmin`` is a 32-bit xid that wraps, and VACUUM freezes old rows but keeps their raw (possibly very old)
    ``xmin``, so such a row's xmin can wrap into the window that is judged by it. Wrapped rows that land on an
    in-progress xid or at/after ``xmax`` would look new: ``seen_xmins`` lists their raw xmins (planning can tell
    them apart, since the planning snapshot cannot see a row of such a transaction), complete for xids below
    ``xid_horizon``; a load that starts later refuses.
    """

    run_id: str
    snapshot: str
    xmin: int  # 64-bit xmin of the planning snapshot
    xmax: int  # 64-bit xmax of the planning snapshot
    in_progress: tuple[int, ...]  # raw 32-bit xids the planning snapshot saw as in progress (pg_snapshot_xip)
    seen_xmins: tuple[int, ...]  # raw 32-bit xmins of wrapped frozen planned rows that look new
    xid_horizon: int  # 64-bit
    input_dim: int
    num_classes: int | None  # classification only
    exclude_bad_rows: bool
    batch_rows: int
    output_dim: int | None = None  # classes, or the regression target's width


@dataclass(frozen=True)
class Column:
    """A scalar feature column: its name and its type (format_type without modifiers)."""

    name: str
    type: str

    @property
    def wire(self) -> str:
        """How its values travel to the loader: 'f4' or 'f8' (big-endian)."""
        return SCALAR_TYPES[self.type]


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
        """'label' (classification), 'scalar', or the array format of a regression target."""
        if self.task == "classification":
            return "label"
        return TARGET_ARRAY_TYPES.get(self.label_type, "scalar")


def source_from_config(conn: psycopg.Connection, config: TrainingConfig) -> Source:
    """resolve_source with the source params of a TrainingConfig."""
    columns = config.feature_columns
    return resolve_source(conn, config.source_table, config.key_column, config.features_column,
                          config.label_column, feature_columns=tuple(columns) if columns is not None else None,
                          task=config.task)


class MissingColumnError(SourceError):
    """A column named by a param is not in the table."""

    def __init__(self, message: str, role: str, columns: list[str]) -> None:
        super().__init__(message)
        self.role, self.columns = role, columns


def resolve_source(conn: psycopg.Connection, table: str, key: str, features: str | None, label: str | None, *,
                   feature_columns: tuple[str, ...] | None = None, task: str = "classification") -> Source:
    """Look the table and columns up in the catalog; raise SourceError saying what is missing and what to do.

    ``label=None``: a source to score (``pgtrain.inference.predict``), without a target; then one array or bytea
    column given as ``feature_columns`` is taken as the features column (a version records either as a list).
    """
    _check_feature_params(features, feature_columns)
    if task not in TASKS:
        raise SourceError(f"task {task!r} is not one of {', '.join(TASKS)}")
    oid, schema, relname, relkind = _relation(conn, table)
    name = sql.Identifier(schema, relname).as_string(conn)
    if relkind not in ("r", "p", "m"):
        raise SourceError(_not_a_table(name, relkind, key))
    columns = {attname: (base, full) for attname, base, full in conn.execute(
        """SELECT attname, format_type(atttypid, NULL), format_type(atttypid, atttypmod) FROM pg_attribute
           WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped""",
        (oid,),
    ).fetchall()}
    roles = [("key_column", key)] + ([("label_column", label)] if label is not None else [])
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
    for column in feature_columns or ():
        if types[column] not in SCALAR_TYPES:
            raise SourceError(f"feature column {column!r} has type {types[column]}; feature columns must be one "
                              "of " + ", ".join(SCALAR_TYPES) + " (cast it in a view materialized into a table)")
    if label is not None and label in (feature_columns or ()):
        raise SourceError(f"label_column {label!r} is also in feature_columns: the model would see its own target; "
                          "remove it from feature_columns")
    if label is not None:
        _check_label_type(label, types[label], task)
    _require_unique_key(conn, oid, name, relkind, key)
    feature_format = COLUMNS if features is None else FEATURE_FORMATS[types[features]]
    return Source(schema, relname, key, features, label, columns[key][1], feature_format,
                  feature_columns=tuple(Column(c, types[c]) for c in feature_columns or ()), task=task,
                  label_type=types[label] if label is not None else "")


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


def _check_feature_params(features: str | None, feature_columns: tuple[str, ...] | None) -> None:
    if features is not None and feature_columns is not None:
        raise SourceError(
            f"both features_column ({features!r}) and feature_columns ({list(feature_columns)}) are set, but the "
            "features come from one or the other: set features_column to null to train on the scalar columns, or "
            "feature_columns to null to train on the array column")
    if features is None and not feature_columns:
        raise SourceError(
            "no features: set feature_columns to the scalar feature columns (in input order), or features_column "
            "to one real[], double precision[] or bytea column (and feature_columns to null)")
    duplicates = sorted({c for c in feature_columns or () if feature_columns.count(c) > 1})
    if duplicates:
        raise SourceError(f"feature_columns names {', '.join(map(repr, duplicates))} more than once; "
                          "list each column once")


def _check_label_type(label: str, label_type: str, task: str) -> None:
    if task == "classification" and label_type not in LABEL_TYPES:
        hint = " (for a numeric target, set task='regression')" if label_type in {
            *SCALAR_TYPES, *TARGET_ARRAY_TYPES} - {"boolean"} else ""
        raise SourceError(f"label_column {label!r} has type {label_type}; classification needs an integer class "
                          f"label{hint}")
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


@contextmanager
def snapshot_transaction(conn: psycopg.Connection, snapshot: str | None = None) -> Iterator[None]:
    """One REPEATABLE READ transaction: every statement in it sees the same rows; with ``snapshot`` (from
    ``pg_export_snapshot()`` in a transaction still open), the same rows as that transaction."""
    if not conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        raise PgtrainError(
            "planning and loading shards need an autocommit connection outside any transaction "
            "(pgtrain.db.connect() gives one), to run in their own REPEATABLE READ snapshot"
        )
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        if snapshot is not None:
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
        yield


def prefer_index_order(conn: psycopg.Connection) -> None:
    """For the rest of this transaction, read rows in key order by walking the key's unique index, never by
    sorting them: a freshly loaded table has no visibility map or statistics yet, and PostgreSQL may otherwise
    pick a sequential (or bitmap) scan and a sort, which is never the cheaper plan for these queries."""
    conn.execute("SET LOCAL enable_sort = off")


def array_length(value: sql.Composable, bytea: bool = False) -> sql.Composable:
    """SQL for the number of values in an array (or packed float32 bytea): NULL for NULL, -1 when it is no flat
    vector."""
    if bytea:
        return sql.SQL("CASE WHEN {f} IS NULL THEN NULL WHEN mod(octet_length({f}), 4) = 0 "
                       "THEN octet_length({f}) / 4 ELSE -1 END").format(f=value)
    return sql.SQL("CASE WHEN {f} IS NULL THEN NULL WHEN array_ndims({f}) = 1 THEN cardinality({f}) "
                   "ELSE -1 END").format(f=value)


def feature_length(source: Source) -> sql.Composable:
    """SQL for the number of features in a row: NULL for NULL features, -1 when they are no flat vector."""
    if source.feature_format == COLUMNS:
        return sql.Literal(len(source.feature_columns))
    return array_length(source.features, source.feature_format == "bytea")


def target_length(source: Source) -> sql.Composable:
    """SQL for the width of an array target (as feature_length)."""
    return array_length(source.label)


def is_validation(source: Source, fraction: float, seed: int) -> sql.Composable:
    """SQL boolean: the row is held out for validation. Deterministic in (key, seed)."""
    threshold = int(round(fraction * _SPLIT_BUCKETS))
    return sql.SQL("(abs(mod(hashtextextended({}::text, {}), {})) < {})").format(
        source.key, sql.Literal(seed), sql.Literal(_SPLIT_BUCKETS), sql.Literal(threshold)
    )


def key_range(source: Source, lo: str | sql.Composable, hi: str | sql.Composable) -> sql.Composable:
    """SQL boolean: the key lies in [lo, hi]; bounds are the key's text form (values or SQL), cast to its type."""
    key_type = sql.SQL(source.key_type)  # from format_type() in the catalog, never user text
    lo, hi = (b if isinstance(b, sql.Composable) else sql.Literal(b) for b in (lo, hi))
    return sql.SQL("{k} BETWEEN CAST({lo} AS {t}) AND CAST({hi} AS {t})").format(
        k=source.key, lo=lo, hi=hi, t=key_type
    )


# --- values: checks and binary form ---------------------------------------------------------------------------

def _scalar_non_finite(value: sql.Composable, type_: str) -> sql.Composable | None:
    if type_ not in _FLOATING:
        return None
    # NaN sorts above +Infinity in PostgreSQL (numeric too), so one comparison finds both.
    return sql.SQL("({v} >= CAST('Infinity' AS {t}) OR {v} = CAST('-Infinity' AS {t}))").format(
        v=value, t=sql.SQL(type_))


def _scalar_out_of_range(value: sql.Composable, type_: str) -> sql.Composable | None:
    if type_ not in _WIDER_THAN_FLOAT32:
        return None
    return sql.SQL("(abs({v}) > CAST({m} AS {t}) AND abs({v}) < CAST('Infinity' AS {t}))").format(
        v=value, m=sql.Literal(_FLOAT32_MAX[type_]), t=sql.SQL(type_))


def _array_checks(value: sql.Composable, element: str) -> dict[str, sql.Composable]:
    """null_elements, non_finite and (double precision) out_of_range of a flat array; never NULL."""
    t = sql.SQL(element)
    non_finite = sql.SQL("(CAST('Infinity' AS {t}) <= ANY({f}) OR CAST('-Infinity' AS {t}) = ANY({f}))").format(
        f=value, t=t)
    checks = {
        "null_elements": sql.SQL(
            "CASE WHEN array_ndims({f}) = 1 THEN array_position({f}, NULL) IS NOT NULL ELSE false END").format(
            f=value),
        "non_finite": sql.SQL("coalesce({}, false)").format(non_finite),
    }
    if element in _WIDER_THAN_FLOAT32:
        # Only rows with a value past float32's largest are looked at twice; infinities count as non_finite.
        checks["out_of_range"] = sql.SQL(
            "coalesce((CAST({m} AS {t}) < ANY({f}) OR CAST({n} AS {t}) > ANY({f})) AND NOT {nf}, false)").format(
            m=sql.Literal(_FLOAT32_MAX[element]), n=sql.Literal("-" + _FLOAT32_MAX[element]), t=t, f=value,
            nf=non_finite)
    return checks


def _any_of(parts: list[sql.Composable]) -> sql.Composable | None:
    if not parts:
        return None
    return sql.SQL("coalesce({}, false)").format(sql.SQL(" OR ").join(parts))


def column_checks(column: Column, value: sql.Composable | None = None) -> list[sql.Composable]:
    """SQL booleans (NULL when the value is NULL) of what makes one scalar feature value bad; ``value``: SQL for
    the column's value (default: the column)."""
    value = value if value is not None else sql.Identifier(column.name)
    return [sql.SQL("{} IS NULL").format(value)] + [c for c in (
        _scalar_non_finite(value, column.type), _scalar_out_of_range(value, column.type)) if c is not None]


def row_checks(source: Source, dim: int, num_classes: int | None,
               output_dim: int | None = None, *, values: bool = True) -> dict[str, sql.Composable]:
    """SQL booleans (never NULL), one per bad-row kind of BAD_ROW_KINDS that applies to this source.

    ``num_classes=None`` (inferred as max(label) + 1) only rules out negative labels. ``output_dim``: the width
    of an array regression target. ``values=False`` leaves out the feature kinds of LOAD_KINDS (the loader checks
    every feature value it stores instead).
    """
    label = source.label
    checks = feature_checks(source, dim, values=values)
    checks["null_label"] = sql.SQL("({} IS NULL)").format(label)
    target = source.target_format
    if target == "label":
        upper = sql.SQL(" OR {} >= {}").format(label, sql.Literal(num_classes)) if num_classes else sql.SQL("")
        checks["label_out_of_range"] = sql.SQL("coalesce({} < 0{}, false)").format(label, upper)
    elif target == "scalar":
        for kind, check in (("target_non_finite", _scalar_non_finite),
                            ("target_out_of_range", _scalar_out_of_range)):
            found = check(label, source.label_type)
            if found is not None:
                checks[kind] = sql.SQL("coalesce({}, false)").format(found)
    else:
        checks["target_wrong_length"] = sql.SQL("({} IS NOT NULL AND {} IS DISTINCT FROM {})").format(
            label, target_length(source), sql.Literal(output_dim))
        checks |= {f"target_{kind}": check
                   for kind, check in _array_checks(label, ARRAY_ELEMENTS[target]).items()}
    return {kind: checks[kind] for kind in BAD_ROW_KINDS if kind in checks}


def feature_checks(source: Source, dim: int, *, values: bool = True) -> dict[str, sql.Composable]:
    """The key's and features' part of ``row_checks`` (all a row needs to be scored), in BAD_ROW_KINDS order;
    without the per-value kinds of LOAD_KINDS unless ``values``."""
    checks = {"null_key": sql.SQL("({} IS NULL)").format(source.key)}
    if source.feature_format == COLUMNS:
        columns = [(sql.Identifier(c.name), c.type) for c in source.feature_columns]
        checks["null_features"] = sql.SQL("({})").format(sql.SQL(" OR ").join(
            sql.SQL("{} IS NULL").format(v) for v, _ in columns))
        for kind, check in (("non_finite", _scalar_non_finite), ("out_of_range", _scalar_out_of_range)):
            found = _any_of([c for c in (check(v, t) for v, t in columns) if c is not None])
            if found is not None:
                checks[kind] = found
    else:
        f = source.features
        checks["null_features"] = sql.SQL("({} IS NULL)").format(f)
        checks["wrong_length"] = sql.SQL("({} IS NOT NULL AND {} IS DISTINCT FROM {})").format(
            f, feature_length(source), sql.Literal(dim))
        if source.feature_format == "bytea":
            checks["non_finite"] = sql.SQL("coalesce(encode({}, 'hex') ~ {}, false)").format(
                f, sql.Literal(_BYTEA_NON_FINITE))
        else:
            checks |= _array_checks(f, ARRAY_ELEMENTS[source.feature_format])
    return {kind: checks[kind] for kind in BAD_ROW_KINDS if kind in checks and (values or kind not in LOAD_KINDS)}


def bad_row(source: Source, dim: int, num_classes: int | None, output_dim: int | None = None, *,
            values: bool = True) -> sql.Composable:
    """SQL boolean: the row has any of the problems of ``row_checks`` (the bad_rows='exclude' filter; with
    ``values=False`` without the kinds of LOAD_KINDS, as compute_shards' first scan counts them).

    The same rows as OR-ing ``row_checks``, in fewer function calls: a flat array's NULL, length and NULL-element
    checks are one CASE, a packed bytea's NULL and length checks one comparison, a label's NULL and range checks
    one test (measured: the lean check scan of 2M x real[100] takes 0.74 CPU seconds instead of 0.84, against
    0.55 for a bare scan that reads every feature value).
    """
    checks = row_checks(source, dim, num_classes, output_dim, values=values)
    merged: dict[str, sql.Composable] = {}
    f = source.features if source.feature_format != COLUMNS else None
    if source.feature_format in ARRAY_ELEMENTS:
        # array_position refuses multi-dimensional arrays: the CASE calls it on flat ones only. NULL or empty
        # features (array_ndims NULL) and wrong shapes fall to ELSE.
        merged["null_features"] = sql.SQL(
            "CASE WHEN array_ndims({f}) = 1 AND cardinality({f}) = {dim} THEN array_position({f}, NULL) IS NOT NULL "
            "ELSE true END").format(f=f, dim=sql.Literal(dim))
        covered = {"null_features", "wrong_length", "null_elements"}
    elif source.feature_format == "bytea":
        merged["null_features"] = sql.SQL("(octet_length({}) IS DISTINCT FROM {})").format(f, sql.Literal(4 * dim))
        covered = {"null_features", "wrong_length"}
    else:
        covered = set()
    if source.target_format == "label":
        upper = sql.SQL(" AND {} < {}").format(source.label, sql.Literal(num_classes)) if num_classes else sql.SQL("")
        merged["null_label"] = sql.SQL("(({} >= 0{}) IS NOT TRUE)").format(source.label, upper)
        covered |= {"null_label", "label_out_of_range"}
    parts = [merged.get(kind, check) for kind, check in checks.items() if kind not in covered or kind in merged]
    return sql.SQL("({})").format(sql.SQL(" OR ").join(parts))


def _scalar_value(value: sql.Composable, type_: str) -> sql.Composable:
    """SQL: one scalar as real or double precision (SCALAR_TYPES says which), never raising for a value the
    checks let through."""
    if type_ in ("real", "double precision"):
        return value
    if type_ == "numeric":
        # A numeric too small for float8 would raise: it is 0 in float32 anyway. One too large for it (or NaN,
        # which sorts above every number) is sent as 1e300, infinite in float32: the loader finds it and refuses.
        return sql.SQL("CAST(CASE WHEN abs({v}) < 1e-300 THEN 0 WHEN abs({v}) > 1e300 THEN 1e300 ELSE {v} END "
                       "AS double precision)").format(v=value)
    if type_ == "boolean":
        return sql.SQL("CAST(CAST({} AS integer) AS real)").format(value)
    return sql.SQL("CAST({v} AS {t})").format(
        v=value, t=sql.SQL("real" if SCALAR_TYPES[type_] == "f4" else "double precision"))


def _scalar_send(value: sql.Composable, type_: str) -> sql.Composable:
    """SQL bytea: one scalar as float4send or float8send (SCALAR_TYPES says which)."""
    return sql.SQL("float{}send({})").format(sql.SQL(SCALAR_TYPES[type_][1]), _scalar_value(value, type_))


def feature_groups(source: Source) -> dict[str, list[int]]:
    """Scalar feature columns: wire ('f4', 'f8') -> positions in feature order; the payload holds the f4
    group first, then the f8 group, each in feature order, each one real[] or double precision[] (array_send)."""
    groups: dict[str, list[int]] = {"f4": [], "f8": []}
    for i, column in enumerate(source.feature_columns):
        groups[column.wire].append(i)
    return {wire: positions for wire, positions in groups.items() if positions}


def feature_payload(source: Source) -> sql.Composable:
    """SQL bytea: a row's features as the loader reads them."""
    if source.feature_format == "bytea":
        return source.features
    if source.feature_format != COLUMNS:
        return sql.SQL("array_send({})").format(source.features)
    # One array per group, built in one allocation and sent by array_send: measured faster than concatenating
    # one float4send per column (each || copies the row so far) and than the plain COPY's 100 fields.
    return sql.SQL(" || ").join(
        sql.SQL("array_send(CAST(ARRAY[{}] AS {}))").format(
            sql.SQL(", ").join(_scalar_value(sql.Identifier(source.feature_columns[i].name),
                                             source.feature_columns[i].type) for i in positions),
            sql.SQL(ARRAY_ELEMENTS[WIRE_ARRAYS[wire]] + "[]"))
        for wire, positions in feature_groups(source).items())


def target_payload(source: Source) -> sql.Composable:
    """SQL bytea: a row's label (int4) or regression target (scalar or array) as the loader reads it."""
    target = source.target_format
    if target == "label":
        return sql.SQL("int4send(CAST({} AS integer))").format(source.label)
    if target == "scalar":
        return _scalar_send(source.label, source.label_type)
    return sql.SQL("array_send({})").format(source.label)


# --- rows as of the planning snapshot -------------------------------------------------------------------------

_XID_SPACE = 1 << 32
# How far past the planning snapshot's xmax a rank may still load, and how many distinct raw xmins of wrapped
# frozen rows that look newer than that xmax the plan may list (past that, the horizon comes nearer).
XID_HORIZON = 1 << 30
SEEN_XMINS_MAX = 10_000
_AGE_MAX = (1 << 31) - 1  # age() is an int4: two xids further apart than this cannot be told apart by it


@dataclass(frozen=True)
class XidClock:
    """The current transaction's snapshot, and the xid that ``age()`` counts from in it, all 64-bit."""

    snapshot: str
    xmin: int
    xmax: int
    now: int
    xip: tuple[int, ...] = ()  # the snapshot's in-progress xids


def read_xid_clock(conn: psycopg.Connection) -> XidClock:
    """Read in a REPEATABLE READ transaction: then ``now`` is fixed and no visible row is younger than it."""
    snapshot, xmin, xmax, age_of_3, xip = conn.execute(
        """SELECT s::text, pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint, age('3'::xid),
                  array(SELECT x::text::bigint FROM pg_snapshot_xip(s) AS x ORDER BY 1)
           FROM pg_current_snapshot() AS s"""
    ).fetchone()
    return XidClock(snapshot, xmin, xmax, widen_xid((age_of_3 + 3) % _XID_SPACE, xmax), tuple(xip))


def widen_xid(xid32: int, floor: int) -> int:
    """The smallest 64-bit xid >= ``floor`` whose low 32 bits are ``xid32``."""
    return floor + (xid32 - floor) % _XID_SPACE


def xid_limit(clock: XidClock) -> int:
    """The furthest 64-bit xid (exclusive) a load of a plan made with ``clock`` may start at."""
    return min(clock.xmax + XID_HORIZON, clock.xmin + _AGE_MAX)


def _xid_array(xids: tuple[int, ...]) -> sql.Composable:
    return sql.SQL("CAST({} AS xid[])").format(sql.Literal("{" + ",".join(str(x % _XID_SPACE) for x in xids) + "}"))


def alias_xmin_age(source: Source, clock: XidClock) -> sql.Composable:
    """SQL: age(xmin) of a row visible to ``clock``'s snapshot whose xmin is one of its in-progress xids or lies in
    [xmax, ``xid_limit``), else NULL. Such a row can only be a frozen one whose old raw xmin wrapped there."""
    x = sql.Identifier(source.schema, source.table, "xmin")
    return sql.SQL("CASE WHEN age({x}) BETWEEN {far} AND {near} OR {x} = ANY({xip}) THEN age({x}) END").format(
        x=x, far=sql.Literal(clock.now - xid_limit(clock) + 1), near=sql.Literal(clock.now - clock.xmax),
        xip=_xid_array(clock.xip))


def xmins_may_alias(clock: XidClock) -> bool:
    """Whether a row visible to ``clock``'s snapshot can have a raw xmin that ``alias_xmin_age`` looks for.

    Not before the cluster's xids pass one 32-bit round plus XID_HORIZON: until then every raw xmin is its own
    64-bit xid X (3 <= X < xmax), whose age() is either above the window or, once it exceeds 2^31, X + 2^32 -
    now, in the window only if X + 2^32 < ``xid_limit``; and an in-progress xid is no visible row's xmin."""
    return xid_limit(clock) > _XID_SPACE + 3


def seen_xmins(ages: list[int], clock: XidClock) -> tuple[tuple[int, ...], int]:
    """From the ``alias_xmin_age`` values of the planned rows: (their raw xmins, in-progress ones first, then the
    nearest the snapshot's xmax first; 64-bit xid below which that list is complete)."""
    distances = sorted({clock.now - age - clock.xmax for age in ages})  # < 0: an in-progress xid
    in_progress = [d for d in distances if d < 0]  # as many as the snapshot had in-progress xids, at most
    later = [d for d in distances if d >= 0]
    horizon = xid_limit(clock)
    if len(later) > SEEN_XMINS_MAX:
        horizon, later = clock.xmax + later[SEEN_XMINS_MAX], later[:SEEN_XMINS_MAX]
    return tuple((clock.xmax + d) % _XID_SPACE for d in in_progress + later), horizon


def planned_rows(source: Source, clock: XidClock, alias: str | None = None) -> sql.Composable:
    """SQL boolean: the row was visible to the planning snapshot (``clock`` read in the loading transaction).

    ``alias``: the name the source table has in the query, if it is aliased there.

    A row the loader sees is committed. age() places its raw xmin in the window [planning xmin, now] or outside
    it; the horizon keeps that window under 2^31 xids, so inside it the placement is exact. Outside it, the xid
    is older than the planning snapshot, or a frozen row's wrapped one: planned. Inside it, the row is either
    the real inserting transaction's, planned iff committed before the snapshot (below xmax, not in progress),
    or a frozen row wrapped there, which is old and planned: below xmax and not in progress it passes the same
    test, and elsewhere ``seen_xmins`` names it (complete below ``xid_horizon``, hence the refusal past it).
    Aborted inserts never reach here (the loader's snapshot hides them); and no per-transaction list is needed.
    One case the snapshot cannot tell: pg_snapshot lists no subtransaction xids, so a row inserted in a savepoint
    of a transaction in progress at planning, committed since, is read; the rank then reads more rows than
    planned and refuses (load_shard's count check).
    """
    plan = source.plan
    if plan is None:
        raise PgtrainError(f"{source.qualified_name} has no planned snapshot; manifest.source_for gives one")
    if not (plan.xmin <= clock.now < plan.xid_horizon and clock.now - plan.xmin <= _AGE_MAX):
        raise SourceError(
            f"run {plan.run_id} was planned at transaction {plan.xmin} and the database is now at {clock.now}: "
            "too far apart to tell the planned rows from newer ones by their xmin; re-run the DAG run from "
            "compute_shards"
        )
    xmin = sql.Identifier(alias, "xmin") if alias else sql.Identifier(source.schema, source.table, "xmin")
    return sql.SQL("CASE WHEN age({x}) BETWEEN 0 AND {since_xmin} "
                   "THEN (age({x}) > {since_xmax} AND NOT ({x} = ANY({in_progress}))) OR {x} = ANY({seen}) "
                   "ELSE true END").format(
        x=xmin, since_xmin=sql.Literal(clock.now - plan.xmin), since_xmax=sql.Literal(clock.now - plan.xmax),
        in_progress=_xid_array(plan.in_progress), seen=_xid_array(plan.seen_xmins))
