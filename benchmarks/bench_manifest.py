"""Manifest benchmark: compute_shards against its floor, and how many rows the ranks read.

    .venv/bin/python benchmarks/bench_manifest.py [ROWS [WORLD_SIZE [DIM]]]   # default 2,000,000, 8, 100
    PGTRAIN_BENCH_MANIFEST_ROWS / _WORLD_SIZE / _DIM also set them; embedded PostgreSQL unless
    PGTRAIN_BENCH_DATABASE_URL.

The table (bigint key with gaps, real[] features, integer label) is written with binary COPY from pgtrain's
synthetic data, then vacuumed as autovacuum would. The floor, measured in the same rounds: one heap scan that
reads every feature value (``SELECT sum(cardinality(features))``) plus one ``percentile_disc`` pass over the key
(the world_size shard edges). Rounds of (floor scan, floor key pass, plan_shards) interleaved, ROUNDS times;
``plan_vs_floor`` is the median over rounds of plan_shards / (scan + key pass) of that round. check/cut seconds
are its passes timed alone (as plan_shards runs them: with integer keys the check scan also collects the
validation rows' keys, and the cut counts them per shard instead of a second pass); ``check_values_seconds`` is
the check with the per-value NaN/infinity test that bad_rows='exclude' runs in SQL (bad_rows='fail' leaves it to
the loader). scan_amplification counts the table rows fetched (pg_stat_user_tables) while every rank loads its
shard with load_shard, divided by the rows in the table; the original sketch's LIMIT/OFFSET per rank is measured
the same way beside it.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable

import psycopg
from common import bench_database, machine, report, stopwatch
from psycopg import sql

from pgtrain.config.params import TrainingConfig
from pgtrain.data import loader, manifest, row_check
from pgtrain.data.source.resolve import resolve_source
from pgtrain.data.source.rows import bad_row
from pgtrain.data.source.snapshot import read_xid_clock, snapshot_transaction
from pgtrain.runs import record

TABLE = "bench_manifest"
T = sql.Identifier(TABLE)
ROUNDS = 3


def generate(conn: psycopg.Connection, rows: int, dim: int) -> None:
    """Keys 3i or 3i+1 (gaps), pgtrain's synthetic features and labels 0..9, written with binary COPY in chunks;
    the primary key is built afterwards."""
    import numpy as np

    from dev import examples

    conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} (id bigint NOT NULL, features real[] NOT NULL, "
                         "label integer NOT NULL)").format(T))
    chunk = 250_000
    for first in range(0, rows, chunk):
        count = min(chunk, rows - first)
        features, labels = examples.synthetic(count, dim, classes=10, seed=first)
        i = np.arange(first + 1, first + count + 1, dtype=np.int64)
        examples.insert_samples(conn, features, labels, ("public", TABLE), keys=3 * i + i % 2)
    conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(T))
    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(T))


def rows_fetched(conn: psycopg.Connection) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute("SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables "
                        "WHERE relid = to_regclass(%s)", (TABLE,)).fetchone()[0]


def counted(stats: psycopg.Connection, worker: psycopg.Connection, work: Callable[[], None]) -> int:
    """Table rows fetched while ``work`` runs on ``worker`` (whose statistics are flushed before each reading)."""
    worker.execute("SELECT pg_stat_force_next_flush()")
    before = rows_fetched(stats)
    work()
    worker.execute("SELECT pg_stat_force_next_flush()")
    return rows_fetched(stats) - before


def main() -> None:
    args = [int(a) for a in sys.argv[1:4]]
    env = os.environ.get
    rows = args[0] if args else int(env("PGTRAIN_BENCH_MANIFEST_ROWS", 2_000_000))
    world_size = args[1] if len(args) > 1 else int(env("PGTRAIN_BENCH_MANIFEST_WORLD_SIZE", 8))
    dim = args[2] if len(args) > 2 else int(env("PGTRAIN_BENCH_MANIFEST_DIM", 100))
    with bench_database() as (_, url):
        figures = run_benchmark(url, rows, world_size, dim)
    report(figures)


def run_benchmark(url: str, rows: int, world_size: int, dim: int) -> dict[str, float | int | str]:
    print(f"manifest benchmark: {rows} rows x {dim} features, world_size {world_size}, {machine()}", flush=True)
    with psycopg.connect(url, autocommit=True) as conn, psycopg.connect(url, autocommit=True) as stats:
        with stopwatch() as generating:
            generate(conn, rows, dim)
        print(f"  generated in {generating():.1f} s", flush=True)
        config = TrainingConfig(world_size=world_size, source_table=TABLE, num_classes=10)
        fractions = [(rank + 1) / world_size for rank in range(world_size)]
        scans, key_passes, plans = [], [], []
        for round_ in range(ROUNDS):
            with stopwatch() as scanning:
                conn.execute(sql.SQL("SELECT sum(cardinality(features)) FROM {}").format(T)).fetchone()
            with stopwatch() as key_pass:
                conn.execute(sql.SQL("SELECT percentile_disc(%s::float8[]) WITHIN GROUP (ORDER BY id) FROM {}"
                                     ).format(T), (fractions,)).fetchone()
            run = record.plan_run(conn, "bench_manifest", f"plan-{round_}", config)
            with stopwatch() as planning:
                plan = manifest.plan_shards(conn, run)
            scans.append(scanning())
            key_passes.append(key_pass())
            plans.append(planning())
            print(f"  round {round_ + 1}: floor scan {scans[-1]:.3f} s + key pass {key_passes[-1]:.3f} s, "
                  f"plan_shards {plans[-1]:.3f} s ({plans[-1] / (scans[-1] + key_passes[-1]):.2f}x)", flush=True)
        ratios = [p / (s + k) for p, s, k in zip(plans, scans, key_passes, strict=True)]
        print(f"  plan_shards: {[s.row_count for s in plan.shards]}", flush=True)
        with snapshot_transaction(conn):  # the key pass with the work_mem plan_shards gives its own key sort
            manifest.fit_key_sort(conn, rows)
            with stopwatch() as key_pass_in_memory:
                conn.execute(sql.SQL("SELECT percentile_disc(%s::float8[]) WITHIN GROUP (ORDER BY id) FROM {}"
                                     ).format(T), (fractions,)).fetchone()

        source = resolve_source(conn, TABLE, "id", "features", "label")
        batch = manifest.batch_size(source, dim)
        with snapshot_transaction(conn):
            clock = read_xid_clock(conn)
            split = manifest.folded_split(conn, source, 0.1, 0)
            with stopwatch() as checking:  # as plan_shards runs it: with the validation keys for cut_shards
                check = row_check.check_rows(conn, source, dim, 10, clock, values=False, split=split)
            with stopwatch() as checking_values:  # what bad_rows='exclude' pays: the NaN/infinity test in SQL
                row_check.check_rows(conn, source, dim, 10, clock)
            with stopwatch() as cutting:
                manifest.cut_shards(conn, source, rows, world_size, 0.1, 0, batch, None,
                                    validation_keys=check.validation_keys)
            with stopwatch() as cutting_excluding:  # bad_rows='exclude' with bad rows found: reads the heap too
                manifest.cut_shards(conn, source, rows, world_size, 0.1, 0, batch, bad_row(source, dim, 10))

        run = record.get_run(conn, run.run_id)
        source = manifest.source_for(conn, run)

        def load_all() -> None:
            for shard in plan.shards:
                data = loader.load_shard(conn, source, shard, dim, config.validation_fraction, config.seed)
                assert len(data.labels) == shard.row_count

        with stopwatch() as loading:
            pgtrain_read = counted(stats, conn, load_all)
        per_rank = -(-rows // world_size)

        offset_query = sql.SQL("SELECT count(features) FROM (SELECT features, label FROM {} LIMIT %s OFFSET %s) s")

        def offsets() -> None:
            for rank in range(world_size):
                conn.execute(offset_query.format(T), (per_rank, rank * per_rank))

        offset_read = counted(stats, conn, offsets)
    return {
        "manifest.rows": rows, "manifest.world_size": world_size, "manifest.dim": dim,
        "manifest.generate_seconds": round(generating(), 1),
        "manifest.plan_seconds": round(statistics.median(plans), 3),
        "manifest.plan_seconds_min": round(min(plans), 3),
        "manifest.floor_scan_seconds": round(statistics.median(scans), 3),
        "manifest.floor_key_pass_seconds": round(statistics.median(key_passes), 3),
        "manifest.floor_key_pass_in_memory_seconds": round(key_pass_in_memory(), 3),
        "manifest.plan_vs_floor": round(statistics.median(ratios), 3),
        "manifest.plan_vs_floor_min": round(min(ratios), 3),
        "manifest.check_seconds": round(checking(), 3),
        "manifest.check_values_seconds": round(checking_values(), 3),
        "manifest.cut_seconds": round(cutting(), 3),
        "manifest.cut_seconds_excluding_bad_rows": round(cutting_excluding(), 3),
        "manifest.load_all_ranks_seconds": round(loading(), 2),
        "manifest.scan_amplification": round(pgtrain_read / rows, 4),
        "manifest.offset_scan_amplification": round(offset_read / rows, 4),
    }


if __name__ == "__main__":
    main()
