"""Stream one rank's key range with ``COPY ... TO STDOUT (FORMAT BINARY)`` straight into numpy arrays.

compute_shards cut each rank's range into batches of a few hundred rows; the COPY sends one row per batch,
whose payload is the batch's rows packed back to back (features as sent by PostgreSQL, label, validation
flag), so the client handles a few thousand COPY messages per million rows, not a million. Each payload is
viewed with one structured numpy dtype and copied into arrays allocated once at their final size: no
per-row Python objects, and memory stays at the tensors plus one batch. The COPY reads only the rank's
key range, only rows visible to the planning snapshot, and the rows counted must match the manifest.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import psycopg
from psycopg import sql

from pgtrain.errors import PgtrainError, SourceError
from pgtrain.runs import Shard
from pgtrain.source import (
    PlannedRows,
    Source,
    bad_row,
    is_validation,
    key_range,
    planned_rows,
    prefer_index_order,
    read_xid_clock,
    snapshot_transaction,
)

if TYPE_CHECKING:
    import torch

_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_BATCH_HEADER = struct.Struct(">hiqi")  # field count, length of count (8), count, length of payload
ELEMENT_TYPES = {"float4_array": (700, ">f4"), "float8_array": (701, ">f8")}  # array format: (type oid, dtype)
ROWS_ALIAS = "_pgtrain_rows"  # the source table in batch_query


@dataclass
class ShardData:
    features: np.ndarray  # (rows, dim) float32
    labels: np.ndarray  # (rows,) int64
    is_validation: np.ndarray  # (rows,) bool
    pinned: bool = False  # the arrays live in page-locked (CUDA pinned) memory

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features, labels, is_validation) as torch tensors sharing this memory (pinned if loaded pinned)."""
        import torch

        return (torch.from_numpy(self.features), torch.from_numpy(self.labels),
                torch.from_numpy(self.is_validation))


def feature_fields(feature_format: str, dim: int) -> list[tuple[Any, ...]]:
    """numpy fields of one features value in PostgreSQL's binary form (array_send, or the raw bytea)."""
    if feature_format == "bytea":
        return [("x", "<f4", (dim,))]
    _, element = ELEMENT_TYPES[feature_format]
    return [("ndim", ">i4"), ("hasnull", ">i4"), ("elemtype", ">u4"), ("dim", ">i4"), ("lbound", ">i4"),
            ("x", [("elen", ">i4"), ("v", element)], (dim,))]


def record_dtype(feature_format: str, dim: int) -> np.dtype:
    """One row of a batch payload: features, label::int4, is_validation."""
    return np.dtype([*feature_fields(feature_format, dim), ("label", ">i4"), ("val", "u1")])


def batch_query(source: Source, shard: Shard, visible: sql.Composable, validation_fraction: float,
                seed: int) -> sql.Composed:
    """One row per batch of the rank, in key order: (row count, the rows packed as ``record_dtype``).

    ``visible``: SQL that keeps the planned rows, on the source table aliased ROWS_ALIAS (``planned_rows``).
    The batch list is sorted (a few thousand keys), then each batch is one range scan of the key index whose
    rows are concatenated in key order: nothing the size of the shard is ever sorted or materialized.
    """
    plan = _plan(source)
    features = source.features if source.feature_format == "bytea" else sql.SQL("array_send({})").format(
        source.features)
    filters = [visible]
    if plan.exclude_bad_rows:
        filters.append(sql.SQL("NOT {}").format(bad_row(source, plan.input_dim, plan.num_classes)))
    # The source table is aliased too: its name, whatever it is, can never hide _pgtrain_batch.
    return sql.SQL(
        """SELECT _pgtrain_packed.n, _pgtrain_packed.payload
           FROM (SELECT b.lo, b.hi, b.i FROM pgtrain.shard_batches s,
                        unnest(s.batch_lo, s.batch_hi) WITH ORDINALITY AS b(lo, hi, i)
                 WHERE s.run_id = {run} AND s.rank = {rank} ORDER BY b.i) AS _pgtrain_batch
           CROSS JOIN LATERAL (
             SELECT count(*) AS n,
                    string_agg({features} || int4send({label}::int4) || boolsend({is_val}), ''::bytea
                               ORDER BY {key}) AS payload
             FROM {rel} AS {rows} WHERE {in_batch} AND {filters}) AS _pgtrain_packed
           ORDER BY _pgtrain_batch.i"""
    ).format(run=sql.Literal(plan.run_id), rank=sql.Literal(shard.rank), features=features, label=source.label,
             is_val=is_validation(source, validation_fraction, seed), key=source.key, rel=source.relation,
             rows=sql.Identifier(ROWS_ALIAS),
             in_batch=key_range(source, sql.SQL("_pgtrain_batch.lo"), sql.SQL("_pgtrain_batch.hi")),
             filters=sql.SQL(" AND ").join(filters))


@contextmanager
def shard_copy(conn: psycopg.Connection, source: Source, shard: Shard, validation_fraction: float,
               seed: int) -> Iterator[psycopg.Copy]:
    """The rank's COPY, open inside its own REPEATABLE READ transaction (what load_shard reads)."""
    plan = _plan(source)
    with snapshot_transaction(conn):
        clock = read_xid_clock(conn)
        prefer_index_order(conn)
        batches = conn.execute("SELECT FROM pgtrain.shard_batches WHERE run_id = %s AND rank = %s",
                               (plan.run_id, shard.rank)).fetchone()
        if batches is None:
            raise PgtrainError(f"run {plan.run_id} has no batches for rank {shard.rank}; re-run compute_shards")
        query = batch_query(source, shard, planned_rows(source, clock, ROWS_ALIAS), validation_fraction, seed)
        with conn.cursor() as cur, cur.copy(sql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(query)) as copy:
            yield copy


def load_shard(conn: psycopg.Connection, source: Source, shard: Shard, dim: int, validation_fraction: float,
               seed: int, *, pin_memory: bool | None = None) -> ShardData:
    """Load the rows of ``shard`` as planned; raises SourceError if they changed since compute_shards.

    ``pin_memory``: allocate the arrays in CUDA pinned memory (needs torch); None = when CUDA is available.
    ``conn`` must be an autocommit connection outside a transaction (the load runs in its own snapshot).
    """
    plan = _plan(source)
    if dim != plan.input_dim:
        raise PgtrainError(f"rank {shard.rank} was asked for {dim} features but run {plan.run_id} planned "
                           f"{plan.input_dim}; pass run.input_dim")
    layout = record_dtype(source.feature_format, dim)
    out = _allocate(shard.row_count, dim, _cuda_available() if pin_memory is None else pin_memory)
    filled = 0
    with shard_copy(conn, source, shard, validation_fraction, seed) as copy:
        first = True
        for block in copy:
            if first:  # the stream's header arrives with the first row
                block, first = _skip_signature(block), False
            filled = _store(block, layout, out, filled, shard)
    if filled != shard.row_count:
        raise SourceError(
            f"rank {shard.rank} read {filled} rows in its key range but the manifest planned {shard.row_count}: "
            "rows were deleted or updated after compute_shards; re-run the DAG run from compute_shards"
        )
    return out


def _store(block: memoryview, layout: np.dtype, out: ShardData, filled: int, shard: Shard) -> int:
    """Copy one COPY row (a batch) into ``out`` from row ``filled``; returns the new fill level."""
    if len(block) == 2:  # the COPY trailer
        return filled
    fields, count_len, count, payload_len = _BATCH_HEADER.unpack_from(block)
    if fields != 2 or count_len != 8:
        raise SourceError(f"rank {shard.rank}: unexpected COPY row layout ({fields} fields)")
    if count == 0:
        return filled
    if payload_len != count * layout.itemsize:
        raise SourceError(
            f"rank {shard.rank}: a batch of {count} rows holds {payload_len} bytes, not {count} x "
            f"{layout.itemsize}: the rows do not all have {out.features.shape[1]} features any more; "
            "re-run compute_shards"
        )
    if filled + count > len(out.labels):
        raise SourceError(
            f"rank {shard.rank} read more rows than the {shard.row_count} its manifest planned: rows were "
            "added in its key range after compute_shards; re-run the DAG run from compute_shards"
        )
    records = np.frombuffer(block, layout, count, _BATCH_HEADER.size)
    span = slice(filled, filled + count)
    if "ndim" in layout.names:
        if ((records["ndim"] != 1) | (records["hasnull"] != 0) | (records["dim"] != out.features.shape[1])).any():
            raise SourceError(f"rank {shard.rank}: a feature array changed shape or gained NULLs after "
                              "compute_shards; re-run compute_shards")
        out.features[span] = records["x"]["v"]
    else:
        out.features[span] = records["x"]
    out.labels[span] = records["label"]
    out.is_validation[span] = records["val"]
    return filled + count


def _skip_signature(block: memoryview) -> memoryview:
    if bytes(block[: len(_SIGNATURE)]) != _SIGNATURE:
        raise SourceError("the COPY stream does not start with the binary COPY signature")
    extension = int.from_bytes(block[15:19], "big")
    return block[19 + extension:]


def _plan(source: Source) -> PlannedRows:
    if source.plan is None:
        raise PgtrainError(
            f"no shard plan for {source.qualified_name}: run compute_shards first, and get the source with "
            "manifest.source_for(conn, run)"
        )
    return source.plan


def _allocate(rows: int, dim: int, pinned: bool) -> ShardData:
    if not pinned:
        return ShardData(np.empty((rows, dim), np.float32), np.empty(rows, np.int64), np.empty(rows, bool))
    import torch

    tensors = [torch.empty(shape, dtype=dtype, pin_memory=True)
               for shape, dtype in (((rows, dim), torch.float32), (rows, torch.int64), (rows, torch.bool))]
    return ShardData(*(t.numpy() for t in tensors), pinned=True)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
