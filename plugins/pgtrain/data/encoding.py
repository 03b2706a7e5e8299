"""How a source's raw columns become the model's input, and its output a label: the one encoding training,
``predict`` and ``load_predictor`` apply, part of the run's input record (``pgtrain.data.input_record``), stored
with the run (``pgtrain.training_runs.encoding``) and the version (its spec's ``encoding``).

A row of scalar feature columns becomes one float32 *input row*, in this order:

1. each NUMBER or DATE column's value (booleans 0/1, dates as days since 1970-01-01), a NULL replaced by the
   column's training mean (``missing_values='impute'``);
2. one 0/1 "was missing" input for each of those columns that had NULLs in the training rows;
3. each CATEGORY column's level code: 0 "other" (rare levels and values never seen in training), 1 NULL, then
   2.. its kept levels (most frequent first).

PostgreSQL sends a categorical value as the 64-bit ``hashtextextended(value::text, 0)``, which the client maps to
its code with one vectorized search among the levels' hashes (``codes``): no text crosses the wire and no Python
touches a row. ``load_predictor`` computes the same hash of a Python value (``pgtrain.data.text_hash``) and looks
it up among the same hashes, so a level stored only as its hash (``pgtrain.data.level_storage``) scores as one
stored in clear. The model standardizes parts 1-2 (the built-in mlp encodes a value with quantile edges
piecewise-linearly instead, ``pgtrain.models.piecewise``) and one-hot encodes part 3 (``pgtrain.models.network``). Class
labels of any type travel the same way and map to class numbers in the recorded class order (-1: a class never seen in
training).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pgtrain.core.errors import SourceError
from pgtrain.data.source.resolve import DATE, NUMBER, Column, Source, categories, valued
from pgtrain.data.text_hash import hashtextextended

OTHER, NULL_LEVEL = 0, 1  # the codes every categorical column has before its levels
FIRST_LEVEL = 2
# What a NULL categorical value is sent as (hashtextextended never returns NULL for a value); planning refuses a
# level whose hash is this (never seen: one chance in 2**64 per level).
NULL_HASH = 0
UNSEEN_CLASS = -1


@dataclass(frozen=True)
class Layout:
    """Where each part of an input row is: ``numeric`` columns (values and "was missing" inputs, standardized by
    the model), then one code column per category (one-hot encoded by the model, ``sizes`` codes each)."""

    numeric: int
    sizes: tuple[int, ...]
    # The quantile bin edges of each value column, the first of the numeric inputs (() for one without: its value
    # is standardized); the built-in mlp encodes each value with edges piecewise-linearly (one input per bin).
    edges: tuple[tuple[float, ...], ...] = ()

    @property
    def width(self) -> int:
        """Columns of an input row (what the loader fills and the run records as input_dim)."""
        return self.numeric + len(self.sizes)

    @property
    def encoded_width(self) -> int:
        """Columns the network sees: numeric inputs (a value with edges: one per bin) plus every category's one-hot
        codes."""
        return self.numeric + sum(len(e) - 2 for e in self.edges if e) + sum(self.sizes)

    def standardized(self) -> Layout:
        """This layout with every value standardized (what a model other than the built-in mlp is given)."""
        return replace(self, edges=())


def layout(columns: Sequence[Column]) -> Layout:
    values = valued(columns)
    edges = tuple(c.edges for c in values)
    return Layout(len(values) + sum(c.missing for c in values),
                  tuple(FIRST_LEVEL + len(c.levels) for c in categories(columns)), edges if any(edges) else ())


def inputs(columns: Sequence[Column]) -> list[tuple[str, Column]]:
    """The input row's columns in order: ("value" | "missing" | "code", the feature column)."""
    values = valued(columns)
    return ([("value", c) for c in values] + [("missing", c) for c in values if c.missing]
            + [("code", c) for c in categories(columns)])


def columns_of(encoding: Mapping[str, Any]) -> tuple[Column, ...]:
    return tuple(Column(c["name"], c["type"], c["kind"], c.get("mean"), bool(c.get("missing")),
                        tuple(c.get("levels") or ()), tuple(int(h) for h in c.get("hashes") or ()),
                        tuple(float(e) for e in c.get("edges") or ()),
                        tuple((int(b), tuple(float(v) for v in e)) for b, e in (c.get("bin_edges") or {}).items()))
                 for c in encoding.get("columns") or ())


def apply(source: Source, encoding: Mapping[str, Any] | None) -> Source:
    """``source`` as planned: its feature columns and classes as ``encoding`` records them."""
    if not encoding:
        return source
    classes = encoding.get("classes")
    return replace(source, feature_columns=columns_of(encoding) or source.feature_columns,
                   classes=tuple(classes) if classes is not None else None,
                   class_hashes=tuple(int(h) for h in encoding.get("class_hashes") or ()),
                   missing_values=encoding.get("missing_values", source.missing_values))


def layout_of(encoding: Mapping[str, Any] | None) -> Layout | None:
    """The input layout of a recorded encoding; None when there is none (array features, or a version from
    before encodings, whose inputs are its features as they are)."""
    columns = columns_of(encoding or {})
    if not columns:
        return None
    return layout(columns)


# -- codes from hashes (the loader, predict) ----------------------------------------------------------------
def hash_table(hashes: Sequence[int], first: int) -> tuple[np.ndarray, np.ndarray]:
    """(sorted hashes, their codes) for ``codes``: the i-th hash has code ``first + i``."""
    values = np.asarray(hashes, dtype=np.int64)
    order = np.argsort(values, kind="stable")
    return values[order], (order + first).astype(np.int64)


def codes(hashed: np.ndarray, table: tuple[np.ndarray, np.ndarray], missing: int) -> np.ndarray:
    """Each hash's code in ``table``; ``missing`` where a hash is not there."""
    keys, values = table
    if len(keys) == 0:
        return np.full(hashed.shape, missing, np.int64)
    at = np.minimum(np.searchsorted(keys, hashed), len(keys) - 1)
    return np.where(keys[at] == hashed, values[at], missing)


class Coder:
    """Maps the hashes of one row batch's categorical values (columns in input order) to level codes."""

    def __init__(self, columns: Sequence[Column]) -> None:
        self.tables = [hash_table(c.hashes, FIRST_LEVEL) for c in categories(columns)]

    def __call__(self, hashed: np.ndarray) -> np.ndarray:
        out = np.empty(hashed.shape, np.float32)
        for i, table in enumerate(self.tables):
            column = hashed[:, i]
            out[:, i] = np.where(column == NULL_HASH, NULL_LEVEL, codes(column, table, OTHER))
        return out


class ClassCoder:
    """Maps the hashes of a batch's class labels to class numbers (UNSEEN_CLASS for a class the training rows did
    not have)."""

    def __init__(self, source: Source) -> None:
        self.table = hash_table(source.class_hashes, 0)

    def __call__(self, hashed: np.ndarray) -> np.ndarray:
        return codes(hashed, self.table, UNSEEN_CLASS)


# -- Python values (load_predictor) -------------------------------------------------------------------------
def as_text(value: Any, sql_type: str) -> str:
    """A value as psycopg returns it -> its text form in PostgreSQL (``CAST(value AS text)``), which levels and
    classes are recorded as."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value.rstrip(" ") if sql_type == "character" else value  # bpchar::text drops trailing blanks
    if isinstance(value, float) and value.is_integer() and sql_type in ("real", "double precision"):
        return str(int(value))
    return str(value)


def from_text(text: str, label_type: str) -> Any:
    """A class recorded as text -> the Python value psycopg would return for the label column."""
    if label_type in ("smallint", "integer", "bigint"):
        return int(text)
    if label_type == "boolean":
        return text == "true"
    return text


_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH = datetime.datetime(1970, 1, 1)
_DAY = 86400.0


def days(value: Any) -> float:
    """A date or timestamp as days since 1970-01-01 (a naive timestamp read as UTC), as PostgreSQL computes it
    (``date_part('epoch', ...) / 86400``)."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            return value.timestamp() / _DAY
        return (value - _EPOCH).total_seconds() / _DAY
    if isinstance(value, datetime.date):
        return float((value - _EPOCH_DATE).days)
    raise SourceError(f"{value!r} is not a date or timestamp")


def input_rows(columns: Sequence[Column], rows: Iterable[Mapping[str, Any]]) -> np.ndarray:
    """Rows as mappings of column name -> Python value, encoded into input rows (float32)."""
    rows = list(rows)
    planned = inputs(columns)
    out = np.empty((len(rows), len(planned)), np.float32)
    # By hash, as the loader and predict map a value: a level stored as its hash alone has no text to match.
    lookup = {c.name: {hashed: FIRST_LEVEL + i for i, hashed in enumerate(c.hashes)} for c in categories(columns)}
    for j, (part, column) in enumerate(planned):
        values = []
        for i, row in enumerate(rows):
            if column.name not in row:
                raise SourceError(f"row {i} has no column {column.name!r}; the model's input columns are "
                                  + ", ".join(repr(c.name) for c in columns))
            values.append(row[column.name])
        if part == "missing":
            out[:, j] = [value is None for value in values]
        elif part == "code":
            out[:, j] = _level_codes(values, column, lookup[column.name])
        else:
            out[:, j] = [_number(v, column, i) for i, v in enumerate(values)]
    return out


def _level_codes(values: Sequence[Any], column: Column, lookup: Mapping[int, int]) -> list[int]:
    """Each value's level code, by the hash of its text (hashed once per distinct value)."""
    known: dict[str, int] = {}
    codes = []
    for value in values:
        if value is None:
            codes.append(NULL_LEVEL)
            continue
        text = as_text(value, column.type)
        if text not in known:
            known[text] = lookup.get(hashtextextended(text), OTHER)
        codes.append(known[text])
    return codes


def _number(value: Any, column: Column, row: int) -> float:
    if value is None:
        if column.mean is None:
            raise SourceError(f"row {row}: {column.name!r} is NULL, and the model was trained with "
                              "missing_values='bad_row' (it has no value to impute)")
        return column.mean
    number = days(value) if column.kind == DATE else float(value)
    if not math.isfinite(number) or (column.kind == NUMBER and abs(number) > 3.4028234663852886e38):
        raise SourceError(f"row {row}: {column.name!r} is {value!r}, which is not a finite float32")
    return number
