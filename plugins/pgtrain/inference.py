"""Use a committed version: ``load_model`` rebuilds it from its spec alone; ``predict`` scores a table with it.

``predict`` reads the source in key order a page at a time (keyset pagination, one binary COPY row per
page: the keys and the features as arrays), runs the model, and COPYs (key, prediction) into the target
table, all in one transaction: the predictions land together or not at all.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import psycopg
from psycopg import sql

from pgtrain import model_store
from pgtrain.errors import PgtrainError, SourceError

if TYPE_CHECKING:
    import torch

DEFAULT_BATCH_ROWS = 10_000
PREDICTION_COLUMN = "prediction"
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")
_NUMERIC_TYPES = {"smallint", "integer", "bigint", "real", "double precision", "numeric"}
_FLOAT8_OID = 701


@dataclass(frozen=True)
class Prediction:
    model_name: str
    version: int
    into: str
    rows: int


def load_model(conn_or_url: psycopg.Connection | str, name: str, version: int | str = "head") -> torch.nn.Module:
    """The version (``"head"`` or a number) as a torch module in eval mode, built by ``trainer.model.build_model``
    from what the version records and loaded strictly with its state dict."""
    with _connection(conn_or_url) as conn:
        number, spec, _ = model_store.version_layout(conn, name, _version_number(version))
        _, arrays = model_store.load_tensors(conn, name, number)
    return _build(name, number, spec, arrays)


def predict(conn: psycopg.Connection, name: str, version: int | str | None, source: str, key_column: str, into: str,
            feature_columns: Sequence[str] | None = None, batch_rows: int = DEFAULT_BATCH_ROWS) -> Prediction:
    """Score every row of ``source`` with the version and write (key, prediction) into ``into``.

    Feature columns default to those recorded with the version. ``into`` is created when missing, with
    the source key's type and ``prediction`` integer (classification), double precision (a scalar
    target) or double precision[]; an existing table must have those two columns and no predictions
    for the same keys yet.
    """
    if batch_rows < 1:
        raise PgtrainError(f"batch_rows must be at least 1, got {batch_rows}")
    with conn.transaction():
        number, spec, _ = model_store.version_layout(conn, name, _version_number(version))
        _, arrays = model_store.load_tensors(conn, name, number)
        model = _build(name, number, spec, arrays)
        relation, key, features = _source_columns(conn, source, key_column,
                                                  list(feature_columns or spec.get("feature_columns") or []))
        reader = _PageReader(conn, relation, key, features, int(spec["input_dim"]), batch_rows)
        classify = spec.get("task", "classification") == "classification"
        output_dim = int(spec["output_dim"])
        target = _target_table(conn, into, key, "integer" if classify else
                               "double precision" if output_dim == 1 else "double precision[]")
        rows = 0
        for keys, x in reader.pages():
            out = _forward(model, x)
            rows += _write_page(conn, target, key, keys, out, classify, output_dim)
    return Prediction(name, number, into, rows)


# -- the model --------------------------------------------------------------------------------------------
def _build(name: str, version: int, spec: dict[str, Any], arrays: dict[str, np.ndarray]) -> torch.nn.Module:
    import torch

    from trainer.model import build_model

    if not spec.get("model") or not spec.get("input_dim") or not spec.get("output_dim"):
        raise PgtrainError(f"model {name!r} version {version} records no model spec to rebuild it from; "
                           "export its state dict instead (pgtrain-models export)")
    model = build_model(spec["model"], int(spec["input_dim"]), int(spec["output_dim"]),
                        spec.get("model_options") or {}, seed=0)
    # assign: the module's tensors become the arrays just read, instead of a second copy of the weights
    model.load_state_dict({n: torch.from_numpy(a) for n, a in arrays.items()}, strict=True, assign=True)
    return model.eval()


def _forward(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def _version_number(version: int | str | None) -> int | None:
    if version is None or version == "head":
        return None
    try:
        return int(version)
    except (TypeError, ValueError):
        raise PgtrainError(f"version should be 'head' or a version number, got {version!r}") from None


@contextmanager
def _connection(conn_or_url: psycopg.Connection | str):
    if isinstance(conn_or_url, str):
        with psycopg.connect(conn_or_url, autocommit=True) as conn:
            yield conn
    else:
        yield conn_or_url


# -- the source -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Column:
    name: str
    type_name: str  # format_type, for messages and kinds
    type_ident: sql.Composable  # schema-qualified type, for casts and CREATE TABLE


def _source_columns(conn: psycopg.Connection, source: str, key_column: str, feature_columns: list[str]
                    ) -> tuple[sql.Identifier, _Column, list[_Column]]:
    try:
        row = conn.execute("""SELECT c.oid, n.nspname, c.relname FROM pg_class c
                              JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)""",
                           (source,)).fetchone()
    except psycopg.errors.InvalidName as error:
        raise SourceError(f"source {source!r} is not a valid table name: {error.diag.message_primary}") from None
    if row is None:
        raise SourceError(f"source table {source!r} does not exist (or is not visible to this user); give an "
                          "existing table, schema-qualified and quoted as in SQL if needed")
    oid, schema, table = row
    columns = {name: _Column(name, type_name, sql.Identifier(type_schema, type_base))
               for name, type_name, type_schema, type_base in conn.execute(
                   """SELECT a.attname, format_type(a.atttypid, NULL), tn.nspname, t.typname
                      FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
                      JOIN pg_namespace tn ON tn.oid = t.typnamespace
                      WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped""", (oid,))}
    if not feature_columns:
        raise PgtrainError("no feature columns: the version records none; pass feature_columns")
    missing = [c for c in [key_column, *feature_columns] if c not in columns]
    if missing:
        raise SourceError(f"source table {schema}.{table} has no column(s) {', '.join(map(repr, missing))} "
                          f"(it has {', '.join(sorted(columns))}); pass --feature-columns / --key-column naming "
                          "its columns in the model's input order")
    return sql.Identifier(schema, table), columns[key_column], [columns[c] for c in feature_columns]


class _PageReader:
    """Keyset pages of (keys as binary COPY fields, features as float32 (rows, input_dim))."""

    def __init__(self, conn: psycopg.Connection, relation: sql.Identifier, key: _Column, features: list[_Column],
                 input_dim: int, batch_rows: int) -> None:
        self.conn, self.key, self.input_dim = conn, key, input_dim
        kinds = {c.type_name for c in features}
        if len(features) == 1 and features[0].type_name in {"real[]", "double precision[]"}:
            self.kind, row_features = "array", sql.SQL("{}::float8[]").format(sql.Identifier(features[0].name))
        elif len(features) == 1 and features[0].type_name == "bytea":
            self.kind, row_features = "bytea", sql.Identifier(features[0].name)
        elif kinds <= _NUMERIC_TYPES:
            if len(features) != input_dim:
                raise SourceError(f"the model takes {input_dim} features but {len(features)} columns were given "
                                  f"({', '.join(c.name for c in features)})")
            self.kind = "array"
            row_features = sql.SQL("ARRAY[{}]").format(sql.SQL(", ").join(
                sql.SQL("{}::float8").format(sql.Identifier(c.name)) for c in features))
        else:
            raise SourceError("feature columns must be one real[]/double precision[]/bytea column or numeric "
                              "scalar columns; got " + ", ".join(f"{c.name} {c.type_name}" for c in features))
        self.parts = {"key": sql.Identifier(key.name), "features": row_features, "rel": relation,
                      "n": sql.Literal(batch_rows)}

    def pages(self):
        after = sql.SQL("")
        while True:
            query = sql.SQL(
                """COPY (SELECT count(*)::int4, array_agg(k ORDER BY k), array_agg(f ORDER BY k),
                                (array_agg(k::text ORDER BY k DESC))[1]
                         FROM (SELECT {key} AS k, {features} AS f FROM {rel} WHERE {key} IS NOT NULL {after}
                               ORDER BY {key} LIMIT {n}) page)
                   TO STDOUT (FORMAT BINARY)""").format(after=after, **self.parts)
            with self.conn.cursor() as cur:
                try:
                    with cur.copy(query) as copy:
                        block = b"".join(bytes(b) for b in copy)
                except psycopg.errors.ArraySubscriptError as error:
                    raise SourceError(f"feature arrays of different lengths in one page: "
                                      f"{error.diag.message_primary}; every row needs {self.input_dim}") from None
            fields = _fields(block)
            count = _I32.unpack(fields[0])[0]
            if count == 0:
                return
            yield _array_elements(fields[1], count), self._features(fields[2], count)
            after = sql.SQL("AND {} > CAST({} AS {})").format(self.parts["key"], sql.Literal(fields[3].decode()),
                                                             self.key.type_ident)

    def _features(self, data: bytes | None, count: int) -> np.ndarray:
        if self.kind == "bytea":
            elements = _array_elements(data, count)
            if any(e is None or len(e) != 4 + 4 * self.input_dim for e in elements):
                raise SourceError(f"bytea features must be {4 * self.input_dim} bytes (packed float32) and not NULL")
            return np.frombuffer(b"".join(e[4:] for e in elements), dtype="<f4").reshape(count, self.input_dim)
        ndim, hasnull = struct.unpack_from(">ii", data)
        dims = struct.unpack_from(f">{2 * ndim}i", data, 12)
        if ndim != 2 or dims[2] != self.input_dim:
            raise SourceError(f"features have {dims[2] if ndim == 2 else '?'} values a row, the model takes "
                              f"{self.input_dim}")
        if hasnull:
            raise SourceError("some rows have NULL features; the model cannot score them")
        values = np.frombuffer(data, dtype=[("len", ">i4"), ("v", ">f8")], offset=12 + 8 * ndim)
        return values["v"].astype(np.float32).reshape(count, self.input_dim)


def _fields(row: bytes) -> list[bytes | None]:
    """The fields of the one COPY row in a binary COPY stream (header, row, trailer)."""
    if not row.startswith(_SIGNATURE):
        raise PgtrainError("the COPY stream does not start with the binary COPY signature")
    pos = 19 + _I32.unpack_from(row, 15)[0]
    count = _I16.unpack_from(row, pos)[0]
    pos += 2
    fields: list[bytes | None] = []
    for _ in range(count):
        length = _I32.unpack_from(row, pos)[0]
        pos += 4
        fields.append(None if length < 0 else row[pos:pos + length])
        pos += max(length, 0)
    return fields


def _array_elements(data: bytes, count: int) -> list[bytes]:
    """The elements of a 1-D binary array, each still with its length word (a binary COPY field as is)."""
    ndim = _I32.unpack_from(data, 0)[0]
    pos = 12 + 8 * ndim
    elements = []
    for _ in range(count):
        length = _I32.unpack_from(data, pos)[0]
        end = pos + 4 + max(length, 0)
        elements.append(data[pos:end])
        pos = end
    return elements


# -- the target -------------------------------------------------------------------------------------------
def _target_table(conn: psycopg.Connection, into: str, key: _Column, prediction_type: str) -> sql.Identifier:
    try:
        parts = conn.execute("SELECT parse_ident(%s)", (into,)).fetchone()[0]
    except psycopg.errors.InvalidParameterValue as error:
        raise PgtrainError(f"--into {into!r} is not a valid table name: {error.diag.message_primary}") from None
    if len(parts) > 2:
        raise PgtrainError(f"--into {into!r}: give a table or schema.table")
    target = sql.Identifier(*parts)
    conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({} {} PRIMARY KEY, {} {} NOT NULL)").format(
        target, sql.Identifier(key.name), key.type_ident, sql.Identifier(PREDICTION_COLUMN),
        sql.SQL(prediction_type)))
    have = dict(conn.execute("""SELECT a.attname, format_type(a.atttypid, NULL) FROM pg_attribute a
                                WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped""",
                             (target.as_string(conn),)).fetchall())
    wanted = {key.name: key.type_name, PREDICTION_COLUMN: prediction_type}
    wrong = [f"{c} {t}" for c, t in wanted.items() if have.get(c) != t]
    if wrong:
        raise PgtrainError(f"table {into!r} exists without the columns predict writes ({', '.join(wrong)}); "
                           "predict into a new table")
    return target


def _write_page(conn: psycopg.Connection, target: sql.Identifier, key: _Column, keys: list[bytes],
                out: np.ndarray, classify: bool, output_dim: int) -> int:
    # Each prediction as a binary COPY field (length word, then the value), built for the whole page at once.
    if classify:
        fields = np.empty(len(out), dtype=[("len", ">i4"), ("v", ">i4")])
        fields["len"], fields["v"] = 4, out.argmax(axis=1)
    elif output_dim == 1:
        fields = np.empty(len(out), dtype=[("len", ">i4"), ("v", ">f8")])
        fields["len"], fields["v"] = 8, out[:, 0]
    else:  # a 1-D double precision[]: ndim, hasnull, element type, length, lower bound, then the elements
        cell = np.dtype([("len", ">i4"), ("v", ">f8")])
        fields = np.empty(len(out), dtype=[("len", ">i4"), ("head", ">i4", 5), ("cells", cell, (output_dim,))])
        fields["len"], fields["head"] = 20 + cell.itemsize * output_dim, (1, 0, _FLOAT8_OID, output_dim, 1)
        fields["cells"]["len"], fields["cells"]["v"] = 8, out
    raw, size = fields.tobytes(), fields.dtype.itemsize
    rows = b"".join(b"\x00\x02" + k + raw[i * size:(i + 1) * size] for i, k in enumerate(keys))
    statement = sql.SQL("COPY {} ({}, {}) FROM STDIN (FORMAT BINARY)").format(
        target, sql.Identifier(key.name), sql.Identifier(PREDICTION_COLUMN))
    try:
        with conn.transaction(), conn.cursor() as cur, cur.copy(statement) as copy:
            copy.write(_SIGNATURE + struct.pack(">ii", 0, 0))
            copy.write(rows)
            copy.write(_I16.pack(-1))
    except psycopg.errors.UniqueViolation:
        raise PgtrainError(f"table {target.as_string(conn)} already holds predictions for some of these keys; "
                           "predict into a new table or delete them first") from None
    return len(keys)
