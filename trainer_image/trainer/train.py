"""python -m trainer --run-id RUN --attempt N [--backend horovod|torch] [--alone]: one rank of a pgtrain run.

Builds the run's model (the MLP or a ``package.module:factory``), resumes from the run's latest
checkpoint or warm-starts from a committed version (``init_from``), reads its manifest row, streams its
key range from PostgreSQL, trains with its collectives' distributed optimizer (trainer.collectives: Horovod
or torch.distributed), and (rank 0) records per-epoch
metrics, checkpoints, the kept parameters' figures on the test rows and the final staged parameters. The
database URL comes from $PGTRAIN_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

import numpy as np
import psycopg
import torch

import trainer
from pgtrain.config.boosted import BOOSTED
from pgtrain.config.params import TrainingConfig
from pgtrain.core.db import connect, connect_retrying
from pgtrain.core.errors import PgtrainError
from pgtrain.data import input_record, loader
from pgtrain.launch.horovodrun import name_passfile
from pgtrain.launch.lifetime import die_with_parent
from pgtrain.models.cost import multiply_adds_per_row
from pgtrain.models.ensemble import member_loss, trained_output
from pgtrain.models.network import ClampedUnstandardize, PgtrainModel, build_model, state_layout, writable_tensor
from pgtrain.runs import record
from pgtrain.store import tensors
from trainer import collectives, prefetch
from trainer.args import parse_args
from trainer.device import (
    Cuda,
    device_line,
    driver_version,
    forward_precision,
    gpus_requested,
    nccl_version,
    out_of_memory_refused,
    place_rows,
    select_device,
    training_state_bytes,
    use_tf32,
)
from trainer.evaluate import Task, balanced_class_weights, epoch_figures, test_figures
from trainer.optim import Schedule, load_optimizer_arrays, make_optimizer
from trainer.start import Start, agree_on_start, check_encoding_parent, plan_fingerprint, write_checkpoint
from trainer.stopping import BEST_EPOCH, EarlyStopping
from trainer.threads import set_up_threads, thread_summary, threads_per_rank, threads_while


def steps_per_epoch(manifest_rows: list[record.Shard], batch_size: int) -> int:
    """The same for every rank, from the largest shard, so no rank waits in an allreduce the others skip."""
    return max(1, math.ceil(max(s.train_count for s in manifest_rows) / batch_size))


def cpu_step_work(model: torch.nn.Module, shards: list[record.Shard], steps: int, device: torch.device
                  ) -> int | None:
    """The multiply-adds of the largest training step's forward pass where the CPU computes it: what a rank's
    training threads are sized by (``trainer.threads``); None on a GPU, or for layers ``multiply_adds_per_row``
    cannot count."""
    per_row = multiply_adds_per_row(model)
    if device.type != "cpu" or per_row is None:
        return None
    return -(-max(s.train_count for s in shards) // steps) * per_row


def batch_and_rate(config: TrainingConfig, shards: list[record.Shard]) -> tuple[int, float]:
    """(rows per rank per step, learning rate): the run's, or the auto ones (TrainingConfig) for this manifest."""
    batch = config.batch_size_for(max(s.train_count for s in shards))
    return batch, config.learning_rate_for(batch)


def epoch_order(train_count: int, seed: int, epoch: int, rank: int) -> np.ndarray:
    """This rank's shuffled positions among its training rows for ``epoch``: seeded, so a resumed run repeats it.

    ``permutation(train_count)``'s order, shuffled in place in 4-byte positions where they fit: the one array a
    rank holds beside its rows that grows with them."""
    order = np.arange(train_count, dtype=np.int32 if train_count <= np.iinfo(np.int32).max else np.int64)
    np.random.default_rng([seed, epoch, rank]).shuffle(order)
    return order


def batch_bounds(rows: int, steps: int) -> list[int]:
    """Start offsets of ``steps`` consecutive batches (plus the end), sizes differing by at most one."""
    size, larger = divmod(rows, steps)
    return [step * size + min(step, larger) for step in range(steps + 1)]


def epoch_batches(train_rows: np.ndarray, steps: int, seed: int, epoch: int, rank: int) -> list[np.ndarray]:
    """This rank's shuffled training rows in ``steps`` batches: what the training loop steps on."""
    order = train_rows[epoch_order(len(train_rows), seed, epoch, rank)]
    bounds = batch_bounds(len(order), steps)
    return [order[lo:hi] for lo, hi in zip(bounds, bounds[1:], strict=False)]


def global_statistics(values: torch.Tensor, name: str, columns: int | None = None,
                      chunk_rows: int = 65536) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std per column of ``values`` (its first ``columns`` columns) over all ranks (float64 sums;
    constant columns get std 1)."""
    columns = values.shape[1] if columns is None else columns
    sums = torch.zeros(2, columns, dtype=torch.float64)
    for start in range(0, len(values), chunk_rows):
        x = values[start:start + chunk_rows, :columns].double()
        sums[0] += x.sum(0)
        sums[1] += x.square_().sum(0)  # in place: one chunk-sized copy, not two
    sums = collectives.allreduce_sum(sums, f"{name}_sums")
    count = collectives.allreduce_sum(torch.tensor(float(len(values)), dtype=torch.float64), f"{name}_count")
    mean = sums[0] / count
    std = (sums[1] / count - mean * mean).clamp(min=0).sqrt()
    std[std < 1e-6] = 1.0
    return mean.float(), std.float()


def global_range(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Min and max per column of ``values`` over all ranks (each rank's gathered: exact for any split; a rank
    without rows contributes +inf / -inf)."""
    columns = values.shape[1]
    if len(values):
        mine = torch.stack([values.amin(0), values.amax(0)]).double().cpu()
    else:
        mine = torch.tensor([[math.inf] * columns, [-math.inf] * columns], dtype=torch.float64)
    every = collectives.allgather(mine.unsqueeze(0), "target_range")
    return every[:, 0].amin(0).float(), every[:, 1].amax(0).float()


# -- one epoch -------------------------------------------------------------------------------------------
class Batches:
    """Gathers a step's rows into buffers allocated once (a step allocates nothing for its batch): on the device
    when the rows are there; else on the host, into a small page-locked buffer copied to the device."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, largest: int, device: torch.device) -> None:
        self.x, self.y = x, y
        self.x_out = x.new_empty((largest, *x.shape[1:]), device=device)
        self.y_out = y.new_empty((largest, *y.shape[1:]), device=device)
        self.staged = x.device != device
        self.copied: torch.cuda.Event | None = None  # the last copy out of the host buffers
        if self.staged:
            self.x_host = torch.empty(self.x_out.shape, dtype=x.dtype, pin_memory=True)
            self.y_host = torch.empty(self.y_out.shape, dtype=y.dtype, pin_memory=True)

    @property
    def rows_device(self) -> torch.device:
        """Where a step's row positions are read: where the rows are."""
        return self.x.device

    def __call__(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(rows)
        if not self.staged:
            return (torch.index_select(self.x, 0, rows, out=self.x_out[:n]),
                    torch.index_select(self.y, 0, rows, out=self.y_out[:n]))
        if self.copied is not None:
            self.copied.synchronize()  # the previous batch has left the host buffers
        x = self.x_out[:n].copy_(torch.index_select(self.x, 0, rows, out=self.x_host[:n]), non_blocking=True)
        y = self.y_out[:n].copy_(torch.index_select(self.y, 0, rows, out=self.y_host[:n]), non_blocking=True)
        self.copied = torch.cuda.Event()
        self.copied.record()
        return x, y


def train_epoch(model: PgtrainModel, optimizer: torch.optim.Optimizer, schedule: Schedule, first_step: int,
                task: Task, batches: Batches, order: torch.Tensor, bounds: list[int],
                precision: str = "fp32") -> torch.Tensor:
    """One pass over this rank's shuffled rows; returns [loss sum, correct] on the device (no sync per step).
    ``precision``: the run's (bf16: each step's forward pass and loss autocast, trainer.device.forward_precision)."""
    sums = task.train_sums()
    for step, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False), start=first_step):
        schedule.set(step)
        optimizer.zero_grad()
        if hi == lo:  # still take part in the gradient allreduce, contributing nothing
            (model.standardized(torch.zeros(2, model.input_dim, device=task.device)).sum() * 0).backward()
            optimizer.step()
            continue
        x, y = batches(order[lo:hi])
        with forward_precision(task.device, precision):
            out = model.standardized(x)
            loss = member_loss(task.loss, out, y)
        loss.backward()
        optimizer.step()
        task.add_train(sums, loss, trained_output(out, task.regression), y)
    return sums


def epoch_line(epoch: int, epochs: int, m: dict[str, Any], steps: int, regression: bool) -> str:
    def show(key: str) -> str:
        return "n/a" if m.get(key) is None else f"{m[key]:.4f}"

    if regression:
        quality = f"train loss {m['train_loss']:.4f}, val rmse {show('val_rmse')} mae {show('val_mae')} " \
                  f"r2 {show('val_r2')}"
    else:
        quality = f"train loss {m['train_loss']:.4f} acc {show('train_accuracy')}, val acc {show('val_accuracy')}"
    eta = m["seconds"] * (epochs - epoch)  # at this epoch's pace
    return (f"epoch {epoch}/{epochs}: {quality}, {steps} steps, {m['samples_per_second'] or 0:.0f} samples/s, "
            f"{m['seconds']:.2f}s, ETA {eta:.0f}s")


# -- the rank ----------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    die_with_parent()  # a rank whose launcher is gone must not train on
    if args.alone:
        name_passfile()  # no launcher between the task and this rank: it names the inherited passfile itself
    try:
        return train(args)
    except PgtrainError as error:  # bad input, not a crash: the run's verdict, one clear line, no traceback
        print(f"run {args.run_id} refused its input: {error}", file=sys.stderr, flush=True)
        record_verdict(args, "refused", str(error))
        return 2
    except Exception as error:
        record_verdict(args, "failed", f"{type(error).__name__}: {error}")
        raise


def record_verdict(args: argparse.Namespace, status: str, reason: str) -> None:
    """Best effort: the launchers read the verdict from the run; one that cannot be written reads as a crash."""
    try:
        with connect(attempt=args.attempt) as conn:
            record.record_verdict(conn, args.run_id, status, reason)
    except Exception as error:
        print(f"could not record the verdict of run {args.run_id}: {error}", file=sys.stderr, flush=True)


def train(args: argparse.Namespace, cuda: Cuda = torch.cuda) -> int:
    imports = time.perf_counter() - trainer.STARTED  # torch's and the trainer's: most of a small run's start
    ranks = collectives.init(args.backend, args.collective_timeout, alone=args.alone)
    # First: before anything can create a CUDA context. A rank whose pod holds GPUs never falls back to the CPU.
    device = select_device(ranks.local_rank(), cuda, gpus_requested(os.environ))
    rank, size = ranks.rank(), ranks.size()
    print(device_line(rank, device, cuda, driver_version(), nccl_version()), flush=True)
    use_tf32(device)
    conn = connect_retrying(attempt=args.attempt)  # every rank at once: a busy or restarting server gets retried
    record.mark_training(conn, args.run_id)  # the first fenced write: a stale attempt stops here
    if rank == 0:
        record.set_backend(conn, args.run_id, ranks.name)
        print(f"collectives: {ranks.name} ({size} rank{'s' if size != 1 else ''})", flush=True)
    run = record.get_run(conn, args.run_id)
    config = run.config
    set_up_threads(os.environ, ranks.local_size(), config.intra_op_threads)
    shards = record.get_manifest(conn, run.run_id)
    if len(shards) != size:
        raise PgtrainError(
            f"run {run.run_id} was planned for {len(shards)} ranks but this job has {size}; "
            f"launch it with -np {len(shards)}"
        )
    if config.model == BOOSTED:  # trees grown across the same ranks from the same rows (trainer.boosted)
        from trainer import boosted  # only here: a rank of a network never loads the booster's module

        return boosted.train_rank(conn, run, shards, ranks.local_size(), device,
                                  lambda: load_rows(conn, run, shards, rank, size, imports))
    planned = input_record.of_run(run)
    regression, output_dim = planned.task == "regression", planned.output_dim

    # The model and its starting weights are settled before the rows are taken: a bad model reference, factory or
    # init_from is refused first (a rank alone may have begun reading them meanwhile: that read is dropped).
    model = build_model(config.model, planned.input_dim, output_dim, config.model_options_for_build, config.seed,
                        run.encoding)
    fingerprint = plan_fingerprint(shards)
    start = agree_on_start(conn, run, model, rank, fingerprint)
    check_encoding_parent(run, start.init_version)
    if rank == 0:
        record.set_model_layout(conn, run.run_id, state_layout(model))
        record.set_init_version(conn, run.run_id, start.init_version)
        for metrics in start.history:  # a retried task may have cleared them: the checkpoint keeps them
            record.record_epoch(conn, run.run_id, metrics["epoch"], {k: v for k, v in metrics.items() if k != "epoch"})

    data = load_rows(conn, run, shards, rank, size, imports)

    # Loaded training rows first, then validation, then test: views of the loaded memory, never copied.
    (x_train, y_train), (x_val, y_val), (x_test, y_test) = (tuple(map(torch.from_numpy, part))
                                                            for part in data.split())
    del data
    if regression:
        y_train, y_val, y_test = (y.float().reshape(len(y), output_dim) for y in (y_train, y_val, y_test))
    if not start.from_state:
        mean, std = global_statistics(x_train, "feature", model.standardized_columns)
        model.normalizer.mean.copy_(mean)
        model.normalizer.std.copy_(std)
        if regression and config.standardize_target:
            mean, std = global_statistics(y_train, "target")
            model.target.mean.copy_(mean)
            model.target.std.copy_(std)
    if regression and isinstance(model.target, ClampedUnstandardize) and (not start.from_state or start.fill_bounds):
        low, high = global_range(y_train)
        model.target.low.copy_(low)
        model.target.high.copy_(high)
    batch_size, learning_rate = batch_and_rate(config, shards)
    steps = steps_per_epoch(shards, batch_size)
    train_count = len(x_train)
    largest = -(-train_count // steps)
    # On the device: the rows (the regression targets twice: as read and scaled) and each epoch's order.
    row_bytes = sum(t.nbytes for t in (x_train, y_train, x_val, y_val, x_test, y_test)) + (
        y_train.nbytes + y_val.nbytes + y_test.nbytes if regression else 0) + 8 * train_count
    batch_bytes = largest * (x_train[:1].nbytes + y_train[:1].nbytes)
    on_device = place_rows(device, cuda, row_bytes, training_state_bytes(model), batch_bytes, batch_size, size)
    with out_of_memory_refused(device, batch_size, size):
        if on_device:  # one copy each; the host memory goes with its last reference, here
            x_train, y_train, x_val, y_val, x_test, y_test = (
                t.to(device) for t in (x_train, y_train, x_val, y_val, x_test, y_test))
        return fit(conn, run, model, start, shards, fingerprint, device, cuda,
                   (x_train, y_train, x_val, y_val, x_test, y_test), batch_size, learning_rate)


def load_rows(conn: psycopg.Connection, run: record.Run, shards: list[record.Shard], rank: int,
              size: int, imports: float) -> loader.ShardData:
    """This rank's rows of its manifest row, streamed with COPY (validation rows last); the connection of a rank
    but 0 is closed after (rank 0 records)."""
    read = prefetch.take(shards)  # read while torch was imported (a rank alone), else now
    if read is None:
        load_started = time.perf_counter()
        data = prefetch.read_shard(conn, run, shards, rank, size)
        load_seconds = time.perf_counter() - load_started
    else:
        data, load_seconds = read
    if rank != 0:
        conn.close()
    print(f"rank {rank}/{size}: imports {imports:.2f} s, {len(data.labels)} rows ({shards[rank].val_count} "
          f"validation, {shards[rank].test_count} test) keys {shards[rank].key_lo}..{shards[rank].key_hi}, "
          f"loaded in {load_seconds:.2f} s on {data.streams} connection{'s' if data.streams > 1 else ''}"
          + (f" {prefetch.EARLY}" if read is not None else ""), flush=True)
    return data


def fit(conn: psycopg.Connection, run: record.Run, model: PgtrainModel, start: Start, shards: list[record.Shard],
        fingerprint: str, device: torch.device, cuda: Cuda,
        rows: tuple[torch.Tensor, ...], batch_size: int, learning_rate: float) -> int:
    """Train on ``rows`` (x_train, y_train, x_val, y_val, x_test, y_test: on ``device``, or in host memory with
    each batch copied over), choosing the epoch on the validation rows only, then read the kept parameters' figures
    once on the test rows and (rank 0) stage the parameters: the best epoch's with early stopping, else the last
    one's."""
    rank, size, config = collectives.rank(), collectives.size(), run.config
    regression, output_dim = config.task == "regression", model.output_dim
    x_train, y_train, x_val, y_val, x_test, y_test = rows
    model.to(device)
    steps = steps_per_epoch(shards, batch_size)
    step_threads = threads_per_rank(os.environ, collectives.active().local_size(), config.intra_op_threads,
                                    cpu_step_work(model, shards, steps, device))
    optimizer = make_optimizer(config, model, learning_rate)
    if size > 1:  # one rank has nothing to average: no gradient hooks, no wait on the collectives each step
        # (a new optimizer over the same parameter groups: the state is loaded into it, below)
        optimizer = collectives.distributed_optimizer(optimizer, model)
    if start.epoch > 0:  # every rank loads rank 0's checkpointed state (a fresh optimizer has none to share)
        load_optimizer_arrays(optimizer, model, collectives.broadcast_object(start.optimizer, "optimizer_state"))
    schedule = Schedule(config, optimizer, learning_rate, steps)
    collectives.broadcast_parameters(model.state_dict())

    # Regression trains on the standardized target (identity without standardize_target); once, not per step.
    y_train_fit = model.target.scale(y_train) if regression else y_train
    y_val_fit = model.target.scale(y_val) if regression else y_val
    weights = (balanced_class_weights(y_train, output_dim)
               if not regression and config.class_weight == "balanced" else None)
    task = Task(regression, output_dim, device, weights, input_record.of_run(run).classes)
    validation_rows = sum(s.val_count for s in shards)
    stopping = EarlyStopping.for_run(config, validation_rows, start.history)  # rank 0 has the history
    stopping.best_epoch = collectives.broadcast_object(stopping.best_epoch, "best_epoch")
    best = {k: writable_tensor(v).to(device) for k, v in start.best.items()} or None
    if rank == 0:
        auto = [name for name in ("batch_size", "learning_rate") if getattr(config, name) is None]
        print(f"{config.optimizer} at learning rate {learning_rate:g} ({config.lr_schedule} schedule), batch "
              f"{batch_size} rows per rank (global {batch_size * size}), {steps} steps per epoch, "
              f"{thread_summary(step_threads)}" + (f" ({' and '.join(auto)} auto)" if auto else ""),
              flush=True)
        if config.early_stopping_patience and not stopping.on:
            print("early stopping is off: the run has no validation rows (validation_fraction 0)", flush=True)
    train_count = len(x_train)
    batches = Batches(x_train, y_train_fit, -(-train_count // steps), device)
    global_train_rows = sum(s.train_count for s in shards)
    history = list(start.history)
    epoch = start.epoch
    while epoch < config.epochs and not stopping.should_stop(epoch):
        epoch += 1
        started = time.perf_counter()
        # Randomness inside the model (dropout) is seeded per epoch and rank too, so a resumed run repeats it.
        torch.manual_seed(int(np.random.SeedSequence([config.seed, epoch, rank]).generate_state(1)[0]))
        model.train()
        # The order is dropped with the epoch: the next one is never built beside it.
        with threads_while(step_threads):
            train_sums = train_epoch(model, optimizer, schedule, (epoch - 1) * steps, task, batches,
                                     torch.from_numpy(epoch_order(train_count, config.seed, epoch, rank)).to(
                                         batches.rows_device), batch_bounds(train_count, steps), config.precision)
        if device.type == "cuda":
            cuda.synchronize(device.index)
        train_seconds = time.perf_counter() - started
        model.eval()
        gather = task.gathers(validation_rows)
        val_sums, probabilities = task.validation(model, x_val, y_val, y_val_fit, gather)
        counts = torch.tensor([len(x_train)], dtype=torch.float64, device=device)
        val_count = torch.tensor([len(x_val)], dtype=torch.float64, device=device)
        totals = collectives.allreduce_sum(torch.cat([train_sums, counts, val_sums, val_count]).cpu(), "epoch_totals")
        metrics = epoch_figures(task, totals, task.exact_metrics(probabilities, y_val) if gather else None)
        metrics["seconds"] = time.perf_counter() - started
        metrics["samples_per_second"] = global_train_rows / train_seconds if train_seconds > 0 else None
        # Rank 0 has the exact metrics: it decides, every rank follows (the same epochs everywhere).
        improved = rank == 0 and stopping.update(epoch, metrics)
        stopping.best_epoch = collectives.broadcast_object(stopping.best_epoch, "best_epoch")
        if stopping.on:
            metrics[BEST_EPOCH] = stopping.best_epoch
            if improved and rank == 0:
                best = {k: v.detach().clone() for k, v in model.state_dict().items()}
        history.append({"epoch": epoch, **metrics})
        if rank == 0:
            record.record_epoch(conn, run.run_id, epoch, metrics)
            print(epoch_line(epoch, config.epochs, metrics, steps, regression), flush=True)
            if config.checkpoint_every and epoch % config.checkpoint_every == 0 and epoch < config.epochs:
                write_checkpoint(conn, run, epoch, model, optimizer, start, history, fingerprint, best)

    if rank == 0 and stopping.on and stopping.best_epoch is not None and best is not None:
        model.load_state_dict(best)
    if test_rows := sum(s.test_count for s in shards):
        collectives.broadcast_parameters(model.state_dict())  # rank 0's kept parameters, on every rank
        model.eval()
        figures = test_figures(task, model, x_test, y_test, model.target.scale(y_test) if regression else y_test,
                               test_rows)
        if rank == 0:
            record.set_test_metrics(conn, run.run_id, figures)
            shown = ", ".join(f"{k} {v:.4f}" for k, v in figures.items() if isinstance(v, float))
            print(f"the kept parameters on the {test_rows} test rows (they chose nothing): {shown}", flush=True)
    if rank == 0:
        if stopping.on and stopping.best_epoch is None:
            print(f"early stopping had no {stopping.metric.name} to follow (undefined in every epoch): the last "
                  "epoch's parameters are the run's", flush=True)
        elif stopping.on and best is not None:
            print(f"{'stopped early: ' if epoch < config.epochs else ''}the best epoch by "
                  f"{stopping.metric.name} is {stopping.best_epoch} of {epoch} ({stopping.best_value:.6g}): its "
                  "parameters are the run's", flush=True)
        state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
        tensors.write_staged(conn, run.run_id, state)
        record.set_status(conn, run.run_id, "trained")
        # Staged parameters supersede the checkpoints; a retry after this point trains again from scratch.
        tensors.delete_checkpoints(conn, run.run_id)
        conn.close()
        print(f"staged {len(state)} tensors for run {run.run_id}", flush=True)
    collectives.shutdown()
    return 0
