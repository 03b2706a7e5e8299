"""Stream one rank's key range with ``COPY ... TO STDOUT (FORMAT BINARY)`` straight into numpy arrays.

compute_shards cut each rank's range into batches of a few hundred rows; the COPY sends one row per batch,
whose payload is the batch's rows packed back to back (features as sent by PostgreSQL: one array or bytea,
or one float4/float8 per scalar column; the label or regression target; the row's part of the split), so the client
handles a few thousand COPY messages per million rows, not a million. Each payload is
viewed with one structured numpy dtype and copied into arrays allocated once at their final size: no
per-row Python objects, and memory stays at the tensors plus one batch. The COPY reads only the rank's
key range, only rows visible to the planning snapshot, and the rows counted must match the manifest.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import psycopg
from psycopg import sql

from pgtrain.core.errors import PgtrainError, SourceError
from pgtrain.data import copy_binary
from pgtrain.data.encoding import ClassCoder
from pgtrain.data.load_streams import BackStream, BatchSpan, Claims, Stopped
from pgtrain.data.prefault import prefault_in_background
from pgtrain.data.row_check import load_refusal
from pgtrain.data.source.resolve import Source
from pgtrain.data.source.rows import (
    TEST,
    TRAIN,
    VALIDATION,
    bad_row,
    feature_payload,
    key_range,
    split_part,
    target_payload,
)
from pgtrain.data.source.snapshot import (
    PlannedRows,
    planned_rows,
    prefer_index_order,
    read_xid_clock,
    snapshot_transaction,
)
from pgtrain.data.wire import Group, feature_arrays, feature_groups_of, fill_features, record_dtype, well_formed
from pgtrain.runs.record import Shard

if TYPE_CHECKING:
    import torch

_BATCH_HEADER = struct.Struct(">hiqi")  # field count, length of count (8), count, length of payload
ROWS_ALIAS = "_pgtrain_rows"  # the source table in batch_query
log = logging.getLogger(__name__)


@dataclass
class ShardData:
    """One rank's rows in ordinary (pageable) host memory: key order as loaded, or split (``split``)."""

    features: np.ndarray  # (rows, dim) float32
    labels: np.ndarray  # classification: (rows,) int64; regression: (rows, output_dim) float32
    part: np.ndarray  # (rows,) uint8: each row's part of the split (rows.TRAIN, VALIDATION, TEST)
    streams: int = 1  # how many connections read the rows (load_shard's streams)

    @property
    def is_validation(self) -> np.ndarray:
        """(rows,) bool: the validation rows (they choose the epoch)."""
        return self.part == VALIDATION

    @property
    def is_test(self) -> np.ndarray:
        """(rows,) bool: the test rows (they choose nothing)."""
        return self.part == TEST

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features, labels, is_validation) as torch tensors sharing this memory (is_validation a new array)."""
        import torch

        return (torch.from_numpy(self.features), torch.from_numpy(self.labels),
                torch.from_numpy(self.is_validation))

    def split(self) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """((features, labels) of the training rows, of the validation rows, of the test rows), each in key order,
        as views of this memory: the rows must have been loaded with ``validation_last`` (``load_shard``), which
        placed them so. Copying ``features[train_rows]`` and ``features[validation_rows]`` would hold the shard
        twice; moving them in place after the load would still hold the held-out rows a second time."""
        if (np.diff(self.part.astype(np.int8)) < 0).any():  # TRAIN, VALIDATION, TEST are 0, 1, 2
            raise ValueError("these rows are in key order: load_shard(..., validation_last=True) places the "
                             "validation rows after the training rows, and the test rows after them, as split "
                             "needs them")
        test = len(self.part) - int(np.count_nonzero(self.is_test))
        train = test - int(np.count_nonzero(self.is_validation))
        return tuple((self.features[lo:hi], self.labels[lo:hi]) for lo, hi in
                     ((0, train), (train, test), (test, len(self.part))))


def batch_query(source: Source, shard: Shard, visible: sql.Composable, validation_fraction: float,
                seed: int, span: BatchSpan | None = None, test_fraction: float = 0.0) -> sql.Composed:
    """One row per batch of the rank (``span``: of those only), in key order (the batches last first if
    ``span.descending``; the rows of a batch always in key order): (row count, the rows packed as
    ``record_dtype``).

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
                 WHERE s.run_id = {run} AND s.rank = {rank}{in_span}
                 ORDER BY b.i {order}) AS _pgtrain_batch
           CROSS JOIN LATERAL (
             SELECT count(*) AS n,
                    string_agg({features} || ({target} || {part}), ''::bytea
                               ORDER BY {key}) AS payload
             FROM {rel} AS {rows} WHERE {in_batch} AND {filters}) AS _pgtrain_packed
           ORDER BY _pgtrain_batch.i {order}"""
    ).format(run=sql.Literal(plan.run_id), rank=sql.Literal(shard.rank),
             in_span=sql.SQL(" AND b.i BETWEEN {} AND {}").format(span.first, span.last) if span else sql.SQL(""),
             order=sql.SQL("DESC" if span and span.descending else "ASC"),
             features=feature_payload(source, plan.nullable_columns), target=target_payload(source),
             part=split_part(source, validation_fraction, test_fraction, seed), key=source.key, rel=source.relation,
             rows=sql.Identifier(ROWS_ALIAS),
             in_batch=key_range(source, sql.SQL("_pgtrain_batch.lo"), sql.SQL("_pgtrain_batch.hi")),
             filters=sql.SQL(" AND ").join(filters))


def read_spans(conn: psycopg.Connection, source: Source, shard: Shard, validation_fraction: float, seed: int,
               spans: Iterable[BatchSpan], test_fraction: float = 0.0) -> Iterator[tuple[memoryview, BatchSpan]]:
    """Each row (a batch) of the rank's COPY of each span in turn, with its span, inside the connection's open
    REPEATABLE READ transaction (``snapshot_transaction``), whose snapshot decides what is read; ``spans`` may be
    handed out while the rows are read (``load_streams.Claims``)."""
    clock = read_xid_clock(conn)  # per transaction: age() counts from its own first call
    prefer_index_order(conn)
    visible = planned_rows(source, clock, ROWS_ALIAS)
    for span in spans:
        query = batch_query(source, shard, visible, validation_fraction, seed, span, test_fraction)
        with conn.cursor() as cur, cur.copy(sql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(query)) as copy:
            for row in copy_binary.rows(copy):
                yield row, span


def streams_for(world_size: int) -> int:
    """How many connections each rank reads its shard on: two when a rank loads alone, one otherwise.

    The server builds the batches of one COPY on one core, which bounds a lone rank's load; a second backend
    reading part of the batches lifts that bound (figures in benchmarks/RESULTS.md). With more ranks, they
    already keep as many backends busy; a run never holds more than max(2, world_size) loading connections."""
    return 2 if world_size == 1 else 1


def load_shard(conn: psycopg.Connection, source: Source, shard: Shard, dim: int, validation_fraction: float,
               seed: int, *, streams: int = 1, validation_last: bool = False, test_fraction: float = 0.0) -> ShardData:
    """Load the rows of ``shard`` as planned; raises SourceError if they changed since compute_shards.

    The arrays are ordinary host memory, never CUDA pinned memory: the loader creates no CUDA context (a rank
    selects its GPU first), and torch's pinned allocator would round the shard up to a power of two and keep it.
    ``streams``: 2 also reads on a second connection (same user, same snapshot), opened in a thread while this
    one starts: this one claims chunks of batches from the first up, that one from the last down, filling the
    arrays from the end, until they meet (``load_streams.Claims``; ``streams_for``). Where that connection cannot
    be opened, cannot import the snapshot, or would wait for a lock (SECOND_CONNECTION_LOCK_TIMEOUT) before its
    first batch, this connection reads everything.
    ``validation_last``: the training rows first, then the validation rows, then the test rows, each in key order
    (``ShardData.split``): the planned split says where each part begins, so every batch is stored where it stays.
    Else all rows in key order. ``test_fraction``: the run's (as planned: 0 for a manifest without test rows).
    ``conn`` must be an autocommit connection outside a transaction (the load runs in its own snapshot).
    """
    plan = _plan(source)
    if dim != plan.input_dim:
        raise PgtrainError(f"rank {shard.rank} was asked for {dim} features but run {plan.run_id} planned "
                           f"{plan.input_dim}; pass run.input_dim")
    if streams not in (1, 2):
        raise PgtrainError(f"a rank loads on 1 or 2 connections, not {streams}")
    targets = None if source.target_format in ("label", "class") else plan.output_dim
    out = _allocate(shard.row_count, dim, targets)
    # Fresh arrays' pages are mapped (and zeroed by the kernel) on first write: in a thread, while the COPY
    # streams, rather than one page fault at a time in the loop below.
    prefault = prefault_in_background([out.features, out.labels, out.part])
    classes = ClassCoder(source) if source.target_format == "class" else None
    fill = _Fill(out, shard, record_dtype(source, dim, plan.output_dim), feature_groups_of(source, dim), classes,
                 validation_last)

    def read(on: psycopg.Connection, spans: Iterable[BatchSpan]) -> None:
        with np.errstate(over="ignore"):
            for block, span in read_spans(on, source, shard, validation_fraction, seed, spans, test_fraction):
                _store(block, fill, span.descending)

    try:
        with snapshot_transaction(conn):
            (batches,) = conn.execute(
                "SELECT cardinality(batch_lo) FROM pgtrain.shard_batches WHERE run_id = %s AND rank = %s",
                (plan.run_id, shard.rank)).fetchone() or (None,)
            if batches is None:
                raise PgtrainError(f"run {plan.run_id} has no batches for rank {shard.rank}; re-run compute_shards")
            if streams == 1 or batches < 2:
                read(conn, [BatchSpan(1, batches)])
            else:
                claims = Claims(batches)
                back = BackStream(conn, conn.execute("SELECT pg_export_snapshot()").fetchone()[0],
                                   lambda on: read(on, iter(claims.back, None)), fill)
                if back.run_alongside(lambda: read(conn, iter(claims.front, None))):
                    out.streams = 2
                else:
                    read(conn, [claims.reserved])
    finally:
        if prefault is not None:
            prefault.join()
    fill.check_complete()
    if fill.non_finite:
        raise load_refusal(conn, source, shard.rank, fill.non_finite)
    return out


class _Region:
    """Rows ``lo``..``hi`` of the arrays: the front stream fills them from ``lo`` up, the back stream from ``hi``
    down."""

    def __init__(self, lo: int, hi: int, what: str) -> None:
        self.lo, self.hi, self.what = lo, hi, what
        self.front, self.back = lo, hi


class _Fill:
    """Where each batch of a load goes: one region for all rows in key order, or (``validation_last``) one for the
    training rows, one after it for the validation rows and one after that for the test rows, each as many rows
    as planned. In each region the front
    stream fills from the first row up, the back stream (reading its batches last first) from the last row down;
    planned rows meet exactly, and neither may pass the other."""

    def __init__(self, out: ShardData, shard: Shard, layout: np.dtype, groups: list[Group],
                 classes: ClassCoder | None, validation_last: bool = False) -> None:
        self.out, self.shard, self.layout, self.groups, self.classes = out, shard, layout, groups, classes
        test = shard.row_count - shard.test_count
        self.regions = ({TRAIN: _Region(0, shard.train_count, "training "),
                         VALIDATION: _Region(shard.train_count, test, "validation "),
                         TEST: _Region(test, shard.row_count, "test ")} if validation_last
                        else {None: _Region(0, shard.row_count, "")})
        self.non_finite = 0
        self.failed = False
        self._lock = threading.Lock()

    def parts(self, records: np.ndarray, from_back: bool) -> list[tuple[np.ndarray, slice]]:
        """A batch's records and where they go: all of them together, or its rows of each part of the split."""
        if None in self.regions:
            return [(records, self.place(len(records), None, from_back))]
        return [(rows, self.place(len(rows), kind, from_back))
                for kind in self.regions if len(rows := records[records["part"] == kind])]

    def place(self, count: int, kind: int | None, from_back: bool) -> slice:
        with self._lock:
            if self.failed:
                raise Stopped
            region = self.regions[kind]
            if count > region.back - region.front:
                raise SourceError(
                    f"rank {self.shard.rank} read more {region.what}rows than the {region.hi - region.lo} its "
                    "manifest planned: rows were added in its key range after compute_shards; re-run the DAG run "
                    "from compute_shards"
                )
            if from_back:
                region.back -= count
                return slice(region.back, region.back + count)
            region.front += count
            return slice(region.front - count, region.front)

    def back_started(self) -> bool:
        with self._lock:
            return any(region.back < region.hi for region in self.regions.values())

    def add_non_finite(self, count: int) -> None:
        with self._lock:
            self.non_finite += count

    def check_complete(self) -> None:
        for region in self.regions.values():
            filled = region.front - region.lo + region.hi - region.back
            if filled != region.hi - region.lo:
                raise SourceError(
                    f"rank {self.shard.rank} read {filled} {region.what}rows in its key range but the manifest "
                    f"planned {region.hi - region.lo}: rows were deleted or updated after compute_shards; re-run the "
                    "DAG run from compute_shards"
                )


def non_finite_rows(features: np.ndarray) -> int:
    """How many rows of ``features`` (float32, rows x dim) hold a NaN or an infinity (a float8 or numeric value
    beyond float32's range is one once stored): one sum, which is finite unless some value is not or the sum
    overflows, then the exact count only in those cases."""
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(features.sum(dtype=np.float32)):
            return 0
    return int(np.count_nonzero(~np.isfinite(features).all(axis=1)))


def _store(block: memoryview, fill: _Fill, from_back: bool) -> None:
    """Copy one COPY row (a batch) into ``fill``'s arrays, where ``fill`` places it; counts the batch's rows
    that have a NaN or infinite feature (``non_finite_rows``)."""
    shard, layout, out = fill.shard, fill.layout, fill.out
    fields, count_len, count, payload_len = _BATCH_HEADER.unpack_from(block)
    if fields != 2 or count_len != 8:
        raise SourceError(f"rank {shard.rank}: unexpected COPY row layout ({fields} fields)")
    if count == 0:
        return
    if payload_len != count * layout.itemsize:
        raise SourceError(
            f"rank {shard.rank}: a batch of {count} rows holds {payload_len} bytes, not {count} x "
            f"{layout.itemsize}: the rows do not all have {out.features.shape[1]} features any more, or a feature "
            "column holds a NULL that compute_shards did not see; re-run compute_shards"
        )
    records = np.frombuffer(block, layout, count, _BATCH_HEADER.size)
    for prefix, width in feature_arrays(layout, fill.groups, out.features.shape[1]):
        _check_arrays(records, prefix, width, shard, "feature")
    if "t_ndim" in layout.names:
        _check_arrays(records, "t_", out.labels.shape[1], shard, "target")
    for rows, span in fill.parts(records, from_back):
        _store_rows(rows, span, fill)


def _store_rows(records: np.ndarray, span: slice, fill: _Fill) -> None:
    """Copy ``records`` (rows of one batch, in key order) into rows ``span`` of ``fill``'s arrays."""
    layout, out = fill.layout, fill.out
    fill_features(records, out.features[span], fill.groups)
    if found := non_finite_rows(out.features[span]):
        fill.add_non_finite(found)
    if "label" in layout.names:
        out.labels[span] = records["label"]
    elif "label_hash" in layout.names:
        out.labels[span] = fill.classes(records["label_hash"])
    elif "y" in layout.names:
        out.labels[span, 0] = records["y"]
    else:
        out.labels[span] = records["t_x"]["v"]
    out.part[span] = records["part"]


def _check_arrays(records: np.ndarray, prefix: str, width: int, shard: Shard, what: str) -> None:
    if not well_formed(records, prefix, width).all():
        raise SourceError(f"rank {shard.rank}: a {what} array changed shape or gained NULLs after "
                          "compute_shards; re-run compute_shards")


def _plan(source: Source) -> PlannedRows:
    if source.plan is None:
        raise PgtrainError(
            f"no shard plan for {source.qualified_name}: run compute_shards first, and get the source with "
            "manifest.source_for(conn, run)"
        )
    return source.plan


def _allocate(rows: int, dim: int, targets: int | None = None) -> ShardData:
    """Arrays for ``rows`` rows; ``targets``: the regression target's width (None: int64 class labels)."""
    label_shape, label_dtype = ((rows,), np.int64) if targets is None else ((rows, targets), np.float32)
    return ShardData(np.empty((rows, dim), np.float32), np.empty(label_shape, label_dtype), np.empty(rows, np.uint8))
