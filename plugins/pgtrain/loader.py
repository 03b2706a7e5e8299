"""Stream one rank's key range with ``COPY ... TO STDOUT (FORMAT BINARY)`` straight into numpy arrays.

compute_shards cut each rank's range into batches of a few hundred rows; the COPY sends one row per batch,
whose payload is the batch's rows packed back to back (features as sent by PostgreSQL: one array or bytea,
or one float4/float8 per scalar column; the label or regression target; the validation flag), so the client
handles a few thousand COPY messages per million rows, not a million. Each payload is
viewed with one structured numpy dtype and copied into arrays allocated once at their final size: no
per-row Python objects, and memory stays at the tensors plus one batch. The COPY reads only the rank's
key range, only rows visible to the planning snapshot, and the rows counted must match the manifest.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import struct
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import psycopg
from psycopg import sql

from pgtrain import copy_binary
from pgtrain.errors import PgtrainError, SourceError
from pgtrain.runs import Shard
from pgtrain.source import (
    COLUMNS,
    SCALAR_TYPES,
    WIRE_ARRAYS,
    PlannedRows,
    Source,
    bad_row,
    feature_groups,
    feature_payload,
    is_validation,
    key_range,
    planned_rows,
    prefer_index_order,
    read_xid_clock,
    snapshot_transaction,
    target_payload,
)

if TYPE_CHECKING:
    import torch

_BATCH_HEADER = struct.Struct(">hiqi")  # field count, length of count (8), count, length of payload
ELEMENT_TYPES = {"float4_array": (700, ">f4"), "float8_array": (701, ">f8")}  # array format: (type oid, dtype)
SCALAR_DTYPES = {"f4": ">f4", "f8": ">f8"}  # float4send, float8send
ROWS_ALIAS = "_pgtrain_rows"  # the source table in batch_query


@dataclass
class ShardData:
    features: np.ndarray  # (rows, dim) float32
    labels: np.ndarray  # classification: (rows,) int64; regression: (rows, output_dim) float32
    is_validation: np.ndarray  # (rows,) bool
    pinned: bool = False  # the arrays live in page-locked (CUDA pinned) memory

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features, labels, is_validation) as torch tensors sharing this memory (pinned if loaded pinned)."""
        import torch

        return (torch.from_numpy(self.features), torch.from_numpy(self.labels),
                torch.from_numpy(self.is_validation))


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
    if source.target_format == "scalar":
        return [("y", SCALAR_DTYPES[SCALAR_TYPES[source.label_type]])]
    return feature_fields(source.target_format, output_dim, prefix="t_")


def record_dtype(source: Source, dim: int, output_dim: int | None = None) -> np.dtype:
    """One row of a batch payload: features, label::int4 or the regression target, is_validation."""
    return np.dtype([*source_feature_fields(source, dim), *target_fields(source, output_dim), ("val", "u1")])


def batch_query(source: Source, shard: Shard, visible: sql.Composable, validation_fraction: float,
                seed: int) -> sql.Composed:
    """One row per batch of the rank, in key order: (row count, the rows packed as ``record_dtype``).

    ``visible``: SQL that keeps the planned rows, on the source table aliased ROWS_ALIAS (``planned_rows``).
    The batch list is sorted (a few thousand keys), then each batch is one range scan of the key index whose
    rows are concatenated in key order: nothing the size of the shard is ever sorted or materialized. The short
    tail of a row is joined first, so its features are copied once (``||`` copies both sides).
    """
    plan = _plan(source)
    filters = [visible]
    if plan.exclude_bad_rows:
        filters.append(sql.SQL("NOT {}").format(bad_row(source, plan.input_dim, plan.num_classes, plan.output_dim)))
    # The source table is aliased too: its name, whatever it is, can never hide _pgtrain_batch.
    return sql.SQL(
        """SELECT _pgtrain_packed.n, _pgtrain_packed.payload
           FROM (SELECT b.lo, b.hi, b.i FROM pgtrain.shard_batches s,
                        unnest(s.batch_lo, s.batch_hi) WITH ORDINALITY AS b(lo, hi, i)
                 WHERE s.run_id = {run} AND s.rank = {rank} ORDER BY b.i) AS _pgtrain_batch
           CROSS JOIN LATERAL (
             SELECT count(*) AS n,
                    string_agg({features} || ({target} || boolsend({is_val})), ''::bytea
                               ORDER BY {key}) AS payload
             FROM {rel} AS {rows} WHERE {in_batch} AND {filters}) AS _pgtrain_packed
           ORDER BY _pgtrain_batch.i"""
    ).format(run=sql.Literal(plan.run_id), rank=sql.Literal(shard.rank), features=feature_payload(source),
             target=target_payload(source),
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
    layout = record_dtype(source, dim, plan.output_dim)
    targets = None if source.target_format == "label" else plan.output_dim
    out = _allocate(shard.row_count, dim, _cuda_available() if pin_memory is None else pin_memory, targets)
    # Fresh arrays' pages are mapped (and zeroed by the kernel) on first write: in a thread, while the COPY
    # streams, rather than one page fault at a time in the loop below.
    prefault = None if out.pinned else prefault_in_background([out.features, out.labels, out.is_validation])
    groups = feature_groups_of(source, dim)
    filled = non_finite = 0
    try:
        with shard_copy(conn, source, shard, validation_fraction, seed) as copy, np.errstate(over="ignore"):
            for block in copy_binary.rows(copy):
                filled, found = _store(block, layout, out, filled, shard, groups)
                non_finite += found
    finally:
        if prefault is not None:
            prefault.join()
    if filled != shard.row_count:
        raise SourceError(
            f"rank {shard.rank} read {filled} rows in its key range but the manifest planned {shard.row_count}: "
            "rows were deleted or updated after compute_shards; re-run the DAG run from compute_shards"
        )
    if non_finite:
        from pgtrain.manifest import load_refusal  # manifest imports this module

        raise load_refusal(conn, source, shard.rank, non_finite)
    return out


def non_finite_rows(features: np.ndarray) -> int:
    """How many rows of ``features`` (float32, rows x dim) hold a NaN or an infinity (a float8 or numeric value
    beyond float32's range is one once stored): one sum, which is finite unless some value is not or the sum
    overflows, then the exact count only in those cases."""
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(features.sum(dtype=np.float32)):
            return 0
    return int(np.count_nonzero(~np.isfinite(features).all(axis=1)))


_MADV_POPULATE_WRITE = 23  # Linux >= 5.14: map pages writable (zeroed if new) without changing their contents
_PREFAULT_CHUNK = 8 << 20


def prefault_in_background(arrays: list[np.ndarray]) -> threading.Thread | None:
    """Map the pages of ``arrays`` in a thread (madvise MADV_POPULATE_WRITE, chunk by chunk from the start, the
    GIL released), so the loop that fills them rarely takes a page fault; None where Linux cannot. It never
    writes to the arrays: rows stored meanwhile are safe."""
    if not sys.platform.startswith("linux"):
        return None
    thread = threading.Thread(target=_populate, args=(arrays,), name="pgtrain-prefault", daemon=True)
    thread.start()
    return thread


def _populate(arrays: list[np.ndarray]) -> None:
    madvise = _libc_madvise()
    page = mmap.PAGESIZE
    for array in arrays:
        start, end = array.ctypes.data, array.ctypes.data + array.nbytes
        at = -(-start // page) * page
        while at + page <= end:
            size = min(_PREFAULT_CHUNK, (end - at) // page * page)
            if madvise(at, size, _MADV_POPULATE_WRITE) != 0:
                return  # an older kernel: the loop takes the faults itself
            at += size


@functools.cache
def _libc_madvise() -> Any:
    madvise = ctypes.CDLL(None, use_errno=True).madvise  # ctypes releases the GIL around the call
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return madvise


def _positions(positions: list[int], dim: int) -> slice | list[int]:
    """Where a group of scalar feature columns goes in a features row: a slice when they are all of them."""
    return slice(None) if positions == list(range(dim)) else positions


def _store(block: memoryview, layout: np.dtype, out: ShardData, filled: int, shard: Shard,
           groups: list[tuple[str, slice | list[int]]]) -> tuple[int, int]:
    """Copy one COPY row (a batch) into ``out`` from row ``filled``; returns the new fill level and how many of
    the batch's rows have a NaN or infinite feature (``non_finite_rows``).

    ``groups``: for scalar feature columns, (record field, positions in the features row) per wire type.
    """
    fields, count_len, count, payload_len = _BATCH_HEADER.unpack_from(block)
    if fields != 2 or count_len != 8:
        raise SourceError(f"rank {shard.rank}: unexpected COPY row layout ({fields} fields)")
    if count == 0:
        return filled, 0
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
        _check_arrays(records, "", out.features.shape[1], shard, "feature")
    for name, positions in groups:  # scalar feature columns: one array per wire type
        width = out.features.shape[1] if isinstance(positions, slice) else len(positions)
        _check_arrays(records, name.removesuffix("x"), width, shard, "feature")
    fill_features(records, out.features[span], groups)
    non_finite = non_finite_rows(out.features[span])
    if "label" in layout.names:
        out.labels[span] = records["label"]
    elif "y" in layout.names:
        out.labels[span, 0] = records["y"]
    else:
        _check_arrays(records, "t_", out.labels.shape[1], shard, "target")
        out.labels[span] = records["t_x"]["v"]
    out.is_validation[span] = records["val"]
    return filled + count, non_finite


def fill_features(records: np.ndarray, target: np.ndarray, groups: list[tuple[str, slice | list[int]]]) -> None:
    """Copy the features of ``records`` (rows of ``source_feature_fields``) into ``target``, float32 (rows, dim).

    ``groups``: for scalar feature columns, (record field, positions in the features row) per wire type.
    """
    if groups:
        for name, positions in groups:
            target[:, positions] = records[name]["v"]
    elif "ndim" in records.dtype.names:
        target[:] = records["x"]["v"]
    else:
        target[:] = records["x"]


def feature_groups_of(source: Source, dim: int) -> list[tuple[str, slice | list[int]]]:
    """``fill_features``'s groups for ``source`` (empty unless its features are scalar columns)."""
    return [(f"{wire}_x", _positions(positions, dim)) for wire, positions in feature_groups(source).items()]


def _check_arrays(records: np.ndarray, prefix: str, width: int, shard: Shard, what: str) -> None:
    if ((records[prefix + "ndim"] != 1) | (records[prefix + "hasnull"] != 0) | (records[prefix + "dim"] != width)
            ).any():
        raise SourceError(f"rank {shard.rank}: a {what} array changed shape or gained NULLs after "
                          "compute_shards; re-run compute_shards")


def _plan(source: Source) -> PlannedRows:
    if source.plan is None:
        raise PgtrainError(
            f"no shard plan for {source.qualified_name}: run compute_shards first, and get the source with "
            "manifest.source_for(conn, run)"
        )
    return source.plan


def _allocate(rows: int, dim: int, pinned: bool, targets: int | None = None) -> ShardData:
    """Arrays for ``rows`` rows; ``targets``: the regression target's width (None: int64 class labels)."""
    label_shape, label_dtype = ((rows,), np.int64) if targets is None else ((rows, targets), np.float32)
    if not pinned:
        return ShardData(np.empty((rows, dim), np.float32), np.empty(label_shape, label_dtype),
                         np.empty(rows, bool))
    import torch

    tensors = [torch.empty(shape, dtype=dtype, pin_memory=True)
               for shape, dtype in (((rows, dim), torch.float32),
                                    (label_shape, torch.int64 if targets is None else torch.float32),
                                    (rows, torch.bool))]
    return ShardData(*(t.numpy() for t in tensors), pinned=True)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
