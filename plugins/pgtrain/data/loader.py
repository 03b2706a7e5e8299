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

import logging
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import psycopg
from psycopg import sql

from pgtrain.core.errors import PgtrainError, SourceError
from pgtrain.data import copy_binary
from pgtrain.data.encoding import ClassCoder
from pgtrain.data.prefault import prefault_in_background
from pgtrain.data.row_check import load_refusal
from pgtrain.data.source.resolve import Source
from pgtrain.data.source.rows import bad_row, feature_payload, is_validation, key_range, target_payload
from pgtrain.data.source.snapshot import (
    PlannedRows,
    in_snapshot_of,
    planned_rows,
    prefer_index_order,
    read_xid_clock,
    second_connection,
    snapshot_transaction,
)
from pgtrain.data.wire import Group, feature_groups_of, fill_features, record_dtype
from pgtrain.runs.record import Shard

if TYPE_CHECKING:
    import torch

_BATCH_HEADER = struct.Struct(">hiqi")  # field count, length of count (8), count, length of payload
ROWS_ALIAS = "_pgtrain_rows"  # the source table in batch_query
# A two-connection load reads its batches in about this many COPYs (_Claims): a few more statements, and the
# streams end within a chunk of each other however unevenly they are served.
CHUNKS_PER_LOAD = 8
log = logging.getLogger(__name__)


@dataclass
class ShardData:
    """One rank's rows in ordinary (pageable) host memory: key order as loaded, or split (``split``)."""

    features: np.ndarray  # (rows, dim) float32
    labels: np.ndarray  # classification: (rows,) int64; regression: (rows, output_dim) float32
    is_validation: np.ndarray  # (rows,) bool
    streams: int = 1  # how many connections read the rows (load_shard's streams)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features, labels, is_validation) as torch tensors sharing this memory."""
        import torch

        return (torch.from_numpy(self.features), torch.from_numpy(self.labels),
                torch.from_numpy(self.is_validation))

    def split(self, chunk_rows: int = 16384) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """((features, labels) of the training rows, (features, labels) of the validation rows), each in key order,
        as views of this memory: the rows are reordered in place, training rows first (``is_validation`` follows).

        Copying ``features[train_rows]`` and ``features[validation_rows]`` would hold the shard twice beside the
        loaded arrays; this holds only the validation rows and one chunk beside them."""
        train_count = len(self.is_validation) - int(np.count_nonzero(self.is_validation))
        for array in (self.features, self.labels):
            validation = array[self.is_validation]
            kept = 0
            # Training rows move towards the front, chunk by chunk: a chunk is copied out before it is written
            # back, and never above its own end, so no row is overwritten before it was read.
            for start in range(0, len(array), chunk_rows):
                rows = array[start:start + chunk_rows][~self.is_validation[start:start + chunk_rows]]
                array[kept:kept + len(rows)] = rows
                kept += len(rows)
            array[train_count:] = validation
        self.is_validation[:train_count] = False
        self.is_validation[train_count:] = True
        return ((self.features[:train_count], self.labels[:train_count]),
                (self.features[train_count:], self.labels[train_count:]))


@dataclass(frozen=True)
class BatchSpan:
    """Which of a rank's batches one COPY reads: ordinals ``first``..``last`` (from 1), last first if
    ``descending`` (the rows inside a batch stay in key order)."""

    first: int
    last: int
    descending: bool = False


def batch_query(source: Source, shard: Shard, visible: sql.Composable, validation_fraction: float,
                seed: int, span: BatchSpan | None = None) -> sql.Composed:
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
                    string_agg({features} || ({target} || boolsend({is_val})), ''::bytea
                               ORDER BY {key}) AS payload
             FROM {rel} AS {rows} WHERE {in_batch} AND {filters}) AS _pgtrain_packed
           ORDER BY _pgtrain_batch.i {order}"""
    ).format(run=sql.Literal(plan.run_id), rank=sql.Literal(shard.rank),
             in_span=sql.SQL(" AND b.i BETWEEN {} AND {}").format(span.first, span.last) if span else sql.SQL(""),
             order=sql.SQL("DESC" if span and span.descending else "ASC"), features=feature_payload(source),
             target=target_payload(source),
             is_val=is_validation(source, validation_fraction, seed), key=source.key, rel=source.relation,
             rows=sql.Identifier(ROWS_ALIAS),
             in_batch=key_range(source, sql.SQL("_pgtrain_batch.lo"), sql.SQL("_pgtrain_batch.hi")),
             filters=sql.SQL(" AND ").join(filters))


def read_spans(conn: psycopg.Connection, source: Source, shard: Shard, validation_fraction: float, seed: int,
               spans: Iterable[BatchSpan]) -> Iterator[tuple[memoryview, BatchSpan]]:
    """Each row (a batch) of the rank's COPY of each span in turn, with its span, inside the connection's open
    REPEATABLE READ transaction (``snapshot_transaction``), whose snapshot decides what is read; ``spans`` may be
    handed out while the rows are read (``_Claims``)."""
    clock = read_xid_clock(conn)  # per transaction: age() counts from its own first call
    prefer_index_order(conn)
    visible = planned_rows(source, clock, ROWS_ALIAS)
    for span in spans:
        query = batch_query(source, shard, visible, validation_fraction, seed, span)
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
               seed: int, *, streams: int = 1) -> ShardData:
    """Load the rows of ``shard`` as planned; raises SourceError if they changed since compute_shards.

    The arrays are ordinary host memory, never CUDA pinned memory: the loader creates no CUDA context (a rank
    selects its GPU first), and torch's pinned allocator would round the shard up to a power of two and keep it.
    ``streams``: 2 also reads on a second connection (same user, same snapshot), opened in a thread while this
    one starts: this one claims chunks of batches from the first up, that one from the last down, filling the
    arrays from the end, until they meet (``_Claims``; ``streams_for``). Where that connection cannot be opened,
    cannot import the snapshot, or would wait for a lock (SECOND_CONNECTION_LOCK_TIMEOUT) before its first
    batch, this connection reads everything.
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
    prefault = prefault_in_background([out.features, out.labels, out.is_validation])
    classes = ClassCoder(source) if source.target_format == "class" else None
    fill = _Fill(out, shard, record_dtype(source, dim, plan.output_dim), feature_groups_of(source, dim), classes)

    def read(on: psycopg.Connection, spans: Iterable[BatchSpan]) -> None:
        with np.errstate(over="ignore"):
            for block, span in read_spans(on, source, shard, validation_fraction, seed, spans):
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
                claims = _Claims(batches)
                back = _BackStream(conn, conn.execute("SELECT pg_export_snapshot()").fetchone()[0],
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


class _Stopped(Exception):
    """The other stream of the same load failed: this one stops (the other's error is the one raised)."""


class _Fill:
    """Where each batch of a load goes. The front stream fills from the first row up, the back stream (reading
    its batches last first) from the last row down; planned rows meet exactly, and neither may pass the other."""

    def __init__(self, out: ShardData, shard: Shard, layout: np.dtype, groups: list[Group],
                 classes: ClassCoder | None) -> None:
        self.out, self.shard, self.layout, self.groups, self.classes = out, shard, layout, groups, classes
        self.front, self.back, self.non_finite = 0, shard.row_count, 0
        self.failed = False
        self._lock = threading.Lock()

    def place(self, count: int, from_back: bool) -> slice:
        with self._lock:
            if self.failed:
                raise _Stopped
            if count > self.back - self.front:
                raise SourceError(
                    f"rank {self.shard.rank} read more rows than the {self.shard.row_count} its manifest planned: "
                    "rows were added in its key range after compute_shards; re-run the DAG run from compute_shards"
                )
            if from_back:
                self.back -= count
                return slice(self.back, self.back + count)
            self.front += count
            return slice(self.front - count, self.front)

    def back_started(self) -> bool:
        with self._lock:
            return self.back < self.shard.row_count

    def add_non_finite(self, count: int) -> None:
        with self._lock:
            self.non_finite += count

    def check_complete(self) -> None:
        filled = self.front + self.shard.row_count - self.back
        if filled != self.shard.row_count:
            raise SourceError(
                f"rank {self.shard.rank} read {filled} rows in its key range but the manifest planned "
                f"{self.shard.row_count}: rows were deleted or updated after compute_shards; re-run the DAG run "
                "from compute_shards"
            )


class _Claims:
    """Which batches each stream of a two-connection load reads next, a chunk at a time: the front claims from the
    first batch up, the back from the last down, until they meet, so a stream that starts later or gets less CPU
    reads less instead of holding up the load. The back's first chunk is ``reserved`` for it: it reads at least
    that much, or gives it back before reading any of it."""

    def __init__(self, batches: int) -> None:
        self.size = -(-batches // CHUNKS_PER_LOAD)
        self.reserved = BatchSpan(max(batches - self.size, 1) + 1, batches, descending=True)
        self._reserved_taken = False
        self._next_front, self._next_back = 1, self.reserved.first - 1
        self._lock = threading.Lock()

    def front(self) -> BatchSpan | None:
        with self._lock:
            if self._next_front > self._next_back:
                return None
            last = min(self._next_front + self.size - 1, self._next_back)
            span, self._next_front = BatchSpan(self._next_front, last), last + 1
            return span

    def back(self) -> BatchSpan | None:
        with self._lock:
            if not self._reserved_taken:
                self._reserved_taken = True
                return self.reserved
            if self._next_back < self._next_front:
                return None
            first = max(self._next_back - self.size + 1, self._next_front)
            span, self._next_back = BatchSpan(first, self._next_back, descending=True), first - 1
            return span


class _BackStream:
    """The back stream of a two-connection load, read in a thread on a second connection (opened there, while the
    first connection starts reading) in the exported ``snapshot``."""

    def __init__(self, first: psycopg.Connection, snapshot: str, read: Callable[[psycopg.Connection], None],
                 fill: _Fill) -> None:
        self.first, self.snapshot, self.read, self.fill = first, snapshot, read, fill
        self.conn: psycopg.Connection | None = None
        self.error: BaseException | None = None
        self.handed_back = False
        self._imported = False

    def run_alongside(self, front: Callable[[], None]) -> bool:
        """Run ``front()`` here while the thread reads from the back; False if the thread gave its reserved chunk
        back before reading any of it (the caller reads it then). An error of the front cancels the back's query;
        an error of the back stops the front at its next batch. The first error is raised; the thread has ended."""
        thread = threading.Thread(target=self._run, name="pgtrain-load", daemon=True)
        thread.start()
        try:
            front()
            thread.join()
        except BaseException as error:
            self.fill.failed = True
            try:
                if self.conn is not None:
                    self.conn.cancel_safe(timeout=5)  # ends the back's COPY or lock wait now
            except Exception as cancel_error:  # the thread still stops at its next batch
                log.warning("could not cancel the second loading connection's query: %s", cancel_error)
            finally:
                thread.join()
            if isinstance(error, _Stopped) and self.error is not None:
                raise self.error from None
            if self.error is not None and not isinstance(self.error, _Stopped):
                error.add_note(f"the second loading connection failed too: {self.error}")
            raise
        if self.error is not None:
            raise self.error
        return not self.handed_back

    def _run(self) -> None:
        # Reads only the first connection's settings, fixed since it connected, while it streams.
        self.conn = second_connection(self.first, "pgtrain-load", "loading")
        if self.conn is None:
            self.handed_back = True
            return
        try:
            with self.conn, in_snapshot_of(self.conn, self.snapshot):
                if self.fill.failed:  # the front failed while this connection was being opened
                    return
                self._imported = True
                self.read(self.conn)
        except _Stopped:
            pass
        except BaseException as error:
            if self._may_hand_back(error):
                log.warning("the second loading connection gave its batches back before reading any of them (%s); "
                            "reading them on the first", str(error).strip())
                self.handed_back = True
            else:
                self.error = error
                self.fill.failed = True

    def _may_hand_back(self, error: BaseException) -> bool:
        """Only a snapshot it could not import or a lock it would wait for, before it placed any row."""
        fits = isinstance(error, psycopg.errors.LockNotAvailable) or (
            isinstance(error, psycopg.Error) and not self._imported)
        return fits and not self.fill.failed and not self.fill.back_started()


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
            f"{layout.itemsize}: the rows do not all have {out.features.shape[1]} features any more; "
            "re-run compute_shards"
        )
    records = np.frombuffer(block, layout, count, _BATCH_HEADER.size)
    if "ndim" in layout.names:
        _check_arrays(records, "", out.features.shape[1], shard, "feature")
    for name, positions, _ in fill.groups:  # scalar feature columns: one array per wire type
        width = out.features.shape[1] if isinstance(positions, slice) else len(positions)
        _check_arrays(records, name.removesuffix("x"), width, shard, "feature")
    span = fill.place(count, from_back)
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
        _check_arrays(records, "t_", out.labels.shape[1], shard, "target")
        out.labels[span] = records["t_x"]["v"]
    out.is_validation[span] = records["val"]


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


def _allocate(rows: int, dim: int, targets: int | None = None) -> ShardData:
    """Arrays for ``rows`` rows; ``targets``: the regression target's width (None: int64 class labels)."""
    label_shape, label_dtype = ((rows,), np.int64) if targets is None else ((rows, targets), np.float32)
    return ShardData(np.empty((rows, dim), np.float32), np.empty(label_shape, label_dtype), np.empty(rows, bool))
