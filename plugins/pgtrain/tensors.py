"""Tensors as rows: (name, shape, dtype, little-endian bytes). numpy only, so it works without torch."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import psycopg

ALLOWED_DTYPES = {"float32", "float64", "int64", "int32"}


def to_rows(arrays: Mapping[str, np.ndarray]) -> list[tuple[str, list[int], str, bytes]]:
    rows = []
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        dtype = array.dtype.name
        if dtype not in ALLOWED_DTYPES:
            raise ValueError(f"tensor {name}: dtype {dtype} is not stored; use one of {sorted(ALLOWED_DTYPES)}")
        rows.append((name, list(array.shape), dtype, array.astype(array.dtype.newbyteorder("<")).tobytes()))
    return rows


def from_rows(rows: Iterable[tuple[str, list[int], str, bytes]]) -> dict[str, np.ndarray]:
    return {
        name: np.frombuffer(bytes(data), dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)
        for name, shape, dtype, data in rows
    }


def delete_staged(conn: psycopg.Connection, run_id: str) -> None:
    conn.execute("DELETE FROM pgtrain.staged_parameters WHERE run_id = %s", (run_id,))


def write_staged(conn: psycopg.Connection, run_id: str, arrays: Mapping[str, np.ndarray]) -> None:
    """Stage the run's final parameters, replacing any from an earlier attempt, atomically."""
    with conn.transaction():
        delete_staged(conn, run_id)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO pgtrain.staged_parameters (run_id, name, shape, dtype, data) VALUES (%s, %s, %s, %s, %s)",
                [(run_id, *row) for row in to_rows(arrays)],
            )


def read_staged(conn: psycopg.Connection, run_id: str) -> dict[str, np.ndarray]:
    return from_rows(
        conn.execute(
            "SELECT name, shape, dtype, data FROM pgtrain.staged_parameters WHERE run_id = %s ORDER BY name",
            (run_id,),
        ).fetchall()
    )

