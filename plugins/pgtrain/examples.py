"""Example data: scikit-learn's bundled handwritten digits, and synthetic learnable samples for scale tests.

    python -m pgtrain.examples digits [--if-empty]
    python -m pgtrain.examples synthetic --rows N --dim D [--classes C] [--table T]

The database URL comes from $PGTRAIN_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import psycopg
from psycopg import sql

from pgtrain.db import connect

SAMPLES_TABLE = ("public", "samples")


def digits() -> tuple[np.ndarray, np.ndarray]:
    """1,797 x 64 pixel intensities (0..16) and labels 0..9; shipped inside scikit-learn, no download."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return data.data.astype(np.float32), data.target.astype(np.int64)


def synthetic(rows: int, dim: int, classes: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters around random class centres: a problem an MLP learns to well above chance."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 1.0, (classes, dim)).astype(np.float32)
    labels = rng.integers(0, classes, rows)
    features = centres[labels] + rng.normal(0.0, 1.0, (rows, dim)).astype(np.float32)
    return features.astype(np.float32), labels.astype(np.int64)


def insert_samples(conn: psycopg.Connection, features: np.ndarray, labels: np.ndarray,
                   table: tuple[str, str] = SAMPLES_TABLE) -> int:
    """Append rows (features as real[]) with one COPY; returns the number of rows written."""
    query = sql.SQL("COPY {} (features, label) FROM STDIN").format(sql.Identifier(*table))
    with conn.transaction(), conn.cursor() as cur, cur.copy(query) as copy:
        for row, label in zip(features.tolist(), labels.tolist(), strict=True):
            copy.write_row((row, label))
    return len(labels)


def count_rows(conn: psycopg.Connection, table: tuple[str, str] = SAMPLES_TABLE) -> int:
    return conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(*table))).fetchone()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pgtrain.examples", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    d = sub.add_parser("digits", help="load the 1,797 handwritten digits into public.samples")
    d.add_argument("--if-empty", action="store_true", help="do nothing when public.samples has rows")
    s = sub.add_parser("synthetic", help="append synthetic rows to public.samples")
    s.add_argument("--rows", type=int, required=True)
    s.add_argument("--dim", type=int, default=100)
    s.add_argument("--classes", type=int, default=10)
    s.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with connect() as conn:
        from pgtrain.migrations import apply_migrations

        apply_migrations(conn)
        existing = count_rows(conn)
        if args.kind == "digits" and args.if_empty and existing:
            print(f"public.samples already holds {existing} rows; not loading the digits")
            return 0
        features, labels = digits() if args.kind == "digits" else synthetic(args.rows, args.dim, args.classes,
                                                                          args.seed)
        written = insert_samples(conn, features, labels)
        print(f"loaded {written} {args.kind} rows into public.samples ({existing + written} rows now)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
