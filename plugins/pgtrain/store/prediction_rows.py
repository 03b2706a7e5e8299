"""What ``predict`` writes: rows of (key, prediction[, probabilities]) in binary COPY form, built a page at a time
with numpy, classes in the label's own SQL type. Where they go: ``prediction_table``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import psycopg
from psycopg import sql

from pgtrain.core.errors import PgtrainError
from pgtrain.data import copy_binary

PREDICTION_COLUMN = "prediction"
PROBABILITIES_COLUMN = "probabilities"
_FLOAT8_OID = 701


def probabilities_of(out: np.ndarray) -> np.ndarray:
    """Class probabilities of a batch's logits (rows x classes): the softmax."""
    import torch

    return torch.softmax(torch.from_numpy(out), 1).numpy()


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
    try:
        with conn.transaction():
            values = conn.execute(sql.SQL("SELECT {}(CAST(c AS {})) FROM unnest(CAST(%s AS text[])) WITH ORDINALITY "
                                          "AS u(c, i) ORDER BY i").format(
                sql.Identifier("pg_catalog", send.split(".")[-1]), sql.SQL(sql_type)), (list(classes),),
                binary=True).fetchall()
    except psycopg.DataError as error:  # an enum value renamed or dropped since training, a narrower type
        raise PgtrainError(f"the version's classes cannot be written as {sql_type}: {error.diag.message_primary}; "
                           f"the label's type changed since training (an enum value renamed or dropped?): restore "
                           f"the value, or train a new version on the type as it is now") from None
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
