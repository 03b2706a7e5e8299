"""The record layout a batch of rows travels in: one structured numpy dtype per source (``record_dtype``),
shared by the planner (which sizes batches by it), the loader (which reads shards in it) and ``predict``.

A row's features arrive as PostgreSQL sends them (``pgtrain.data.source.rows.feature_payload``: one array or
bytea, or one float4/float8 array per wire type of scalar columns), then its label or regression target
(``target_payload``) and its part of the split (rows.split_part).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pgtrain.data.encoding import Coder
from pgtrain.data.source.resolve import COLUMNS, SCALAR_TYPES, WIRE_ARRAYS, Source
from pgtrain.data.source.rows import feature_groups

# array format: (type oid, dtype)
ELEMENT_TYPES = {"float4_array": (700, ">f4"), "float8_array": (701, ">f8"), "int8_array": (20, ">i8")}
SCALAR_DTYPES = {"f4": ">f4", "f8": ">f8"}  # float4send, float8send


def feature_fields(feature_format: str, dim: int, prefix: str = "") -> list[tuple[Any, ...]]:
    """numpy fields of one features value in PostgreSQL's binary form (array_send, or the raw bytea)."""
    if feature_format == "bytea":
        return [(prefix + "x", "<f4", (dim,))]
    _, element = ELEMENT_TYPES[feature_format]
    return [(prefix + name, ">i4") for name in ("ndim", "hasnull")] + [(prefix + "elemtype", ">u4")] + [
        (prefix + name, ">i4") for name in ("dim", "lbound")] + [
        (prefix + "x", [("elen", ">i4"), ("v", element)], (dim,))]


def source_feature_fields(source: Source, dim: int) -> list[tuple[Any, ...]]:
    """numpy fields of a row's features as ``source.feature_payload`` sends them."""
    if source.feature_format != COLUMNS:
        return feature_fields(source.feature_format, dim)
    return [field for wire, positions in feature_groups(source).items()
            for field in feature_fields(WIRE_ARRAYS[wire], len(positions), prefix=f"{wire}_")]


def target_fields(source: Source, output_dim: int | None) -> list[tuple[Any, ...]]:
    """numpy fields of a row's target as ``source.target_payload`` sends it."""
    if source.target_format == "label":
        return [("label", ">i4")]
    if source.target_format == "class":
        return [("label_hash", ">i8")]
    if source.target_format == "scalar":
        return [("y", SCALAR_DTYPES[SCALAR_TYPES[source.label_type]])]
    return feature_fields(source.target_format, output_dim, prefix="t_")


def record_dtype(source: Source, dim: int, output_dim: int | None = None) -> np.dtype:
    """One row of a batch payload: features, label::int4 or the regression target, its part of the split."""
    return np.dtype([*source_feature_fields(source, dim), *target_fields(source, output_dim), ("part", "u1")])


Group = tuple[str, slice | list[int], Coder | None]


def fill_features(records: np.ndarray, target: np.ndarray, groups: list[Group]) -> None:
    """Copy the features of ``records`` (rows of ``source_feature_fields``) into ``target``, float32 (rows, dim).

    ``groups``: for scalar feature columns, (record field, positions in the input row, the Coder that maps a
    category group's hashes to codes) per wire type.
    """
    if groups:
        for name, positions, coder in groups:
            values = records[name]["v"]
            target[:, positions] = coder(values) if coder is not None else values
    elif "ndim" in records.dtype.names:
        target[:] = records["x"]["v"]
    else:
        target[:] = records["x"]


def feature_groups_of(source: Source, dim: int) -> list[Group]:
    """``fill_features``'s groups for ``source`` (empty unless its features are scalar columns)."""
    return [(f"{wire}_x", _positions(positions, dim), Coder(source.feature_columns) if wire == "h8" else None)
            for wire, positions in feature_groups(source).items()]


def _positions(positions: list[int], dim: int) -> slice | list[int]:
    """Where a group of scalar feature columns goes in a features row: a slice when they are all of them."""
    return slice(None) if positions == list(range(dim)) else positions


def feature_arrays(layout: np.dtype, groups: list[Group], dim: int) -> list[tuple[str, int]]:
    """The feature arrays of a record ``layout`` whose headers say what shape they hold: (field prefix, values
    expected); ``groups`` as ``feature_groups_of`` gives them."""
    return ([("", dim)] if "ndim" in layout.names else []) + [
        (name.removesuffix("x"), dim if isinstance(positions, slice) else len(positions))
        for name, positions, _ in groups]


def well_formed(records: np.ndarray, prefix: str, width: int) -> np.ndarray:
    """Which ``records`` hold a flat array of ``width`` values without NULLs in the array fields ``prefix``."""
    return (records[prefix + "ndim"] == 1) & (records[prefix + "hasnull"] == 0) & (records[prefix + "dim"] == width)

