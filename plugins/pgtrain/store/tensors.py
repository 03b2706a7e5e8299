"""Tensors as blobs of chunked rows: each tensor's little-endian bytes are a blob in ``pgtrain.tensor_chunks``
(blob_id, seq, data), rows of at most ``CHUNK_BYTES``, streamed with binary COPY; its owner row holds the layout
(name, shape, dtype, nbytes) and the blob_id. numpy only, so it works without torch.

Writing hands COPY slices of each array's own memory (no ``tobytes()``, no concatenation); reading
allocates each destination array once and fills it chunk by chunk, so moving a state dict costs about
one copy of its tensors plus one chunk in flight. Three kinds of owner share the format: a run's staged
parameters, its latest checkpoint, and committed model versions (``pgtrain.store.model_store``), which take over
the staged blobs when a run is committed, without copying them. A blob's chunks are deleted by the database
(004's triggers) when the last row that references it is.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from pgtrain.core.errors import PgtrainError
from pgtrain.data.copy_binary import HEADER, I32, TRAILER, fields, rows

# Bytes per chunk row: at most 64 MB, and a multiple of every item size so a chunk holds whole elements.
CHUNK_BYTES = 16 * 1024 * 1024
_PIECE = 1024 * 1024  # bytes handed to COPY at a time
ALLOWED_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
FLOAT_DTYPES = frozenset({"float16", "float32", "float64"})
_ROW_HEAD = struct.Struct(">hiqii")  # a COPY row up to its data: field count, blob_id (int8), seq (int4)
_I64 = struct.Struct(">q")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    nonfinite: int | None = None  # counted while writing; None when unknown
    blob_id: int | None = None  # its bytes in pgtrain.tensor_chunks

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "nbytes": self.nbytes,
                "blob_id": self.blob_id}

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> TensorInfo:
        return cls(entry["name"], tuple(entry["shape"]), entry["dtype"], entry["nbytes"], blob_id=entry["blob_id"])


# -- staged parameters ----------------------------------------------------------------------------------
def delete_staged(conn: psycopg.Connection, run_id: str) -> None:
    conn.execute("DELETE FROM pgtrain.staged_parameters WHERE run_id = %s", (run_id,))


def write_staged(conn: psycopg.Connection, run_id: str, arrays: Mapping[str, np.ndarray]) -> None:
    """Stage the run's final parameters, replacing any from an earlier attempt, atomically."""
    arrays = _checked(arrays)
    with conn.transaction():
        _serialize(conn, "staged", run_id)
        delete_staged(conn, run_id)
        infos = new_blobs(conn, arrays)
        # Layout rows first: a stale attempt's write is refused by their fence (007) before any byte is sent.
        with conn.cursor() as cur:
            cur.executemany(
                """INSERT INTO pgtrain.staged_parameters (run_id, name, shape, dtype, nbytes, blob_id)
                   VALUES (%s, %s, %s, %s, %s, %s)""",
                [(run_id, i.name, list(i.shape), i.dtype, i.nbytes, i.blob_id) for i in infos],
            )
        counted = copy_chunks(conn, infos, arrays)
        conn.execute(
            """UPDATE pgtrain.staged_parameters p SET nonfinite = c.nonfinite
               FROM unnest(%s::text[], %s::bigint[]) AS c (name, nonfinite)
               WHERE p.run_id = %s AND p.name = c.name""",
            (list(counted), list(counted.values()), run_id),
        )


def staged_layout(conn: psycopg.Connection, run_id: str, *, lock: bool = False) -> list[TensorInfo]:
    """The staged tensors' layout rows, in name order (``lock``: FOR SHARE, so no rewrite can interleave)."""
    query = sql.SQL("""SELECT name, shape, dtype, nbytes, nonfinite, blob_id FROM pgtrain.staged_parameters
                       WHERE run_id = %s ORDER BY name {}""").format(sql.SQL("FOR SHARE" if lock else ""))
    return [TensorInfo(n, tuple(s), d, b, f, i) for n, s, d, b, f, i in conn.execute(query, (run_id,))]


def read_staged(conn: psycopg.Connection, run_id: str) -> dict[str, np.ndarray]:
    with conn.transaction():
        infos = staged_layout(conn, run_id, lock=True)
        return read_chunks(conn, infos, f"the staged parameters of run {run_id!r}")


def count_staged_nonfinite(conn: psycopg.Connection, run_id: str, infos: list[TensorInfo]) -> dict[str, int]:
    """name -> non-finite values of the float tensors in ``infos``, streamed a chunk at a time."""
    floats = [i for i in infos if i.dtype in FLOAT_DTYPES]
    counts = dict.fromkeys((i.name for i in floats), 0)
    for info, _, payload in _chunk_stream(conn, floats, f"the staged parameters of run {run_id!r}"):
        values = np.frombuffer(payload, dtype=np.dtype(info.dtype).newbyteorder("<"))
        counts[info.name] += int(values.size - np.count_nonzero(np.isfinite(values)))
    return counts


# -- checkpoints (the latest one per run) -----------------------------------------------------------------
def write_checkpoint(conn: psycopg.Connection, run_id: str, epoch: int, arrays: Mapping[str, np.ndarray],
                     meta: Mapping[str, Any]) -> None:
    """Replace the run's checkpoint with this one (model and optimizer tensors, ``meta`` as JSON), atomically."""
    arrays = _checked(arrays)
    with conn.transaction():
        _serialize(conn, "checkpoint", run_id)
        delete_checkpoints(conn, run_id)
        infos = new_blobs(conn, arrays)
        # The row first: a stale attempt's write is refused by its fence (007) before any byte is sent.
        conn.execute(
            "INSERT INTO pgtrain.checkpoints (run_id, epoch, meta, tensors) VALUES (%s, %s, %s, %s)",
            (run_id, epoch, Jsonb(dict(meta)), Jsonb([i.as_json() for i in infos])),
        )
        copy_chunks(conn, infos, arrays)


def read_checkpoint(conn: psycopg.Connection, run_id: str) -> tuple[int, dict[str, np.ndarray], dict] | None:
    """(epoch, name -> array, meta) of the run's latest checkpoint, or None when it has none."""
    with conn.transaction():
        row = conn.execute("SELECT epoch, meta, tensors FROM pgtrain.checkpoints WHERE run_id = %s FOR SHARE",
                           (run_id,)).fetchone()
        if row is None:
            return None
        epoch, meta, layout = row
        infos = [TensorInfo.from_json(t) for t in layout]
        arrays = read_chunks(conn, infos, f"the checkpoint of run {run_id!r}")
    return epoch, arrays, meta


def delete_checkpoints(conn: psycopg.Connection, run_id: str) -> None:
    conn.execute("DELETE FROM pgtrain.checkpoints WHERE run_id = %s", (run_id,))


# -- blobs -----------------------------------------------------------------------------------------------------
def new_blobs(conn: psycopg.Connection, arrays: Mapping[str, np.ndarray]) -> list[TensorInfo]:
    """The layout of ``arrays`` in name order, each with a new blob_id (its chunks are not written yet)."""
    names = sorted(arrays)
    ids = [r[0] for r in conn.execute("SELECT nextval('pgtrain.tensor_blob_ids') FROM generate_series(1, %s)",
                                      (len(names),))]
    return [TensorInfo(name, tuple(np.shape(arrays[name])), arrays[name].dtype.name, arrays[name].nbytes,
                       blob_id=blob_id) for name, blob_id in zip(names, ids, strict=True)]


def copy_chunks(conn: psycopg.Connection, infos: Iterable[TensorInfo],
                arrays: Mapping[str, np.ndarray]) -> dict[str, int | None]:
    """COPY each array's bytes into its blob's chunks; returns name -> non-finite values (None: not a float)."""
    counted: dict[str, int | None] = {}
    with conn.cursor() as cur, \
            cur.copy("COPY pgtrain.tensor_chunks (blob_id, seq, data) FROM STDIN (FORMAT BINARY)") as copy:
        copy.write(HEADER)
        for info in infos:
            array = _little_endian(arrays[info.name])
            flat = array.reshape(-1)
            raw = memoryview(flat.view(np.uint8)) if flat.size else memoryview(b"")
            nonfinite = 0 if array.dtype.name in FLOAT_DTYPES else None
            per_chunk = CHUNK_BYTES // max(array.itemsize, 1)
            for seq, start in enumerate(range(0, flat.size, per_chunk)):
                stop = min(start + per_chunk, flat.size)
                if nonfinite is not None:
                    nonfinite += int((stop - start) - np.count_nonzero(np.isfinite(flat[start:stop])))
                payload = raw[start * array.itemsize:stop * array.itemsize]
                copy.write(_ROW_HEAD.pack(3, 8, info.blob_id, 4, seq) + I32.pack(len(payload)))
                for offset in range(0, len(payload), _PIECE):
                    copy.write(payload[offset:offset + _PIECE])
            counted[info.name] = nonfinite
        copy.write(TRAILER)
    return counted


def read_chunks(conn: psycopg.Connection, infos: Iterable[TensorInfo], owner: str) -> dict[str, np.ndarray]:
    """Arrays of ``infos`` (of ``owner``, for messages), each allocated once and filled from its blob's chunks."""
    infos = list(infos)
    out = {i.name: np.empty(i.shape, dtype=np.dtype(i.dtype).newbyteorder("<")) for i in infos}
    filled = dict.fromkeys(out, 0)
    targets = {name: array.reshape(-1).view(np.uint8) for name, array in out.items() if array.size}
    for info, _seq, payload in _chunk_stream(conn, [i for i in infos if i.nbytes], owner):
        target, start = targets[info.name], filled[info.name]
        if start + len(payload) > target.size:
            raise PgtrainError(f"tensor {info.name!r} of {owner} has more bytes than its layout says "
                               f"({target.size}); the store is damaged")
        target[start:start + len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        filled[info.name] = start + len(payload)
    short = [f"{i.name} ({filled[i.name]} of {i.nbytes} bytes)" for i in infos if filled[i.name] != i.nbytes]
    if short:
        raise PgtrainError(f"incomplete tensors of {owner}: {', '.join(short)}; they were deleted or never fully "
                           "written")
    return out


def _chunk_stream(conn: psycopg.Connection, infos: list[TensorInfo], owner: str
                  ) -> Iterable[tuple[TensorInfo, int, memoryview]]:
    """(info, seq, payload) of every chunk of ``infos``' blobs in blob and seq order, a COPY row at a time."""
    if not infos:
        return
    by_blob = {i.blob_id: i for i in infos}
    statement = sql.SQL("COPY (SELECT blob_id, seq, data FROM pgtrain.tensor_chunks WHERE blob_id = ANY({}) "
                        "ORDER BY blob_id, seq) TO STDOUT (FORMAT BINARY)").format(sql.Literal(list(by_blob)))
    expected: tuple[int, int] | None = None
    with conn.cursor() as cur, cur.copy(statement) as copy:
        for row in rows(copy):
            raw_blob, raw_seq, payload = fields(row)
            blob, seq = _I64.unpack(raw_blob)[0], I32.unpack(raw_seq)[0]
            follows = expected is not None and blob == expected[0]
            if seq != (expected[1] + 1 if follows else 0):
                raise PgtrainError(f"tensor {by_blob[blob].name!r} of {owner} misses chunk(s) before {seq}; "
                                   "the store is damaged")
            expected = (blob, seq)
            yield by_blob[blob], seq, payload


def _checked(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """numpy arrays of allowed dtypes (no copy for numpy input); ValueError naming the first bad one."""
    out = {}
    for name, array in arrays.items():
        array = np.asarray(array)
        if array.dtype.name not in ALLOWED_DTYPES:
            raise ValueError(f"tensor {name}: dtype {array.dtype.name} is not stored; use one of "
                             f"{list(ALLOWED_DTYPES)}")
        out[name] = array
    return out


def _little_endian(array: np.ndarray) -> np.ndarray:
    """C-contiguous little-endian: the array itself when it is one (the usual case), else one copy of it."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)  # (this one makes 0-d into 1-d)


def _serialize(conn: psycopg.Connection, kind: str, run_id: str) -> None:
    # Two writers of one run's tensors (an orphaned attempt and its retry) must not interleave delete and COPY.
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"pgtrain.{kind}:{run_id}",))
