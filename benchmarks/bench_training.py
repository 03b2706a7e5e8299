"""Training throughput: the default local configuration against plain PyTorch at the same global batch, 1 vs 2 ranks.

    .venv/bin/python benchmarks/bench_training.py       # embedded PostgreSQL unless PGTRAIN_BENCH_DATABASE_URL
    PGTRAIN_BENCH_TRAIN_ROWS=20000 PGTRAIN_BENCH_TRAIN_ROUNDS=1 .venv/bin/python benchmarks/bench_training.py

200,000 synthetic rows x 100 features, 10 classes (dev.examples.synthetic), the default mlp (one hidden
layer of 50), validation_fraction 0.1. Every configuration trains the same rows; samples/s is the trainer's
own figure (training rows of all ranks / the epoch's training-loop seconds, the median over its epochs).
In each round, interleaved:

- ``default``: the DAG's defaults (1 rank with all CPUs' threads, auto batch size and learning rate) through
  ``launch_local.run_local``, i.e. ``horovodrun --gloo`` as the train task runs it;
- ``two_ranks``: the same with ``world_size=2`` (auto batch 1,800 rows a rank here, 1 thread a rank on 2 CPUs);
- ``one_rank_1t``: 1 rank with ``OMP_NUM_THREADS=1``; the faster of it and ``default`` is the 1-rank figure;
- ``batch32``: the defaults before the auto batch (2 ranks x 32 rows, learning rate 0.05), one epoch, round 1;
- ``plain_torch``: one process, no Horovod, the same model, optimizer and learning rate on the same training
  rows at the default's global batch: a shuffled index, ``x[idx]``, forward, backward, step, subnormal floats
  flushed as a rank does. Run with torch's default threads and with one thread; the faster one is the floor.
  Once more unflushed (``training.flush_denormal_speedup``);
- the two-process ceiling: two plain PyTorch processes at once, one thread each, each on half the rows at the
  2-rank batch: what two local ranks reach with no allreduce at all.

Figures: ``training.default_vs_plain_torch`` (default samples/s / plain PyTorch's best, best round),
``training.local_2_vs_1_ranks`` (2 ranks / the faster 1-rank setting, same round, best round),
``training.local_2_vs_1_ranks_1_thread_each``, ``training.two_process_ceiling_vs_1_rank``,
``training.two_ranks_vs_ceiling``, the samples/s of each, and the old default's
``training.batch32_vs_plain_torch`` (against plain PyTorch at its global batch of 64).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time

import psycopg
from common import bench_database, report

from dev import examples
from pgtrain.config.params import TrainingConfig
from pgtrain.data import manifest
from pgtrain.launch import local as launch_local
from pgtrain.runs import record
from trainer.train import batch_and_rate

ROWS = int(os.environ.get("PGTRAIN_BENCH_TRAIN_ROWS", "200000"))
DIM = int(os.environ.get("PGTRAIN_BENCH_TRAIN_DIM", "100"))
EPOCHS = int(os.environ.get("PGTRAIN_BENCH_TRAIN_EPOCHS", "3"))
ROUNDS = int(os.environ.get("PGTRAIN_BENCH_TRAIN_ROUNDS", "2"))
CLASSES = 10


def horovod_run(conn: psycopg.Connection, url: str, name: str, **params: object) -> dict[str, float]:
    """Plan and train one run through the local launcher; its resolved batch, rate and median samples/s."""
    config = TrainingConfig.from_mapping({"epochs": EPOCHS, "checkpoint_every": 0, **params})
    run = record.plan_run(conn, "bench_training", f"{name}-{time.time_ns()}", config)
    manifest.plan_shards(conn, run)
    run = record.get_run(conn, run.run_id)
    lines: list[str] = []
    log = logging.getLogger(f"bench.{name}")
    log.propagate = False
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    started = time.perf_counter()
    launch_local.run_local(run.run_id, config.world_size, url, log, timeout_seconds=1800)
    wall = time.perf_counter() - started
    speeds = [m["samples_per_second"] for m in record.epoch_metrics(conn, run.run_id)]
    shards = record.get_manifest(conn, run.run_id)
    batch, rate = batch_and_rate(config, shards)
    said = next((line.partition(":")[2] for line in lines if "<stdout>:batch " in line), "")
    print(f"  {name:<10} {statistics.median(speeds):>10.0f} samples/s  epochs {[round(s) for s in speeds]}  "
          f"job {wall:.1f} s  [{said}]", flush=True)
    return {"samples_per_s": statistics.median(speeds), "batch": batch, "world_size": config.world_size,
            "learning_rate": rate,
            "train_rows": sum(s.train_count for s in shards)}


def plain_args(train_rows: int, batch: int, learning_rate: float, threads: int | None, flush_denormal: bool = True,
               part: tuple[int, int] = (0, 1)) -> list[str]:
    return [sys.executable, __file__, "--plain", str(train_rows), str(batch), str(learning_rate), str(threads or 0),
            str(int(flush_denormal)), f"{part[0]}/{part[1]}"]


def plain_torch(train_rows: int, batch: int, learning_rate: float, threads: int | None,
                flush_denormal: bool = True) -> float:
    """Median samples/s of plain PyTorch in a fresh process (as a rank is): ``threads`` None = torch's default."""
    out = subprocess.run(plain_args(train_rows, batch, learning_rate, threads, flush_denormal), check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.splitlines()[-1])["samples_per_s"]


def two_process_ceiling(train_rows: int, batch: int, learning_rate: float) -> float:
    """Samples/s of two plain PyTorch processes at once, one thread each, each on half the rows at ``batch``:
    what two local ranks would do with no gradient exchange at all (their ceiling on this machine)."""
    half = train_rows // 2
    procs = [subprocess.Popen(plain_args(half, batch, learning_rate, 1, part=(i, 2)), stdout=subprocess.PIPE,
                              text=True) for i in range(2)]
    speeds = [json.loads(p.communicate()[0].splitlines()[-1])["samples_per_s"] for p in procs]
    return 2 * min(speeds)  # the pair is as fast as its slower half


def plain_torch_main(train_rows: int, batch: int, learning_rate: float, threads: int, flush_denormal: bool,
                     part: int) -> None:
    import torch
    import torch.nn.functional as F

    from trainer.model import build_model

    if threads:
        torch.set_num_threads(threads)
    torch.set_flush_denormal(flush_denormal)
    features, labels = examples.synthetic(ROWS, DIM, CLASSES, 0)
    x = torch.from_numpy(features[part * train_rows:(part + 1) * train_rows])
    y = torch.from_numpy(labels[part * train_rows:(part + 1) * train_rows]).long()
    model = build_model("mlp", DIM, CLASSES, {"hidden_sizes": [50]}, 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=0.9)
    speeds = []
    for _ in range(EPOCHS):
        started = time.perf_counter()
        order = torch.randperm(train_rows)
        for lo in range(0, train_rows, batch):
            idx = order[lo:lo + batch]
            optimizer.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            optimizer.step()
        speeds.append(train_rows / (time.perf_counter() - started))
    print(json.dumps({"samples_per_s": statistics.median(speeds), "threads": torch.get_num_threads()}))


def main() -> None:
    figures: dict[str, float | int | str] = {}
    rounds: list[dict[str, float]] = []
    with bench_database() as (_, url), psycopg.connect(url, autocommit=True) as conn:
        examples.insert_samples(conn, *examples.synthetic(ROWS, DIM, CLASSES, 0))
        before: dict[str, float] | None = None
        for number in range(ROUNDS):
            print(f"round {number + 1}/{ROUNDS}", flush=True)
            default = horovod_run(conn, url, "default")
            two = horovod_run(conn, url, "two_ranks", world_size=2)
            os.environ["OMP_NUM_THREADS"] = "1"  # reaches the ranks (launch_local passes OMP_*)
            try:
                one_thread = horovod_run(conn, url, "one_rank_1t", world_size=1)
            finally:
                del os.environ["OMP_NUM_THREADS"]
            rows, batch, rate = int(default["train_rows"]), int(default["batch"] * default["world_size"]), \
                default["learning_rate"]
            plain = {threads: plain_torch(rows, batch, rate, threads) for threads in (None, 1)}
            unflushed = plain_torch(rows, batch, rate, None, flush_denormal=False)
            ceiling = two_process_ceiling(rows, int(two["batch"]), two["learning_rate"])
            print(f"  plain torch at global batch {batch}: {plain[None]:.0f} samples/s (default threads), "
                  f"{plain[1]:.0f} (1 thread), {unflushed:.0f} (default threads, subnormals not flushed); "
                  f"two 1-thread processes, no allreduce: {ceiling:.0f}", flush=True)
            one_rank = max(default["samples_per_s"], one_thread["samples_per_s"]) if default["world_size"] == 1 \
                else one_thread["samples_per_s"]
            rounds.append({"default": default["samples_per_s"], "two": two["samples_per_s"],
                           "one": one_rank, "one_1_thread": one_thread["samples_per_s"],
                           "plain": max(plain.values()), "plain_default_threads": plain[None],
                           "plain_1_thread": plain[1], "plain_unflushed": unflushed, "ceiling": ceiling})
            if before is None:
                before = horovod_run(conn, url, "batch32", batch_size=32, learning_rate=0.05, world_size=2, epochs=1)
                before["plain"] = max(plain_torch(rows, 64, 0.05, t) for t in (None, 1))
                print(f"  plain torch at global batch 64: {before['plain']:.0f} samples/s", flush=True)
    best = max(rounds, key=lambda r: r["default"] / r["plain"])
    figures.update({
        "training.rows": ROWS, "training.dim": DIM, "training.cpus": os.cpu_count() or 0,
        "training.default_world_size": int(default["world_size"]),
        "training.default_batch_per_rank": int(default["batch"]),
        "training.default_learning_rate": round(default["learning_rate"], 4),
        "training.default_samples_per_s": round(best["default"]),
        "training.plain_torch_samples_per_s": round(best["plain"]),
        "training.plain_torch_default_threads_samples_per_s": round(best["plain_default_threads"]),
        "training.plain_torch_1_thread_samples_per_s": round(best["plain_1_thread"]),
        "training.plain_torch_unflushed_samples_per_s": round(best["plain_unflushed"]),
        "training.flush_denormal_speedup": round(best["plain_default_threads"] / best["plain_unflushed"], 2),
        "training.default_vs_plain_torch": round(best["default"] / best["plain"], 3),
        "training.default_vs_plain_torch_rounds": str([round(r["default"] / r["plain"], 3) for r in rounds]),
        "training.one_rank_samples_per_s": round(max(r["one"] for r in rounds)),
        "training.one_rank_1_thread_samples_per_s": round(max(r["one_1_thread"] for r in rounds)),
        "training.two_ranks_samples_per_s": round(max(r["two"] for r in rounds)),
        "training.two_ranks_batch_per_rank": int(two["batch"]),
        "training.local_2_vs_1_ranks": round(max(r["two"] / r["one"] for r in rounds), 3),
        "training.local_2_vs_1_ranks_rounds": str([round(r["two"] / r["one"], 3) for r in rounds]),
        # data-parallel scaling at one thread a rank, and what two processes reach with no allreduce at all
        "training.local_2_vs_1_ranks_1_thread_each": round(max(r["two"] / r["one_1_thread"] for r in rounds), 3),
        "training.two_process_ceiling_vs_1_rank": round(max(r["ceiling"] / r["one"] for r in rounds), 3),
        "training.two_ranks_vs_ceiling": round(max(r["two"] / r["ceiling"] for r in rounds), 3),
    })
    if before is not None:
        figures["training.batch32_samples_per_s"] = round(before["samples_per_s"])
        figures["training.batch32_plain_torch_samples_per_s"] = round(before["plain"])
        figures["training.batch32_vs_plain_torch"] = round(before["samples_per_s"] / before["plain"], 3)
        figures["training.default_vs_batch32"] = round(best["default"] / before["samples_per_s"], 1)
    report(figures)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--plain":
        plain_torch_main(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]),
                         sys.argv[6] == "1", int(sys.argv[7].partition("/")[0]))
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the embedded server on the way out
        main()
