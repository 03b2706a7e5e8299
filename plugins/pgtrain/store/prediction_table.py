"""Where ``predict`` writes: the target table (created when missing, never in pgtrain's own schema, refused when its
columns do not fit) and its rows of (key, prediction[, probabilities]) in binary COPY form, built a page at a time
with numpy, classes in the label's own SQL type.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import psycopg
from psycopg import sql

from pgtrain.core.errors import PgtrainError
from pgtrain.core.migrations import SCHEMA as PGTRAIN_SCHEMA
from pgtrain.data import copy_binary
from pgtrain.data.source.resolve import Source, find_relation

PREDICTION_COLUMN = "prediction"
PROBABILITIES_COLUMN = "probabilities"
_FLOAT8_OID = 701


def probabilities_of(out: np.ndarray) -> np.ndarray:
    """Class probabilities of a batch's logits (rows x classes): the softmax."""
    import torch

    return torch.softmax(torch.from_numpy(out), 1).numpy()


def target_table(conn: psycopg.Connection, into: str, source: Source, prediction_type: str,
                  probabilities: bool = False) -> sql.Identifier:
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
    target = sql.Identifier(*parts)
    key_type = sql.SQL(source.key_type)  # format_type() of the source's key, from the catalog
    extra = sql.SQL(", {} double precision[] NOT NULL").format(sql.Identifier(PROBABILITIES_COLUMN)) if (
        probabilities) else sql.SQL("")
    conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({} {} PRIMARY KEY, {} {} NOT NULL{})").format(
        target, source.key, key_type, sql.Identifier(PREDICTION_COLUMN), sql.SQL(prediction_type), extra))
    oid = find_relation(conn, target.as_string(conn), role="--into")[0]
    have = dict(conn.execute("""SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
                                WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped""", (oid,)).fetchall())
    wanted = {source.key_column: source.key_type, PREDICTION_COLUMN: prediction_type,
              **({PROBABILITIES_COLUMN: "double precision[]"} if probabilities else {})}
    wrong = [f"{c} {t}" for c, t in wanted.items() if have.get(c) != t]
    if wrong:
        raise PgtrainError(f"table {into!r} exists without the columns predict writes ({', '.join(wrong)}); "
                           "predict into a new table")
    return target


def label_type(conn: psycopg.Connection, recorded: str) -> str:
    """The label's type as the version records it (format_type() when it was planned), checked against the
    catalog before it reaches SQL: an existing type's name, with at most a numeric modifier (character(1))."""
    base, _, modifier = recorded.partition("(")
    try:
        with conn.transaction():
            (name,) = conn.execute("SELECT format_type(to_regtype(%s), NULL)", (base,)).fetchone()
    except (psycopg.DataError, psycopg.ProgrammingError):  # not even a type name
        name = None
    if name is None or name != base or (modifier and not re.fullmatch(r"[0-9]+(,[0-9]+)?\)", modifier)):
        raise PgtrainError(f"the version's label type {recorded!r} is not a type of this database; predict where "
                           "the label's type (an enum, say) exists")
    return recorded


def class_fields(conn: psycopg.Connection, classes: Sequence[str], sql_type: str) -> list[bytes]:
    """Each class as a binary COPY field of the label's type (length word, then the type's send form)."""
    # format_type() of the label column, from the catalog (never user text), as for the key's type
    (send,) = conn.execute("SELECT typsend::regproc::text FROM pg_type WHERE oid = %s::regtype", (sql_type,)).fetchone()
    values = conn.execute(sql.SQL("SELECT {}(CAST(c AS {})) FROM unnest(CAST(%s AS text[])) WITH ORDINALITY AS u(c, i) "
                                  "ORDER BY i").format(sql.Identifier("pg_catalog", send.split(".")[-1]),
                                                       sql.SQL(sql_type)),
                          (list(classes),), binary=True).fetchall()
    return [copy_binary.I32.pack(len(v)) + bytes(v) for (v,) in values]


def _float8_arrays(values: np.ndarray) -> np.ndarray:
    """Rows of ``values`` as binary COPY fields of double precision[] (numpy records, one per row)."""
    width = values.shape[1]
    cell = np.dtype([("len", ">i4"), ("v", ">f8")])
    fields = np.empty(len(values), dtype=[("len", ">i4"), ("head", ">i4", 5), ("cells", cell, (width,))])
    fields["len"], fields["head"] = 20 + cell.itemsize * width, (1, 0, _FLOAT8_OID, width, 1)
    fields["cells"]["len"], fields["cells"]["v"] = 8, values
    return fields


def page_rows(keys: np.ndarray | list[bytes], out: np.ndarray, classify: bool, output_dim: int,
              class_fields: list[bytes] | None = None, probabilities: bool = False) -> bytes:
    """A page's rows as binary COPY rows of (key, prediction[, probabilities]); ``keys``: binary COPY fields (a
    numpy ``V`` array when they share one width). Built by numpy as one record array when every column's fields
    share one width (fixed-width keys, any prediction but a label of uneven widths), else row by row."""
    columns = [keys, _prediction_fields(out, classify, output_dim, class_fields)]
    if probabilities:
        columns.append(_float8_arrays(probabilities_of(out).astype(np.float64)))
    if all(isinstance(c, np.ndarray) for c in columns):
        rows = np.empty(len(out), [("n", ">i2"), *((f"f{i}", c.dtype) for i, c in enumerate(columns))])
        rows["n"] = len(columns)
        for i, column in enumerate(columns):
            rows[f"f{i}"] = column
        return rows.tobytes()
    count = copy_binary.I16.pack(len(columns))
    return b"".join(count + b"".join(fields) for fields in zip(*map(_each, columns), strict=True))


def _prediction_fields(out: np.ndarray, classify: bool, output_dim: int, class_fields: list[bytes] | None
                       ) -> np.ndarray | list[bytes]:
    """Each row's prediction as a binary COPY field (length word, then the value), for the whole page at once."""
    if class_fields is not None:
        by_class = out.argmax(axis=1)
        if len({len(f) for f in class_fields}) == 1:
            return np.frombuffer(b"".join(class_fields), f"V{len(class_fields[0])}")[by_class]
        return [class_fields[c] for c in by_class.tolist()]
    if classify:
        fields = np.empty(len(out), dtype=[("len", ">i4"), ("v", ">i4")])
        fields["len"], fields["v"] = 4, out.argmax(axis=1)
    elif output_dim == 1:
        fields = np.empty(len(out), dtype=[("len", ">i4"), ("v", ">f8")])
        fields["len"], fields["v"] = 8, out[:, 0]
    else:  # a 1-D double precision[]: ndim, hasnull, element type, length, lower bound, then the elements
        fields = _float8_arrays(out)
    return fields


def _each(column: np.ndarray | list[bytes]) -> list[bytes]:
    if not isinstance(column, np.ndarray):
        return column
    raw, size = column.tobytes(), column.dtype.itemsize
    return [raw[i:i + size] for i in range(0, len(raw), size)]


@contextmanager
def prediction_copy(conn: psycopg.Connection, target: sql.Identifier, source: Source,
                    probabilities: bool = False) -> Iterator[Callable[[bytes], None]]:
    """One binary COPY into ``target`` in a savepoint of ``conn``'s transaction: yields the function that sends
    rows (``page_rows``); a key already there is a PgtrainError."""
    columns = [source.key, sql.Identifier(PREDICTION_COLUMN)] + (
        [sql.Identifier(PROBABILITIES_COLUMN)] if probabilities else [])
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(target, sql.SQL(", ").join(columns))
    try:
        with conn.transaction(), conn.cursor() as cur, cur.copy(statement) as copy:
            copy.write(copy_binary.HEADER)
            yield copy.write
            copy.write(copy_binary.TRAILER)
    except psycopg.errors.UniqueViolation:
        raise PgtrainError(f"table {target.as_string(conn)} already holds predictions for some of these keys; "
                           "predict into a new table or delete them first") from None
