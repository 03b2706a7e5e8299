"""Lock and commit benchmark: commit latency and throughput under 1/4/16 contenders, lock hand-off delay.

    .venv/bin/python benchmarks/bench_locks.py          # embedded PostgreSQL unless PGTRAIN_BENCH_DATABASE_URL

Each contender is a process committing its own prepared runs (digits-sized MLP, 64 -> 50 -> 10) to one
model with ``commit_run``; latency includes waiting for the model's lock. Hand-off: a waiter blocked
in ``acquire_lock`` in another process, from the holder's release call to the waiter holding the lock.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import uuid

import numpy as np
import psycopg
from common import bench_database, report, stopwatch

from pgtrain.config.params import TrainingConfig
from pgtrain.core.errors import LockTimeout
from pgtrain.models.spec import ModelSpec
from pgtrain.runs.record import plan_run, record_epoch
from pgtrain.store.locks import Lease, LockManager
from pgtrain.store.model_store import commit_run
from pgtrain.store.tensors import write_staged

SPEC = ModelSpec(64, (50,), 10)
CTX = mp.get_context("fork")
COMMITS = {1: 40, 4: 15, 16: 6}  # per contender
HANDOFFS = 100
# The baseline waiter: try once, sleep, try again (the fixed sleep loop LISTEN/NOTIFY replaces).
POLL_INTERVAL = 0.05


def prepare_runs(url: str, model: str, count: int) -> list[str]:
    rng = np.random.default_rng(0)
    config = TrainingConfig(model_name=model, hidden_sizes=SPEC.hidden_sizes)
    run_ids = []
    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(count):
            run = plan_run(conn, "bench", f"{model}-{i}", config)
            conn.execute("UPDATE pgtrain.training_runs SET input_dim = %s, num_classes = %s WHERE run_id = %s",
                         (SPEC.input_dim, SPEC.num_classes, run.run_id))
            write_staged(conn, run.run_id, {n: rng.standard_normal(s).astype(np.float32)
                                            for n, s in SPEC.parameter_shapes().items()})
            record_epoch(conn, run.run_id, 1, {"train_loss": 0.5, "train_accuracy": 0.9, "val_loss": 0.5,
                                               "val_accuracy": 0.9, "seconds": 1.0})
            run_ids.append(run.run_id)
    return run_ids


def _committer(url: str, run_ids: list[str], barrier, out) -> None:
    latencies = []
    with psycopg.connect(url, autocommit=True) as conn:
        barrier.wait()
        for run_id in run_ids:
            started = time.perf_counter()
            result = commit_run(conn, run_id, owner={"task_id": "bench"}, lock_timeout=120)
            latencies.append(time.perf_counter() - started)
            assert result.created
    out.put(latencies)


def bench_commits(url: str, contenders: int) -> dict[str, float]:
    per = COMMITS[contenders]
    run_ids = prepare_runs(url, f"bench-{contenders}", contenders * per)
    barrier, out = CTX.Barrier(contenders + 1), CTX.Queue()
    procs = [CTX.Process(target=_committer, args=(url, run_ids[i::contenders], barrier, out))
             for i in range(contenders)]
    for p in procs:
        p.start()
    barrier.wait()
    with stopwatch() as elapsed:
        latencies = np.concatenate([out.get(timeout=300) for _ in procs])
    for p in procs:
        p.join()
    with psycopg.connect(url) as conn:
        versions = conn.execute("SELECT count(*), max(version) FROM pgtrain.model_versions WHERE model_name = %s",
                                (f"bench-{contenders}",)).fetchone()
    assert versions == (len(run_ids), len(run_ids)), versions
    ms = latencies * 1000
    return {f"locks.commit_{contenders}_p50_ms": round(float(np.percentile(ms, 50)), 2),
            f"locks.commit_{contenders}_p99_ms": round(float(np.percentile(ms, 99)), 2),
            f"locks.commit_{contenders}_per_s": round(len(latencies) / elapsed(), 1)}


def _poll(locks: LockManager, name: str) -> Lease:
    while True:
        try:
            return locks.acquire_lock(name, timeout=0)
        except LockTimeout:
            time.sleep(POLL_INTERVAL)


def _waiter(url: str, name: str, ready, acquired, done, polling: bool) -> None:
    with LockManager(url, ttl=30) as locks:
        for _ in range(HANDOFFS):
            ready.set()
            lease = _poll(locks, name) if polling else locks.acquire_lock(name, timeout=30)
            acquired.put(time.monotonic())  # CLOCK_MONOTONIC: one clock for every process on the machine
            locks.release(lease)
            done.wait()
            done.clear()


def handoff_delays_ms(url: str, polling: bool) -> np.ndarray:
    """Release-to-acquisition delays of a waiter in another process, woken by NOTIFY (or polling)."""
    name = f"handoff-{uuid.uuid4().hex[:8]}"
    ready, done, acquired = CTX.Event(), CTX.Event(), CTX.Queue()
    delays = []
    with LockManager(url, ttl=30) as locks:
        waiter = CTX.Process(target=_waiter, args=(url, name, ready, acquired, done, polling))
        lease = locks.acquire_lock(name)
        waiter.start()
        for _ in range(HANDOFFS):
            ready.wait()
            ready.clear()
            time.sleep(0.01)  # let the waiter get into its wait
            released = time.monotonic()
            locks.release(lease)
            delays.append(acquired.get(timeout=30) - released)
            lease = locks.acquire_lock(name, timeout=30)  # the waiter releases right away
            done.set()
        locks.release(lease)
        waiter.join()
    return np.array(delays) * 1000


def bench_handoff(url: str) -> dict[str, float]:
    notified, polled = handoff_delays_ms(url, polling=False), handoff_delays_ms(url, polling=True)
    notified_p50, polled_p50 = float(np.percentile(notified, 50)), float(np.percentile(polled, 50))
    return {"locks.handoff_p50_ms": round(notified_p50, 2),
            "locks.handoff_p99_ms": round(float(np.percentile(notified, 99)), 2),
            "locks.handoff_polling_p50_ms": round(polled_p50, 2),
            "locks.handoff_speedup_vs_polling": round(polled_p50 / notified_p50, 1)}


def bench_uncontended(url: str, n: int = 200) -> dict[str, float]:
    times = []
    with LockManager(url, ttl=30) as locks:
        for _ in range(n):
            started = time.perf_counter()
            locks.release(locks.acquire_lock("uncontended"))
            times.append(time.perf_counter() - started)
    return {"locks.acquire_release_p50_ms": round(float(np.percentile(np.array(times) * 1000, 50)), 3)}


def main() -> None:
    with bench_database() as (_, url):
        figures: dict[str, float | int | str] = {"locks.cpus": os.cpu_count() or 0}
        figures.update(bench_uncontended(url))
        figures.update(bench_handoff(url))
        for contenders in COMMITS:
            figures.update(bench_commits(url, contenders))
    report(figures)


if __name__ == "__main__":
    main()
