"""Manifest benchmark: compute_shards against one scan of the table, and how many rows the ranks read.

    .venv/bin/python benchmarks/bench_manifest.py [ROWS [WORLD_SIZE [DIM]]]   # default 2,000,000, 8, 100
    PGTRAIN_BENCH_MANIFEST_ROWS / _WORLD_SIZE / _DIM also set them, PGTRAIN_BENCH_MANIFEST_ROUNDS the rounds
    (default 5); embedded PostgreSQL unless PGTRAIN_BENCH_DATABASE_URL.

The table (bigint key with gaps, real[] features, integer label) is written with binary COPY from pgtrain's
synthetic data, then vacuumed as autovacuum would. Contenders, each timed in a fresh process (imports and the
connection before the clock), interleaved, their order rotated every round:

- ``one_scan``: ``SELECT count(*), sum(cardinality(features))``, one (parallel) heap scan that reads every row's
  feature array: the floor every ratio divides by, same round;
- ``plan``: ``plan_shards`` as compute_shards runs it (the key pass, ``key_order.grid_walk``, on a second
  connection while the check scans);
- ``plan_one_connection``: the same with the key pass after the check on planning's own connection, as before
  (and as when a second connection is refused).

Both plans' shards and batch keys must be equal (a checksum of what each wrote), and each ratio is taken per
round: ``plan_vs_one_scan`` is the median over rounds of plan / one_scan of that round. Then, in this process,
each pass timed alone as plan_shards runs it: the check scan (with integer keys it also collects the validation
rows' keys, which cut_shards counts per shard instead of a second pass), ``check_values_seconds`` the check with
the per-value NaN/infinity test that bad_rows='exclude' runs in SQL (bad_rows='fail' leaves it to the loader),
the key pass, and the cut with bad rows excluded. scan_amplification counts the table rows fetched
(pg_stat_user_tables) while every rank loads its shard with load_shard, divided by the rows in the table; the
original sketch's LIMIT/OFFSET per rank is measured the same way beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
from common import bench_database, machine, report, stopwatch
from psycopg import sql

from pgtrain.config.params import TrainingConfig
from pgtrain.data import key_order, loader, manifest, row_check
from pgtrain.data.source.resolve import resolve_source
from pgtrain.data.source.rows import bad_row
from pgtrain.data.source.snapshot import read_xid_clock, snapshot_transaction
from pgtrain.planning.plan import admit_run, author_admitting, plan_shards_checked
from pgtrain.runs import record

TABLE = "bench_manifest"
T = sql.Identifier(TABLE)
CONTENDERS = ("one_scan", "plan", "plan_one_connection")


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


def config_for(world_size: int) -> TrainingConfig:
    # launcher=kubernetes: planning is the same, and a local run would refuse more ranks than this machine's CPUs.
    return TrainingConfig(world_size=world_size, source_table=TABLE, num_classes=10, launcher="kubernetes")


def written_plan(conn: psycopg.Connection, run_id: str) -> str:
    """A checksum of the shards and batch keys a plan wrote."""
    shards = conn.execute("SELECT rank, key_lo, key_hi, row_count, train_count, val_count FROM pgtrain.shard_manifest "
                          "WHERE run_id = %s ORDER BY rank", (run_id,)).fetchall()
    batches = conn.execute("SELECT rank, batch_lo, batch_hi FROM pgtrain.shard_batches WHERE run_id = %s ORDER BY rank",
                           (run_id,)).fetchall()
    return hashlib.sha256(json.dumps([shards, batches], default=str).encode()).hexdigest()[:16]


def measure(contender: str, url: str, world_size: int) -> dict[str, object]:
    """In this fresh process: one timed run of ``contender``, its seconds and a checksum of its result."""
    with psycopg.connect(url, autocommit=True) as conn:
        if contender == "one_scan":
            start = time.perf_counter()
            found = conn.execute(sql.SQL("SELECT count(*), sum(cardinality(features)) FROM {}").format(T)).fetchone()
            return {"seconds": time.perf_counter() - start, "checksum": list(found)}
        if contender == "plan_one_connection":
            manifest.key_pass_beside = lambda *args: None  # as when a second connection is refused
        config = config_for(world_size)
        author = author_admitting(conn, config)
        run = admit_run(conn, config, author, "bench_manifest", f"{contender}-{uuid.uuid4().hex[:8]}")
        start = time.perf_counter()
        plan_shards_checked(conn, run.run_id, author)
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "checksum": written_plan(conn, run.run_id), "run_id": run.run_id}


def _fractions(rows: int, wanted: list[int]) -> str:
    """The positions as boundary_query takes them (as key_order.keys_at sent them before the index walk)."""
    return "{" + ",".join(repr((p - 0.5) / rows) for p in wanted) + "}"


def parts_vs_one_scan(conn: psycopg.Connection, source: object, dim: int, rows: int, world_size: int, batch: int,
                      clock: object, repeats: int = 5) -> dict[str, float]:
    """Each pass of a plan alone, as a ratio to one scan timed beside it (interleaved, medians of ``repeats``), in
    the open snapshot: the check with the bad-row tests only, the check as plan_shards runs it (also hashing every
    key for the validation split and collecting the validation keys), the key pass as planned (``key_order.grid_walk``:
    one walk of the key index that counts the keys too), the key pass as before it (count the keys, then walk
    their index: ``key_order.keys_at``) and the sort (count the keys, sort them: ``key_order.boundary_query``).
    Planning needs at least the second and the third: their sum, less one scan, bounds what any overlap can save."""
    split = manifest.folded_split(conn, source, 0.1, 0, 0.1)
    work = {
        "one_scan": lambda: conn.execute(sql.SQL("SELECT count(*), sum(cardinality(features)) FROM {}").format(T)),
        "check_bad_row_tests": lambda: row_check.check_rows(conn, source, dim, 10, clock, values=False),
        "check_as_planned": lambda: row_check.check_rows(conn, source, dim, 10, clock, values=False, split=split),
        "key_pass": lambda: key_order.grid_walk(conn, source, world_size, batch),
        "key_pass_count_then_walk": lambda: (conn.execute(sql.SQL("SELECT count(*) FROM {}").format(T)),
                                             key_order.keys_at(conn, source, rows,
                                                               key_order.shard_grid(rows, world_size, batch)[2])),
        "key_pass_sort": lambda: (conn.execute(sql.SQL("SELECT count(*) FROM {}").format(T)), conn.execute(
            key_order.boundary_query(source), (_fractions(rows, key_order.shard_grid(rows, world_size, batch)[2]),))),
    }
    seconds: dict[str, list[float]] = {name: [] for name in work}
    for _ in range(repeats):
        for name, run in work.items():
            with stopwatch() as elapsed:
                run()
            seconds[name].append(elapsed())
    floor = statistics.median(seconds["one_scan"])
    figures = {f"manifest.parts.{name}_vs_one_scan": round(statistics.median(times) / floor, 3)
               for name, times in seconds.items() if name != "one_scan"}
    print(f"  each pass alone, over one scan ({floor:.3f} s): {figures}", flush=True)
    return figures


def postmaster_of(conn: psycopg.Connection) -> int | None:
    """The server's postmaster pid when it runs on this machine (the checkpointer's parent), else None."""
    (pid,) = conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'").fetchone()
    stat = Path(f"/proc/{pid}/stat")
    return int(stat.read_text().rsplit(")", 1)[1].split()[1]) if stat.exists() else None


def reaped_cpu_seconds(postmaster: int) -> float:
    """CPU seconds of the server processes that have ended (backends, parallel workers): what the postmaster
    counts for the children it reaped (cutime + cstime)."""
    fields = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def in_subprocess(contender: str, url: str, world_size: int, postmaster: int | None) -> dict[str, object]:
    """The contender's figures from a fresh process; with ``postmaster``, also the server CPU seconds its backends
    and their parallel workers used (counted once they have ended: less sensitive to other load than seconds)."""
    before = reaped_cpu_seconds(postmaster) if postmaster else 0.0
    command = [sys.executable, __file__, "--measure", contender, url, str(world_size)]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{contender}: {proc.stderr.strip()}")
    result = json.loads(proc.stdout.splitlines()[-1])
    if postmaster:
        time.sleep(0.2)  # the backends end as their connections close
        result["server_cpu"] = reaped_cpu_seconds(postmaster) - before
    return result


def main() -> None:
    args = [int(a) for a in sys.argv[1:4]]
    env = os.environ.get
    rows = args[0] if args else int(env("PGTRAIN_BENCH_MANIFEST_ROWS", 2_000_000))
    world_size = args[1] if len(args) > 1 else int(env("PGTRAIN_BENCH_MANIFEST_WORLD_SIZE", 8))
    dim = args[2] if len(args) > 2 else int(env("PGTRAIN_BENCH_MANIFEST_DIM", 100))
    rounds = int(env("PGTRAIN_BENCH_MANIFEST_ROUNDS", 5))
    with bench_database() as (_, url):
        figures = run_benchmark(url, rows, world_size, dim, rounds)
    report(figures)


def run_benchmark(url: str, rows: int, world_size: int, dim: int, rounds: int) -> dict[str, float | int | str]:
    print(f"manifest benchmark: {rows} rows x {dim} features, world_size {world_size}, {rounds} rounds, "
          f"{machine()}, load average {os.getloadavg()[0]:.1f}", flush=True)
    with psycopg.connect(url, autocommit=True) as conn, psycopg.connect(url, autocommit=True) as stats:
        with stopwatch() as generating:
            generate(conn, rows, dim)
        print(f"  generated in {generating():.1f} s", flush=True)
        measured: dict[str, list[dict]] = {name: [] for name in CONTENDERS}
        postmaster = postmaster_of(conn)
        loads = []  # the 1-minute load average after each round
        for round_ in range(rounds):
            shift = round_ % len(CONTENDERS)
            for name in CONTENDERS[shift:] + CONTENDERS[:shift]:
                measured[name].append(in_subprocess(name, url, world_size, postmaster))
            seconds = {name: measured[name][-1]["seconds"] for name in CONTENDERS}
            loads.append(os.getloadavg()[0])
            print(f"  round {round_ + 1}: " + ", ".join(f"{n} {v:.3f} s" for n, v in seconds.items())
                  + f" (plan {seconds['plan'] / seconds['one_scan']:.2f}x one scan), load average "
                  f"{loads[-1]:.1f}", flush=True)
        checksums = {name: {m["checksum"] if isinstance(m["checksum"], str) else tuple(m["checksum"])
                            for m in measured[name]} for name in CONTENDERS}
        if len(checksums["one_scan"]) != 1 or len(checksums["plan"] | checksums["plan_one_connection"]) != 1:
            raise RuntimeError(f"the contenders' results differ between rounds or plans: {checksums}")

        def ratios(name: str, over: str) -> list[float]:
            return [m["seconds"] / o["seconds"] for m, o in zip(measured[name], measured[over], strict=True)]

        def median_seconds(name: str, key: str = "seconds") -> float:
            return round(statistics.median(m[key] for m in measured[name]), 3)

        cpu = {}
        if postmaster:
            cpu = {f"manifest.{name}_server_cpu_seconds": median_seconds(name, "server_cpu") for name in CONTENDERS}
            for name in ("plan", "plan_one_connection"):
                cpu[f"manifest.{name}_vs_one_scan_server_cpu"] = round(statistics.median(
                    m["server_cpu"] / o["server_cpu"] for m, o in zip(measured[name], measured["one_scan"], strict=True)
                ), 3)
            print(f"  server CPU seconds (medians): {cpu}", flush=True)

        config = config_for(world_size)
        run = record.get_run(conn, measured["plan"][-1]["run_id"])
        shards = record.get_manifest(conn, run.run_id)
        print(f"  plan_shards: {[s.row_count for s in shards]}", flush=True)

        source = resolve_source(conn, TABLE, "id", "features", "label")
        batch = manifest.batch_size(source, dim)
        with snapshot_transaction(conn):
            clock = read_xid_clock(conn)
            split = manifest.folded_split(conn, source, 0.1, 0, 0.1)
            with stopwatch() as checking:  # as plan_shards runs it: with the validation keys for cut_shards
                check = row_check.check_rows(conn, source, dim, 10, clock, values=False, split=split)
            with stopwatch() as checking_values:  # what bad_rows='exclude' pays: the NaN/infinity test in SQL
                row_check.check_rows(conn, source, dim, 10, clock)
            with stopwatch() as key_pass:
                keys = key_order.grid_walk(conn, source, world_size, batch).keys
            parts = parts_vs_one_scan(conn, source, dim, rows, world_size, batch, clock)
            with stopwatch() as cutting:
                manifest.cut_shards(conn, source, rows, world_size, 0.1, 0, batch, None,
                                    held_keys=check.held_keys, keys=keys, test_fraction=0.1)
            with stopwatch() as cutting_excluding:  # bad_rows='exclude' with bad rows found: reads the heap too
                manifest.cut_shards(conn, source, rows, world_size, 0.1, 0, batch, bad_row(source, dim, 10),
                                    test_fraction=0.1)

        source = manifest.source_for(conn, run)

        def load_all() -> None:
            for shard in shards:
                data = loader.load_shard(conn, source, shard, dim, config.validation_fraction, config.seed,
                                         test_fraction=config.test_fraction)
                assert len(data.labels) == shard.row_count

        with stopwatch() as loading:
            pgtrain_read = counted(stats, conn, load_all)
        per_rank = -(-rows // world_size)

        offset_query = sql.SQL("SELECT count(features) FROM (SELECT features, label FROM {} LIMIT %s OFFSET %s) s")

        def offsets() -> None:
            for rank in range(world_size):
                conn.execute(offset_query.format(T), (per_rank, rank * per_rank))

        offset_read = counted(stats, conn, offsets)
    plan_ratios = ratios("plan", "one_scan")
    return {
        "manifest.rows": rows, "manifest.world_size": world_size, "manifest.dim": dim, "manifest.rounds": rounds,
        "manifest.load_average": f"{min(loads):.1f}-{max(loads):.1f}",
        "manifest.generate_seconds": round(generating(), 1),
        "manifest.plan_seconds": median_seconds("plan"),
        "manifest.plan_seconds_min": round(min(m["seconds"] for m in measured["plan"]), 3),
        "manifest.plan_one_connection_seconds": median_seconds("plan_one_connection"),
        "manifest.one_scan_seconds": median_seconds("one_scan"),
        "manifest.plan_vs_one_scan": round(statistics.median(plan_ratios), 3),
        "manifest.plan_vs_one_scan_min": round(min(plan_ratios), 3),
        "manifest.plan_one_connection_vs_one_scan": round(statistics.median(ratios("plan_one_connection",
                                                                                   "one_scan")), 3),
        "manifest.plan_vs_plan_one_connection": round(statistics.median(ratios("plan", "plan_one_connection")), 3),
        **cpu,
        **parts,
        "manifest.check_seconds": round(checking(), 3),
        "manifest.check_values_seconds": round(checking_values(), 3),
        "manifest.key_pass_seconds": round(key_pass(), 3),
        "manifest.cut_seconds": round(cutting(), 3),
        "manifest.cut_seconds_excluding_bad_rows": round(cutting_excluding(), 3),
        "manifest.load_all_ranks_seconds": round(loading(), 2),
        "manifest.scan_amplification": round(pgtrain_read / rows, 4),
        "manifest.offset_scan_amplification": round(offset_read / rows, 4),
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(measure(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        main()
