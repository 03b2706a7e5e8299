"""Stream one rank's key range with ``COPY ... TO STDOUT (FORMAT BINARY)`` straight into numpy arrays.

Rows have a fixed size once the planner has checked them (same feature length, no NULLs), so each
chunk of the COPY stream is parsed with one structured numpy dtype and copied into arrays that were
allocated once at their final size: no per-row Python objects, and memory stays close to the tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import psycopg
from psycopg import sql

from pgtrain.errors import SourceError
from pgtrain.runs import Shard
from pgtrain.source import Source, is_validation, key_range

_HEADER = b"PGCOPY\n\xff\r\n\x00"
_CHUNK_BYTES = 4 << 20


@dataclass
class ShardData:
    features: np.ndarray  # (rows, dim) float32
    labels: np.ndarray  # (rows,) int64
    is_validation: np.ndarray  # (rows,) bool


def row_dtype(feature_format: str, dim: int) -> np.dtype:
    """The binary COPY layout of one (features, label::int4, is_validation) row."""
    if feature_format == "bytea":
        features = [("flen", ">i4"), ("x", "<f4", (dim,))]
    else:
        element = ">f4" if feature_format == "float4_array" else ">f8"
        features = [
            ("flen", ">i4"), ("ndim", ">i4"), ("hasnull", ">i4"), ("elemtype", ">u4"), ("dim", ">i4"),
            ("lbound", ">i4"), ("x", [("elen", ">i4"), ("v", element)], (dim,)),
        ]
    return np.dtype([("nfields", ">i2"), *features, ("llen", ">i4"), ("label", ">i4"),
                     ("vlen", ">i4"), ("val", "u1")])


def copy_query(source: Source, shard: Shard, validation_fraction: float, seed: int) -> sql.Composed:
    return sql.SQL(
        "COPY (SELECT {features}, {label}::int4, {is_val} FROM {rel} WHERE {in_range} ORDER BY {key}) "
        "TO STDOUT (FORMAT BINARY)"
    ).format(
        features=source.features, label=source.label, rel=source.relation, key=source.key,
        is_val=is_validation(source, validation_fraction, seed),
        in_range=key_range(source, shard.key_lo, shard.key_hi),
    )


def load_shard(conn: psycopg.Connection, source: Source, shard: Shard, dim: int,
               validation_fraction: float, seed: int) -> ShardData:
    """Load the rows of ``shard``; raises SourceError if the range no longer holds the planned rows."""
    dtype = row_dtype(source.feature_format, dim)
    rows = shard.row_count
    out = ShardData(np.empty((rows, dim), np.float32), np.empty(rows, np.int64), np.empty(rows, bool))
    filled = 0
    pending = bytearray()
    header_seen = False
    with conn.cursor() as cur, cur.copy(copy_query(source, shard, validation_fraction, seed)) as copy:
        for chunk in copy:
            pending += chunk
            if not header_seen:
                if len(pending) < 19:
                    continue
                pending = _strip_header(pending)
                header_seen = True
            if len(pending) >= _CHUNK_BYTES:
                filled, pending = _parse(pending, dtype, out, filled, shard)
    if pending[-2:] == b"\xff\xff":
        del pending[-2:]
    filled, pending = _parse(pending, dtype, out, filled, shard)
    if pending or filled != rows:
        raise SourceError(
            f"rank {shard.rank} read {filled} rows in its key range but the manifest planned {rows}: "
            "rows were added or deleted after compute_shards; re-run the DAG run from compute_shards"
        )
    return out


def _strip_header(buffer: bytearray) -> bytearray:
    if not buffer.startswith(_HEADER):
        raise SourceError("the COPY stream does not start with the binary COPY signature")
    extension = int.from_bytes(buffer[15:19], "big")
    return buffer[19 + extension:]


def _parse(buffer: bytearray, dtype: np.dtype, out: ShardData, filled: int,
           shard: Shard) -> tuple[int, bytearray]:
    whole = len(buffer) // dtype.itemsize
    if whole == 0:
        return filled, buffer
    if filled + whole > len(out.labels):
        raise SourceError(
            f"rank {shard.rank} read more rows than the {shard.row_count} its manifest planned: rows were "
            "added in its key range after compute_shards; re-run the DAG run from compute_shards"
        )
    records = np.frombuffer(buffer, dtype=dtype, count=whole)
    if (records["nfields"] != 3).any() or (records["flen"] < 0).any():
        raise SourceError(f"rank {shard.rank}: a row has NULL or malformed features; compute_shards checks this")
    if "dim" in dtype.names and ((records["dim"] != out.features.shape[1]) | (records["hasnull"] != 0)).any():
        raise SourceError(f"rank {shard.rank}: a row's feature length changed after compute_shards")
    span = slice(filled, filled + whole)
    values = records["x"]["v"] if dtype["x"].base.names else records["x"]
    out.features[span] = values
    out.labels[span] = records["label"]
    out.is_validation[span] = records["val"].astype(bool)
    return filled + whole, buffer[whole * dtype.itemsize:]
