"""Training throughput on a GPU: pgtrain's training loop against a plain PyTorch loop on the same GPU and rows, and
1 -> N GPUs. Without a CUDA device it says so and measures nothing (exit 0). Sized to finish within 8 minutes on
one GPU; not run on a GPU yet (benchmarks/RESULTS.md).

    .venv/bin/python benchmarks/bench_gpu.py       # embedded PostgreSQL unless PGTRAIN_BENCH_DATABASE_URL
    PGTRAIN_BENCH_GPU_ROWS=200000 PGTRAIN_BENCH_GPU_ROUNDS=1 .venv/bin/python benchmarks/bench_gpu.py

1,000,000 synthetic rows x 64 ``real[]`` features, 10 classes (dev.examples.synthetic), the default mlp and
AdamW at the auto batch and learning rate of one rank, validation_fraction 0.1. Each variant runs in a fresh
process that loads rank 0's shard of a 1-rank plan from PostgreSQL (``load_shard``, as a rank does), selects
GPU 0 (``trainer.device.select_device``) and trains 3 epochs on the shard's training rows; samples/s is the
median over the epochs (each timed to a ``cuda.synchronize``), rounds interleaved, the best round reported, and
every variant's checksum of the rows it trained on must agree:

- ``device``: pgtrain's loop (``trainer.train.Batches`` and ``train_epoch``, as ``fit`` calls them) with the rows
  on the GPU, where a rank puts them when they fit;
- ``pinned``: the same loop with the rows in host memory: each step gathers its batch into a page-locked buffer
  and copies it over with a non-blocking copy (where a rank's rows do not fit on its GPU);
- ``device_bf16``, ``pinned_bf16``: the same under ``torch.autocast`` to bfloat16 (not a trainer option yet);
- ``plain``, ``plain_bf16``: plain PyTorch on the same rows on the GPU: ``torch.randperm`` on the GPU, ``x[idx]``,
  the network's forward (no input standardization), cross entropy, backward, the same optimizer (AdamW) step at
  the same learning rate.

Then the trainer itself, end to end: ``launch_local.run_local`` (``horovodrun --gloo``) on 1 GPU and, where the
machine has N > 1, on N GPUs (N ranks, one GPU each): its own samples/s (training rows of all ranks per second).

Figures: ``gpu.<variant>.samples_per_s``, ``gpu.device_vs_plain``, ``gpu.pinned_vs_plain``,
``gpu.bf16_vs_fp32`` (``device_bf16`` / ``device``), ``gpu.trainer_1_gpu_samples_per_s``,
``gpu.trainer_<N>_gpus_samples_per_s`` and ``gpu.scaling_<N>_vs_1``, ``gpu.name``, ``gpu.count``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time

import numpy as np
import psycopg
from common import bench_database, report, write_synthetic

from pgtrain.config.params import TrainingConfig
from pgtrain.data import loader, manifest
from pgtrain.runs import record

ROWS = int(os.environ.get("PGTRAIN_BENCH_GPU_ROWS", "1000000"))
ROUNDS = int(os.environ.get("PGTRAIN_BENCH_GPU_ROUNDS", "2"))
DIM, CLASSES, EPOCHS = 64, 10, 3
TABLE = "samples_gpu"
VARIANTS = ["device", "pinned", "device_bf16", "pinned_bf16", "plain", "plain_bf16"]


def plan(conn: psycopg.Connection, world_size: int) -> record.Run:
    config = TrainingConfig.from_mapping({"source_table": f"public.{TABLE}", "epochs": EPOCHS,
                                          "checkpoint_every": 0, "world_size": world_size})
    run = record.plan_run(conn, "bench_gpu", f"{world_size}-{time.time_ns()}", config)
    manifest.plan_shards(conn, run)
    return record.get_run(conn, run.run_id)


def variant(name: str, run_id: str, url: str) -> dict[str, float]:
    """One variant in a fresh process: its median samples/s and the checksum of the rows it trained on."""
    out = subprocess.run([sys.executable, __file__, "--variant", name, run_id, url], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.splitlines()[-1])


def variant_main(name: str, run_id: str, url: str) -> None:
    import torch
    import torch.nn.functional as F

    from trainer.device import select_device
    from trainer.evaluate import Task
    from trainer.model import build_model
    from trainer.optim import Schedule, make_optimizer
    from trainer.train import Batches, batch_and_rate, batch_bounds, epoch_order, steps_per_epoch, train_epoch

    device = select_device(0, torch.cuda)
    with psycopg.connect(url, autocommit=True) as conn:
        run, shards = record.get_run(conn, run_id), record.get_manifest(conn, run_id)
        data = loader.load_shard(conn, manifest.source_for(conn, run), shards[0], run.input_dim,
                                 run.config.validation_fraction, run.config.seed, validation_last=True,
                                 test_fraction=run.config.test_fraction)
    (x, y), *_ = (tuple(map(torch.from_numpy, part)) for part in data.split())
    config, rows = run.config, len(x)
    checksum = float(data.features[:rows].sum(dtype=np.float64))  # on the host, the same sum for every variant
    batch, rate = batch_and_rate(config, shards)
    steps = steps_per_epoch(shards, batch)
    model = build_model(config.model, run.input_dim, CLASSES, config.model_options_for_build, config.seed).to(device)
    optimizer = make_optimizer(config, model, rate)
    if not name.startswith("pinned"):
        x, y = x.to(device), y.to(device)
    bf16 = torch.autocast("cuda", dtype=torch.bfloat16) if name.endswith("bf16") else contextlib.nullcontext()
    if name.startswith("plain"):
        def epoch(number: int) -> None:
            order = torch.randperm(rows, device=device)
            for lo in range(0, rows, batch):
                idx = order[lo:lo + batch]
                optimizer.zero_grad()
                with bf16:
                    loss = F.cross_entropy(model.net(x[idx]), y[idx])
                loss.backward()
                optimizer.step()
    else:
        batches = Batches(x, y, -(-rows // steps), device)
        schedule, task = Schedule(config, optimizer, rate, steps), Task(False, CLASSES, device)

        def epoch(number: int) -> None:
            order = torch.from_numpy(epoch_order(rows, config.seed, number, 0)).to(batches.rows_device)
            with bf16:
                train_epoch(model, optimizer, schedule, (number - 1) * steps, task, batches, order,
                            batch_bounds(rows, steps))

    speeds = []
    for number in range(1, EPOCHS + 1):
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        epoch(number)
        torch.cuda.synchronize(device)
        speeds.append(rows / (time.perf_counter() - started))
    print(json.dumps({"samples_per_s": statistics.median(speeds), "checksum": checksum,
                      "name": torch.cuda.get_device_name(device)}))


def trainer_samples_per_s(conn: psycopg.Connection, url: str, world_size: int) -> float:
    """The trainer's own median samples/s over its epochs, on ``world_size`` ranks, one GPU each."""
    from pgtrain.launch import local as launch_local

    run = plan(conn, world_size)
    log = logging.getLogger(f"bench.gpu.{world_size}")
    log.addHandler(logging.StreamHandler(sys.stderr))
    log.setLevel(logging.INFO)
    launch_local.run_local(run.run_id, world_size, url, log, timeout_seconds=300)
    return statistics.median(m["samples_per_second"] for m in record.epoch_metrics(conn, run.run_id))


def main() -> None:
    import torch

    if not torch.cuda.is_available():
        print("bench_gpu: skipped: no CUDA device here (torch.cuda.is_available() is False); nothing measured")
        print("{}")  # run_all's JSON line: no figures
        return
    count = torch.cuda.device_count()
    figures: dict[str, float | int | str] = {"gpu.rows": ROWS, "gpu.dim": DIM, "gpu.count": count}
    rounds: list[dict[str, float]] = []
    with bench_database() as (_, url), psycopg.connect(url, autocommit=True) as conn:
        write_synthetic(conn, TABLE, ROWS, DIM, CLASSES)
        run = plan(conn, 1)
        for number in range(ROUNDS):
            results = {name: variant(name, run.run_id, url) for name in VARIANTS}
            checksums = {name: r["checksum"] for name, r in results.items()}
            if len(set(checksums.values())) != 1:
                raise SystemExit(f"the variants trained on different rows: {checksums}")
            figures["gpu.name"] = results["device"]["name"]
            rounds.append({name: r["samples_per_s"] for name, r in results.items()})
            print(f"round {number + 1}/{ROUNDS}: " + ", ".join(f"{k} {v:.0f}" for k, v in rounds[-1].items())
                  + " samples/s", flush=True)
        one = trainer_samples_per_s(conn, url, 1)
        figures["gpu.trainer_1_gpu_samples_per_s"] = round(one)
        if count > 1:
            many = trainer_samples_per_s(conn, url, count)
            figures[f"gpu.trainer_{count}_gpus_samples_per_s"] = round(many)
            figures[f"gpu.scaling_{count}_vs_1"] = round(many / one, 3)
    best = max(rounds, key=lambda r: r["device"] / r["plain"])
    figures.update({f"gpu.{name}.samples_per_s": round(best[name]) for name in VARIANTS})
    figures.update({
        "gpu.device_vs_plain": round(best["device"] / best["plain"], 3),
        "gpu.pinned_vs_plain": round(best["pinned"] / best["plain"], 3),
        "gpu.bf16_vs_fp32": round(best["device_bf16"] / best["device"], 3),
        "gpu.device_vs_plain_rounds": str([round(r["device"] / r["plain"], 3) for r in rounds]),
    })
    report(figures)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--variant":
        variant_main(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the embedded server on the way out
        main()
