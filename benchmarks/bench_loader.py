"""Loader benchmark: pgtrain's COPY BINARY loader against the original fetchall() path and the raw COPY.

    .venv/bin/python benchmarks/bench_loader.py [ROWS [DIM]]   # default 1,000,000 x 100
    PGTRAIN_BENCH_ROWS / PGTRAIN_BENCH_DIM also set the size; embedded PostgreSQL unless
    PGTRAIN_BENCH_DATABASE_URL. PGTRAIN_BENCH_FETCHALL_ROWS times the (slow, ~3.5 GB at 1M x 100) fetchall
    baseline on only the first N rows and compares rows per second.

The same synthetic rows are stored twice, as real[] and as packed float32 bytea (bigint keys). Per format, in
a fresh process: the peak RSS growth of a first load (VmHWM), then the raw COPY (pgtrain's own COPY statement,
its bytes only drained) and load_shard alternate three times, the best of each kept.
The baseline is the original sketch: SELECT features, label ... LIMIT/OFFSET, fetchall(), torch.tensor().
For the breakdown: the drain of a plain one-COPY-row-per-sample COPY of the same rows, and the time to first
touch fresh arrays of the tensors' size (page faults and zeroing, which the raw drain does not pay).

loader.scalar_columns: ROWS / 2 rows (500,000 at full size) x DIM ``real`` columns (feature_columns), loaded
with load_shard against a plain ``COPY (SELECT the same columns ORDER BY key) TO STDOUT (FORMAT BINARY)``
drained in the same process (best of three each, alternating), and against fetchall() of the same columns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from common import bench_database, machine, report, stopwatch

FORMATS = ("float4_array", "bytea")
REPEATS = 3
MB = 1 << 20


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def measure_loader(url: str, run_id: str) -> dict[str, float]:
    """In this (fresh) process: best raw-COPY drain and best load_shard, and one load's peak RSS growth."""
    import numpy as np
    import psycopg
    from psycopg import sql

    from pgtrain import loader, manifest, runs

    with psycopg.connect(url, autocommit=True) as conn:
        run = runs.get_run(conn, run_id)
        source = manifest.source_for(conn, run)
        shard = runs.get_manifest(conn, run_id)[0]
        cfg = run.config

        def drain() -> int:
            with loader.shard_copy(conn, source, shard, cfg.validation_fraction, cfg.seed) as copy:
                return sum(map(len, copy))

        def load() -> loader.ShardData:
            return loader.load_shard(conn, source, shard, run.input_dim, cfg.validation_fraction, cfg.seed,
                                     pin_memory=False)

        def drain_plain() -> None:  # the straightforward COPY: one COPY row per sample (for comparison)
            query = sql.SQL("COPY (SELECT {f}, {l} FROM {t} ORDER BY {k}) TO STDOUT (FORMAT BINARY)").format(
                f=source.features, l=source.label, t=source.relation, k=source.key)
            with conn.cursor() as cur, cur.copy(query) as copy:
                sum(map(len, copy))

        drain()  # warm the caches once
        before = _rss("VmRSS")  # first, while no large array was ever allocated in this process
        _reset_peak()
        data = load()
        peak = _rss("VmHWM") - before
        tensors = data.features.nbytes + data.labels.nbytes + data.is_validation.nbytes
        del data
        with stopwatch() as elapsed:
            drain_plain()
        plain = elapsed()
        with stopwatch() as elapsed:  # what first touching the tensors' memory costs here, for the breakdown
            fresh = [np.empty((shard.row_count, run.input_dim), np.float32), np.empty(shard.row_count, np.int64),
                     np.empty(shard.row_count, bool)]
            for array in fresh:
                array.fill(0)
        touch = elapsed()
        del fresh
        drains, loads = [], []
        for _ in range(REPEATS):
            with stopwatch() as elapsed:
                copy_bytes = drain()
            drains.append(elapsed())
            with stopwatch() as elapsed:
                data = load()
            loads.append(elapsed())
            assert len(data.labels) == shard.row_count
            del data
    return {"drain_s": min(drains), "load_s": min(loads), "copy_mb": copy_bytes / MB, "peak_rss_mb": peak / MB,
            "tensor_mb": tensors / MB, "rows": shard.row_count, "plain_copy_s": plain, "touch_s": touch}


def measure_fetchall(url: str, table: str, rows: int, packed: bool) -> dict[str, float]:
    """The original path: LIMIT/OFFSET query, fetchall(), Python lists, torch.tensor()."""
    import numpy as np
    import psycopg
    import torch
    from psycopg import sql

    with psycopg.connect(url) as conn:
        before = _rss("VmRSS")
        _reset_peak()
        with stopwatch() as elapsed:
            records = conn.execute(sql.SQL("SELECT features, label FROM {} LIMIT %s OFFSET %s").format(
                sql.Identifier(table)), (rows, 0)).fetchall()
            if packed:
                features = torch.tensor(np.stack([np.frombuffer(f, "<f4") for f, _ in records]))
            else:
                features = torch.tensor([f for f, _ in records])
            labels = torch.tensor([label for _, label in records])
        assert features.shape[0] == labels.shape[0] == rows
    return {"seconds": elapsed(), "rows": rows, "peak_rss_mb": (_rss("VmHWM") - before) / MB}


def measure_scalar_columns(url: str, run_id: str) -> dict[str, float]:
    """Scalar feature columns: best load_shard against the best drain of a plain COPY of the same columns."""
    import psycopg
    from psycopg import sql

    from pgtrain import loader, manifest, runs

    with psycopg.connect(url, autocommit=True) as conn:
        run = runs.get_run(conn, run_id)
        source = manifest.source_for(conn, run)
        shard = runs.get_manifest(conn, run_id)[0]
        cfg = run.config
        plain = sql.SQL("COPY (SELECT {c}, {l} FROM {t} ORDER BY {k}) TO STDOUT (FORMAT BINARY)").format(
            c=sql.SQL(", ").join(map(sql.Identifier, source.column_names)), l=source.label, t=source.relation,
            k=source.key)

        def drain_plain() -> int:
            with conn.cursor() as cur, cur.copy(plain) as copy:
                return sum(map(len, copy))

        drain_plain()  # warm the caches once
        drains, loads = [], []
        for _ in range(REPEATS):
            with stopwatch() as elapsed:
                copy_bytes = drain_plain()
            drains.append(elapsed())
            with stopwatch() as elapsed:
                data = loader.load_shard(conn, source, shard, run.input_dim, cfg.validation_fraction, cfg.seed,
                                         pin_memory=False)
            loads.append(elapsed())
            assert data.features.shape == (shard.row_count, len(source.column_names))
            del data
    return {"load_s": min(loads), "plain_copy_s": min(drains), "plain_copy_mb": copy_bytes / MB,
            "rows": shard.row_count}


def measure_fetchall_columns(url: str, table: list[str], columns: list[str], rows: int) -> dict[str, float]:
    """The original path on scalar columns: SELECT the columns LIMIT/OFFSET, fetchall(), torch.tensor()."""
    import psycopg
    import torch
    from psycopg import sql

    with psycopg.connect(url) as conn, stopwatch() as elapsed:
        records = conn.execute(sql.SQL("SELECT {}, label FROM {} LIMIT %s OFFSET %s").format(
            sql.SQL(", ").join(map(sql.Identifier, columns)), sql.Identifier(*table)), (rows, 0)).fetchall()
        features = torch.tensor([r[:-1] for r in records])
        labels = torch.tensor([r[-1] for r in records])
        assert features.shape == (rows, len(columns)) and labels.shape[0] == rows
    return {"seconds": elapsed(), "rows": rows}


def prepare_scalar_columns(url: str, rows: int, dim: int) -> tuple[str, list[str], list[str]]:
    """A table of ``dim`` real columns planned as a one-rank run; returns (run id, table, column names)."""
    import psycopg

    from pgtrain import examples, manifest, runs
    from pgtrain.config import TrainingConfig

    features, labels = examples.synthetic(rows, dim, classes=10, seed=0)
    table, names = ["public", "bench_scalar_columns"], [f"x{i}" for i in range(dim)]
    with psycopg.connect(url, autocommit=True) as conn:
        with stopwatch() as elapsed:
            examples.load_scalar_table(conn, tuple(table), names, features, "label", labels, "integer",
                                       feature_type="real")
        print(f"  wrote {rows} rows x {dim} real columns in {elapsed():.1f} s", flush=True)
        conn.execute("VACUUM ANALYZE public.bench_scalar_columns")
        config = TrainingConfig(world_size=1, source_table=".".join(table), features_column=None,
                                feature_columns=tuple(names), num_classes=10)
        run = runs.plan_run(conn, "bench_loader", "scalar_columns", config)
        manifest.plan_shards(conn, run)
    return run.run_id, table, names


def in_subprocess(function: str, *args: object) -> dict[str, float]:
    proc = subprocess.run([sys.executable, __file__, "--measure", function, json.dumps(args)],
                          stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(proc.stdout.splitlines()[-1])


def prepare(url: str, rows: int, dim: int) -> dict[str, str]:
    """The same synthetic rows as real[] and as bytea tables, each planned as a one-rank run."""
    import psycopg
    from psycopg import sql

    from pgtrain import examples, manifest, runs
    from pgtrain.config import TrainingConfig

    features, labels = examples.synthetic(rows, dim, classes=10, seed=0)
    keys = examples.synthetic_keys(rows)
    run_ids = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for fmt in FORMATS:
            table = ("public", f"bench_{fmt}")
            examples.create_samples_table(conn, table, feature_format=fmt)
            with stopwatch() as elapsed:
                examples.insert_samples(conn, features, labels, table, keys=keys)
            print(f"  wrote {rows} x {dim} rows as {fmt} in {elapsed():.1f} s", flush=True)
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(*table)))
            config = TrainingConfig(world_size=1, source_table=".".join(table), num_classes=10)
            run = runs.plan_run(conn, "bench_loader", fmt, config)
            manifest.plan_shards(conn, run)
            run_ids[fmt] = run.run_id
    return run_ids


def main() -> None:
    args = [int(a) for a in sys.argv[1:3]]
    rows = args[0] if args else int(os.environ.get("PGTRAIN_BENCH_ROWS", 1_000_000))
    dim = args[1] if len(args) > 1 else int(os.environ.get("PGTRAIN_BENCH_DIM", 100))
    fetchall_rows = min(rows, int(os.environ.get("PGTRAIN_BENCH_FETCHALL_ROWS", rows)))
    with bench_database() as (_, url):
        print(f"loader benchmark: {rows} rows x {dim} features, {machine()}", flush=True)
        run_ids = prepare(url, rows, dim)
        baseline = in_subprocess("measure_fetchall", url, "bench_float4_array", fetchall_rows, False)
        print(f"  original fetchall() path (real[]): {baseline}", flush=True)
        figures: dict[str, float | int | str] = {
            "loader.rows": rows, "loader.dim": dim, "loader.fetchall.seconds": round(baseline["seconds"], 3),
            "loader.fetchall.rows": fetchall_rows,
            "loader.fetchall.peak_rss_mb": round(baseline["peak_rss_mb"], 1)}
        baseline_rate = baseline["rows"] / baseline["seconds"]
        for fmt in FORMATS:
            m = in_subprocess("measure_loader", url, run_ids[fmt])
            print(f"  {fmt}: {m}", flush=True)
            rate = m["rows"] / m["load_s"]
            figures |= {
                f"loader.{fmt}.rows_per_s": round(rate),
                f"loader.{fmt}.load_seconds": round(m["load_s"], 3),
                f"loader.{fmt}.raw_copy_seconds": round(m["drain_s"], 3),
                f"loader.{fmt}.per_sample_copy_drain_seconds": round(m["plain_copy_s"], 3),
                f"loader.{fmt}.first_touch_of_tensor_memory_seconds": round(m["touch_s"], 3),
                f"loader.{fmt}.copy_mb": round(m["copy_mb"], 1),
                f"loader.{fmt}.speedup_vs_fetchall": round(rate / baseline_rate, 1),
                f"loader.{fmt}.overhead_vs_raw_copy": round(m["load_s"] / m["drain_s"], 3),
                f"loader.{fmt}.peak_rss_mb": round(m["peak_rss_mb"], 1),
                f"loader.{fmt}.tensor_mb": round(m["tensor_mb"], 1),
                f"loader.{fmt}.peak_rss_vs_tensors": round(m["peak_rss_mb"] / m["tensor_mb"], 3),
            }
        packed = in_subprocess("measure_fetchall", url, "bench_bytea", fetchall_rows, True)
        figures["loader.bytea.speedup_vs_fetchall_of_bytea"] = round(
            figures["loader.bytea.rows_per_s"] / (packed["rows"] / packed["seconds"]), 1)
        scalar_rows = max(1, rows // 2)
        run_id, table, names = prepare_scalar_columns(url, scalar_rows, dim)
        m = in_subprocess("measure_scalar_columns", url, run_id)
        print(f"  scalar columns: {m}", flush=True)
        columns_baseline = in_subprocess("measure_fetchall_columns", url, table, names,
                                         min(scalar_rows, fetchall_rows))
        print(f"  fetchall() of the scalar columns: {columns_baseline}", flush=True)
        figures |= {
            "loader.scalar_columns.rows": scalar_rows, "loader.scalar_columns.columns": dim,
            "loader.scalar_columns.seconds": round(m["load_s"], 3),
            "loader.scalar_columns.rows_per_s": round(m["rows"] / m["load_s"]),
            "loader.scalar_columns.raw_copy_seconds": round(m["plain_copy_s"], 3),
            "loader.scalar_columns.raw_copy_mb": round(m["plain_copy_mb"], 1),
            "loader.scalar_columns.overhead_vs_raw_copy": round(m["load_s"] / m["plain_copy_s"], 3),
            "loader.scalar_columns.fetchall_seconds": round(columns_baseline["seconds"], 3),
            "loader.scalar_columns.speedup_vs_fetchall": round(
                (m["rows"] / m["load_s"]) / (columns_baseline["rows"] / columns_baseline["seconds"]), 1),
        }
    report(figures)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        result = globals()[sys.argv[2]](*json.loads(sys.argv[3]))
        print(json.dumps(result))
    else:
        main()
