"""Tensors as chunked rows: a layout row per tensor (name, shape, dtype, nbytes), its little-endian bytes in
rows of at most ``CHUNK_BYTES``, streamed with binary COPY. numpy only, so it works without torch.

Writing hands COPY slices of each array's own memory (no ``tobytes()``, no concatenation); reading
allocates each destination array once and fills it chunk by chunk, so moving a state dict costs about
one copy of its tensors plus one chunk in flight. The same chunk format serves three stores: a run's
staged parameters, its latest checkpoint, and committed model versions (``pgtrain.model_store``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from pgtrain.copy_binary import HEADER, I16, I32, TRAILER, field, fields, rows
from pgtrain.errors import PgtrainError

# Bytes per chunk row: at most 64 MB, and a multiple of every item size so a chunk holds whole elements.
CHUNK_BYTES = 16 * 1024 * 1024
_PIECE = 1024 * 1024  # bytes handed to COPY at a time
ALLOWED_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
FLOAT_DTYPES = frozenset({"float16", "float32", "float64"})



@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    nonfinite: int | None = None  # counted while writing; None when unknown

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "nbytes": self.nbytes}


# -- staged parameters ----------------------------------------------------------------------------------
def delete_staged(conn: psycopg.Connection, run_id: str) -> None:
    conn.execute("DELETE FROM pgtrain.staged_parameters WHERE run_id = %s", (run_id,))


def write_staged(conn: psycopg.Connection, run_id: str, arrays: Mapping[str, np.ndarray]) -> None:
    """Stage the run's final parameters, replacing any from an earlier attempt, atomically."""
    arrays = _checked(arrays)
    with conn.transaction():
        _serialize(conn, "staged", run_id)
        delete_staged(conn, run_id)
        infos = copy_chunks(conn, sql.Identifier("pgtrain", "staged_chunks"), {"run_id": run_id}, arrays)
        with conn.cursor() as cur:
            cur.executemany(
                """INSERT INTO pgtrain.staged_parameters (run_id, name, shape, dtype, nbytes, nonfinite)
                   VALUES (%s, %s, %s, %s, %s, %s)""",
                [(run_id, i.name, list(i.shape), i.dtype, i.nbytes, i.nonfinite) for i in infos],
            )


def staged_layout(conn: psycopg.Connection, run_id: str, *, lock: bool = False) -> list[TensorInfo]:
    """The staged tensors' layout rows, in name order (``lock``: FOR SHARE, so no rewrite can interleave)."""
    query = sql.SQL("""SELECT name, shape, dtype, nbytes, nonfinite FROM pgtrain.staged_parameters
                       WHERE run_id = %s ORDER BY name {}""").format(sql.SQL("FOR SHARE" if lock else ""))
    return [TensorInfo(n, tuple(s), d, b, f) for n, s, d, b, f in conn.execute(query, (run_id,))]


def read_staged(conn: psycopg.Connection, run_id: str) -> dict[str, np.ndarray]:
    with conn.transaction():
        infos = staged_layout(conn, run_id, lock=True)
        return read_chunks(conn, sql.Identifier("pgtrain", "staged_chunks"), {"run_id": run_id}, infos)


def count_staged_nonfinite(conn: psycopg.Connection, run_id: str, infos: list[TensorInfo]) -> dict[str, int]:
    """name -> non-finite values of the float tensors in ``infos``, streamed a chunk at a time."""
    counts = dict.fromkeys((i.name for i in infos if i.dtype in FLOAT_DTYPES), 0)
    by_name = {i.name: i for i in infos}
    for name, _, payload in _chunk_stream(conn, sql.Identifier("pgtrain", "staged_chunks"), {"run_id": run_id},
                                          sorted(counts)):
        values = np.frombuffer(payload, dtype=np.dtype(by_name[name].dtype).newbyteorder("<"))
        counts[name] += int(values.size - np.count_nonzero(np.isfinite(values)))
    return counts


# -- checkpoints (the latest one per run) -----------------------------------------------------------------
def write_checkpoint(conn: psycopg.Connection, run_id: str, epoch: int, arrays: Mapping[str, np.ndarray],
                     meta: Mapping[str, Any]) -> None:
    """Replace the run's checkpoint with this one (model and optimizer tensors, ``meta`` as JSON), atomically."""
    arrays = _checked(arrays)
    with conn.transaction():
        _serialize(conn, "checkpoint", run_id)
        delete_checkpoints(conn, run_id)
        infos = copy_chunks(conn, sql.Identifier("pgtrain", "checkpoint_chunks"), {"run_id": run_id}, arrays)
        conn.execute(
            "INSERT INTO pgtrain.checkpoints (run_id, epoch, meta, tensors) VALUES (%s, %s, %s, %s)",
            (run_id, epoch, Jsonb(dict(meta)), Jsonb([i.as_json() for i in infos])),
        )


def read_checkpoint(conn: psycopg.Connection, run_id: str) -> tuple[int, dict[str, np.ndarray], dict] | None:
    """(epoch, name -> array, meta) of the run's latest checkpoint, or None when it has none."""
    with conn.transaction():
        row = conn.execute("SELECT epoch, meta, tensors FROM pgtrain.checkpoints WHERE run_id = %s FOR SHARE",
                           (run_id,)).fetchone()
        if row is None:
            return None
        epoch, meta, layout = row
        infos = [TensorInfo(t["name"], tuple(t["shape"]), t["dtype"], t["nbytes"]) for t in layout]
        arrays = read_chunks(conn, sql.Identifier("pgtrain", "checkpoint_chunks"), {"run_id": run_id}, infos)
    return epoch, arrays, meta


def delete_checkpoints(conn: psycopg.Connection, run_id: str) -> None:
    conn.execute("DELETE FROM pgtrain.checkpoints WHERE run_id = %s", (run_id,))


# -- the chunk format ---------------------------------------------------------------------------------------
def copy_chunks(conn: psycopg.Connection, table: sql.Identifier, keys: Mapping[str, str | int],
                arrays: Mapping[str, np.ndarray]) -> list[TensorInfo]:
    """COPY each array's bytes into ``table`` (keys..., name, seq, data); returns their layout, name order."""
    columns = [*keys, "name", "seq", "data"]
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        table, sql.SQL(", ").join(map(sql.Identifier, columns)))
    prefix = I16.pack(len(columns)) + b"".join(field(v) for v in keys.values())
    infos = []
    with conn.cursor() as cur, cur.copy(statement) as copy:
        copy.write(HEADER)
        for name in sorted(arrays):
            array = _little_endian(arrays[name])
            flat = array.reshape(-1)
            raw = memoryview(flat.view(np.uint8)) if flat.size else memoryview(b"")
            nonfinite = 0 if array.dtype.name in FLOAT_DTYPES else None
            row_prefix = prefix + field(name)
            per_chunk = CHUNK_BYTES // max(array.itemsize, 1)
            for seq, start in enumerate(range(0, flat.size, per_chunk)):
                stop = min(start + per_chunk, flat.size)
                if nonfinite is not None:
                    nonfinite += int((stop - start) - np.count_nonzero(np.isfinite(flat[start:stop])))
                payload = raw[start * array.itemsize:stop * array.itemsize]
                copy.write(row_prefix + field(seq) + I32.pack(len(payload)))
                for offset in range(0, len(payload), _PIECE):
                    copy.write(payload[offset:offset + _PIECE])
            infos.append(TensorInfo(name, tuple(array.shape), array.dtype.name, array.nbytes, nonfinite))
        copy.write(TRAILER)
    return infos


def read_chunks(conn: psycopg.Connection, table: sql.Identifier, keys: Mapping[str, str | int],
                infos: Iterable[TensorInfo]) -> dict[str, np.ndarray]:
    """Arrays of ``infos``, each allocated once and filled from its chunks in ``table`` (keys..., name, seq, data)."""
    infos = list(infos)
    out = {i.name: np.empty(i.shape, dtype=np.dtype(i.dtype).newbyteorder("<")) for i in infos}
    filled = dict.fromkeys(out, 0)
    targets = {name: array.reshape(-1).view(np.uint8) for name, array in out.items() if array.size}
    for name, _seq, payload in _chunk_stream(conn, table, keys, [i.name for i in infos if i.nbytes]):
        target, start = targets[name], filled[name]
        if start + len(payload) > target.size:
            raise PgtrainError(f"tensor {name!r} in {table.as_string(conn)} has more bytes than its layout says "
                               f"({target.size}); the store is damaged")
        target[start:start + len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        filled[name] = start + len(payload)
    short = [f"{i.name} ({filled[i.name]} of {i.nbytes} bytes)" for i in infos if filled[i.name] != i.nbytes]
    if short:
        raise PgtrainError(f"incomplete tensors in {table.as_string(conn)} for {dict(keys)}: {', '.join(short)}; "
                           "they were deleted or never fully written")
    return out


def _chunk_stream(conn: psycopg.Connection, table: sql.Identifier, keys: Mapping[str, str | int],
                  names: list[str]) -> Iterable[tuple[str, int, memoryview]]:
    """(name, seq, payload) of every chunk of ``names`` in name and seq order, a COPY row at a time."""
    if not names:
        return
    where = sql.SQL(" AND ").join(sql.SQL("{} = {}").format(sql.Identifier(k), sql.Literal(v))
                                  for k, v in keys.items())
    statement = sql.SQL(
        "COPY (SELECT name, seq, data FROM {} WHERE {} AND name = ANY({}) ORDER BY name, seq) "
        "TO STDOUT (FORMAT BINARY)").format(table, where, sql.Literal(names))
    expected: tuple[str, int] | None = None
    with conn.cursor() as cur, cur.copy(statement) as copy:
        for row in rows(copy):
            raw_name, raw_seq, payload = fields(row)
            name, seq = bytes(raw_name).decode(), I32.unpack(raw_seq)[0]
            follows = expected is not None and name == expected[0]
            if seq != (expected[1] + 1 if follows else 0):
                raise PgtrainError(f"tensor {name!r} in {table.as_string(conn)} misses chunk(s) before {seq}; "
                                   "the store is damaged")
            expected = (name, seq)
            yield name, seq, payload


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
