"""The user's source table: resolve and check its identifiers, and the SQL fragments that select its rows.

Identifiers given by users are looked up in the catalog and only ever reach SQL quoted. The
row-selection fragments here are shared by the planner (``compute_shards``) and the trainer's
loader, so both sides agree on which rows a run trains on:

- ``is_validation``: the deterministic train/validation split (a hash of the key);
- ``row_checks`` / ``bad_row``: what makes a row unusable (NULLs, NaN/Inf, wrong length, bad label);
- ``planned_rows``: the row was visible to the snapshot the manifest was cut in. Rows inserted
  (or updated) after planning have a newer ``xmin`` and are left out; see ``PlannedRows``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from pgtrain.errors import PgtrainError, SourceError

FEATURE_FORMATS = {"real[]": "float4_array", "double precision[]": "float8_array", "bytea": "bytea"}
ARRAY_ELEMENTS = {"float4_array": "real", "float8_array": "double precision"}
LABEL_TYPES = {"smallint", "integer", "bigint"}
# Resolution of the hash-based validation split: fraction is applied in millionths.
_SPLIT_BUCKETS = 1_000_000
# A packed little-endian float32 is NaN or infinite when its 8 exponent bits are all set: the high bit of its
# third byte and the low 7 bits of its fourth. In hex, 8 characters per value: the 5th is 8-f, the 7th 7 or f,
# the 8th f.
_BYTEA_NON_FINITE = r"^(?:.{8})*.{4}[89a-f].[7f]f"

# Bad-row kinds, cheapest check first (bad_row ORs them in this order), and what each means.
BAD_ROW_KINDS: dict[str, str] = {
    "null_key": "the key is NULL",
    "null_features": "the features are NULL",
    "wrong_length": "the feature vector does not hold {dim} values",
    "null_label": "the label is NULL",
    "label_out_of_range": "the label is outside [0, {num_classes})",
    "null_elements": "the feature array has NULL elements",
    "non_finite": "a feature is NaN or infinite",
}


@dataclass(frozen=True)
class PlannedRows:
    """What compute_shards planned for a run, as the loader needs it to read exactly those rows.

    Rows are selected "as of" the planning snapshot by their ``xmin``. ``xmin`` is a 32-bit xid that wraps,
    and VACUUM freezes old rows but keeps their raw (possibly very old) ``xmin``, so a row's xmin alone cannot
    say whether it predates the snapshot. What it can say, measured with ``age()`` from now: a row whose xmin
    lies in [snapshot xmin, now] is new unless its xmin is one of ``seen_xmins``, the raw xmins of planned rows
    in that window (transactions that committed just before planning, or frozen rows whose old xids wrapped
    into it). ``seen_xmins`` is complete for xids below ``xid_horizon``; a load that starts later refuses.
    """

    run_id: str
    snapshot: str
    xmin: int  # 64-bit xmin of the planning snapshot
    seen_xmins: tuple[int, ...]
    xid_horizon: int  # 64-bit
    input_dim: int
    num_classes: int
    exclude_bad_rows: bool
    batch_rows: int


@dataclass(frozen=True)
class Source:
    schema: str
    table: str
    key_column: str
    features_column: str
    label_column: str
    key_type: str
    feature_format: str
    plan: PlannedRows | None = None  # set by manifest.source_for once compute_shards has run

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


@contextmanager
def snapshot_transaction(conn: psycopg.Connection) -> Iterator[None]:
    """One REPEATABLE READ transaction: every statement in it sees the same rows."""
    if not conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        raise PgtrainError(
            "planning and loading shards need an autocommit connection outside any transaction "
            "(pgtrain.db.connect() gives one), to run in their own REPEATABLE READ snapshot"
        )
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def prefer_index_order(conn: psycopg.Connection) -> None:
    """For the rest of this transaction, read rows in key order by walking the key's unique index, never by
    sorting them: a freshly loaded table has no visibility map or statistics yet, and PostgreSQL may otherwise
    pick a sequential (or bitmap) scan and a sort, which is never the cheaper plan for these queries."""
    conn.execute("SET LOCAL enable_sort = off")


def feature_length(source: Source) -> sql.Composable:
    """SQL for the number of features in a row: NULL for NULL features, -1 when they are no flat vector."""
    f = source.features
    if source.feature_format == "bytea":
        return sql.SQL("CASE WHEN {f} IS NULL THEN NULL WHEN mod(octet_length({f}), 4) = 0 "
                       "THEN octet_length({f}) / 4 ELSE -1 END").format(f=f)
    return sql.SQL("CASE WHEN {f} IS NULL THEN NULL WHEN array_ndims({f}) = 1 THEN cardinality({f}) "
                   "ELSE -1 END").format(f=f)


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


def row_checks(source: Source, dim: int, num_classes: int | None) -> dict[str, sql.Composable]:
    """SQL booleans (never NULL), one per bad-row kind of BAD_ROW_KINDS that applies to this source.

    ``num_classes=None`` (inferred as max(label) + 1) only rules out negative labels.
    """
    f, label = source.features, source.label
    upper = sql.SQL(" OR {} >= {}").format(label, sql.Literal(num_classes)) if num_classes else sql.SQL("")
    checks = {
        "null_key": sql.SQL("({} IS NULL)").format(source.key),
        "null_features": sql.SQL("({} IS NULL)").format(f),
        "wrong_length": sql.SQL("({} IS NOT NULL AND {} IS DISTINCT FROM {})").format(
            f, feature_length(source), sql.Literal(dim)),
        "null_label": sql.SQL("({} IS NULL)").format(label),
        "label_out_of_range": sql.SQL("coalesce({} < 0{}, false)").format(label, upper),
    }
    if source.feature_format == "bytea":
        checks["non_finite"] = sql.SQL("coalesce(encode({}, 'hex') ~ {}, false)").format(
            f, sql.Literal(_BYTEA_NON_FINITE))
    else:
        element = sql.SQL(ARRAY_ELEMENTS[source.feature_format])
        checks["null_elements"] = sql.SQL(
            "CASE WHEN array_ndims({f}) = 1 THEN array_position({f}, NULL) IS NOT NULL ELSE false END"
        ).format(f=f)
        # NaN sorts above +Infinity in PostgreSQL, so one comparison finds both.
        checks["non_finite"] = sql.SQL(
            "coalesce(CAST('Infinity' AS {t}) <= ANY({f}) OR CAST('-Infinity' AS {t}) = ANY({f}), false)"
        ).format(f=f, t=element)
    return {kind: checks[kind] for kind in BAD_ROW_KINDS if kind in checks}


def bad_row(source: Source, dim: int, num_classes: int | None) -> sql.Composable:
    """SQL boolean: the row has any of the problems of ``row_checks`` (the bad_rows='exclude' filter)."""
    return sql.SQL("({})").format(sql.SQL(" OR ").join(row_checks(source, dim, num_classes).values()))


# --- rows as of the planning snapshot -------------------------------------------------------------------------

_XID_SPACE = 1 << 32
# How far past the planning snapshot's xmin the list of seen xmins reaches (and so how many transactions
# later a rank may still load), and how many distinct xmins it may hold.
XID_HORIZON = 1 << 30
SEEN_XMINS_MAX = 10_000


@dataclass(frozen=True)
class XidClock:
    """The current transaction's snapshot, and the xid that ``age()`` counts from in it, all 64-bit."""

    snapshot: str
    xmin: int
    xmax: int
    now: int


def read_xid_clock(conn: psycopg.Connection) -> XidClock:
    """Read in a REPEATABLE READ transaction: then ``now`` is fixed and no visible row is younger than it."""
    snapshot, xmin, xmax, age_of_3 = conn.execute(
        """SELECT s::text, pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint, age('3'::xid)
           FROM pg_current_snapshot() AS s"""
    ).fetchone()
    return XidClock(snapshot, xmin, xmax, widen_xid((age_of_3 + 3) % _XID_SPACE, xmax))


def widen_xid(xid32: int, floor: int) -> int:
    """The smallest 64-bit xid >= ``floor`` whose low 32 bits are ``xid32``."""
    return floor + (xid32 - floor) % _XID_SPACE


def recent_xmin_age(source: Source, clock: XidClock) -> sql.Composable:
    """SQL: age(xmin) of a row whose xmin lies in [snapshot xmin, snapshot xmin + XID_HORIZON), else NULL."""
    newest = clock.now - clock.xmin  # the age of an xmin equal to the snapshot's xmin
    return sql.SQL("CASE WHEN age({x}) BETWEEN {lo} AND {hi} THEN age({x}) END").format(
        x=sql.Identifier(source.schema, source.table, "xmin"),
        lo=sql.Literal(newest - XID_HORIZON + 1), hi=sql.Literal(newest))


def seen_xmins(ages: list[int], clock: XidClock) -> tuple[tuple[int, ...], int]:
    """From the ``recent_xmin_age`` values of the planned rows: (raw xmins nearest the snapshot's xmin first,
    64-bit xid below which that list is complete)."""
    newest = clock.now - clock.xmin
    distances = sorted({newest - age for age in ages})
    horizon = XID_HORIZON
    if len(distances) > SEEN_XMINS_MAX:
        horizon, distances = distances[SEEN_XMINS_MAX], distances[:SEEN_XMINS_MAX]
    return tuple((clock.xmin + d) % _XID_SPACE for d in distances), clock.xmin + horizon


def planned_rows(source: Source, clock: XidClock, alias: str | None = None) -> sql.Composable:
    """SQL boolean: the row was visible to the planning snapshot (``clock`` read in the loading transaction).

    ``alias``: the name the source table has in the query, if it is aliased there.
    """
    plan = source.plan
    if plan is None:
        raise PgtrainError(f"{source.qualified_name} has no planned snapshot; manifest.source_for gives one")
    if not plan.xmin <= clock.now < plan.xid_horizon:
        raise SourceError(
            f"run {plan.run_id} was planned at transaction {plan.xmin} and the database is now at {clock.now}: "
            "too far apart to tell the planned rows from newer ones by their xmin; re-run the DAG run from "
            "compute_shards"
        )
    xmin = sql.Identifier(alias, "xmin") if alias else sql.Identifier(source.schema, source.table, "xmin")
    seen = "{" + ",".join(map(str, plan.seen_xmins)) + "}"
    return sql.SQL("CASE WHEN age({x}) BETWEEN 0 AND {window} THEN {x} = ANY(CAST({seen} AS xid[])) "
                   "ELSE true END").format(x=xmin, window=sql.Literal(clock.now - plan.xmin),
                                           seen=sql.Literal(seen))
