"""Where ``predict`` writes, and how a run takes the place of an earlier one's rows (``mode``):

- ``upsert`` (the default): every scored key gets this run's prediction, inserted or updated (one
  ``INSERT ... ON CONFLICT`` from a temporary table the COPY fills); no other row is touched.
- ``replace``: the table's rows are deleted and this run's written, in the one transaction: other sessions see the
  previous rows until it commits, then the new ones (DELETE, not TRUNCATE, which an older snapshot sees empty).
- ``append``: refused, before a row is written, when the table holds a key the source has; else rows are added.

A table the run creates takes its rows in one COPY whatever the mode: it has none, and no other session sees it
before the run commits.

``--into`` is resolved as SQL resolves it (never into pgtrain's own schema), created when missing (the key as
PRIMARY KEY), and every way an existing table does not fit what this run writes is refused before a row is
written. The whole run is one transaction: a failure leaves the previous rows as they were.

The classes of ``probabilities`` are recorded, in the array's order and in their text form, as JSON in the
column's comment: ``{"classes": ["Adelie", "Chinstrap", "Gentoo"]}`` (``probability_classes`` reads it). A comment
is part of the table (transactional, dumped and restored with it), costs no bytes per row, and keeps the array a
fixed double precision[] that the rows are built as; rows of other classes are never mixed in: an upsert or
append whose classes differ from the recorded ones is refused (``replace`` rewrites the table and its comment).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgtrain.core.errors import PgtrainError
from pgtrain.core.migrations import SCHEMA as PGTRAIN_SCHEMA
from pgtrain.data import copy_binary
from pgtrain.data.source.resolve import Source, find_relation
from pgtrain.store.prediction_rows import PREDICTION_COLUMN, PROBABILITIES_COLUMN

MODES = ("upsert", "replace", "append")
DEFAULT_MODE = "upsert"
_STAGED = "pgtrain_predictions_staged"  # the upsert's temporary table, dropped when the run ends
_FLOAT8_ARRAY = "double precision[]"


@dataclass(frozen=True)
class Target:
    """The table a run writes (``table``, named ``into`` by the user), how (``mode``) and where its COPY goes
    (``copy_into``: the table itself, or the upsert's temporary table)."""

    table: sql.Identifier
    into: str
    mode: str
    key: sql.Identifier
    columns: tuple[str, ...]  # the columns written, the key first
    copy_into: sql.Identifier
    classes_comment: str | None  # the probabilities' comment to record at the end (None: it is right already)

    @property
    def staged(self) -> bool:
        """Whether the COPY fills the upsert's temporary table (merged into the table by ``finish``)."""
        return self.copy_into != self.table


def open_target(conn: psycopg.Connection, into: str, source: Source, prediction_type: str, mode: str = DEFAULT_MODE,
                classes: Sequence[str] | None = None) -> Target:
    """Resolve ``into`` (created when missing), refuse every way it does not fit, then make ready for ``mode``
    (a table this call created takes one COPY whatever the mode; else append: refuse keys already there; replace:
    delete the rows; upsert: the temporary table). ``classes``: the
    probabilities' classes (in text form), when they are written."""
    if mode not in MODES:
        raise PgtrainError(f"mode {mode!r}: give one of {', '.join(MODES)}")
    table = _table_name(conn, into)
    wanted = {source.key_column: source.key_type, PREDICTION_COLUMN: prediction_type,
              **({PROBABILITIES_COLUMN: _FLOAT8_ARRAY} if classes is not None else {})}
    found, created = _resolve_or_create(conn, table, source, wanted)
    oid, _, _, kind = found
    if kind not in ("r", "p"):
        raise PgtrainError(f"--into {into!r} is not a table (relkind {kind!r}); predict into a table")
    columns = _columns(conn, oid)
    _refuse_misfits(into, columns, wanted)
    if mode == "upsert" and not _key_is_unique(conn, oid, source.key_column):
        raise PgtrainError(f"--mode upsert matches rows by their key, but {source.key_column!r} of {into!r} has no "
                           f"unique index: ALTER TABLE {table.as_string(conn)} ADD PRIMARY KEY "
                           f"({source.key.as_string(conn)}), or use --mode replace")
    comment = _classes_comment(conn, oid, table, into, mode, columns, classes) if classes is not None else None
    copy_into = table
    if not created:  # a table this run created has no rows and no other session sees it: one COPY, whatever the mode
        if mode == "append":
            _refuse_keys_there(conn, table, into, source)
        elif mode == "replace":
            conn.execute(sql.SQL("DELETE FROM {}").format(table))
        else:
            copy_into = sql.Identifier("pg_temp", _STAGED)
            conn.execute(sql.SQL("CREATE TEMPORARY TABLE {} ({}) ON COMMIT DROP").format(
                sql.Identifier(_STAGED), sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t))
                                                            for c, t in wanted.items())))
    return Target(table, into, mode, source.key, tuple(wanted), copy_into, comment)


def _resolve_or_create(conn: psycopg.Connection, table: sql.Identifier, source: Source, wanted: dict[str, str]
                       ) -> tuple[tuple[int, str, str, str], bool]:
    """The table ``table`` names as SQL resolves it (a temporary table first, then the search_path), created when
    it resolves to none (the key as PRIMARY KEY, then the wanted columns): (its relation, whether this call
    created it). A table of another session created meanwhile is one that was there."""
    name = table.as_string(conn)
    found = find_relation(conn, name, role="--into")
    if found is not None:
        return found, False
    try:
        with conn.transaction():  # a savepoint: a table created meanwhile leaves the transaction as it was
            conn.execute(sql.SQL("CREATE TABLE {} ({} {} PRIMARY KEY, {})").format(
                table, source.key, sql.SQL(source.key_type),  # format_type() of the source's key, from the catalog
                sql.SQL(", ").join(sql.SQL("{} {} NOT NULL").format(sql.Identifier(c), sql.SQL(t))
                                   for c, t in list(wanted.items())[1:])))
        created = True
    except (psycopg.errors.DuplicateTable, psycopg.errors.UniqueViolation):  # another session's, committed meanwhile
        created = False
    found = find_relation(conn, name, role="--into")
    if found is None:  # not possible unless the name cannot be resolved after all
        raise PgtrainError(f"--into {name}: the table could not be found after creating it")
    return found, created


def _table_name(conn: psycopg.Connection, into: str) -> sql.Identifier:
    try:
        with conn.transaction():
            parts = conn.execute("SELECT parse_ident(%s)", (into,)).fetchone()[0]
    except psycopg.errors.InvalidParameterValue as error:
        raise PgtrainError(f"--into {into!r} is not a valid table name: {error.diag.message_primary}") from None
    if len(parts) > 2:
        raise PgtrainError(f"--into {into!r}: give a table or schema.table")
    schema = parts[0] if len(parts) == 2 else conn.execute("SELECT current_schema()").fetchone()[0]
    if schema == PGTRAIN_SCHEMA:  # its tables are the migrations' (sql/): scores live with the user's data
        raise PgtrainError(f"--into {into!r} is in pgtrain's own schema {PGTRAIN_SCHEMA!r}, which holds only the "
                           "tables of its migrations; write the predictions to a table of another schema "
                           "(e.g. public.scores)")
    return sql.Identifier(*parts)


@dataclass(frozen=True)
class _Column:
    type: str
    required: bool  # NOT NULL without a default (nor identity, nor generated): every insert must give it
    comment: str | None


def _columns(conn: psycopg.Connection, oid: int) -> dict[str, _Column]:
    return {name: _Column(kind, required, comment) for name, kind, required, comment in conn.execute(
        """SELECT attname, format_type(atttypid, atttypmod),
                  attnotnull AND NOT atthasdef AND attidentity = '' AND attgenerated = '',
                  col_description(attrelid, attnum)
           FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum""", (oid,))}


def _refuse_misfits(into: str, columns: dict[str, _Column], wanted: dict[str, str]) -> None:
    """Every way the table does not take this run's rows, in one error: a column missing or of another type, a
    probabilities column this run leaves out (it would be NULL, or stale after an upsert), a NOT NULL column
    without a default that predict does not write."""
    problems = []
    for name, kind in wanted.items():
        if name not in columns:
            problems.append(f"it has no column {name!r} ({kind})")
        elif columns[name].type != kind:
            problems.append(f"its column {name!r} is {columns[name].type}, predict writes {kind} there")
    if PROBABILITIES_COLUMN in columns and PROBABILITIES_COLUMN not in wanted:
        problems.append(f"it has a {PROBABILITIES_COLUMN!r} column (it was written with --probabilities), which "
                        "this run would leave NULL or stale: pass --probabilities (probabilities=True)")
    problems += [f"its column {name!r} is NOT NULL without a default, and predict writes only "
                 f"{', '.join(wanted)}: drop the constraint or give it a default"
                 for name, column in columns.items() if column.required and name not in wanted]
    if problems:
        raise PgtrainError(f"table {into!r} does not fit what predict writes: {'; '.join(problems)}. Nothing was "
                           "written; fix the table or predict into another one (--into)")


def _key_is_unique(conn: psycopg.Connection, oid: int, key_column: str) -> bool:
    """A unique index (a primary key, say) on the key alone, which ``ON CONFLICT`` can match rows by."""
    return conn.execute(
        """SELECT EXISTS (SELECT FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid
                          WHERE i.indrelid = %s AND i.indisunique AND i.indimmediate AND i.indpred IS NULL
                            AND i.indnatts = 1 AND i.indkey[0] = a.attnum AND a.attname = %s)""",
        (oid, key_column)).fetchone()[0]


def _classes_comment(conn: psycopg.Connection, oid: int, table: sql.Identifier, into: str, mode: str,
                     columns: dict[str, _Column], classes: Sequence[str]) -> str | None:
    """The comment to record on the probabilities column, None when it records these classes already; refused
    when rows of other (or unrecorded) classes would stay beside this run's."""
    recorded = _recorded(columns[PROBABILITIES_COLUMN].comment)
    if recorded == list(classes):
        return None
    if mode != "replace" and conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {})").format(table)).fetchone()[0]:
        held = (f"of the classes {recorded}" if recorded is not None else
                "whose classes are not recorded (written before pgtrain recorded them in the column's comment)")
        raise PgtrainError(f"table {into!r} holds probabilities {held}; this version's are {list(classes)}: "
                           "--mode replace rewrites the table with this version's, or predict into another table")
    if not conn.execute("SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = %s", (oid,)).fetchone()[0]:
        raise PgtrainError(f"the probabilities' classes are recorded in the comment of {into!r}.probabilities, "
                           "which only the table's owner may set: run predict as the owner, or into another table")
    return json.dumps({"classes": list(classes)})


def _recorded(comment: str | None) -> list[str] | None:
    try:
        found = json.loads(comment) if comment else None
    except ValueError:  # someone else's comment
        return None
    classes = found.get("classes") if isinstance(found, dict) else None
    return [str(c) for c in classes] if isinstance(classes, list) else None


def probability_classes(conn: psycopg.Connection, table: str) -> list[str] | None:
    """The classes (text form) of the ``probabilities`` arrays of a table predict wrote, in their order; None when
    none are recorded. In SQL: ``col_description('public.scores'::regclass, attnum)::jsonb -> 'classes'``."""
    found = find_relation(conn, table, role="table")
    if found is None:
        raise PgtrainError(f"table {table!r} does not exist")
    column = _columns(conn, found[0]).get(PROBABILITIES_COLUMN)
    return _recorded(column.comment) if column is not None else None


def _refuse_keys_there(conn: psycopg.Connection, table: sql.Identifier, into: str, source: Source) -> None:
    """append: a key of the source the table holds already would be a second row (or a unique violation)."""
    count, examples = conn.execute(sql.SQL(
        "SELECT count(*), pgtrain.example_keys(CAST(t.{k} AS text)) FROM {t} AS t "
        "WHERE t.{k} IN (SELECT s.{k} FROM {s} AS s)").format(k=source.key, t=table, s=source.relation)).fetchone()
    if count:
        raise PgtrainError(f"table {into!r} already holds predictions for {count} keys of {source.qualified_name} "
                           f"(e.g. {', '.join(examples)}); --mode append adds rows and never a second one for a "
                           "key: --mode upsert updates them, --mode replace makes the table this run's predictions")


@contextmanager
def prediction_copy(conn: psycopg.Connection, target: Target) -> Iterator[Callable[[bytes], None]]:
    """One binary COPY into the target (``copy_into``) in a savepoint of ``conn``'s transaction: yields the function
    that sends rows (``prediction_rows.page_rows``)."""
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        target.copy_into, sql.SQL(", ").join(map(sql.Identifier, target.columns)))
    with _refused(target), conn.transaction(), conn.cursor() as cur, cur.copy(statement) as copy:
        copy.write(copy_binary.HEADER)
        yield copy.write
        copy.write(copy_binary.TRAILER)


def finish(conn: psycopg.Connection, target: Target) -> None:
    """The run's last writes, in its transaction: the upsert of the staged rows, the probabilities' classes."""
    if target.staged:  # an upsert into a table that was there: the staged rows, merged
        names = [sql.Identifier(c) for c in target.columns]
        with _refused(target):
            conn.execute(sql.SQL(
                "INSERT INTO {t} ({c}) SELECT {c} FROM {s} ON CONFLICT ({k}) DO UPDATE SET {u}").format(
                t=target.table, c=sql.SQL(", ").join(names), s=target.copy_into, k=target.key,
                u=sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(n) for n in names[1:])))
        conn.execute(sql.SQL("DROP TABLE {}").format(target.copy_into))
    if target.classes_comment is not None:
        conn.execute(sql.SQL("COMMENT ON COLUMN {}.{} IS {}").format(
            target.table, sql.Identifier(PROBABILITIES_COLUMN), sql.Literal(target.classes_comment)))


@contextmanager
def _refused(target: Target) -> Iterator[None]:
    """A constraint of the table (a CHECK, a unique key another session wrote meanwhile, a trigger's) refusing a
    row: a PgtrainError; the transaction rolls back, the table keeps its previous rows."""
    try:
        yield
    except psycopg.errors.IntegrityError as error:
        detail = f" ({error.diag.message_detail})" if error.diag.message_detail else ""
        raise PgtrainError(f"table {target.into!r} refused a prediction: {error.diag.message_primary}{detail}; "
                           f"nothing was written (--mode {target.mode}), the table keeps its previous rows") from None
