"""python -m trainer --run-id RUN: one Horovod rank of a pgtrain run.

Reads its manifest row, streams its key range from PostgreSQL, trains the MLP with Horovod's
DistributedOptimizer, and (rank 0) records per-epoch metrics and stages the final parameters.
The database URL comes from $PGTRAIN_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

from pgtrain import loader, manifest, runs, tensors
from pgtrain.db import connect
from pgtrain.errors import INPUT_ERROR_MARK, PgtrainError
from pgtrain.model_spec import ModelSpec
from trainer.model import MLP, build_model

MOMENTUM = 0.9


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__.splitlines()[0])
    parser.add_argument("--run-id", required=True, help="the training run (pgtrain.training_runs.run_id)")
    return parser.parse_args(argv)


def steps_per_epoch(manifest_rows: list[runs.Shard], batch_size: int) -> int:
    """The same for every rank, from the largest shard, so no rank waits in an allreduce the others skip."""
    return max(1, math.ceil(max(s.train_count for s in manifest_rows) / batch_size))


def epoch_batches(train_rows: np.ndarray, steps: int, seed: int, epoch: int, rank: int) -> list[np.ndarray]:
    """This rank's shuffled training rows in ``steps`` batches (sizes differ by at most one)."""
    order = np.random.default_rng([seed, epoch, rank]).permutation(train_rows)
    return np.array_split(order, steps)


def feature_statistics(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of the training features over all ranks (constant features get std 1)."""
    x = features.double()
    sums = hvd.allreduce(torch.stack([x.sum(0), (x * x).sum(0)]), op=hvd.Sum, name="feature_sums")
    count = hvd.allreduce(torch.tensor(float(len(x)), dtype=torch.float64), op=hvd.Sum, name="feature_count")
    mean = sums[0] / count
    std = (sums[1] / count - mean * mean).clamp(min=0).sqrt()
    std[std < 1e-6] = 1.0
    return mean.float(), std.float()


def pick_device() -> torch.device:
    """This rank's GPU (one per local rank) when CUDA is there, else the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
        return torch.device("cuda", hvd.local_rank())
    return torch.device("cpu")


def train_step(model: MLP, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
    """One SGD step on this rank's batch; returns (summed loss, correct predictions) of the batch."""
    optimizer.zero_grad()
    if len(y) == 0:  # still take part in the gradient allreduce, contributing nothing
        (model(x.new_zeros(1, model.spec.input_dim)).sum() * 0).backward()
        optimizer.step()
        return 0.0, 0
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    optimizer.step()
    return loss.item() * len(y), int((logits.argmax(1) == y).sum())


@torch.no_grad()
def evaluate(model: MLP, features: torch.Tensor, labels: torch.Tensor, chunk_rows: int = 65536) -> tuple[float, int]:
    """(summed loss, correct predictions) over the rows, a chunk at a time."""
    loss_sum, correct = 0.0, 0
    for start in range(0, len(labels), chunk_rows):
        logits = model(features[start:start + chunk_rows])
        y = labels[start:start + chunk_rows]
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        correct += int((logits.argmax(1) == y).sum())
    return loss_sum, correct


def global_means(name: str, loss_sum: float, correct: int, count: int) -> tuple[float | None, float | None]:
    totals = hvd.allreduce(torch.tensor([loss_sum, correct, count], dtype=torch.float64), op=hvd.Sum, name=name)
    if totals[2] == 0:
        return None, None
    return float(totals[0] / totals[2]), float(totals[1] / totals[2])


def main(argv: list[str] | None = None) -> int:
    try:
        return train(parse_args(argv))
    except PgtrainError as error:  # bad input, not a crash: one clear line, no traceback
        print(f"{INPUT_ERROR_MARK} {error}", file=sys.stderr, flush=True)
        return 2


def train(args: argparse.Namespace) -> int:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    conn = connect()
    run = runs.get_run(conn, args.run_id)
    config = run.config
    shards = runs.get_manifest(conn, run.run_id)
    if len(shards) != size:
        raise PgtrainError(
            f"run {run.run_id} was planned for {len(shards)} ranks but this Horovod job has {size}; "
            f"launch it with -np {len(shards)}"
        )
    data = loader.load_shard(conn, manifest.source_for(conn, run), shards[rank], run.input_dim,
                             config.validation_fraction, config.seed)
    if rank != 0:
        conn.close()
    print(f"rank {rank}/{size}: {len(data.labels)} rows ({int(data.is_validation.sum())} validation) "
          f"keys {shards[rank].key_lo}..{shards[rank].key_hi}", flush=True)

    device = pick_device()
    features, labels, _ = data.tensors()  # page-locked when CUDA is present (the loader allocates them so)
    train_rows = np.flatnonzero(~data.is_validation)
    val_rows = torch.from_numpy(np.flatnonzero(data.is_validation)).to(device)
    spec = ModelSpec(run.input_dim, tuple(config.hidden_sizes), run.num_classes)
    model = build_model(spec, config.seed)
    mean, std = feature_statistics(features[train_rows])
    # The whole shard goes to the GPU once (one fast copy from pinned memory); batches are cut there.
    features, labels = features.to(device, non_blocking=True), labels.to(device, non_blocking=True)
    model.normalizer.mean.copy_(mean)
    model.normalizer.std.copy_(std)
    model.to(device)

    optimizer = torch.optim.SGD(model.parameters(), lr=config.learning_rate, momentum=MOMENTUM)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    steps = steps_per_epoch(shards, config.batch_size)
    for epoch in range(1, config.epochs + 1):
        started = time.perf_counter()
        model.train()
        loss_sum, correct = 0.0, 0
        for batch in epoch_batches(train_rows, steps, config.seed, epoch, rank):
            index = torch.from_numpy(batch).to(device)
            batch_loss, batch_correct = train_step(model, optimizer, features[index], labels[index])
            loss_sum += batch_loss
            correct += batch_correct
        train_loss, train_accuracy = global_means("train_totals", loss_sum, correct, len(train_rows))
        model.eval()
        val_sums = evaluate(model, features[val_rows], labels[val_rows])
        val_loss, val_accuracy = global_means("val_totals", *val_sums, len(val_rows))
        seconds = time.perf_counter() - started
        if rank == 0:
            runs.record_epoch(conn, run.run_id, epoch, {
                "train_loss": train_loss, "train_accuracy": train_accuracy, "val_loss": val_loss,
                "val_accuracy": val_accuracy, "seconds": seconds,
            })
            val_text = "n/a" if val_accuracy is None else f"{val_accuracy:.4f}"
            print(f"epoch {epoch}/{config.epochs}: train loss {train_loss:.4f} acc {train_accuracy:.4f}, "
                  f"val acc {val_text}, {steps} steps, {seconds:.2f}s", flush=True)

    if rank == 0:
        tensors.write_staged(conn, run.run_id, {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})
        runs.set_status(conn, run.run_id, "trained")
        conn.close()
        print(f"staged {len(spec.parameter_shapes())} tensors for run {run.run_id}", flush=True)
    hvd.shutdown()
    return 0
