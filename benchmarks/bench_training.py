"""Training throughput: the default local configuration against plain PyTorch, on a quiet machine and beside a CPU hog.

    .venv/bin/python benchmarks/bench_training.py       # embedded PostgreSQL unless PGTRAIN_BENCH_DATABASE_URL
    PGTRAIN_BENCH_TRAIN_ROWS=20000 PGTRAIN_BENCH_TRAIN_ROUNDS=1 .venv/bin/python benchmarks/bench_training.py

200,000 synthetic rows x 100 features, 10 classes (dev.examples.synthetic), the default mlp (one hidden
layer of 50), validation_fraction 0.1. Every configuration trains the same rows; samples/s is the trainer's
own figure (training rows of all ranks / the epoch's training-loop seconds, the median over its epochs).
PGTRAIN_BENCH_TRAIN_ROUNDS rounds (default 5), each measuring both conditions, their order alternating:

- quiet: nothing but the benchmark;
- busy: a CPU hog beside it, a second process spinning on one core (the last this process may use), started
  before the condition's first measurement and stopped after its last: what a shared Airflow worker looks like.

In each condition:

- ``default``: the DAG's defaults (1 rank, its threads as ``trainer.threads`` chooses them, auto batch size
  and learning rate, the default optimizer) through ``launch_local.run_local``, as the train task runs it;
- ``plain_torch``: one fresh process, no Horovod, the same model, optimizer, learning rate and weight decay on
  the same number of rows at the default's global batch: a shuffled index, ``x[idx]``, forward, backward, step,
  subnormal floats flushed as a rank does. Run with torch's default threads, with one thread, and with torch's
  default threads waiting passively (``OMP_WAIT_POLICY=PASSIVE``); the fastest is the floor.

Quiet only, every round: ``two_ranks`` (``world_size=2``), ``one_rank_1t`` (1 rank, ``OMP_NUM_THREADS=1``), plain
PyTorch unflushed (``training.flush_denormal_speedup``), and the two-process ceiling (two plain 1-thread processes
at once on half the rows each at the 2-rank batch: what two local ranks reach with no allreduce). Round 1 only:
``batch32``, the defaults before the auto batch (2 ranks x 32 rows, SGD at 0.05), one epoch.

Ratios are taken within a round; each figure is the median over rounds, with ``_min`` and ``_rounds`` beside it.
``training.vs_plain_torch`` (quiet, target >= 0.9) and ``training.vs_plain_torch_busy`` (beside the hog, target
>= 0.8): default samples/s over plain PyTorch's best; ``training.load_average`` / ``_busy``: the 1-minute load
average when the condition started, the median over rounds (it lags: the hog's own 1.0 builds up over a minute).
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
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from common import bench_database, report

from dev import examples
from pgtrain.config.params import TrainingConfig
from pgtrain.launch import local as launch_local
from pgtrain.planning.plan import plan_training
from pgtrain.runs import record
from trainer.train import batch_and_rate

ROWS = int(os.environ.get("PGTRAIN_BENCH_TRAIN_ROWS", "200000"))
DIM = int(os.environ.get("PGTRAIN_BENCH_TRAIN_DIM", "100"))
EPOCHS = int(os.environ.get("PGTRAIN_BENCH_TRAIN_EPOCHS", "5"))
ROUNDS = int(os.environ.get("PGTRAIN_BENCH_TRAIN_ROUNDS", "5"))
CLASSES = 10
TARGETS = {"quiet": 0.9, "busy": 0.8}
# plain PyTorch's thread settings: (threads, None = torch's default; wait passively)
PLAIN_SETTINGS = {"default_threads": (None, False), "1_thread": (1, False), "passive": (None, True)}


def horovod_run(conn: psycopg.Connection, url: str, name: str, **params: object) -> dict[str, float]:
    """Plan and train one run through the local launcher; its resolved batch, rate and median samples/s."""
    config = TrainingConfig.from_mapping({"epochs": EPOCHS, "checkpoint_every": 0, **params})
    run = plan_training(conn, config, "bench_training", f"{name}-{time.time_ns()}")
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
    # rank 0's line of its optimizer: "[0]<stdout>:..." under a launcher, as it is from a rank alone
    said = next((line.rpartition("<stdout>:")[2] for line in lines if " rows per rank " in line), "")
    print(f"  {name:<12} {statistics.median(speeds):>10.0f} samples/s  epochs {[round(s) for s in speeds]}  "
          f"job {wall:.1f} s  [{said}]", flush=True)
    return {"samples_per_s": statistics.median(speeds), "batch": batch, "world_size": config.world_size,
            "learning_rate": rate, "optimizer": config.optimizer, "weight_decay": config.weight_decay_value,
            "train_rows": sum(s.train_count for s in shards)}


def plain_args(run: dict, batch: int, threads: int | None, flush_denormal: bool = True,
               part: tuple[int, int] = (0, 1), rows: int | None = None) -> list[str]:
    """The command of one plain PyTorch process, with ``run``'s optimizer, rate and weight decay."""
    return [sys.executable, __file__, "--plain", str(rows or run["train_rows"]), str(batch), str(run["learning_rate"]),
            str(threads or 0), str(int(flush_denormal)), f"{part[0]}/{part[1]}", str(run["optimizer"]),
            str(run["weight_decay"])]


def plain_torch(run: dict, batch: int, threads: int | None, passive: bool = False,
                flush_denormal: bool = True) -> float:
    """Median samples/s of plain PyTorch in a fresh process (as a rank is): ``threads`` None = torch's default;
    ``passive``: its OpenMP threads sleep while they wait (else libgomp's default, spinning a while)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    out = subprocess.run(plain_args(run, batch, threads, flush_denormal), check=True, stdout=subprocess.PIPE,
                         text=True, env=env).stdout
    return json.loads(out.splitlines()[-1])["samples_per_s"]


def two_process_ceiling(run: dict) -> float:
    """Samples/s of two plain PyTorch processes at once, one thread each, each on half the rows at ``run``'s
    batch: what two local ranks would do with no gradient exchange at all (their ceiling on this machine)."""
    half = int(run["train_rows"]) // 2
    procs = [subprocess.Popen(plain_args(run, int(run["batch"]), 1, part=(i, 2), rows=half), stdout=subprocess.PIPE,
                              text=True) for i in range(2)]
    speeds = [json.loads(p.communicate()[0].splitlines()[-1])["samples_per_s"] for p in procs]
    return 2 * min(speeds)  # the pair is as fast as its slower half


@contextmanager
def cpu_hog(on: bool) -> Iterator[None]:
    """``on``: a second process spinning on one core (the last this process may use) while the block runs."""
    if not on:
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(hog.pid, {max(os.sched_getaffinity(0))})
        yield
    finally:
        hog.kill()
        hog.wait()


def condition(conn: psycopg.Connection, url: str, busy: bool) -> dict[str, float | str]:
    """The default configuration and plain PyTorch at each thread setting, quiet or beside the hog."""
    load = os.getloadavg()[0]
    with cpu_hog(busy):
        default = horovod_run(conn, url, "default_busy" if busy else "default")
        batch = int(default["batch"] * default["world_size"])
        plain = {name: plain_torch(default, batch, *setting) for name, setting in PLAIN_SETTINGS.items()}
    best = max(plain, key=plain.__getitem__)
    ratio = default["samples_per_s"] / plain[best]
    print(f"  plain torch at global batch {batch}: " + ", ".join(f"{v:.0f} ({k})" for k, v in plain.items())
          + f"; default / best plain {ratio:.3f} ({'beside the hog' if busy else 'quiet'}, load {load:.2f})",
          flush=True)
    return {"load": load, "default": default["samples_per_s"], "plain": plain[best], "plain_best": best,
            "ratio": ratio, **{f"plain_{k}": v for k, v in plain.items()}, "run": default}


def quiet_extras(conn: psycopg.Connection, url: str, default: dict) -> dict[str, float]:
    """Quiet only: 2 ranks, 1 rank at 1 thread, plain PyTorch unflushed, the two-process ceiling."""
    two = horovod_run(conn, url, "two_ranks", world_size=2)
    os.environ["OMP_NUM_THREADS"] = "1"  # reaches the ranks (launch_local passes OMP_*)
    try:
        one_thread = horovod_run(conn, url, "one_rank_1t", world_size=1)
    finally:
        del os.environ["OMP_NUM_THREADS"]
    batch = int(default["batch"] * default["world_size"])
    unflushed = plain_torch(default, batch, None, flush_denormal=False)
    ceiling = two_process_ceiling(two)
    print(f"  plain torch unflushed (default threads) {unflushed:.0f}; two 1-thread processes, no allreduce: "
          f"{ceiling:.0f}", flush=True)
    return {"two": two["samples_per_s"], "two_batch": two["batch"], "one_1_thread": one_thread["samples_per_s"],
            "unflushed": unflushed, "ceiling": ceiling}


def plain_torch_main(train_rows: int, batch: int, learning_rate: float, threads: int, flush_denormal: bool,
                     part: int, optimizer_name: str, weight_decay: float) -> None:
    import torch
    import torch.nn.functional as F

    from pgtrain.models.network import build_model

    if threads:
        torch.set_num_threads(threads)
    torch.set_flush_denormal(flush_denormal)
    features, labels = examples.synthetic(ROWS, DIM, CLASSES, 0)
    x = torch.from_numpy(features[part * train_rows:(part + 1) * train_rows])
    y = torch.from_numpy(labels[part * train_rows:(part + 1) * train_rows]).long()
    model = build_model("mlp", DIM, CLASSES, {"hidden_sizes": [50]}, 0)
    if optimizer_name == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=0.9, weight_decay=weight_decay)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=weight_decay)
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


def spread(figures: dict[str, float | int | str], name: str, values: list[float], digits: int = 3) -> None:
    """``name``: the median over rounds; ``name_min`` and ``name_rounds`` beside it."""
    figures[name] = round(statistics.median(values), digits)
    figures[f"{name}_min"] = round(min(values), digits)
    figures[f"{name}_rounds"] = str([round(v, digits) for v in values])


def main() -> None:
    figures: dict[str, float | int | str] = {"training.load_average_before": round(os.getloadavg()[0], 2)}
    rounds: list[dict[str, dict]] = []
    before: dict[str, float] | None = None
    with bench_database() as (_, url), psycopg.connect(url, autocommit=True) as conn:
        examples.insert_samples(conn, *examples.synthetic(ROWS, DIM, CLASSES, 0))
        for number in range(ROUNDS):
            order = (False, True) if number % 2 == 0 else (True, False)  # quiet first, then the hog first
            print(f"round {number + 1}/{ROUNDS}", flush=True)
            measured = {("busy" if busy else "quiet"): condition(conn, url, busy) for busy in order}
            measured["extras"] = quiet_extras(conn, url, measured["quiet"]["run"])
            rounds.append(measured)
            if before is None:
                before = horovod_run(conn, url, "batch32", batch_size=32, learning_rate=0.05, world_size=2,
                                     optimizer="sgd", epochs=1)
                before["plain"] = max(plain_torch(before, 64, t) for t in (None, 1))
                print(f"  plain torch at global batch 64: {before['plain']:.0f} samples/s", flush=True)
    default = rounds[-1]["quiet"]["run"]
    figures.update({
        "training.rows": ROWS, "training.dim": DIM, "training.cpus": len(os.sched_getaffinity(0)),
        "training.rounds": ROUNDS, "training.default_world_size": int(default["world_size"]),
        "training.default_batch_per_rank": int(default["batch"]),
        "training.default_optimizer": str(default["optimizer"]),
        "training.default_learning_rate": round(default["learning_rate"], 4),
    })
    for key, suffix in (("quiet", ""), ("busy", "_busy")):
        runs = [r[key] for r in rounds]
        spread(figures, f"training.vs_plain_torch{suffix}", [r["ratio"] for r in runs])
        figures[f"training.vs_plain_torch{suffix}_target"] = TARGETS[key]
        figures[f"training.load_average{suffix}"] = round(statistics.median(r["load"] for r in runs), 2)
        figures[f"training.default{suffix}_samples_per_s"] = round(statistics.median(r["default"] for r in runs))
        figures[f"training.plain_torch{suffix}_samples_per_s"] = round(statistics.median(r["plain"] for r in runs))
        for name in PLAIN_SETTINGS:
            figures[f"training.plain_torch{suffix}_{name}_samples_per_s"] = round(
                statistics.median(r[f"plain_{name}"] for r in runs))
        best = Counter(r["plain_best"] for r in runs).most_common(1)[0][0]
        figures[f"training.plain_torch{suffix}_best_setting"] = str(best)
    quiet, extras = [r["quiet"] for r in rounds], [r["extras"] for r in rounds]
    one_rank = [max(q["default"], e["one_1_thread"]) if default["world_size"] == 1 else e["one_1_thread"]
                for q, e in zip(quiet, extras, strict=True)]
    figures["training.flush_denormal_speedup"] = round(statistics.median(
        q["plain_default_threads"] / e["unflushed"] for q, e in zip(quiet, extras, strict=True)), 2)
    figures["training.one_rank_1_thread_samples_per_s"] = round(statistics.median(e["one_1_thread"] for e in extras))
    figures["training.two_ranks_samples_per_s"] = round(statistics.median(e["two"] for e in extras))
    figures["training.two_ranks_batch_per_rank"] = int(extras[-1]["two_batch"])
    spread(figures, "training.local_2_vs_1_ranks", [e["two"] / o for e, o in zip(extras, one_rank, strict=True)])
    # data-parallel scaling at one thread a rank, and what two processes reach with no allreduce at all
    spread(figures, "training.local_2_vs_1_ranks_1_thread_each", [e["two"] / e["one_1_thread"] for e in extras])
    spread(figures, "training.two_process_ceiling_vs_1_rank",
           [e["ceiling"] / o for e, o in zip(extras, one_rank, strict=True)])
    spread(figures, "training.two_ranks_vs_ceiling", [e["two"] / e["ceiling"] for e in extras])
    if before is not None:
        figures["training.batch32_samples_per_s"] = round(before["samples_per_s"])
        figures["training.batch32_plain_torch_samples_per_s"] = round(before["plain"])
        figures["training.batch32_vs_plain_torch"] = round(before["samples_per_s"] / before["plain"], 3)
        figures["training.default_vs_batch32"] = round(figures["training.default_samples_per_s"]
                                                       / before["samples_per_s"], 1)
    for key, suffix in (("quiet", ""), ("busy", "_busy")):
        met = figures[f"training.vs_plain_torch{suffix}"] >= TARGETS[key]
        print(f"training.vs_plain_torch{suffix} {figures[f'training.vs_plain_torch{suffix}']} (min "
              f"{figures[f'training.vs_plain_torch{suffix}_min']}, load {figures[f'training.load_average{suffix}']}):"
              f" target >= {TARGETS[key]} {'met' if met else 'missed'}", flush=True)
    report(figures)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--plain":
        plain_torch_main(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]),
                         sys.argv[6] == "1", int(sys.argv[7].partition("/")[0]), sys.argv[8], float(sys.argv[9]))
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the embedded server and the hog on the way out
        main()
