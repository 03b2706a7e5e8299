"""Training throughput on a GPU: pgtrain's training loop against a plain PyTorch loop on the same GPU, rows and batch
size, for a launch-bound and a compute-bound model, then the trainer end to end on both backends (1 GPU, and all of
the machine's). Without a CUDA device it says so and measures nothing (exit 0); ``--quick`` runs its CPU parts
small on the CPU, to prove the code works where no GPU is. Sized to finish within 8 minutes on one GPU:
scripts/gpu_check.sh runs it after the GPU checks (``--check``) and writes the figures to benchmarks/results.json.

    .venv/bin/python benchmarks/bench_gpu.py          # embedded PostgreSQL unless PGTRAIN_BENCH_DATABASE_URL
    .venv/bin/python benchmarks/bench_gpu.py --quick  # small, and on the CPU where there is no GPU
    .venv/bin/python benchmarks/bench_gpu.py --check  # the GPU stack: CUDA, driver, NCCL, TF32, bf16; exit 2 if none

1,000,000 synthetic rows x 64 ``real[]`` features, 10 classes (dev.examples.synthetic), AdamW, validation_fraction
0.1, rank 0's shard of a 1-rank plan loaded from PostgreSQL (``load_shard``, as a rank does) onto GPU 0
(``trainer.device.select_device``). Two model sizes (SIZES): ``launch`` (the default mlp, hidden 50, at the auto batch:
each step's kernels are tiny, the step's Python and kernel launches bound it) and ``compute`` (hidden 4096 x 3 at
batch 4096: matmuls bound it). Per size and round, a fresh process loads the rows once and runs every variant, in an
order rotated each round, EPOCHS epochs each (each timed to a ``cuda.synchronize``; the first epoch is warm-up, the
variant's figure is the median of the others); a size's figure per variant is the **median over rounds** (every
round's ratios are reported too), and every variant's checksum of the rows it trained on must agree:

- ``device``: pgtrain's loop (``trainer.train.Batches`` and ``train_epoch``, as ``fit`` calls them) with the rows
  on the GPU, where a rank puts them when they fit;
- ``pinned``: the same loop with the rows in host memory, each batch gathered into a page-locked buffer and copied
  over (where a rank's rows do not fit on its GPU; GPU only);
- ``device_bf16``, ``pinned_bf16``: the same at ``precision: bf16`` (the trainer's autocast);
- ``plain``, ``plain_bf16``: plain PyTorch on the same rows and batch size on the GPU: ``torch.randperm``,
  ``x[idx]``, the network's forward (no input standardization), cross entropy, backward, the same optimizer step.

TF32 is on in every variant and subnormals are flushed, as a rank sets them (``trainer.device.use_tf32``,
``trainer.threads.set_up_threads``). Then the trainer itself
(``launch_local.run_local``) per backend the machine can run on GPUs (``torch``: torch.distributed over NCCL;
``horovod``: where its build has NCCL), on 1 GPU and, where the machine has N > 1, on N: its own median samples/s.

Figures: ``gpu.<size>.<variant>.samples_per_s``, ``gpu.<size>.device_vs_plain`` (and ``pinned_vs_plain``,
``bf16_vs_fp32``, ``device_vs_plain_rounds``), ``gpu.trainer.<backend>_<N>_gpus_samples_per_s``,
``gpu.trainer.<backend>_scaling_<N>_vs_1``, ``gpu.name``, ``gpu.count``, ``gpu.device_type`` (cpu in --quick
without a GPU: those figures prove the code, not a GPU).
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
from collections.abc import Callable

import numpy as np
import psycopg
from common import bench_database, interleaved, report, write_synthetic

from pgtrain.config.params import TrainingConfig
from pgtrain.data import loader, manifest
from pgtrain.planning.plan import plan_training
from pgtrain.runs import record

QUICK = "--quick" in sys.argv
ROWS = int(os.environ.get("PGTRAIN_BENCH_GPU_ROWS", "8000" if QUICK else "1000000"))
ROUNDS = int(os.environ.get("PGTRAIN_BENCH_GPU_ROUNDS", "2" if QUICK else "3"))
DIM, CLASSES = 64, 10
EPOCHS = 2 if QUICK else 4  # the first is warm-up
TABLE = "samples_gpu"
# Model size -> the params of its plan: launch-bound (tiny kernels) and compute-bound (large matmuls).
SIZES: dict[str, dict[str, object]] = {
    "launch": {"hidden_sizes": [50]},
    "compute": {"hidden_sizes": [128, 128] if QUICK else [4096, 4096, 4096], "batch_size": 512 if QUICK else 4096},
}
GPU_VARIANTS = ["device", "pinned", "device_bf16", "pinned_bf16", "plain", "plain_bf16"]
CPU_VARIANTS = ["device", "device_bf16", "plain", "plain_bf16"]  # page-locked memory needs CUDA


def plan(conn: psycopg.Connection, world_size: int, **params: object) -> record.Run:
    config = TrainingConfig.from_mapping({"source_table": f"public.{TABLE}", "epochs": EPOCHS, "checkpoint_every": 0,
                                          "world_size": world_size, "early_stopping_patience": 0, **params})
    return plan_training(conn, config, "bench_gpu", f"{world_size}-{time.time_ns()}")


def size_round(run_id: str, url: str, order: list[str]) -> dict[str, dict[str, float]]:
    """Every variant of one size in ``order``, in a fresh process that loads the rows once."""
    out = subprocess.run([sys.executable, __file__, "--round", run_id, url, ",".join(order)], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.splitlines()[-1])


def round_main(run_id: str, url: str, order: list[str]) -> None:
    import torch

    from trainer.device import select_device, use_tf32
    from trainer.threads import set_up_threads

    device = select_device(0, torch.cuda)
    use_tf32(device)
    set_up_threads(os.environ, 1)  # as a rank: its threads, and subnormals flushed (for the plain loop too)
    with psycopg.connect(url, autocommit=True) as conn:
        run, shards = record.get_run(conn, run_id), record.get_manifest(conn, run_id)
        data = loader.load_shard(conn, manifest.source_for(conn, run), shards[0], run.input_dim,
                                 run.config.validation_fraction, run.config.seed, validation_last=True,
                                 test_fraction=run.config.test_fraction)
    (x, y), *_ = (tuple(map(torch.from_numpy, part)) for part in data.split())
    checksum = float(data.features[:len(x)].sum(dtype=np.float64))  # on the host, the same for every variant
    results = {}
    for name in order:
        speed = variant_speed(name, run, shards, x, y, device)
        results[name] = {"samples_per_s": speed, "checksum": checksum}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(json.dumps({"variants": results, "name": name, "device_type": device.type}))


def variant_speed(name: str, run: record.Run, shards: list[record.Shard], x_host, y_host, device) -> float:
    """Median samples/s over the epochs after the first of one variant (a fresh model and optimizer)."""
    import torch
    import torch.nn.functional as F

    from pgtrain.models.network import build_model
    from trainer.device import forward_precision
    from trainer.evaluate import Task
    from trainer.optim import Schedule, make_optimizer
    from trainer.train import Batches, batch_and_rate, batch_bounds, epoch_order, steps_per_epoch, train_epoch

    config, rows = run.config, len(x_host)
    batch, rate = batch_and_rate(config, shards)
    steps = steps_per_epoch(shards, batch)
    model = build_model(config.model, run.input_dim, CLASSES, config.model_options_for_build, config.seed).to(device)
    optimizer = make_optimizer(config, model, rate)
    x, y = (x_host, y_host) if name.startswith("pinned") else (x_host.to(device), y_host.to(device))
    precision = "bf16" if name.endswith("bf16") else "fp32"
    if name.startswith("plain"):
        def epoch(number: int) -> None:
            order = torch.randperm(rows, device=device)
            for lo in range(0, rows, batch):
                idx = order[lo:lo + batch]
                optimizer.zero_grad()
                with forward_precision(device, precision):
                    loss = F.cross_entropy(model.net(x[idx]), y[idx])
                loss.backward()
                optimizer.step()
    else:
        batches = Batches(x, y, -(-rows // steps), device)
        schedule, task = Schedule(config, optimizer, rate, steps), Task(False, CLASSES, device)

        def epoch(number: int) -> None:
            order = torch.from_numpy(epoch_order(rows, config.seed, number, 0)).to(batches.rows_device)
            train_epoch(model, optimizer, schedule, (number - 1) * steps, task, batches, order,
                        batch_bounds(rows, steps), precision)

    return statistics.median(timed_epochs(epoch, rows, device)[1:])


def timed_epochs(epoch: Callable[[int], None], rows: int, device) -> list[float]:
    import torch

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    speeds = []
    for number in range(1, EPOCHS + 1):
        synchronize()
        started = time.perf_counter()
        epoch(number)
        synchronize()
        speeds.append(rows / (time.perf_counter() - started))
    return speeds


def trainer_backends(on_gpu: bool) -> dict[str, str | None]:
    """Each backend -> None where the trainer can run on it here, else why not (Horovod needs NCCL on GPUs)."""
    from pgtrain.launch.backends import horovod_installed

    found, why_not = horovod_installed(sys.executable, os.environ)
    horovod = None if found else why_not
    if found and on_gpu:
        probe = subprocess.run([sys.executable, "-c", "import horovod.torch as h; print(h.nccl_built())"],
                               stdout=subprocess.PIPE, text=True)
        if probe.stdout.strip() in ("", "0", "False"):
            horovod = "this Horovod was built without NCCL (HOROVOD_GPU_OPERATIONS=NCCL: make image-gpu)"
    return {"torch": None, "horovod": horovod}


def trainer_samples_per_s(conn: psycopg.Connection, url: str, world_size: int, backend: str) -> float:
    """The trainer's own median samples/s over its epochs, on ``world_size`` ranks (one GPU each)."""
    from pgtrain.launch import local as launch_local

    run = plan(conn, world_size, backend=backend)
    log = logging.getLogger(f"bench.gpu.{backend}.{world_size}")
    log.addHandler(logging.StreamHandler(sys.stderr))
    log.setLevel(logging.INFO)
    launch_local.run_local(run.run_id, world_size, url, log, timeout_seconds=300)
    return statistics.median(m["samples_per_second"] for m in record.epoch_metrics(conn, run.run_id))


def main() -> None:
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu and not QUICK:
        print("bench_gpu: skipped: no CUDA device here (torch.cuda.is_available() is False); nothing measured "
              "(--quick runs its CPU parts)")
        print("{}")  # run_all's JSON line: no figures
        return
    count = torch.cuda.device_count() if on_gpu else 1
    variants = GPU_VARIANTS if on_gpu else CPU_VARIANTS
    figures: dict[str, float | int | str] = {"gpu.rows": ROWS, "gpu.dim": DIM, "gpu.count": count,
                                             "gpu.rounds": ROUNDS, "gpu.device_type": "cuda" if on_gpu else "cpu"}
    with bench_database() as (_, url), psycopg.connect(url, autocommit=True) as conn:
        write_synthetic(conn, TABLE, ROWS, DIM, CLASSES)
        for size, params in SIZES.items():
            run = plan(conn, 1, **params)
            rounds: list[dict[str, float]] = []
            for number in range(ROUNDS):
                order = [name for round_, name in interleaved(variants, ROUNDS) if round_ == number + 1]
                result = size_round(run.run_id, url, order)
                checksums = {name: r["checksum"] for name, r in result["variants"].items()}
                if len(set(checksums.values())) != 1:
                    raise SystemExit(f"the variants trained on different rows: {checksums}")
                figures["gpu.name"] = result["name"]
                rounds.append({name: r["samples_per_s"] for name, r in result["variants"].items()})
                print(f"{size} round {number + 1}/{ROUNDS}: " + ", ".join(f"{k} {v:.0f}" for k, v in
                                                                       rounds[-1].items()) + " samples/s", flush=True)
            figures.update(size_figures(size, rounds, variants))
        for backend, why_not in trainer_backends(on_gpu).items():
            if why_not is not None:
                print(f"trainer on {backend}: skipped: {why_not}", flush=True)
                continue
            one = trainer_samples_per_s(conn, url, 1, backend)
            figures[f"gpu.trainer.{backend}_1_gpus_samples_per_s"] = round(one)
            if count > 1:
                many = trainer_samples_per_s(conn, url, count, backend)
                figures[f"gpu.trainer.{backend}_{count}_gpus_samples_per_s"] = round(many)
                figures[f"gpu.trainer.{backend}_scaling_{count}_vs_1"] = round(many / one, 3)
    report(figures)


def size_figures(size: str, rounds: list[dict[str, float]], variants: list[str]) -> dict[str, float | int | str]:
    """Each variant's median over the rounds (not the best round), and the ratios of those medians."""
    median = {name: statistics.median(r[name] for r in rounds) for name in variants}
    figures: dict[str, float | int | str] = {f"gpu.{size}.{name}.samples_per_s": round(median[name])
                                             for name in variants}
    figures[f"gpu.{size}.device_vs_plain"] = round(median["device"] / median["plain"], 3)
    figures[f"gpu.{size}.bf16_vs_fp32"] = round(median["device_bf16"] / median["device"], 3)
    figures[f"gpu.{size}.device_vs_plain_rounds"] = str([round(r["device"] / r["plain"], 3) for r in rounds])
    if "pinned" in median:
        figures[f"gpu.{size}.pinned_vs_plain"] = round(median["pinned"] / median["plain"], 3)
    return figures


def check() -> int:
    """The GPU stack, before anything is measured: exit 2 naming what is missing."""
    import torch
    import torch.distributed as dist

    from trainer.device import DRIVER_FLOORS, driver_floor, driver_version, nccl_version, use_tf32

    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, driver {driver_version()}, NCCL {nccl_version()}, "
          f"torch.distributed NCCL {'available' if dist.is_nccl_available() else 'MISSING'}", flush=True)
    if not torch.cuda.is_available():
        why = (f"this torch is a CUDA {torch.version.cuda} build: it needs an NVIDIA driver "
               f"{driver_floor(torch.version.cuda)} or newer (nvidia-smi shows the machine's), or torch's cu126 build "
               f"(driver {DRIVER_FLOORS[12]} or newer)" if torch.version.cuda else
               "this torch is a CPU build (torch.version.cuda is None)")
        print(f"gpu_check: FAILED: no CUDA device is usable here: {why}. Run it on a GPU machine, in the GPU image "
              "(make image-gpu)", file=sys.stderr, flush=True)
        return 2
    device = torch.device("cuda", 0)
    use_tf32(device)
    a = torch.randn(2048, 2048, device=device)
    exact = (a.double() @ a.double()).float()
    tf32_error = float(((a @ a) - exact).abs().max() / exact.abs().max())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        bf16 = (a @ a).dtype
    for index in range(torch.cuda.device_count()):
        print(f"GPU {index}: {torch.cuda.get_device_name(index)}, "
              f"{torch.cuda.mem_get_info(index)[1] / 2**30:.0f} GiB", flush=True)
    print(f"TF32 matmul relative error {tf32_error:.1e} (about 1e-3 expected), bf16 autocast gives {bf16}", flush=True)
    problems = [] if dist.is_nccl_available() else ["torch.distributed has no NCCL"]
    problems += [] if bf16 == torch.bfloat16 else ["bf16 autocast did not give bfloat16"]
    if problems:
        print("gpu_check: FAILED: " + "; ".join(problems), file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--round"]:
        round_main(sys.argv[2], sys.argv[3], sys.argv[4].split(","))
    elif sys.argv[1:2] == ["--check"]:
        sys.exit(check())
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the embedded server on the way out
        main()
